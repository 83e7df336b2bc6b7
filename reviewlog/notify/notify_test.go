package notify

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNewMessageText(t *testing.T) {
	tests := []struct {
		name   string
		event  string
		review testReview
		want   []string
		reject []string
	}{
		{
			name:  "opened",
			event: EventOpened,
			review: testReview{ID: reviewID(1), Status: "pending", Counterparty: "0xb0b", Amount: "1.50", Asset: "usdc",
				Reasons: []struct {
					Rule string `json:"rule"`
				}{{"open_partial"}, {"history"}}},
			want:   []string{"Payment review " + reviewID(1) + " is waiting: 1.50 usdc to 0xb0b (open_partial).", "haia-trace-mcp review show " + reviewID(1)},
			reject: []string{"history"},
		},
		{
			name:   "decided",
			event:  EventDecided,
			review: testReview{ID: reviewID(2), Status: "rejected", DecidedBy: "alice", Counterparty: "0xb0b", Amount: "2", Asset: "usdc"},
			want:   []string{"Payment review " + reviewID(2) + " was rejected by alice: 2 usdc to 0xb0b."},
		},
		{
			name:   "hostile strings are escaped for a terminal and for Slack",
			event:  EventOpened,
			review: testReview{ID: reviewID(3), Counterparty: "<!channel> <https://evil.example|bank> & co\u202e", Amount: "0.01\u200b", Asset: "a\nb"},
			want:   []string{`0.01\u200b a\nb to &lt;!channel&gt; &lt;https://evil.example|bank&gt; &amp; co\u202e`},
			reject: []string{"<", ">", "\u202e", "\u200b", "\n"},
		},
		{
			name:   "a long field is clipped",
			event:  EventOpened,
			review: testReview{ID: reviewID(4), Counterparty: strings.Repeat("x", 500)},
			want:   []string{strings.Repeat("x", maxTextField) + "…"},
			reject: []string{strings.Repeat("x", maxTextField+1)},
		},
		{
			name:   "an empty amount is shown as such",
			event:  EventOpened,
			review: testReview{ID: reviewID(5), Counterparty: "0xb0b", Asset: "usdc"},
			want:   []string{`waiting: "" usdc to 0xb0b.`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMessage(tt.event, tt.review)
			if err != nil {
				t.Fatal(err)
			}
			if m.ReviewID != tt.review.ID || m.Event != tt.event {
				t.Errorf("message = %+v", m)
			}
			for _, w := range tt.want {
				if !strings.Contains(m.Text, w) {
					t.Errorf("text %q lacks %q", m.Text, w)
				}
			}
			for _, r := range tt.reject {
				if strings.Contains(m.Text, r) {
					t.Errorf("text %q holds %q", m.Text, r)
				}
			}
		})
	}
}

func TestMessageRefused(t *testing.T) {
	good := json.RawMessage(`{"review_id":"r-1"}`)
	tests := []struct {
		name string
		msg  Message
		want string
	}{
		{"unknown event", Message{Event: "review.deleted", ReviewID: "r-1", Review: good}, "is none of review.opened, review.decided and settlement.finding"},
		{"empty id", Message{Event: EventOpened, Review: good}, "review id must be 1 to 128 bytes"},
		{"long id", Message{Event: EventOpened, ReviewID: strings.Repeat("a", 129), Review: good}, "review id must be 1 to 128 bytes"},
		{"id with a slash", Message{Event: EventOpened, ReviewID: "../x", Review: good}, `holds '/'`},
		{"id with a newline", Message{Event: EventOpened, ReviewID: "a\nb", Review: good}, `holds '\n'`},
		{"no review", Message{Event: EventOpened, ReviewID: "r-1"}, "not a JSON object"},
		{"review not JSON", Message{Event: EventOpened, ReviewID: "r-1", Review: json.RawMessage(`{`)}, "not a JSON object"},
		{"review an array", Message{Event: EventOpened, ReviewID: "r-1", Review: json.RawMessage(`[1]`)}, "not a JSON object"},
		{"link with a space", Message{Event: EventOpened, ReviewID: "r-1", Review: good, ReviewURL: "https://x.example/a b"}, "not an absolute http(s) URL"},
		{"link not http", Message{Event: EventOpened, ReviewID: "r-1", Review: good, ReviewURL: "javascript:alert(1)"}, "not an absolute http(s) URL"},
		{"link with a bidi control", Message{Event: EventOpened, ReviewID: "r-1", Review: good, ReviewURL: "https://x.example/\u202e"}, "not an absolute http(s) URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := prepare(tt.msg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("prepare: %v; want an error with %q", err, tt.want)
			}
		})
	}
	if _, err := NewMessage(EventOpened, map[string]string{"status": "pending"}); err == nil {
		t.Error("NewMessage accepted a review without review_id")
	}
	if _, err := NewMessage(EventOpened, []int{1}); err == nil {
		t.Error("NewMessage accepted an array")
	}
}

