package fairq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// never is an After that never fires: the wait bound plays no part.
func never(time.Duration) <-chan time.Time { return nil }

func newQueue(t *testing.T, tenants []string, cfg Config) *Queue {
	t.Helper()
	if cfg.After == nil {
		cfg.After = never
	}
	q, err := New(tenants, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// joined waits until n requests wait in q.
func joined(t *testing.T, q *Queue, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for q.Stats().Waiting != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests wait, want %d", q.Stats().Waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// later asks for a slot of who in the background and hands the ticket
// over once admitted; it waits until the request has joined the queue,
// which then holds waiting requests.
func later(t *testing.T, q *Queue, who string, waiting int) <-chan *Ticket {
	t.Helper()
	done := make(chan *Ticket, 1)
	go func() {
		tk, err := q.Acquire(context.Background(), who)
		if err != nil {
			t.Error(err)
		}
		done <- tk
	}()
	joined(t, q, waiting)
	return done
}

func TestNewRefusesNoBound(t *testing.T) {
	good := Config{Slots: 2, PerTenant: 2, Queue: 4, Wait: time.Second}
	for _, tc := range []struct {
		name    string
		tenants []string
		mod     func(*Config)
		want    string
	}{
		{"no slots", []string{"a"}, func(c *Config) { c.Slots = 0 }, "must all be above zero"},
		{"no per-tenant slots", []string{"a"}, func(c *Config) { c.PerTenant = -1 }, "must all be above zero"},
		{"no queue", []string{"a"}, func(c *Config) { c.Queue = 0 }, "must all be above zero"},
		{"no wait", []string{"a"}, func(c *Config) { c.Wait = 0 }, "must all be above zero"},
		{"no tenant", nil, func(*Config) {}, "no tenant"},
		{"a tenant twice", []string{"a", "b", "a"}, func(*Config) {}, `tenant "a" twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mod(&cfg)
			if _, err := New(tc.tenants, cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestUnknownTenant(t *testing.T) {
	q := newQueue(t, []string{"a"}, Config{Slots: 1, PerTenant: 1, Queue: 1, Wait: time.Second})
	if _, err := q.Acquire(t.Context(), "b"); !errors.Is(err, ErrUnknownTenant) {
		t.Fatalf("unknown tenant: %v", err)
	}
	if s := q.Stats(); s.InFlight != 0 || s.Waiting != 0 {
		t.Fatalf("an unknown tenant left state: %+v", s)
	}
}

// Freed slots go to the waiting tenants in turn, whoever has more
// waiting: with one slot, a's five waiters and b's two are admitted
// b, a, b, a, a, a, a (b first: a held the slot last).
func TestRoundRobin(t *testing.T) {
	q := newQueue(t, []string{"a", "b"}, Config{Slots: 1, PerTenant: 1, Queue: 10, Wait: time.Second})
	first, err := q.Acquire(t.Context(), "a")
	if err != nil || first.Turn.Queued || first.Turn.Seq != 1 {
		t.Fatalf("first: %+v %v", first, err)
	}
	type got struct {
		who  string
		turn Turn
	}
	order := make(chan got, 10)
	var wg sync.WaitGroup
	join := func(who string, n int) {
		for range n {
			before := q.Stats().Waiting
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk, err := q.Acquire(context.Background(), who)
				if err != nil {
					t.Error(err)
					return
				}
				order <- got{who, tk.Turn}
				time.Sleep(time.Millisecond) // the next must not overtake the report
				tk.Release()
			}()
			joined(t, q, before+1) // joins in this order
		}
	}
	join("a", 5)
	join("b", 2)
	first.Release()
	wg.Wait()
	close(order)
	var seq []string
	for g := range order {
		seq = append(seq, g.who)
		if !g.turn.Queued {
			t.Errorf("%s was admitted without waiting: %+v", g.who, g.turn)
		}
		if max := g.turn.Ahead + 1; g.turn.OthersFirst > max {
			t.Errorf("%s: %d of the other tenant went first with %d of its own ahead (at most %d)", g.who, g.turn.OthersFirst, g.turn.Ahead, max)
		}
	}
	if s := strings.Join(seq, ""); s != "babaaaa" {
		t.Fatalf("admission order %s, want babaaaa", s)
	}
	s := q.Stats()
	if s.Immediate != 1 || s.Queued != 7 || s.InFlight != 0 || s.Waiting != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// A tenant at its own bound waits even with slots free; another is
// admitted at once.
func TestPerTenantBound(t *testing.T) {
	q := newQueue(t, []string{"a", "b"}, Config{Slots: 3, PerTenant: 2, Queue: 5, Wait: time.Second})
	var held []*Ticket
	for range 2 {
		tk, err := q.Acquire(t.Context(), "a")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, tk)
	}
	done := later(t, q, "a", 1)
	b, err := q.Acquire(t.Context(), "b")
	if err != nil || b.Turn.Queued {
		t.Fatalf("b with a slot free: %+v %v", b, err)
	}
	select {
	case <-done:
		t.Fatal("a's third request ran past its bound of 2")
	case <-time.After(20 * time.Millisecond):
	}
	held[0].Release()
	third := <-done
	if !third.Turn.Queued || third.Turn.OthersFirst != 1 { // b went first: a was at its bound
		t.Fatalf("a's third: %+v", third.Turn)
	}
	held[0].Release() // a second release gives nothing back twice
	if s := q.Stats(); s.InFlight != 3 {
		t.Fatalf("in flight after a double release: %d, want 3", s.InFlight)
	}
}

// The bounds: a full queue refuses at once, a wait past the bound
// refuses, a caller that gives up leaves no waiter behind; each refusal
// names the tenant and the bound.
func TestBoundsRefuse(t *testing.T) {
	fire := make(chan time.Time)
	q := newQueue(t, []string{"a", "b"}, Config{Slots: 1, PerTenant: 1, Queue: 1, Wait: 3 * time.Second,
		After: func(time.Duration) <-chan time.Time { return fire }})
	hold, err := q.Acquire(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := q.Acquire(context.Background(), "a")
		errc <- err
	}()
	joined(t, q, 1)
	_, err = q.Acquire(t.Context(), "a")
	var r *Refusal
	if !errors.As(err, &r) || r.Bound != "queue" || !strings.Contains(err.Error(), `tenant "a" is at its limit: 1 requests already wait`) {
		t.Fatalf("past the queue: %v", err)
	}
	fire <- time.Now()
	err = <-errc
	if !errors.As(err, &r) || r.Bound != "wait" || !strings.Contains(err.Error(), "within 3s") {
		t.Fatalf("past the wait: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		_, err := q.Acquire(ctx, "b")
		errc <- err
	}()
	joined(t, q, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that gave up: %v", err)
	}
	hold.Release()
	s := q.Stats()
	if s.RefusedQueue != 1 || s.RefusedWait != 1 || s.Cancelled != 1 || s.Waiting != 0 || s.InFlight != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// Many tenants and callers at once: the bounds always hold, every
// request is admitted or refused, and every slot comes back.
func TestConcurrentBoundsHold(t *testing.T) {
	tenants := []string{"a", "b", "c"}
	q := newQueue(t, tenants, Config{Slots: 3, PerTenant: 2, Queue: 100, Wait: time.Minute, After: time.After})
	var inFlight atomic.Int32
	per := map[string]*atomic.Int32{"a": {}, "b": {}, "c": {}}
	var wg sync.WaitGroup
	for i := range 60 {
		who := tenants[i%3]
		if i%2 == 0 {
			who = "a" // a floods
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				tk, err := q.Acquire(context.Background(), who)
				if err != nil {
					t.Error(err)
					return
				}
				if n := inFlight.Add(1); n > 3 {
					t.Errorf("%d in flight, bound 3", n)
				}
				if n := per[who].Add(1); n > 2 {
					t.Errorf("%s holds %d, bound 2", who, n)
				}
				per[who].Add(-1)
				inFlight.Add(-1)
				tk.Release()
			}
		}()
	}
	wg.Wait()
	s := q.Stats()
	if s.Immediate+s.Queued != 1200 || s.InFlight != 0 || s.Waiting != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// A freed slot goes to the waiting tenant that holds the fewest: a's
// requests hold three of four slots for long, b's one comes back again and
// again, and b keeps it each time although a waits and was admitted less
// recently — until b holds as many as a.
func TestFewestHeldFirst(t *testing.T) {
	q := newQueue(t, []string{"a", "b"}, Config{Slots: 4, PerTenant: 4, Queue: 10, Wait: time.Second})
	var held []*Ticket
	for range 3 {
		tk, err := q.Acquire(t.Context(), "a")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, tk)
	}
	b, err := q.Acquire(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	aDone := later(t, q, "a", 1)
	for i := range 3 {
		bDone := later(t, q, "b", 2)
		b.Release() // b holds 0, a holds 3: b's waiter takes it
		b = <-bDone
		if b.Turn.OthersFirst != 0 {
			t.Fatalf("round %d: b's request let %d of a's go first", i, b.Turn.OthersFirst)
		}
		joined(t, q, 1)
	}
	held[0].Release() // a holds 2, b holds 1 — but only a waits
	if a := <-aDone; a.Turn.OthersFirst != 3 {
		t.Fatalf("a's waiter: %+v, want 3 of b's first", a.Turn)
	}
}
