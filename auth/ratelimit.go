package auth

import (
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of the per-caller rate limit; they are stated in docs/http.md.
// The bucket size defaults to the rate (see BurstFor).
const (
	DefaultRateLimit   = 50.0  // requests per second per caller (--rate-limit)
	DefaultRateCallers = 10000 // callers whose buckets are remembered
	maxDefaultBurst    = 1 << 30
)

// BurstFor is the bucket size used when none is given: one second's worth
// of the rate, rounded up (at least 1), so that a caller limited to five
// requests a second can send at most five at once.
func BurstFor(perSecond float64) int {
	if !(perSecond > 1) {
		return 1
	}
	if perSecond >= maxDefaultBurst {
		return maxDefaultBurst
	}
	return int(math.Ceil(perSecond))
}

// RateConfig describes the per-caller token bucket.
type RateConfig struct {
	PerSecond  float64 // refill rate; must be > 0
	Burst      int     // bucket size; must be >= 1
	MaxCallers int     // buckets kept; 0 means DefaultRateCallers
	Now        func() time.Time
	// OnLimited, when set, is called once per refused request.
	OnLimited func()
}

// RateLimiter keeps one token bucket per caller, in a table bounded by
// MaxCallers. A bucket that has refilled completely carries no
// information (a new one would be the same), so those are dropped first;
// when the table is still full, the least recently seen caller's bucket
// is dropped, which can only make that caller's next request cheaper.
type RateLimiter struct {
	cfg    RateConfig
	refill time.Duration // time for an empty bucket to become full

	mu    sync.Mutex
	byKey map[string]*list.Element
	lru   *list.List // of *rateEntry, front = most recently seen
}

type rateEntry struct {
	key  string
	lim  *rate.Limiter
	seen time.Time
}

// NewRateLimiter checks cfg and returns a limiter.
func NewRateLimiter(cfg RateConfig) (*RateLimiter, error) {
	var errs []error
	if !(cfg.PerSecond > 0) || math.IsInf(cfg.PerSecond, 0) {
		errs = append(errs, fmt.Errorf("rate limit %v/s: want a finite number of requests per second above 0", cfg.PerSecond))
	}
	if cfg.Burst < 1 {
		errs = append(errs, fmt.Errorf("rate burst %d: want at least 1", cfg.Burst))
	}
	if cfg.MaxCallers == 0 {
		cfg.MaxCallers = DefaultRateCallers
	}
	if cfg.MaxCallers < 1 {
		errs = append(errs, fmt.Errorf("rate limiter table of %d callers: want at least 1", cfg.MaxCallers))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	refill := time.Duration(float64(cfg.Burst) / cfg.PerSecond * float64(time.Second))
	return &RateLimiter{cfg: cfg, refill: refill, byKey: map[string]*list.Element{}, lru: list.New()}, nil
}

// Allow takes one token from key's bucket. When the bucket is empty it
// returns false and how long until a token is there.
func (l *RateLimiter) Allow(key string) (bool, time.Duration) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var e *rateEntry
	if el, ok := l.byKey[key]; ok {
		e = el.Value.(*rateEntry)
		l.lru.MoveToFront(el)
	} else {
		l.makeRoom(now)
		e = &rateEntry{key: key, lim: rate.NewLimiter(rate.Limit(l.cfg.PerSecond), l.cfg.Burst)}
		l.byKey[key] = l.lru.PushFront(e)
	}
	e.seen = now
	if e.lim.AllowN(now, 1) {
		return true, 0
	}
	r := e.lim.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	r.CancelAt(now)
	return false, wait
}

// makeRoom drops full buckets from the idle end, then, if the table is
// still full, the least recently seen one. Callers hold l.mu.
func (l *RateLimiter) makeRoom(now time.Time) {
	for el := l.lru.Back(); el != nil; {
		e := el.Value.(*rateEntry)
		if now.Sub(e.seen) < l.refill {
			break // everything nearer the front was seen more recently
		}
		prev := el.Prev()
		l.drop(el)
		el = prev
	}
	for len(l.byKey) >= l.cfg.MaxCallers {
		l.drop(l.lru.Back())
	}
}

func (l *RateLimiter) drop(el *list.Element) {
	delete(l.byKey, el.Value.(*rateEntry).key)
	l.lru.Remove(el)
}

// Callers is the number of buckets held, for tests and metrics.
func (l *RateLimiter) Callers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byKey)
}

// CallerKey names the caller of a request: the verified token's issuer,
// tenant and subject together, or with no identity (authentication off) the
// remote IP address. A subject is only unique within its issuer and tenant:
// "bot" of one tenant is not "bot" of another, so neither can empty the
// other's bucket. Each part is quoted, so no subject can spell another
// caller's key.
func CallerKey(r *http.Request) string {
	if id, ok := IdentityFrom(r.Context()); ok && id.Subject != "" {
		return "sub:" + strconv.Quote(id.Issuer) + " " + strconv.Quote(id.Tenant) + " " + strconv.Quote(id.Subject)
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "addr:" + host
}

// RateLimitCode is the JSON-RPC error code of a rate-limited request, in
// the range JSON-RPC 2.0 leaves to servers.
const RateLimitCode = -32029

// Middleware answers 429 Too Many Requests, with Retry-After in whole
// seconds (rounded up, at least 1) and a JSON-RPC error body, to a caller
// whose bucket is empty; other callers are not affected.
func (l *RateLimiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, wait := l.Allow(CallerKey(r))
		if ok {
			next.ServeHTTP(w, r)
			return
		}
		if l.cfg.OnLimited != nil {
			l.cfg.OnLimited()
		}
		secs := int64(math.Ceil(wait.Seconds()))
		if secs < 1 {
			secs = 1
		}
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"jsonrpc": "2.0",
			"id":      nil,
			"error": map[string]any{
				"code":    RateLimitCode,
				"message": "rate limit exceeded: retry after " + strconv.FormatInt(secs, 10) + "s",
				"data":    map[string]any{"retry_after_seconds": secs},
			},
		})
	})
}