// TestMessageCarriesTheConsoleLink: a review with a console link gives it
// to the hook and the text; a link that is not a plain http(s) URL is
// left out of both.
func TestMessageCarriesTheConsoleLink(t *testing.T) {
	for _, c := range []struct {
		link string
		ok   bool
	}{
		{"http://localhost:8787/console/reviews/r-1", true},
		{"https://reviews.example/console/reviews/r-1", true},
		{"https://reviews.example/console/reviews/r-1\u202e", false},
		{"https://reviews.example/console/reviews/r 1", false},
		{"https://user@reviews.example/console/", false},
		{"ftp://reviews.example/console/reviews/r-1", false},
		{"/console/reviews/r-1", false},
	} {
		for _, ev := range []string{EventOpened, EventDecided} {
			m, err := NewMessage(ev, map[string]string{"review_id": "r-1", "status": "approved", "review_url": c.link, "counterparty": "0xb0b", "amount": "1", "asset": "usdc"})
			if err != nil {
				t.Fatal(err)
			}
			if got := m.ReviewURL == c.link && strings.Contains(m.Text, " "+c.link); got != c.ok || (!c.ok && (m.ReviewURL != "" || strings.Contains(m.Text, "reviews.example"))) {
				t.Errorf("%s with link %q: ReviewURL %q, text %q", ev, c.link, m.ReviewURL, m.Text)
			}
		}
	}
}

func TestMessageTextMadeWhenEmpty(t *testing.T) {
	m, b, err := prepare(Message{Event: EventOpened, ReviewID: "r-1", Review: json.RawMessage(`{"counterparty":"0xb0b","amount":"3","asset":"usdc"}`)})
	if err != nil {
		t.Fatal(err)
	}
	var d delivered
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.Text, "Payment review r-1 is waiting: 3 usdc to 0xb0b") || d.Text != m.Text || d.Event != EventOpened || d.Review.Counterparty != "0xb0b" {
		t.Errorf("text %q, body %s", m.Text, b)
	}
}

func TestSeenSetForgetsTheOldest(t *testing.T) {
	s := newSeenSet(2)
	s.add("a")
	s.add("b")
	s.add("c")
	if s.has("a") || !s.has("b") || !s.has("c") || len(s.keys) != 2 {
		t.Errorf("after a, b, c in a set of 2: %v", s.keys)
	}
}

