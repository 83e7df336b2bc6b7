package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

const reviewWatchDetails = `Prints the reviews already pending, then one line per review as it opens and
as it is decided, until interrupted. --json prints one JSON object per line:
{"time", "event", "review"}. Events: review.pending (waiting when the watch
started), review.opened, review.decided, review.changed (any other change of
status). Exit codes: 0 interrupted, 1 error, 2 usage or not a Trace root.
`

// Watch events.
const (
	watchPending = "review.pending"
	watchOpened  = "review.opened"
	watchDecided = "review.decided"
	watchChanged = "review.changed"
)

// Bounds of --interval.
const (
	watchMinInterval = 10 * time.Millisecond
	watchMaxInterval = time.Hour
)

// defineReviewWatch polls the review log and prints what changed.
func defineReviewWatch(fs *flag.FlagSet) runFunc {
	var f stackFlags
	f.register(fs, true)
	asJSON := jsonFlag(fs)
	interval := fs.Duration("interval", time.Second, "how often to read the review log")
	guardConfigFlagVar(fs, &f.guardConfig)
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		return runReviewWatch(ctx, env.stdout, env.stderr, &f, asJSON, interval)
	}
}

func runReviewWatch(ctx context.Context, stdout, stderr io.Writer, f *stackFlags, asJSON *bool, interval *time.Duration) error {
	if *interval < watchMinInterval || *interval > watchMaxInterval {
		return usageErrorf("--interval %s is outside %s to %s", *interval, watchMinInterval, watchMaxInterval)
	}
	stack, err := f.open(ctx, nil)
	if err != nil {
		return err
	}
	defer stack.Close()
	st := stack.Store()
	w := &reviewWatcher{
		log:    stack.Log(),
		assets: stack.Policy().Assets,
		path:   st.Describe(),
		json:   *asJSON,
		stdout: stdout,
		stderr: stderr,
		known:  map[string]reviewlog.Review{},
		now:    time.Now,
	}
	if listen := app.LogChanges(st, *interval, nil); listen != nil {
		// Every replica's append NOTIFYs: wake on it, not only on the tick.
		w.wake = make(chan struct{}, 1)
		go listen(ctx, func() {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		})
	}
	return exitCode(w.run(ctx, *interval))
}

type reviewWatcher struct {
	log *reviewlog.Log
	// assets name the amounts' assets by their symbols.
	assets         guard.Registry
	path           string
	json           bool
	stdout, stderr io.Writer
	// known is the state of each review at the last successful read;
	// started says there was one.
	known   map[string]reviewlog.Review
	started bool
	lastErr string
	now     func() time.Time
	// wake, when set, is signalled when the store says it changed.
	wake chan struct{}
}

// watchChange is one line of output.
type watchChange struct {
	Time   string           `json:"time"`
	Event  string           `json:"event"`
	Review reviewlog.Review `json:"review"`
}

func (w *reviewWatcher) run(ctx context.Context, interval time.Duration) int {
	t := time.NewTicker(interval)
	defer t.Stop()
	announced := false
	for {
		if err := w.poll(ctx); err != nil {
			if ctx.Err() != nil {
				return exitOK
			}
			fmt.Fprintf(w.stderr, "haia-trace-mcp review watch: write: %v\n", err)
			return exitFail
		}
		if !announced {
			fmt.Fprintf(w.stderr, "watching %s every %s (interrupt to stop)\n", termsafe.String(w.path), interval)
			announced = true
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-t.C:
		case <-w.wake:
		}
	}
}

// poll reads the log once and prints the changes. A log that cannot be
// read is reported once (until it can be read again) and watched on; only
// a failed write to stdout is returned.
func (w *reviewWatcher) poll(ctx context.Context) error {
	reviews, err := w.log.List(ctx, true)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if msg := err.Error(); msg != w.lastErr {
			fmt.Fprintf(w.stderr, "haia-trace-mcp review watch: cannot read the review log (still watching): %s\n", termsafe.String(msg))
			w.lastErr = msg
		}
		return nil
	}
	if w.lastErr != "" {
		fmt.Fprintln(w.stderr, "haia-trace-mcp review watch: the review log can be read again")
		w.lastErr = ""
	}
	changes := watchDiff(w.known, reviews, !w.started, w.now().UTC())
	w.started = true
	for _, c := range changes {
		if err := w.print(c); err != nil {
			return err
		}
	}
	return nil
}

