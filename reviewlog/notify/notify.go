// Package notify tells a human that a review is waiting (or was decided):
// it runs an operator's command, or POSTs a signed JSON body to an opt-in
// webhook. The decision engine calls Notify after it has answered; Notify
// only validates and enqueues, so a slow, failing or hostile receiver never
// changes or delays an answer.
//
// Every sink has a bounded queue and a few workers. A message that does not
// fit is dropped, counted and logged. Each (review, event) pair is delivered
// at most once per process: a second Notify for it is ignored.
package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
)

// Events.
const (
	EventOpened  = "review.opened"
	EventDecided = "review.decided"
	// EventSettlementFinding: a settlement was recorded whose seller's
	// answer, signed receipt or Trace event disagrees with the
	// authorization it settles (or the seller's signed offer).
	EventSettlementFinding = "settlement.finding"
)

// Defaults of Options.
const (
	DefaultQueueSize   = 256
	DefaultWorkers     = 2
	DefaultTimeout     = 10 * time.Second
	DefaultAttempts    = 5
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 30 * time.Second
)

// Bounds.
const (
	maxReviewIDBytes = 128
	maxBodyBytes     = 1 << 20
	dedupeCapacity   = 1 << 16
	maxTextField     = 120 // runes of one agent-supplied field in Text
)

// Message is one notification.
type Message struct {
	// Event is EventOpened or EventDecided.
	Event string
	// ReviewID names the review; with Event it is the key of the
	// once-per-process rule. 1 to 128 bytes of [A-Za-z0-9._:-].
	ReviewID string
	// Review is the review's JSON object, sent as it is.
	Review json.RawMessage
	// ReviewURL is the reviewer console's page of the review ("" when no
	// console serves): a hook reads it in HAIA_REVIEW_URL, and Text ends
	// with it. NewMessage takes it from the review's "review_url" when
	// that is an absolute http(s) URL.
	ReviewURL string
	// Text is a one-line human summary (the "text" field, which a
	// Slack-style incoming webhook shows). When empty it is made from
	// Review, escaped and clipped; a Text given here is sent as it is.
	Text string
}

// Notifier takes notifications. Notify never blocks beyond an enqueue and
// never fails: problems are logged and counted. Call it once the review's
// line is in the log (after OpenReview or DecideReview returned, not from
// inside their hook), so that nobody is told of a review that was not
// recorded.
type Notifier interface {
	Notify(Message)
}

