package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

// watchSession runs `review watch` in a goroutine through run and hands
// out its output line by line.
type watchSession struct {
	t      *testing.T
	cancel context.CancelFunc
	lines  chan string
	errs   chan string
	code   chan int
}

func startWatch(t *testing.T, args ...string) *watchSession {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	w := &watchSession{t: t, cancel: cancel, lines: make(chan string, 100), errs: make(chan string, 100), code: make(chan int, 1)}
	go func() {
		code := run(ctx, append([]string{"review", "watch"}, args...), strings.NewReader(""), outW, errW)
		outW.Close()
		errW.Close()
		w.code <- code
	}()
	for _, p := range []struct {
		r  io.Reader
		ch chan string
	}{{outR, w.lines}, {errR, w.errs}} {
		go func() {
			s := bufio.NewScanner(p.r)
			for s.Scan() {
				p.ch <- s.Text()
			}
			close(p.ch)
		}()
	}
	t.Cleanup(func() {
		cancel()
		io.Copy(io.Discard, outR)
		io.Copy(io.Discard, errR)
	})
	return w
}

// next returns the next line from ch. The deadline is only a guard against
// a hung test; nothing here measures time.
func (w *watchSession) next(ch chan string, what string) string {
	w.t.Helper()
	select {
	case l, ok := <-ch:
		if !ok {
			w.t.Fatalf("the watch ended while %s was expected", what)
		}
		return l
	case <-time.After(time.Minute):
		w.t.Fatalf("no %s within a minute", what)
	}
	return ""
}

func (w *watchSession) stop() int {
	w.t.Helper()
	w.cancel()
	for range w.lines {
	}
	return <-w.code
}

func TestReviewWatch(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		name := "text"
		if asJSON {
			name = "json"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "events"), 0o700); err != nil {
				t.Fatal(err)
			}
			root, err := confined.OpenRoot(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			l := reviewlog.OpenStore(filestore.New(root), reviewlog.Options{})
			ctx := context.Background()
			terms := serverTerms(t, "")
			open := func(counterparty, amount string) reviewlog.Review {
				t.Helper()
				out, err := engine.Ask(ctx, l, engine.AskRequest{Caller: "agent-1", Decision: guard.Review, ParamsHash: "hmac-sha256:" + strings.Repeat("cd", 32),
					Question: guard.Question{Counterparty: counterparty, Amount: amount, Asset: guard.USDCBase},
					Reasons:  []guard.Reason{{Rule: "open_partial", Detail: "x"}}}, terms)
				if err != nil {
					t.Fatal(err)
				}
				return out.Review
			}
			decide := func(id, status string) {
				t.Helper()
				if _, err := (engine.Decider{Log: l, Chains: aliceChains(t)}).Decide(ctx, id, status, "checked", "alice"); err != nil {
					t.Fatal(err)
				}
			}
			waiting := open("0xa11ce00000000000000000000000000000000001", "1.00")
			history := open("0xa11ce00000000000000000000000000000000001", "9.00")
			decide(history.ID, reviewlog.Rejected)

			args := []string{"--dir", dir, "--interval", "10ms"}
			if asJSON {
				args = append(args, "--json")
			}
			w := startWatch(t, args...)
			if l := w.next(w.errs, "the start message"); !strings.HasPrefix(l, "watching ") || !strings.Contains(l, dir) {
				t.Fatalf("start message %q", l)
			}
			// Each change is made once the previous line is out, so the
			// order is known; the first line was printed before the start
			// message.
			var hostile reviewlog.Review
			want := []struct {
				action            func()
				event, id, status string
			}{
				{nil, watchPending, waiting.ID, reviewlog.Pending},
				{func() { hostile = open("0xb0b\u202ecod.exe", "0.01\u200b") }, watchOpened, "", reviewlog.Pending},
				{func() { decide(hostile.ID, reviewlog.Approved) }, watchDecided, "", reviewlog.Approved},
				{func() { decide(waiting.ID, reviewlog.Rejected) }, watchDecided, waiting.ID, reviewlog.Rejected},
			}
			var got []string
			for _, wl := range want {
				if wl.action != nil {
					wl.action()
				}
				if wl.id == "" {
					wl.id = hostile.ID
				}
				line := w.next(w.lines, wl.event+" of "+wl.id)
				got = append(got, line)
				if asJSON {
					var c struct {
						Time   string
						Event  string
						Review reviewlog.Review
					}
					if err := json.Unmarshal([]byte(line), &c); err != nil {
						t.Fatalf("not JSON: %q: %v", line, err)
					}
					if c.Event != wl.event || c.Review.ID != wl.id || c.Review.Status != wl.status || c.Time == "" {
						t.Errorf("line %q, want %s %s %s", line, wl.event, wl.id, wl.status)
					}
					if wl.id == hostile.ID && c.Review.Counterparty != hostile.Counterparty {
						t.Errorf("JSON changed the counterparty: %q", c.Review.Counterparty)
					}
					continue
				}
				f := strings.Fields(line)
				if len(f) < 7 || f[1] != wl.event || f[2] != wl.id || f[6] != wl.status {
					t.Errorf("line %q, want %s %s %s", line, wl.event, wl.id, wl.status)
				}
			}
			all := strings.Join(got, "\n")
			if strings.Contains(all, history.ID) {
				t.Errorf("decided history was printed:\n%s", all)
			}
			for _, bad := range []string{"\u202e", "\u200b"} {
				if strings.Contains(all, bad) {
					t.Errorf("output holds %U raw:\n%s", []rune(bad)[0], all)
				}
			}
			if !strings.Contains(all, `0xb0b\u202ecod.exe`) || !strings.Contains(all, `0.01\u200b`) {
				t.Errorf("hostile strings not escaped visibly:\n%s", all)
			}
			if !asJSON && !strings.Contains(got[3], "rejected by alice") {
				t.Errorf("decision line %q does not say who", got[3])
			}
			if code := w.stop(); code != exitOK {
				t.Errorf("interrupted watch exited %d", code)
			}
		})
	}
}