func TestInvalidMessageCounted(t *testing.T) {
	logger, logs := testLogger()
	m := NewMetrics()
	c, err := NewCommand(writeScript(t, "exit 0"), CommandEnv{}, Options{Logger: logger, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	c.Notify(Message{Event: "bogus", ReviewID: "r-1", Review: json.RawMessage(`{}`)})
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := m.Snapshot(SinkCommand); got.Failed != 1 || got.Sent != 0 {
		t.Errorf("counts = %+v", got)
	}
	if !strings.Contains(logs.String(), "notification refused") {
		t.Errorf("log: %s", logs)
	}
}

func TestNotifyAfterCloseIsDropped(t *testing.T) {
	logger, _ := testLogger()
	m := NewMetrics()
	c, err := NewCommand(writeScript(t, "exit 0"), CommandEnv{}, Options{Logger: logger, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.Notify(message(t, EventOpened, 1))
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if got := m.Snapshot(SinkCommand); got.Dropped != 1 || got.Sent != 0 {
		t.Errorf("counts = %+v", got)
	}
}

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := writeScript(t, "exit 0")
	tests := []struct {
		name    string
		cfg     Config
		members int
		wantErr string
	}{
		{"nothing", Config{}, 0, ""},
		{"command", Config{Command: script}, 1, ""},
		{"both", Config{Command: script, URL: "http://127.0.0.1:9/hook", SecretFile: secret}, 2, ""},
		{"url without secret", Config{URL: "http://127.0.0.1:9/hook"}, 0, "--notify-url needs --notify-secret-file"},
		{"secret without url", Config{SecretFile: secret}, 0, "--notify-secret-file is set but --notify-url is not"},
		{"missing secret", Config{URL: "http://127.0.0.1:9/hook", SecretFile: filepath.Join(dir, "nope")}, 0, "no such file"},
		{"bad url after a good command", Config{Command: script, URL: "ftp://x", SecretFile: secret}, 0, "http:// or https://"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := New(tt.cfg, Options{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New: %v; want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g.Len() != tt.members {
				t.Errorf("%d members, want %d", g.Len(), tt.members)
			}
			if err := g.Close(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, path, want, wantErr string
	}{
		{"trailing newline dropped", write("ok", "s3cret \n"), "s3cret", ""},
		{"inner white space kept", write("inner", "a b\n"), "a b", ""},
		{"empty", write("empty", ""), "", "is empty"},
		{"only white space", write("blank", "\n\n"), "", "is empty"},
		{"too large", write("big", strings.Repeat("x", maxSecretBytes+1)), "", "larger than 64 KiB"},
		{"missing", filepath.Join(dir, "missing"), "", "no such file"},
		{"directory", dir, "", "not a regular file"},
		{"unnamed", "", "", "no webhook secret file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadSecretFile(tt.path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ReadSecretFile: %q, %v; want %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("ReadSecretFile = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestMetricsRegister(t *testing.T) {
	m := NewMetrics()
	m.sink(SinkWebhook).dropped.Add(3)
	m.sink(SinkCommand).sent.Add(2)
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := m.Register(reg); err == nil {
		t.Error("registering twice succeeded")
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			got[f.GetName()+"/"+metric.GetLabel()[0].GetValue()] = metric.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"haia_notify_sent_total/command": 2, "haia_notify_dropped_total/webhook": 3,
		"haia_notify_failed_total/command": 0, "haia_notify_retries_total/webhook": 0,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if len(got) != 8 {
		t.Errorf("%d series, want 8: %v", len(got), got)
	}
}

func TestGroupFansOut(t *testing.T) {
	var a, b recorder
	g := Multi(&a, nil, &b)
	g.Notify(Message{Event: EventOpened, ReviewID: "r"})
	if g.Len() != 2 || len(a.got) != 1 || len(b.got) != 1 {
		t.Errorf("members %d, a %v, b %v", g.Len(), a.got, b.got)
	}
	if err := g.Close(context.Background()); err != nil {
		t.Errorf("Close of members without Close: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g = Multi(closer{err: errors.New("x")}, closer{})
	if err := g.Close(ctx); err == nil || err.Error() != "x" {
		t.Errorf("Close = %v, want the member's error", err)
	}
}

type recorder struct{ got []Message }

func (r *recorder) Notify(m Message) { r.got = append(r.got, m) }

type closer struct{ err error }

func (closer) Notify(Message)                {}
func (c closer) Close(context.Context) error { return c.err }

// The text shows the terms the server signed over the review's own fields,
// names the caller, the resource and the asset's symbol, and starts with
// TAMPERED where an unsigned record disagrees with the signatures.
func TestNewMessageTextFromSignedTerms(t *testing.T) {
	terms := map[string]any{"caller": "agent-1", "tenant": "acme", "counterparty": "0xb0b", "amount": "0.2", "asset": "eip155:8453/0x8335",
		"resource": "https://api.example/x"}
	for _, tc := range []struct {
		name         string
		review       map[string]any
		want, reject []string
	}{
		{"signed", map[string]any{"review_id": "r-1", "amount": "9.99", "counterparty": "0xevil", "asset": "eip155:8453/0x8335", "asset_symbol": "USDC",
			"terms": terms, "terms_receipt": "rcpt_1"},
			[]string{"Payment review r-1 is waiting: 0.2 USDC (eip155:8453/0x8335) to 0xb0b for https://api.example/x, asked by acme/agent-1"},
			[]string{"9.99", "0xevil", "TAMPERED", "UNSIGNED"}},
		{"tampered", map[string]any{"review_id": "r-2", "amount": "0.2", "counterparty": "0xb0b", "asset": "eip155:8453/0x8335", "terms": terms, "tampered": true},
			[]string{"TAMPERED — ", "Payment review r-2 is waiting"}, nil},
		{"unsigned", map[string]any{"review_id": "r-3", "amount": "0.2", "counterparty": "0xb0b", "asset": "eip155:8453/0x8335", "terms": terms},
			[]string{"UNSIGNED — "}, []string{"TAMPERED"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMessage(EventOpened, tc.review)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(m.Text, w) {
					t.Errorf("text %q lacks %q", m.Text, w)
				}
			}
			for _, r := range tc.reject {
				if strings.Contains(m.Text, r) {
					t.Errorf("text %q holds %q", m.Text, r)
				}
			}
		})
	}
}
