// Package fairq shares a process's work slots between tenants: a bounded
// number of requests run at once, each tenant holds at most a bounded
// number of them, and a slot that frees up goes to the waiting tenant that
// holds the fewest, among equals in turn (round robin), so a tenant with
// many requests in flight cannot take the slots — and with them the CPU —
// from one with few. A request
// waits a bounded time in a bounded queue of its tenant; past either bound
// it is refused with an error that names the bound, never dropped.
package fairq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Config bounds the queue. Every field must be above zero.
type Config struct {
	// Slots is how many requests of all tenants run at once.
	Slots int
	// PerTenant is how many of the slots one tenant may hold at once.
	PerTenant int
	// Queue is how many requests of one tenant may wait for a slot; one
	// more is refused at once.
	Queue int
	// Wait is how long a request waits for a slot before it is refused.
	Wait time.Duration
	// Now reads the clock; After fires after a duration (time.After when
	// nil). Both nil take the wall clock.
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
}

// Turn says how a request was admitted.
type Turn struct {
	// Seq numbers the admissions of the process, from 1.
	Seq uint64
	// Queued is whether the request waited for a slot.
	Queued bool
	// Waited is how long it waited.
	Waited time.Duration
	// Ahead is how many requests of its own tenant waited before it when
	// it joined the queue.
	Ahead int
	// OthersFirst is how many requests of other tenants were admitted
	// while it waited. With one slot, round robin bounds it by (Ahead+1)
	// times the number of other tenants.
	OthersFirst int
}

// Refusal is a request refused by a bound: retry later.
type Refusal struct {
	Tenant string
	// Bound is "queue" (Queue requests of the tenant already waited) or
	// "wait" (no slot came within Wait).
	Bound string
	// Limit is the bound's value in words, e.g. "64 waiting" or "5s".
	Limit string
	// Slots and PerTenant are the queue's, for the message.
	Slots, PerTenant int
}

func (e *Refusal) Error() string {
	switch e.Bound {
	case "queue":
		return fmt.Sprintf("tenant %q is at its limit: %s requests already wait for the %d decision slots it shares (at most %d of them its own); retry later",
			e.Tenant, e.Limit, e.Slots, e.PerTenant)
	default:
		return fmt.Sprintf("tenant %q is at its limit: no decision slot came free within %s (%d slots shared by the tenants, at most %d of them its own); retry later",
			e.Tenant, e.Limit, e.Slots, e.PerTenant)
	}
}

// ErrUnknownTenant is returned for a tenant the queue was not built with.
var ErrUnknownTenant = errors.New("fairq: unknown tenant")

// Stats are the queue's counters since it was built.
type Stats struct {
	Immediate, Queued   uint64 // admissions without and after a wait
	RefusedQueue        uint64 // refused: the tenant's queue was full
	RefusedWait         uint64 // refused: no slot within Wait
	Cancelled           uint64 // the caller gave up while waiting
	InFlight, Waiting   int
	Slots, PerTenant    int
	Queue               int
	WaitBound           time.Duration
	TenantsWithRequests int // tenants holding or waiting for a slot now
}

// Queue is the fair queue of a fixed set of tenants.
type Queue struct {
	cfg Config

	mu       sync.Mutex
	tenants  []*tenant // in name order: the round robin's ring
	byName   map[string]*tenant
	free     int
	cursor   int // the index of the tenant admitted last
	admitted uint64
	stats    Stats
}

type tenant struct {
	name     string
	index    int
	inFlight int
	admitted uint64
	waiters  []*waiter
}

type waiter struct {
	ready     chan struct{} // closed when admitted
	admitted  bool
	since     time.Time
	ahead     int
	allAtJoin uint64 // the queue's admissions when it joined
	ownAtJoin uint64 // its tenant's admissions when it joined
	turn      Turn
}