func TestReviewWatchRefuses(t *testing.T) {
	notRoot := t.TempDir()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "guard"), 0o700); err != nil {
		t.Fatal(err)
	}
	linked := t.TempDir()
	if err := os.Symlink(root, filepath.Join(linked, "guard")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		errHas []string
	}{
		{"not a Trace root", []string{"--dir", notRoot}, exitUsage, []string{notRoot + " is not a Trace root", "neither events/ nor guard/"}},
		{"missing directory", []string{"--dir", filepath.Join(notRoot, "absent")}, exitUsage, []string{filepath.Join(notRoot, "absent"), "no Trace root at", "haia-trace-mcp init"}},
		{"hostile path is escaped", []string{"--dir", filepath.Join(notRoot, "a\x1b[2Jb")}, exitUsage, []string{`a\u001b[2Jb`}},
		{"guard is a symbolic link", []string{"--dir", linked}, exitFail, []string{"guard", "symbolic link"}},
		{"zero interval", []string{"--dir", root, "--interval", "0s"}, exitUsage, []string{"--interval 0s is outside"}},
		{"huge interval", []string{"--dir", root, "--interval", "48h"}, exitUsage, []string{"outside 10ms to 1h0m0s"}},
		{"positional argument", []string{"--dir", root, "extra"}, exitUsage, []string{`unexpected argument "extra"`}},
		{"unknown flag", []string{"--all", "--dir", root}, exitUsage, []string{"flag provided but not defined"}},
	}
	if out, errOut, code := reviewCmd("watch", "--help"); code != exitOK || errOut != "" || !strings.Contains(out, "review watch [--dir .trace]") || !strings.Contains(out, "(default 1s)") {
		t.Errorf("watch --help: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := reviewCmd(append([]string{"watch"}, tt.args...)...)
			if code != tt.code || out != "" {
				t.Errorf("exit %d, stdout %q; want %d and nothing", code, out, tt.code)
			}
			for _, s := range tt.errHas {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr %q lacks %q", errOut, s)
				}
			}
			if strings.ContainsRune(errOut, 0x1b) {
				t.Errorf("stderr holds a raw escape: %q", errOut)
			}
		})
	}
}

