package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// The live queue: the queue page opens a server-sent event stream
// (api/events, same origin, the session cookie) and replaces its tables
// with each "queue" event's HTML, and its seller findings with each
// "findings" event's, rendered by the server from the same templates as
// the page. The console reads the review log while someone
// watches: at every wake of Config.Changes (the store's notifications:
// PostgreSQL's NOTIFY) and every PollInterval (the file store has none,
// and a notification can be missed while reconnecting).
const (
	// DefaultPollInterval is how often the log is read while a queue page
	// is open.
	DefaultPollInterval = time.Second
	maxStreams          = 64 // open event streams
	heartbeat           = 15 * time.Second
	streamWriteWait     = 30 * time.Second
)

// feed says when the queue changed: ch is closed (and replaced) at each
// change of sig, the queue's fingerprint.
type feed struct {
	ch       chan struct{}
	sig      string
	watchers int
}

// changed is the channel closed at the queue's next change.
func (c *Console) changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.feed.ch
}

// Run reads the review log for the live queue while a queue page is open,
// until ctx ends; event streams end with it.
func (c *Console) Run(ctx context.Context) {
	wake := make(chan struct{}, 1)
	if c.cfg.Changes != nil {
		go c.cfg.Changes(ctx, func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		})
	}
	t := time.NewTicker(c.cfg.PollInterval)
	defer t.Stop()
	defer close(c.done)
	for {
		c.mu.Lock()
		watched := c.feed.watchers > 0
		c.mu.Unlock()
		if watched {
			if err := c.refresh(ctx); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("console: the review log could not be read for the live queue", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
	}
}

// refresh reads the log and signals a change of the queue or of its
// seller findings.
func (c *Console) refresh(ctx context.Context) error {
	all, err := c.cfg.Log.List(ctx, true)
	if err != nil {
		return err
	}
	h := sha256.New()
	for _, rv := range all {
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%t\x00%s\x00%s\n", rv.ID, rv.Status, rv.DecidedBy, rv.DecidedWith, rv.Tampered, rv.UsedAt, strings.Join(rv.ApprovedBy, ","))
	}
	// The findings section as the page would show it now: whatever it
	// comes to list (settlements with findings, and what else findingsData
	// learns to read) is live without this list growing with it. Its ages
	// are in it, so it changes once a minute at most while a finding is
	// new; a section that cannot be read says so, and the queue stays live.
	d := &pageData{Base: c.base}
	c.findingsData(ctx, d)
	if err := c.pages.ExecuteTemplate(h, "findings", d); err != nil {
		return fmt.Errorf("render the seller findings: %w", err)
	}
	sig := hex.EncodeToString(h.Sum(nil))
	c.mu.Lock()
	defer c.mu.Unlock()
	if sig != c.feed.sig {
		// The first read after a page opened may already hold what the
		// page's render missed: it signals too.
		close(c.feed.ch)
		c.feed.ch = make(chan struct{})
		c.feed.sig = sig
	}
	return nil
}

// queueData fills d with the queue: pending reviews newest first, then
// the decided ones, last decided first.
func (c *Console) queueData(ctx context.Context, d *pageData) error {
	all, err := c.cfg.Log.List(ctx, true)
	if err != nil {
		return err
	}
	var pending, decided []reviewlog.Review
	for _, rv := range all {
		if rv.Status == reviewlog.Pending {
			pending = append(pending, rv)
		} else {
			decided = append(decided, rv)
		}
	}
	slices.SortStableFunc(pending, func(a, b reviewlog.Review) int { return strings.Compare(b.CreatedAt, a.CreatedAt) })
	slices.SortStableFunc(decided, func(a, b reviewlog.Review) int { return strings.Compare(b.DecidedAt, a.DecidedAt) })
	now := c.cfg.Now()
	for _, rv := range pending {
		d.Pending = append(d.Pending, c.question(rv, now))
	}
	for _, rv := range decided {
		d.Decided = append(d.Decided, c.question(rv, now))
	}
	return nil
}

// events streams the queue to a signed-in reviewer: one "queue" and one
// "findings" event at once and at each change, a comment every heartbeat; the stream ends when
// the session does, the reviewer leaves the trusted file, or the console
// stops.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	who := c.reviewer(r)
	if who == "" {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "sign in with a passkey first"})
		return
	}
	c.mu.Lock()
	if c.streams >= maxStreams {
		c.mu.Unlock()
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "too many open queue pages; reload later"})
		return
	}
	c.streams++
	c.feed.watchers++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.streams--
		c.feed.watchers--
		c.mu.Unlock()
	}()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteWait))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	ping := time.NewTicker(heartbeat)
	defer ping.Stop()
	for {
		next := c.changed()
		if c.reviewer(r) != who {
			return
		}
		ev, err := c.queueEvent(r.Context())
		if err != nil {
			c.cfg.Logger.Warn("console: the live queue could not be rendered", "err", err)
			return
		}
		fe, err := c.findingsEvent(r.Context())
		if err != nil {
			c.cfg.Logger.Warn("console: the live seller findings could not be rendered", "err", err)
			return
		}
		if !send(append(ev, fe...)) {
			return
		}
	wait:
		for {
			select {
			case <-r.Context().Done():
				return
			case <-c.done:
				return
			case <-next:
				break wait
			case <-ping.C:
				if !send([]byte(": keep-alive\n\n")) {
					return
				}
			}
		}
	}
}

// queueEvent is the "queue" event: the queue's tables as HTML, one data
// line each.
func (c *Console) queueEvent(ctx context.Context) ([]byte, error) {
	d := &pageData{Base: c.base}
	if err := c.queueData(ctx, d); err != nil {
		return nil, err
	}
	return c.event("queue", "queuebody", d)
}

// findingsEvent is the "findings" event: the seller findings section as
// HTML (empty when there is none; a problem reading them is said in it,
// as on the page).
func (c *Console) findingsEvent(ctx context.Context) ([]byte, error) {
	d := &pageData{Base: c.base}
	c.findingsData(ctx, d)
	return c.event("findings", "findings", d)
}

// event renders template name with d as server-sent event kind, one data
// line each.
func (c *Console) event(kind, name string, d *pageData) ([]byte, error) {
	var buf bytes.Buffer
	if err := c.pages.ExecuteTemplate(&buf, name, d); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteString("event: " + kind + "\n")
	for _, line := range bytes.Split(termsafe.HTML(buf.Bytes()), []byte("\n")) {
		out.WriteString("data: ")
		out.Write(bytes.TrimSuffix(line, []byte("\r")))
		out.WriteByte('\n')
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
