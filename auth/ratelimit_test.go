package auth

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newLimiter(t *testing.T, perSec float64, burst, callers int, clk *fakeClock) *RateLimiter {
	t.Helper()
	l, err := NewRateLimiter(RateConfig{PerSecond: perSec, Burst: burst, MaxCallers: callers, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestRateLimiterPerCaller(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)}
	l := newLimiter(t, 2, 3, 0, clk)
	steps := []struct {
		key     string
		advance time.Duration
		ok      bool
		wait    time.Duration
	}{
		{"a", 0, true, 0},
		{"a", 0, true, 0},
		{"a", 0, true, 0},
		{"a", 0, false, 500 * time.Millisecond}, // bucket empty; one token per 500 ms
		{"b", 0, true, 0},                       // another caller is served
		{"a", 100 * time.Millisecond, false, 400 * time.Millisecond},
		{"a", 400 * time.Millisecond, true, 0},
		{"a", 0, false, 500 * time.Millisecond},
	}
	for i, s := range steps {
		clk.t = clk.t.Add(s.advance)
		ok, wait := l.Allow(s.key)
		if ok != s.ok || wait != s.wait {
			t.Fatalf("step %d (%s): ok=%v wait=%s, want ok=%v wait=%s", i, s.key, ok, wait, s.ok, s.wait)
		}
	}
}

func TestRateLimiterTableBounded(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)}
	l := newLimiter(t, 1, 2, 10, clk)
	for i := range 1000 {
		l.Allow(fmt.Sprintf("caller-%d", i))
	}
	if n := l.Callers(); n != 10 {
		t.Fatalf("%d buckets after 1000 callers, want the bound 10", n)
	}
	// Buckets that have refilled (2 s at 1/s for a burst of 2) are dropped
	// when the next caller arrives.
	clk.t = clk.t.Add(2 * time.Second)
	l.Allow("late")
	if n := l.Callers(); n != 1 {
		t.Fatalf("%d buckets after the others went idle, want 1", n)
	}
	// The least recently seen caller loses its bucket, never the newest.
	l2 := newLimiter(t, 1, 1, 2, clk)
	l2.Allow("x")
	l2.Allow("y")
	l2.Allow("z") // evicts x
	if ok, _ := l2.Allow("z"); ok {
		t.Fatal("z's bucket was reset by the eviction")
	}
}

func TestRateLimiterConfig(t *testing.T) {
	for _, c := range []RateConfig{{PerSecond: 0, Burst: 1}, {PerSecond: -1, Burst: 1}, {PerSecond: 1, Burst: 0}, {PerSecond: 1, Burst: 1, MaxCallers: -1}} {
		if _, err := NewRateLimiter(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestRateLimitMiddleware(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)}
	limited := 0
	l, err := NewRateLimiter(RateConfig{PerSecond: 0.25, Burst: 1, Now: clk.now, OnLimited: func() { limited++ }})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("served")) }))
	call := func(sub, remote string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(listBody))
		req.RemoteAddr = remote
		if sub != "" {
			req = req.WithContext(WithIdentity(req.Context(), Identity{Subject: sub}))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	tests := []struct {
		name, sub, remote string
		status            int
		retryAfter        string
	}{
		{"first call of agent-1", "agent-1", "10.0.0.1:1000", 200, ""},
		{"agent-1 again", "agent-1", "10.0.0.1:1001", 429, "4"},
		{"agent-1 from another address", "agent-1", "10.0.0.9:1000", 429, "4"},
		{"agent-2 from the same address", "agent-2", "10.0.0.1:1000", 200, ""},
		{"no identity: keyed by address", "", "10.0.0.1:2000", 200, ""},
		{"no identity, same address", "", "10.0.0.1:2001", 429, "4"},
		{"no identity, another address", "", "10.0.0.2:2000", 200, ""},
	}
	for _, tc := range tests {
		rec := call(tc.sub, tc.remote)
		if rec.Code != tc.status || rec.Header().Get("Retry-After") != tc.retryAfter {
			t.Fatalf("%s: %d Retry-After %q, want %d %q", tc.name, rec.Code, rec.Header().Get("Retry-After"), tc.status, tc.retryAfter)
		}
		if tc.status != 429 {
			continue
		}
		var body struct {
			JSONRPC string `json:"jsonrpc"`
			ID      any    `json:"id"`
			Error   struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
				Data    struct {
					RetryAfter int `json:"retry_after_seconds"`
				} `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: body %q: %v", tc.name, rec.Body.String(), err)
		}
		if body.JSONRPC != "2.0" || body.ID != nil || body.Error.Code != RateLimitCode || body.Error.Data.RetryAfter != 4 || !strings.Contains(body.Error.Message, "rate limit") {
			t.Fatalf("%s: body %+v", tc.name, body)
		}
	}
	if limited != 3 {
		t.Fatalf("OnLimited called %d times, want 3", limited)
	}
}

// A subject names a caller only within its issuer and tenant: the same
// "sub" under another tenant (or another issuer) has its own bucket, so no
// caller of one tenant can exhaust a caller of another.
func TestRateLimitKeyedByIssuerTenantSubject(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)}
	l, err := NewRateLimiter(RateConfig{PerSecond: 0.25, Burst: 2, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("served")) }))
	call := func(id Identity) int {
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(listBody))
		req.RemoteAddr = "10.0.0.1:1000"
		req = req.WithContext(WithIdentity(req.Context(), id))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	attacker := Identity{Issuer: "https://idp.example", Tenant: "evil", Subject: "bot"}
	// The attacker empties its own bucket.
	for i, want := range []int{200, 200, 429, 429} {
		if got := call(attacker); got != want {
			t.Fatalf("attacker call %d: %d, want %d", i, got, want)
		}
	}
	others := []struct {
		name string
		id   Identity
	}{
		{"same subject, another tenant", Identity{Issuer: "https://idp.example", Tenant: "acme", Subject: "bot"}},
		{"same subject, no tenant", Identity{Issuer: "https://idp.example", Subject: "bot"}},
		{"same subject and tenant, another issuer", Identity{Issuer: "https://other-idp.example", Tenant: "evil", Subject: "bot"}},
		{"a subject spelling another key's parts", Identity{Issuer: "https://idp.example", Tenant: "", Subject: `"evil" "bot"`}},
	}
	for _, o := range others {
		for i := range 2 {
			if got := call(o.id); got != 200 {
				t.Fatalf("%s: call %d got %d, want 200 — the attacker's bucket is shared", o.name, i, got)
			}
		}
	}
	// And the attacker is still limited.
	if got := call(attacker); got != 429 {
		t.Fatalf("attacker after the others: %d, want 429", got)
	}
	if n := l.Callers(); n != 1+4 {
		t.Fatalf("%d buckets, want 5 (one per issuer, tenant and subject)", n)
	}
}

func TestBurstFor(t *testing.T) {
	for _, c := range []struct {
		rate float64
		want int
	}{{0.01, 1}, {0.5, 1}, {1, 1}, {1.2, 2}, {5, 5}, {50, 50}, {99.5, 100}, {1e12, 1 << 30}} {
		if got := BurstFor(c.rate); got != c.want {
			t.Errorf("BurstFor(%v) = %d, want %d", c.rate, got, c.want)
		}
	}
}