// Options tune a sink. The zero value is usable.
type Options struct {
	// Logger receives failures and drops; slog.Default() when nil.
	Logger *slog.Logger
	// Metrics counts deliveries; a private, unregistered set when nil.
	Metrics *Metrics
	// QueueSize bounds the messages waiting per sink (DefaultQueueSize when 0).
	QueueSize int
	// Workers deliver concurrently per sink (DefaultWorkers when 0).
	Workers int
	// Timeout bounds one command run or one HTTP request (DefaultTimeout when 0).
	Timeout time.Duration
	// Attempts bounds the webhook's tries per message (DefaultAttempts when 0).
	Attempts int
	// BackoffBase and BackoffMax shape the webhook's exponential backoff
	// with jitter between tries (DefaultBackoffBase, DefaultBackoffMax when 0).
	BackoffBase, BackoffMax time.Duration
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Attempts <= 0 {
		o.Attempts = DefaultAttempts
	}
	if o.BackoffBase <= 0 {
		o.BackoffBase = DefaultBackoffBase
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.BackoffMax < o.BackoffBase {
		o.BackoffMax = o.BackoffBase
	}
	return o
}

// NewMessage makes the message for event about a review, which must marshal
// to a JSON object holding at least "review_id". Text is made from the
// review's counterparty, amount, asset, reasons and decision.
func NewMessage(event string, review any) (Message, error) {
	raw, err := json.Marshal(review)
	if err != nil {
		return Message{}, fmt.Errorf("notify: encode the review: %w", err)
	}
	var s summary
	if err := json.Unmarshal(raw, &s); err != nil {
		return Message{}, fmt.Errorf("notify: the review is not a JSON object: %w", err)
	}
	m := Message{Event: event, ReviewID: s.ID, Review: raw}
	if consoleLink(s.ReviewURL) {
		m.ReviewURL = s.ReviewURL
	}
	if err := m.check(); err != nil {
		return Message{}, err
	}
	m.Text = s.text(event)
	return m, nil
}

// maxURLBytes bounds a review's console link.
const maxURLBytes = 2048

// consoleLink says whether u is a link a human may be shown and a hook
// given: an absolute http(s) URL with a host, of printable ASCII only (no
// space, control, bidi or invisible character can ride in it).
func consoleLink(u string) bool {
	if u == "" || len(u) > maxURLBytes {
		return false
	}
	for i := 0; i < len(u); i++ {
		if u[i] <= ' ' || u[i] >= 0x7f || u[i] == '<' || u[i] == '>' || u[i] == '|' {
			return false
		}
	}
	p, err := url.Parse(u)
	return err == nil && (p.Scheme == "http" || p.Scheme == "https") && p.Host != "" && p.User == nil
}

// summary is what Text is made of: the review's terms as the server
// signed them ("terms") where the review carries them, else its own
// fields, and whether an unsigned record disagrees with them ("tampered").
type summary struct {
	ID           string `json:"review_id"`
	ReviewURL    string `json:"review_url"`
	Status       string `json:"status"`
	Counterparty string `json:"counterparty"`
	Amount       string `json:"amount"`
	Asset        string `json:"asset"`
	AssetSymbol  string `json:"asset_symbol"`
	Caller       string `json:"caller"`
	Tenant       string `json:"tenant"`
	Resource     string `json:"resource"`
	DecidedBy    string `json:"decided_by"`
	Tampered     bool   `json:"tampered"`
	TermsReceipt string `json:"terms_receipt"`
	Terms        *struct {
		Caller       string `json:"caller"`
		Tenant       string `json:"tenant"`
		Counterparty string `json:"counterparty"`
		Amount       string `json:"amount"`
		Asset        string `json:"asset"`
		Resource     string `json:"resource"`
	} `json:"terms"`
	Reasons []struct {
		Rule string `json:"rule"`
	} `json:"reasons"`
}

func (s summary) text(event string) string {
	if t := s.Terms; t != nil {
		s.Caller, s.Tenant, s.Counterparty, s.Amount, s.Resource = t.Caller, t.Tenant, t.Counterparty, t.Amount, t.Resource
		if t.Asset != s.Asset {
			s.AssetSymbol = ""
		}
		s.Asset = t.Asset
	}
	asset := field(s.Asset)
	if s.AssetSymbol != "" {
		asset = field(s.AssetSymbol) + " (" + field(s.Asset) + ")"
	}
	what := fmt.Sprintf("%s %s to %s", field(s.Amount), asset, field(s.Counterparty))
	if s.Resource != "" {
		what += " for " + field(s.Resource)
	}
	if s.Caller != "" {
		who := s.Caller
		if s.Tenant != "" {
			who = s.Tenant + "/" + s.Caller
		}
		what += ", asked by " + field(who)
	}
	warn := ""
	switch {
	case s.Tampered:
		warn = "TAMPERED — the review log disagrees with what was signed; do not decide on this text. "
	case s.Terms != nil && s.TermsReceipt == "":
		warn = "UNSIGNED — no receipt of the server signs these terms. "
	}
	if event == EventDecided {
		by := ""
		if s.DecidedBy != "" {
			by = " by " + field(s.DecidedBy)
		}
		return fmt.Sprintf("%sPayment review %s was %s%s: %s.%s", warn, field(s.ID), field(s.Status), by, what, s.link())
	}
	var rules []string
	for _, r := range s.Reasons {
		if r.Rule != "" && r.Rule != "history" {
			rules = append(rules, field(r.Rule))
		}
	}
	why := ""
	if len(rules) > 0 {
		why = " (" + strings.Join(rules, ", ") + ")"
	}
	if s.link() != "" {
		return fmt.Sprintf("%sPayment review %s is waiting: %s%s. Decide at %s or with: haia-trace-mcp review show %s", warn, field(s.ID), what, why, s.ReviewURL, field(s.ID))
	}
	return fmt.Sprintf("%sPayment review %s is waiting: %s%s. Decide with: haia-trace-mcp review show %s", warn, field(s.ID), what, why, field(s.ID))
}

// link is " <review_url>" when the review has a console link to show.
func (s summary) link() string {
	if !consoleLink(s.ReviewURL) {
		return ""
	}
	return " " + s.ReviewURL
}

// field makes an agent-supplied string safe for a terminal and for Slack's
// mrkdwn: invisible and control characters escaped, <, > and & as
// entities (so "<!channel>" or a disguised link stays text), and clipped.
func field(s string) string {
	if s == "" {
		return `""`
	}
	s = termsafe.String(s)
	if utf8.RuneCountInString(s) > maxTextField {
		s = string([]rune(s)[:maxTextField]) + "…"
	}
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// check validates what Notify is given.
func (m Message) check() error {
	if m.Event != EventOpened && m.Event != EventDecided && m.Event != EventSettlementFinding {
		return fmt.Errorf("notify: event %q is none of %s, %s and %s", clip(m.Event), EventOpened, EventDecided, EventSettlementFinding)
	}
	if m.ReviewID == "" || len(m.ReviewID) > maxReviewIDBytes {
		return fmt.Errorf("notify: the review id must be 1 to %d bytes, got %d", maxReviewIDBytes, len(m.ReviewID))
	}
	for i := 0; i < len(m.ReviewID); i++ {
		c := m.ReviewID[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return fmt.Errorf("notify: the review id %q holds %q; only letters, digits and - _ . : are accepted", clip(m.ReviewID), c)
		}
	}
	if len(m.Review) == 0 || !json.Valid(m.Review) || strings.TrimSpace(string(m.Review))[0] != '{' {
		return errors.New("notify: the review is not a JSON object")
	}
	if m.ReviewURL != "" && !consoleLink(m.ReviewURL) {
		return fmt.Errorf("notify: the review's link %q is not an absolute http(s) URL of printable characters", clip(m.ReviewURL))
	}
	return nil
}

func clip(s string) string {
	s = termsafe.String(s)
	if utf8.RuneCountInString(s) > 64 {
		return string([]rune(s)[:64]) + "…"
	}
	return s
}

// body is what a command reads on stdin and the webhook POSTs.
type body struct {
	Event  string          `json:"event"`
	Review json.RawMessage `json:"review"`
	Text   string          `json:"text"`
}

// prepare validates m, fills in Text and encodes the body.
func prepare(m Message) (Message, []byte, error) {
	if err := m.check(); err != nil {
		return m, nil, err
	}
	if m.Text == "" {
		var s summary
		if err := json.Unmarshal(m.Review, &s); err != nil {
			return m, nil, fmt.Errorf("notify: read the review: %w", err)
		}
		if s.ID == "" {
			s.ID = m.ReviewID
		}
		if m.ReviewURL == "" && consoleLink(s.ReviewURL) {
			m.ReviewURL = s.ReviewURL
		}
		m.Text = s.text(m.Event)
	}
	b, err := json.Marshal(body{Event: m.Event, Review: m.Review, Text: m.Text})
	if err != nil {
		return m, nil, fmt.Errorf("notify: encode the body: %w", err)
	}
	if len(b) > maxBodyBytes {
		return m, nil, fmt.Errorf("notify: the body is %d bytes; at most %d are sent", len(b), maxBodyBytes)
	}
	return m, b, nil
}

// job is one queued delivery.
type job struct {
	msg  Message
	body []byte
}

// queue is the machinery every sink shares: validation, the
// once-per-process rule, a bounded queue, workers and a drain on Close.
type queue struct {
	sink    string
	logger  *slog.Logger
	counts  *counts
	deliver func(ctx context.Context, j job) error

	mu     sync.Mutex
	closed bool
	ch     chan job
	seen   *seenSet

	wg     sync.WaitGroup
	ctx    context.Context // cancelled when Close gives up waiting
	cancel context.CancelFunc
	done   chan struct{}
}

func newQueue(sink string, o Options, deliver func(ctx context.Context, j job) error) *queue {
	ctx, cancel := context.WithCancel(context.Background())
	q := &queue{sink: sink, logger: o.Logger.With("sink", sink), counts: o.Metrics.sink(sink), deliver: deliver,
		ch: make(chan job, o.QueueSize), seen: newSeenSet(dedupeCapacity), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	q.wg.Add(o.Workers)
	for range o.Workers {
		go q.work()
	}
	go func() { q.wg.Wait(); close(q.done) }()
	return q
}

// Notify validates and enqueues m; it never blocks on delivery.
func (q *queue) Notify(m Message) {
	m, b, err := prepare(m)
	if err != nil {
		q.counts.failed.Add(1)
		q.logger.Warn("notification refused", "err", err)
		return
	}
	key := m.Event + "\x00" + m.ReviewID
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		q.counts.dropped.Add(1)
		q.logger.Warn("notification dropped: shutting down", "event", m.Event, "review_id", m.ReviewID)
	case q.seen.has(key):
		q.logger.Debug("notification already sent by this process", "event", m.Event, "review_id", m.ReviewID)
	default:
		select {
		case q.ch <- job{msg: m, body: b}:
			q.seen.add(key)
		default:
			q.counts.dropped.Add(1)
			q.logger.Warn("notification dropped: the queue is full", "event", m.Event, "review_id", m.ReviewID, "queue", cap(q.ch))
		}
	}
}

func (q *queue) work() {
	defer q.wg.Done()
	for j := range q.ch {
		if q.ctx.Err() != nil {
			q.counts.dropped.Add(1)
			q.logger.Warn("notification dropped: shut down before it was delivered", "event", j.msg.Event, "review_id", j.msg.ReviewID)
			continue
		}
		if err := q.deliver(q.ctx, j); err != nil {
			q.counts.failed.Add(1)
			q.logger.Warn("notification failed", "event", j.msg.Event, "review_id", j.msg.ReviewID, "err", err)
			continue
		}
		q.counts.sent.Add(1)
		q.logger.Debug("notification delivered", "event", j.msg.Event, "review_id", j.msg.ReviewID)
	}
}

// Close stops taking messages and waits for the queued ones to be
// delivered. When ctx ends first, deliveries in flight are aborted (a
// command is killed), the rest are dropped and counted, and ctx's error is
// returned. Close may be called more than once.
func (q *queue) Close(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
	q.mu.Unlock()
	select {
	case <-q.done:
		q.cancel()
		return nil
	case <-ctx.Done():
	}
	left := len(q.ch)
	q.cancel()
	<-q.done
	return fmt.Errorf("notify %s: shutdown did not wait for every delivery (%d still queued were dropped): %w", q.sink, left, ctx.Err())
}

// seenSet remembers the most recent keys, up to a bound.
type seenSet struct {
	keys map[string]struct{}
	ring []string
	next int
}

func newSeenSet(n int) *seenSet {
	return &seenSet{keys: make(map[string]struct{}), ring: make([]string, n)}
}

func (s *seenSet) has(k string) bool { _, ok := s.keys[k]; return ok }

func (s *seenSet) add(k string) {
	if old := s.ring[s.next]; old != "" {
		delete(s.keys, old)
	}
	s.ring[s.next] = k
	s.keys[k] = struct{}{}
	s.next = (s.next + 1) % len(s.ring)
}

// Group sends every message to each of its members.
type Group struct {
	members []Notifier
}

// Multi combines notifiers; nil ones are left out. An empty group does
// nothing, so a caller can always notify.
func Multi(ns ...Notifier) *Group {
	g := &Group{}
	for _, n := range ns {
		if n != nil {
			g.members = append(g.members, n)
		}
	}
	return g
}

// Notify passes m to every member.
func (g *Group) Notify(m Message) {
	for _, n := range g.members {
		n.Notify(m)
	}
}

// Len is the number of members.
func (g *Group) Len() int { return len(g.members) }

// Close drains every member that can be closed, all within ctx.
func (g *Group) Close(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(g.members))
	for i, n := range g.members {
		c, ok := n.(interface{ Close(context.Context) error })
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Close(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