func TestWatchDiff(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	rev := func(id, status string) reviewlog.Review {
		r := reviewlog.Review{ID: id, Status: status, CreatedAt: "2026-03-04T05:00:00Z"}
		if status == reviewlog.Approved || status == reviewlog.Rejected {
			r.DecidedAt, r.DecidedBy, r.Note = "2026-03-04T05:01:00Z", "alice", "n"
		}
		return r
	}
	tampered := func(r reviewlog.Review) reviewlog.Review { r.Tampered = true; return r }
	type step struct {
		reviews []reviewlog.Review
		first   bool
		want    []string // "event id status time"
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first read shows only what waits", []step{
			{[]reviewlog.Review{rev("a", reviewlog.Pending), rev("b", reviewlog.Approved)}, true, []string{"review.pending a pending 2026-03-04T05:00:00Z"}},
			{[]reviewlog.Review{rev("a", reviewlog.Pending), rev("b", reviewlog.Approved)}, false, nil},
		}},
		{"opened then decided", []step{
			{nil, true, nil},
			{[]reviewlog.Review{rev("a", reviewlog.Pending)}, false, []string{"review.opened a pending 2026-03-04T05:00:00Z"}},
			{[]reviewlog.Review{rev("a", reviewlog.Rejected)}, false, []string{"review.decided a rejected 2026-03-04T05:01:00Z"}},
		}},
		{"opened and decided between two reads", []step{
			{nil, true, nil},
			{[]reviewlog.Review{rev("a", reviewlog.Approved)}, false, []string{"review.opened a pending 2026-03-04T05:00:00Z", "review.decided a approved 2026-03-04T05:01:00Z"}},
		}},
		{"another status change", []step{
			{[]reviewlog.Review{rev("a", reviewlog.Pending)}, true, []string{"review.pending a pending 2026-03-04T05:00:00Z"}},
			{[]reviewlog.Review{rev("a", "expired")}, false, []string{"review.changed a expired 2026-03-04T05:06:07Z"}},
		}},
		{"its line edited, then restored", []step{
			{[]reviewlog.Review{rev("a", reviewlog.Pending)}, true, []string{"review.pending a pending 2026-03-04T05:00:00Z"}},
			{[]reviewlog.Review{tampered(rev("a", reviewlog.Pending))}, false, []string{"review.changed a pending 2026-03-04T05:06:07Z"}},
			{[]reviewlog.Review{rev("a", reviewlog.Pending)}, false, []string{"review.changed a pending 2026-03-04T05:06:07Z"}},
		}},
		{"archived and back", []step{
			{[]reviewlog.Review{rev("a", reviewlog.Pending)}, true, []string{"review.pending a pending 2026-03-04T05:00:00Z"}},
			{nil, false, nil},
			{[]reviewlog.Review{rev("a", reviewlog.Pending)}, false, []string{"review.opened a pending 2026-03-04T05:00:00Z"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			known := map[string]reviewlog.Review{}
			for i, s := range tt.steps {
				var got []string
				for _, c := range watchDiff(known, s.reviews, s.first, now) {
					got = append(got, strings.Join([]string{c.Event, c.Review.ID, c.Review.Status, c.Time}, " "))
					if c.Event == watchOpened && (c.Review.DecidedBy != "" || c.Review.Note != "") {
						t.Errorf("step %d: the opened line carries the decision: %+v", i, c.Review)
					}
				}
				if strings.Join(got, "\n") != strings.Join(s.want, "\n") {
					t.Errorf("step %d: got %q, want %q", i, got, s.want)
				}
			}
		})
	}
}
