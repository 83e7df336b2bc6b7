package notify

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var testSecret = []byte("a shared secret")

// receiver is a loopback webhook endpoint that checks every request as a
// real receiver would.
type receiver struct {
	t      *testing.T
	mu     sync.Mutex
	seen   map[string]int
	bodies []delivered
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		rc.t.Errorf("read body: %v", err)
		return
	}
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
		rc.t.Errorf("%s with Content-Type %q", r.Method, r.Header.Get("Content-Type"))
	}
	if got := r.Header.Get(SignatureHeader); !hmac.Equal([]byte(got), []byte(Sign(testSecret, body))) {
		rc.t.Errorf("signature %q does not match the body", got)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var d delivered
	if err := json.Unmarshal(body, &d); err != nil {
		rc.t.Errorf("body is not JSON: %v", err)
	}
	if r.Header.Get("X-Haia-Event") != d.Event {
		rc.t.Errorf("X-Haia-Event %q, body event %q", r.Header.Get("X-Haia-Event"), d.Event)
	}
	rc.mu.Lock()
	rc.seen[d.Event+" "+d.Review.ID]++
	rc.bodies = append(rc.bodies, d)
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func TestSignKnownVector(t *testing.T) {
	// RFC 4231, test case 2.
	got := Sign([]byte("Jefe"), []byte("what do ya want for nothing?"))
	if want := "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"; got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestWebhookDeliversEachOnceSigned(t *testing.T) {
	rc := &receiver{t: t, seen: map[string]int{}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	logger, logs := testLogger()
	m := NewMetrics()
	w, err := NewWebhook(srv.URL+"/hooks/T000/B000/XXXX", testSecret, Options{Logger: logger, Metrics: m, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		w.Notify(message(t, EventOpened, i))
		w.Notify(message(t, EventOpened, i))
		w.Notify(message(t, EventDecided, i))
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(rc.seen) != 2*n {
		t.Errorf("receiver saw %d distinct messages, want %d", len(rc.seen), 2*n)
	}
	for k, v := range rc.seen {
		if v != 1 {
			t.Errorf("%s received %d times", k, v)
		}
	}
	for _, d := range rc.bodies {
		if d.Review.Counterparty == "" || !strings.Contains(d.Text, d.Review.ID) {
			t.Errorf("body %+v", d)
		}
	}
	if got := m.Snapshot(SinkWebhook); got.Sent != 2*n || got.Failed != 0 || got.Dropped != 0 || got.Retried != 0 {
		t.Errorf("counts = %+v; log:\n%s", got, logs)
	}
	if strings.Contains(logs.String(), "XXXX") {
		t.Errorf("the URL's secret path reached the log:\n%s", logs)
	}
}

// TestWebhookFailingReceiver: 500s, then a hang. Each message is tried a
// bounded number of times, Notify keeps returning at once, and what does
// not fit the queue is counted.
func TestWebhookFailingReceiver(t *testing.T) {
	var calls atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		select { // hang
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	logger, logs := testLogger()
	m := NewMetrics()
	w, err := NewWebhook(srv.URL+"/secret-path", testSecret, Options{Logger: logger, Metrics: m, Workers: 1, QueueSize: 1,
		Attempts: 3, BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w.Notify(message(t, EventOpened, 0))
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := calls.Load(); c != 3 {
		t.Errorf("receiver called %d times, want 3 (the bound)", c)
	}
	got := m.Snapshot(SinkWebhook)
	if got.Sent != 0 || got.Failed != 1 || got.Retried != 2 {
		t.Errorf("counts = %+v", got)
	}
	if !strings.Contains(logs.String(), "no answer within 100ms (attempt 3 of at most 3)") {
		t.Errorf("log:\n%s", logs)
	}
	if strings.Contains(logs.String(), "secret-path") {
		t.Errorf("the URL path reached the log:\n%s", logs)
	}
}

func TestWebhookQueueOverflowCounted(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	logger, logs := testLogger()
	m := NewMetrics()
	w, err := NewWebhook(srv.URL, testSecret, Options{Logger: logger, Metrics: m, Workers: 1, QueueSize: 2, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	w.Notify(message(t, EventOpened, 0))
	<-started // the only worker is stuck in a request
	const n = 50
	for i := 1; i <= n; i++ {
		w.Notify(message(t, EventOpened, i)) // returns at once though nothing is delivered
	}
	if got := m.Snapshot(SinkWebhook); got.Dropped != n-2 {
		t.Errorf("dropped %d, want %d (the queue holds 2)", got.Dropped, n-2)
	}
	if !strings.Contains(logs.String(), "the queue is full") {
		t.Errorf("log:\n%s", logs)
	}
	// A dropped message may be offered again: it was never sent.
	w.Notify(message(t, EventOpened, n))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Close(ctx); err == nil {
		t.Error("Close with an ended context and a stuck request returned nil")
	}
	got := m.Snapshot(SinkWebhook)
	if total := got.Sent + got.Failed + got.Dropped; got.Sent != 0 || total != n+2 {
		t.Errorf("counts = %+v; want all %d accounted for", got, n+2)
	}
}

func TestWebhookAnswers(t *testing.T) {
	tests := []struct {
		name      string
		handler   func(calls int64, w http.ResponseWriter, r *http.Request)
		wantCalls int64
		want      Counts
		wantLog   string
	}{
		{
			name: "429 with Retry-After, then accepted",
			handler: func(calls int64, w http.ResponseWriter, r *http.Request) {
				if calls == 1 {
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				w.WriteHeader(http.StatusOK)
			},
			wantCalls: 2, want: Counts{Sent: 1, Retried: 1},
		},
		{
			name: "503 until the attempts run out",
			handler: func(calls int64, w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
			},
			wantCalls: 4, want: Counts{Failed: 1, Retried: 3}, wantLog: "503 Service Unavailable (attempt 4 of at most 4)",
		},
		{
			name: "400 is final",
			handler: func(calls int64, w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusBadRequest)
			},
			wantCalls: 1, want: Counts{Failed: 1}, wantLog: "400 Bad Request, which is not retried",
		},
		{
			name: "a redirect is not followed",
			handler: func(calls int64, w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/elsewhere" {
					w.WriteHeader(http.StatusOK)
					return
				}
				http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
			},
			wantCalls: 1, want: Counts{Failed: 1}, wantLog: "redirects are not followed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tt.handler(calls.Add(1), w, r)
			}))
			defer srv.Close()
			logger, logs := testLogger()
			m := NewMetrics()
			w, err := NewWebhook(srv.URL+"/hook", testSecret, Options{Logger: logger, Metrics: m, Attempts: 4,
				BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			w.Notify(message(t, EventOpened, 1))
			if err := w.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if c := calls.Load(); c != tt.wantCalls {
				t.Errorf("%d calls, want %d", c, tt.wantCalls)
			}
			if got := m.Snapshot(SinkWebhook); got != tt.want {
				t.Errorf("counts = %+v, want %+v", got, tt.want)
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Errorf("log lacks %q:\n%s", tt.wantLog, logs)
			}
		})
	}
}

func TestWebhookNetworkErrorRetried(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	logger, logs := testLogger()
	m := NewMetrics()
	w, err := NewWebhook(url+"/p4th-s3cret", testSecret, Options{Logger: logger, Metrics: m, Attempts: 3,
		BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w.Notify(message(t, EventOpened, 1))
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := m.Snapshot(SinkWebhook); got.Failed != 1 || got.Retried != 2 {
		t.Errorf("counts = %+v", got)
	}
	if !strings.Contains(logs.String(), "connection refused") || strings.Contains(logs.String(), "p4th-s3cret") {
		t.Errorf("log:\n%s", logs)
	}
}

func TestNewWebhookRefuses(t *testing.T) {
	tests := []struct {
		name, url string
		secret    []byte
		want      string
	}{
		{"ftp", "ftp://example.com/x", testSecret, "must start with http:// or https://"},
		{"no scheme", "example.com/hook", testSecret, "must start with http:// or https://"},
		{"file", "file:///etc/passwd", testSecret, "must start with http:// or https://"},
		{"no host", "https:///hook", testSecret, "has no host"},
		{"fragment", "https://example.com/hook#x", testSecret, "#fragment"},
		{"unparseable, secret not echoed", "https://example.com/s3cr3t\x7f", testSecret, "not a valid URL (not shown"},
		{"empty secret", "https://example.com/hook", nil, "secret is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := NewWebhook(tt.url, tt.secret, Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "s3cr3t") {
				if w != nil {
					_ = w.Close(context.Background())
				}
				t.Fatalf("NewWebhook(%q) = %v; want %q", tt.url, err, tt.want)
			}
		})
	}
}

func TestWebhookWarnsOnPlainHTTP(t *testing.T) {
	tests := []struct {
		url  string
		warn bool
	}{
		{"http://chat.example.com/hook", true},
		{"http://127.0.0.1:9/hook", false},
		{"http://[::1]:9/hook", false},
		{"http://localhost:9/hook", false},
		{"https://chat.example.com/hook", false},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			logger, logs := testLogger()
			w, err := NewWebhook(tt.url, testSecret, Options{Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close(context.Background())
			if got := strings.Contains(logs.String(), "plain http"); got != tt.warn {
				t.Errorf("warned %v, want %v:\n%s", got, tt.warn, logs)
			}
			if strings.Contains(logs.String(), "/hook") || strings.Contains(w.URL(), "/hook") {
				t.Errorf("path shown: %s %s", w.URL(), logs)
			}
		})
	}
}

func TestBackoffAndRetryAfter(t *testing.T) {
	w := &Webhook{base: 100 * time.Millisecond, max: time.Second}
	for attempt, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 40: time.Second} {
		for range 50 {
			if d := w.backoff(attempt); d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %s, want within [%s, %s]", attempt, d, want/2, want)
			}
		}
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0}, {"7", 7 * time.Second}, {"-1", 0}, {"soon", 0}, {"99999999", 86400 * time.Second},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second},
		{now.Add(-30 * time.Second).Format(http.TimeFormat), 0},
	}
	for _, tt := range tests {
		if got := retryAfter(tt.in, now); got != tt.want {
			t.Errorf("retryAfter(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// A receiver recomputes the signature over the bytes it read, before it
// parses them, and compares in constant time.
func ExampleSign() {
	body := []byte(`{"event":"review.opened","review":{"review_id":"r-1"},"text":"x"}`)
	header := Sign([]byte("secret"), body) // what the sender put in X-Haia-Signature
	fmt.Println(hmac.Equal([]byte(header), []byte(Sign([]byte("secret"), body))))
	fmt.Println(hmac.Equal([]byte(header), []byte(Sign([]byte("guess"), body))))
	// Output:
	// true
	// false
}