// watchDiff updates known to reviews and returns what changed, in the
// order the reviews were opened. On the first read only the pending
// reviews are shown (as review.pending); decided history is not. A review
// seen for the first time already decided is shown opened, then decided.
// A review gone from the log (archived) is forgotten silently.
func watchDiff(known map[string]reviewlog.Review, reviews []reviewlog.Review, first bool, now time.Time) []watchChange {
	var out []watchChange
	stamp := now.Format(time.RFC3339)
	present := make(map[string]bool, len(reviews))
	for _, r := range reviews {
		present[r.ID] = true
		prev, seen := known[r.ID]
		known[r.ID] = r
		switch {
		case first:
			if r.Status == reviewlog.Pending {
				out = append(out, watchChange{Time: r.CreatedAt, Event: watchPending, Review: r})
			}
		case !seen:
			opened := r
			opened.Status, opened.DecidedAt, opened.DecidedBy, opened.Note = reviewlog.Pending, "", "", ""
			out = append(out, watchChange{Time: r.CreatedAt, Event: watchOpened, Review: opened})
			if r.Status != reviewlog.Pending {
				out = append(out, statusChange(r, stamp))
			}
		case prev.Status != r.Status:
			out = append(out, statusChange(r, stamp))
		case prev.Tampered != r.Tampered:
			// Its log line was edited (or restored) under the watcher.
			out = append(out, watchChange{Time: stamp, Event: watchChanged, Review: r})
		}
	}
	for id := range known {
		if !present[id] {
			delete(known, id)
		}
	}
	return out
}

// statusChange is the line for a review whose status is no longer what it
// was: review.decided at the decision's time, or review.changed now.
func statusChange(r reviewlog.Review, now string) watchChange {
	if r.Status != reviewlog.Approved && r.Status != reviewlog.Rejected {
		return watchChange{Time: now, Event: watchChanged, Review: r}
	}
	if r.DecidedAt != "" {
		now = r.DecidedAt
	}
	return watchChange{Time: now, Event: watchDecided, Review: r}
}

// print writes one change: a text line (every string from the log
// escaped) or one JSON object (with the same characters as \u escapes).
func (w *reviewWatcher) print(c watchChange) error {
	if w.json {
		b, err := json.Marshal(c)
		if err != nil {
			return fmt.Errorf("encode: %w", err)
		}
		_, err = w.stdout.Write(append(termsafe.JSON(b), '\n'))
		return err
	}
	r := c.Review
	status := watchField(r.Status)
	if r.DecidedBy != "" && r.Status != reviewlog.Pending {
		status += " by " + watchField(r.DecidedBy)
	}
	if r.Tampered {
		status += "  TAMPERED (review show says how)"
	}
	_, err := fmt.Fprintf(w.stdout, "%s  %-14s  %s  %s  %s  %s\n", watchField(c.Time), c.Event, watchField(r.ID),
		watchField(r.Counterparty), watchAmount(r, w.assets), status)
	return err
}

// watchAmount is a review's amount as every command prints it ("0.40
// USDC"), or its fields as the log has them when its asset is unknown.
func watchAmount(r reviewlog.Review, assets guard.Registry) string {
	if a, ok := assets.Lookup(r.Asset); ok && a.Symbol != "" {
		return termsafe.String(decimalText(r.Amount, r.Asset, assets))
	}
	return watchField(r.Amount) + " " + watchField(r.Asset)
}

// watchField shows an empty string as "" so the columns stay countable.
func watchField(s string) string {
	if s == "" {
		return `""`
	}
	return termsafe.String(s)
}
