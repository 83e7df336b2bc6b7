package server

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/fairq"
)

// Defaults of the tenants' fair share; all are stated in docs/http.md.
const (
	DefaultFairQueue = 128
	DefaultFairWait  = 10 * time.Second
)

// DefaultFairSlots is the process's decision slots: four times the cores
// Go runs on, since a decision spends most of its time waiting for its
// store (a quarter or less of it on a core), and the cores must stay busy.
func DefaultFairSlots() int { return 4 * runtime.GOMAXPROCS(0) }

// FairShare shares the process's decision slots between tenants: at most
// Slots requests of all tenants run at once, at most PerTenant of one
// tenant, and a freed slot goes to the waiting tenant holding the fewest,
// among equals in turn. A request
// waits at most Wait, behind at most Queue of its tenant's; past either it
// is answered 429 naming the bound. Zero fields take the defaults
// (PerTenant: Slots, so a tenant alone uses the whole process).
type FairShare struct {
	Slots, PerTenant, Queue int
	Wait                    time.Duration
	// Now and After are the clock (nil: the wall clock).
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
}

// fairShare is the admission step of /mcp with tenants.
type fairShare struct {
	q    *fairq.Queue
	wait prometheus.Histogram
}

func newFairShare(cfg FairShare, tenants []string, reg prometheus.Registerer) (*fairShare, error) {
	if cfg.Slots == 0 {
		cfg.Slots = DefaultFairSlots()
	}
	if cfg.PerTenant == 0 {
		cfg.PerTenant = cfg.Slots
	}
	if cfg.Queue == 0 {
		cfg.Queue = DefaultFairQueue
	}
	if cfg.Wait == 0 {
		cfg.Wait = DefaultFairWait
	}
	q, err := fairq.New(tenants, fairq.Config{Slots: cfg.Slots, PerTenant: cfg.PerTenant, Queue: cfg.Queue, Wait: cfg.Wait, Now: cfg.Now, After: cfg.After})
	if err != nil {
		return nil, fmt.Errorf("tenants' fair share: %w", err)
	}
	f := &fairShare{q: q, wait: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "haia_fair_wait_seconds", Help: "Time a request of a tenant waited for a decision slot (admitted ones).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})}
	stat := func(read func(fairq.Stats) float64) func() float64 {
		return func() float64 { return read(q.Stats()) }
	}
	cs := []prometheus.Collector{f.wait,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "haia_fair_admitted_total", Help: "Requests of tenants admitted to a decision slot, by whether they waited.",
			ConstLabels: prometheus.Labels{"wait": "none"}}, stat(func(s fairq.Stats) float64 { return float64(s.Immediate) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "haia_fair_admitted_total", Help: "Requests of tenants admitted to a decision slot, by whether they waited.",
			ConstLabels: prometheus.Labels{"wait": "queued"}}, stat(func(s fairq.Stats) float64 { return float64(s.Queued) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "haia_fair_refused_total", Help: "Requests of tenants refused with 429, by the bound (queue: the tenant's queue was full; wait: no slot in time).",
			ConstLabels: prometheus.Labels{"bound": "queue"}}, stat(func(s fairq.Stats) float64 { return float64(s.RefusedQueue) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "haia_fair_refused_total", Help: "Requests of tenants refused with 429, by the bound (queue: the tenant's queue was full; wait: no slot in time).",
			ConstLabels: prometheus.Labels{"bound": "wait"}}, stat(func(s fairq.Stats) float64 { return float64(s.RefusedWait) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "haia_fair_abandoned_total", Help: "Requests of tenants whose client went away while they waited for a slot."},
			stat(func(s fairq.Stats) float64 { return float64(s.Cancelled) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "haia_fair_in_flight", Help: "Decision slots held."},
			stat(func(s fairq.Stats) float64 { return float64(s.InFlight) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "haia_fair_waiting", Help: "Requests of tenants waiting for a decision slot."},
			stat(func(s fairq.Stats) float64 { return float64(s.Waiting) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "haia_fair_slots", Help: "The process's decision slots (--tenant-slots)."},
			stat(func(s fairq.Stats) float64 { return float64(s.Slots) })),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("tenants' fair share: metrics: %w", err)
		}
	}
	return f, nil
}

// tenantNames are the names of a tenants map, sorted.
func tenantNames(tenants map[string]*Server) []string { return slices.Sorted(maps.Keys(tenants)) }

// admit runs next in a decision slot of the request's tenant. A token
// naming no tenant of this server goes straight to the mux, which refuses
// it (403): a slot is never taken for it, nor a queue made.
func (f *fairShare) admit(w http.ResponseWriter, r *http.Request, next http.Handler, logger *slog.Logger) {
	id, _ := auth.IdentityFrom(r.Context())
	tk, err := f.q.Acquire(r.Context(), id.Tenant)
	if errors.Is(err, fairq.ErrUnknownTenant) {
		next.ServeHTTP(w, r)
		return
	}
	if n, ok := r.Context().Value(reqNoteKey{}).(*reqNote); ok {
		n.tenant = id.Tenant
		if tk != nil {
			n.turn = &tk.Turn
		}
	}
	var refused *fairq.Refusal
	switch {
	case errors.As(err, &refused):
		w.Header().Set("Retry-After", "1")
		writeSessionError(w, http.StatusTooManyRequests, auth.RateLimitCode, refused.Error())
		return
	case err != nil:
		// The client went away while it waited: nobody reads an answer.
		logger.DebugContext(r.Context(), "a request left the tenant's queue unanswered", "tenant", id.Tenant, "err", err)
		return
	}
	defer tk.Release()
	f.wait.Observe(tk.Turn.Waited.Seconds())
	next.ServeHTTP(w, r)
}