// New builds the queue for tenants (at least one; names must differ).
func New(tenants []string, cfg Config) (*Queue, error) {
	if cfg.Slots <= 0 || cfg.PerTenant <= 0 || cfg.Queue <= 0 || cfg.Wait <= 0 {
		return nil, fmt.Errorf("fairq: slots (%d), per-tenant slots (%d), queue (%d) and wait (%s) must all be above zero",
			cfg.Slots, cfg.PerTenant, cfg.Queue, cfg.Wait)
	}
	if len(tenants) == 0 {
		return nil, errors.New("fairq: no tenant")
	}
	if cfg.PerTenant > cfg.Slots {
		cfg.PerTenant = cfg.Slots
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	names := slices.Sorted(slices.Values(tenants))
	q := &Queue{cfg: cfg, byName: make(map[string]*tenant, len(names)), free: cfg.Slots, cursor: len(names) - 1}
	for i, name := range names {
		if _, dup := q.byName[name]; dup {
			return nil, fmt.Errorf("fairq: tenant %q twice", name)
		}
		t := &tenant{name: name, index: i}
		q.tenants = append(q.tenants, t)
		q.byName[name] = t
	}
	return q, nil
}

// Ticket is a slot held; Release gives it back, once.
type Ticket struct {
	q    *Queue
	t    *tenant
	once sync.Once
	Turn Turn
}

// Release gives the slot back and admits the next waiter in turn.
func (tk *Ticket) Release() {
	tk.once.Do(func() {
		tk.q.mu.Lock()
		defer tk.q.mu.Unlock()
		tk.q.free++
		tk.t.inFlight--
		tk.q.dispatchLocked()
	})
}

// Acquire waits for a slot for the tenant's request. It returns a
// *Refusal past a bound, ctx's error if ctx ends first, or
// ErrUnknownTenant.
func (q *Queue) Acquire(ctx context.Context, name string) (*Ticket, error) {
	q.mu.Lock()
	t, ok := q.byName[name]
	if !ok {
		q.mu.Unlock()
		return nil, fmt.Errorf("%w %q", ErrUnknownTenant, name)
	}
	// A free slot with nobody of this tenant ahead: every waiter of the
	// other tenants is at its own PerTenant bound (dispatch admits the
	// others first), so taking it passes no one.
	if q.free > 0 && t.inFlight < q.cfg.PerTenant && len(t.waiters) == 0 {
		q.admitLocked(t)
		q.stats.Immediate++
		tk := &Ticket{q: q, t: t, Turn: Turn{Seq: q.admitted}}
		q.mu.Unlock()
		return tk, nil
	}
	if len(t.waiters) >= q.cfg.Queue {
		q.stats.RefusedQueue++
		q.mu.Unlock()
		return nil, q.refusal(t, "queue", fmt.Sprintf("%d", q.cfg.Queue))
	}
	w := &waiter{ready: make(chan struct{}), since: q.cfg.Now(), ahead: len(t.waiters),
		allAtJoin: q.admitted, ownAtJoin: t.admitted}
	t.waiters = append(t.waiters, w)
	q.mu.Unlock()

	var bound string
	select {
	case <-w.ready:
		return &Ticket{q: q, t: t, Turn: w.turn}, nil
	case <-q.cfg.After(q.cfg.Wait):
		bound = "wait"
	case <-ctx.Done():
	}
	q.mu.Lock()
	if w.admitted {
		// Admitted as the wait ended: give the slot to the next in turn
		// unless the caller still wants it (the wait bound raced it).
		q.mu.Unlock()
		tk := &Ticket{q: q, t: t, Turn: w.turn}
		if bound == "wait" && ctx.Err() == nil {
			return tk, nil
		}
		tk.Release()
		return nil, ctx.Err()
	}
	t.waiters = slices.DeleteFunc(t.waiters, func(o *waiter) bool { return o == w })
	if bound == "wait" {
		q.stats.RefusedWait++
	} else {
		q.stats.Cancelled++
	}
	q.mu.Unlock()
	if bound == "wait" {
		return nil, q.refusal(t, "wait", q.cfg.Wait.String())
	}
	return nil, ctx.Err()
}

func (q *Queue) refusal(t *tenant, bound, limit string) *Refusal {
	return &Refusal{Tenant: t.name, Bound: bound, Limit: limit, Slots: q.cfg.Slots, PerTenant: q.cfg.PerTenant}
}

func (q *Queue) admitLocked(t *tenant) {
	q.free--
	t.inFlight++
	q.admitted++
	t.admitted++
	q.cursor = t.index
}

// dispatchLocked hands the free slots to the waiters: each to the waiting
// tenant that holds the fewest slots, among equals the first in ring
// order after the tenant admitted last (round robin), skipping tenants at
// their PerTenant bound. The fewest first: a tenant whose requests hold
// their slots long (waiting for its store's lock) would otherwise gather
// the slots that a quick tenant's requests give back.
func (q *Queue) dispatchLocked() {
	n := len(q.tenants)
	for q.free > 0 {
		var next *tenant
		for i := 1; i <= n; i++ {
			t := q.tenants[(q.cursor+i)%n]
			if len(t.waiters) > 0 && t.inFlight < q.cfg.PerTenant && (next == nil || t.inFlight < next.inFlight) {
				next = t
			}
		}
		if next == nil {
			return
		}
		w := next.waiters[0]
		next.waiters[0] = nil
		next.waiters = next.waiters[1:]
		q.admitLocked(next)
		q.stats.Queued++
		w.admitted = true
		w.turn = Turn{Seq: q.admitted, Queued: true, Waited: q.cfg.Now().Sub(w.since), Ahead: w.ahead,
			OthersFirst: int((q.admitted - w.allAtJoin) - (next.admitted - w.ownAtJoin))}
		close(w.ready)
	}
}

// Stats reads the counters.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.stats
	s.InFlight = q.cfg.Slots - q.free
	s.Slots, s.PerTenant, s.Queue, s.WaitBound = q.cfg.Slots, q.cfg.PerTenant, q.cfg.Queue, q.cfg.Wait
	for _, t := range q.tenants {
		s.Waiting += len(t.waiters)
		if t.inFlight > 0 || len(t.waiters) > 0 {
			s.TenantsWithRequests++
		}
	}
	return s
}
