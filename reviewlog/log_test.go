package reviewlog_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newLog(t *testing.T, dir string, c *clock) *reviewlog.Log {
	t.Helper()
	opts := reviewlog.Options{LockWait: 2 * time.Second}
	if c != nil {
		opts.Now = c.now
	}
	return openLog(t, dir, opts)
}

// openLog is the review log in the file store under the Trace root dir.
func openLog(t *testing.T, dir string, opts reviewlog.Options) *reviewlog.Log {
	t.Helper()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return reviewlog.OpenStore(filestore.New(root), opts)
}

// reviewID is a lower-case RFC 9562 version 4 UUID, as review ids are.
var reviewID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// newSignedLog is newLog with a trusted reviewer "alice" whose sign hook
// makes her decisions read as decided.
func newSignedLog(t *testing.T, dir string, c *clock) (*reviewlog.Log, *reviewer) {
	t.Helper()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	alice := newReviewer(t, "alice")
	opts := reviewlog.Options{LockWait: 2 * time.Second, Reviewers: trust(alice)}
	if c != nil {
		opts.Now = c.now
	}
	return reviewlog.OpenStore(filestore.New(root), opts), alice
}

var (
	q1      = guard.Question{Counterparty: "0xb0b0000000000000000000000000000000000002", Amount: "0.05", Asset: guard.USDCBase, Template: "x402-buyer"}
	reasons = []guard.Reason{{Rule: "open_partial", Detail: "1 partial", Evidence: []guard.Ref{{RunID: "r1", OperationID: "op-2"}}}, {Rule: "history", Detail: "read 3"}}
)

func readFile(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, reviewlog.DirName, reviewlog.FileName))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestOpenDecideGetList(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)}
	l, alice := newSignedLog(t, dir, c)
	ctx := context.Background()

	var seen []reviewlog.Tx
	terms := signTerms(t)
	hook := func(tx reviewlog.Tx) error {
		seen = append(seen, tx)
		if tx.Kind == "decided" {
			return alice.sign(t)(tx)
		}
		return terms(tx)
	}
	r1, created, err := engine.OpenReview(ctx, l, q1, reasons, hook)
	if err != nil || !created || r1.Status != reviewlog.Pending || r1.CreatedAt != "2026-07-25T12:00:00.000Z" || !reviewID.MatchString(r1.ID) {
		t.Fatalf("open: %+v %v %v", r1, created, err)
	}
	if len(seen) != 1 || seen[0].Kind != "opened" || seen[0].Review.ID != r1.ID || seen[0].Store == nil {
		t.Errorf("hook saw %+v", seen)
	}

	// Same question, even much later → the same review while it is
	// pending (one open review per question).
	c.add(24 * time.Hour)
	r2, created, err := engine.OpenReview(ctx, l, q1, nil, hook)
	if err != nil || created || r2.ID != r1.ID {
		t.Fatalf("repeat within the window: %+v %v %v", r2, created, err)
	}
	if seen[1].Kind != "reused" {
		t.Errorf("hook kind %q", seen[1].Kind)
	}
	// A different amount is a different question.
	q2 := q1
	q2.Amount = "0.06"
	r3, created, err := engine.OpenReview(ctx, l, q2, reasons, signTerms(t))
	if err != nil || !created || r3.ID == r1.ID {
		t.Fatalf("other amount: %+v %v %v", r3, created, err)
	}
	// Still pending a week later → still the same review.
	c.add(7 * 24 * time.Hour)
	r4, created, err := engine.OpenReview(ctx, l, q1, reasons, signTerms(t))
	if err != nil || created || r4.ID != r1.ID {
		t.Fatalf("a week later: %+v %v %v", r4, created, err)
	}

	d, err := l.DecideReview(ctx, r1.ID, reviewlog.Rejected, "seller B never settled\nsee op-2", "alice", hook)
	if err != nil || d.Status != reviewlog.Rejected || d.DecidedBy != "alice" || d.Note != "seller B never settled\nsee op-2" || d.DecidedAt == "" {
		t.Fatalf("decide: %+v %v", d, err)
	}
	if last := seen[len(seen)-1]; last.Kind != "decided" || last.Review.Status != reviewlog.Rejected {
		t.Errorf("hook saw %+v", last)
	}
	if _, err := l.DecideReview(ctx, r1.ID, reviewlog.Approved, "", "bob", nil); !errors.Is(err, reviewlog.ErrAlreadyDecided) || !strings.Contains(err.Error(), "rejected by alice") {
		t.Errorf("second decision: %v", err)
	}
	// A decided review no longer answers a repeated question.
	q3 := q1
	q3.Counterparty = "api.example.com"
	r5, _, _ := engine.OpenReview(ctx, l, q3, reasons, signTerms(t))
	if _, err := l.DecideReview(ctx, r5.ID, reviewlog.Approved, "", "bob", nil); err != nil {
		t.Fatal(err)
	}
	if r, created, err := engine.OpenReview(ctx, l, q3, reasons, signTerms(t)); err != nil || !created || r.ID == r5.ID {
		t.Errorf("a decided review was reused: %v %v", created, err)
	}

	got, err := l.Get(ctx, r1.ID)
	if err != nil || got.Status != reviewlog.Rejected || got.Counterparty != q1.Counterparty || len(got.Reasons) != 2 || got.Reasons[0].Evidence[0].OperationID != "op-2" {
		t.Errorf("get: %+v %v", got, err)
	}
	pending, _ := l.List(ctx, false)
	all, _ := l.List(ctx, true)
	if len(pending) != 2 || len(all) != 4 || all[0].ID != r1.ID {
		t.Errorf("list: %d pending, %d all", len(pending), len(all))
	}

	if _, err := l.Get(ctx, "1b4e28ba-2fa1-4d2c-883f-0016d3cca427"); !errors.Is(err, reviewlog.ErrUnknownReview) {
		t.Errorf("unknown: %v", err)
	}
	if _, err := l.DecideReview(ctx, "1b4e28ba-2fa1-4d2c-883f-0016d3cca427", reviewlog.Approved, "", "bob", nil); !errors.Is(err, reviewlog.ErrUnknownReview) {
		t.Errorf("unknown decide: %v", err)
	}
	for _, id := range []string{"", "x", "1B4E28BA-2FA1-4D2C-883F-0016D3CCA427", "1b4e28ba-2fa1-1d2c-883f-0016d3cca427", "../../etc/passwd"} {
		if _, err := l.Get(ctx, id); !errors.Is(err, reviewlog.ErrBadID) {
			t.Errorf("Get(%q): %v", id, err)
		}
	}
	for _, bad := range []struct{ status, note, by string }{
		{"maybe", "", "bob"}, {reviewlog.Approved, "", ""}, {reviewlog.Approved, "", "bo\x00b"}, {reviewlog.Approved, strings.Repeat("n", 5000), "bob"}, {reviewlog.Approved, "bell\a", "bob"},
	} {
		if _, err := l.DecideReview(ctx, r4.ID, bad.status, bad.note, bad.by, nil); !errors.Is(err, reviewlog.ErrBadInput) {
			t.Errorf("DecideReview(%q, %q, %q): %v", bad.status, bad.note, bad.by, err)
		}
	}

	info, err := os.Stat(filepath.Join(dir, reviewlog.DirName))
	if err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("guard dir mode %v %v", info.Mode(), err)
	}
	info, err = os.Stat(filepath.Join(dir, reviewlog.DirName, reviewlog.FileName))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("log mode %v %v", info.Mode(), err)
	}
	text := readFile(t, dir)
	if n := strings.Count(text, "\n"); n != 6 || !strings.HasSuffix(text, "\n") {
		t.Errorf("log has %d lines:\n%s", n, text)
	}
}

func TestHookErrorAborts(t *testing.T) {
	dir := t.TempDir()
	l := newLog(t, dir, nil)
	boom := errors.New("signer unavailable")
	if _, _, err := engine.OpenReview(context.Background(), l, q1, reasons, func(reviewlog.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
	if text := readFile(t, dir); text != "" {
		t.Errorf("the log was written: %q", text)
	}
	r, _, err := engine.OpenReview(context.Background(), l, q1, reasons, signTerms(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.DecideReview(context.Background(), r.ID, reviewlog.Approved, "", "bob", func(reviewlog.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
	if got, _ := l.Get(context.Background(), r.ID); got.Status != reviewlog.Pending {
		t.Errorf("decision written despite the hook error: %+v", got)
	}
	called := false
	if err := l.WithLock(context.Background(), func(tx reviewlog.Tx) error { called = tx.Store != nil; return nil }); err != nil || !called {
		t.Errorf("WithLock: %v %v", err, called)
	}
}

func TestEmptyRoot(t *testing.T) {
	l := newLog(t, t.TempDir(), nil)
	list, err := l.List(context.Background(), true)
	if err != nil || len(list) != 0 {
		t.Errorf("%v %v", list, err)
	}
	if _, err := l.Get(context.Background(), "1b4e28ba-2fa1-4d2c-883f-0016d3cca427"); !errors.Is(err, reviewlog.ErrUnknownReview) {
		t.Errorf("%v", err)
	}
}

func TestSymlinksRefused(t *testing.T) {
	dir := t.TempDir()
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(dir, reviewlog.DirName)); err != nil {
		t.Fatal(err)
	}
	l := newLog(t, dir, nil)
	if _, _, err := engine.OpenReview(context.Background(), l, q1, reasons, signTerms(t)); err == nil || !errors.Is(err, confined.ErrSymlink) {
		t.Errorf("symlinked guard dir: %v", err)
	}
	if _, err := l.List(context.Background(), true); err == nil {
		t.Errorf("symlinked guard dir listed")
	}

	dir2 := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir2, reviewlog.DirName), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(elsewhere, "x"), filepath.Join(dir2, reviewlog.DirName, reviewlog.FileName)); err != nil {
		t.Fatal(err)
	}
	l2 := newLog(t, dir2, nil)
	if _, _, err := engine.OpenReview(context.Background(), l2, q1, reasons, signTerms(t)); err == nil || !errors.Is(err, confined.ErrSymlink) {
		t.Errorf("symlinked log: %v", err)
	}
	if _, err := os.Stat(filepath.Join(elsewhere, "x")); err == nil {
		t.Errorf("a file was created through the link")
	}
}

func TestLockTimeout(t *testing.T) {
	dir := t.TempDir()
	l := newLog(t, dir, nil)
	if _, _, err := engine.OpenReview(context.Background(), l, q1, reasons, signTerms(t)); err != nil { // creates guard/ and the lock file
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, reviewlog.DirName, reviewlog.LockName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	q := q1
	q.Amount = "9"
	if _, _, err := engine.OpenReview(context.Background(), l, q, reasons, signTerms(t)); !errors.Is(err, reviewlog.ErrLockTimeout) {
		t.Errorf("got %v, want ErrLockTimeout", err)
	}
	// Readers do not need the lock.
	if list, err := l.List(context.Background(), true); err != nil || len(list) != 1 {
		t.Errorf("list under a held lock: %v %v", list, err)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	if _, _, err := engine.OpenReview(context.Background(), l, q, reasons, signTerms(t)); err != nil {
		t.Errorf("after unlock: %v", err)
	}
}

func TestGoroutinesOpenOnce(t *testing.T) {
	dir := t.TempDir()
	l := newLog(t, dir, nil)
	l2 := newLog(t, dir, nil) // a second Log on the same root: only flock serialises them
	var wg sync.WaitGroup
	ids := make([]string, 16)
	errs := make([]error, 16)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lg := l
			if i%2 == 1 {
				lg = l2
			}
			r, _, err := engine.OpenReview(context.Background(), lg, q1, reasons, signTerms(t))
			ids[i], errs[i] = r.ID, err
		}()
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Errorf("caller %d: %s %v (first %s)", i, ids[i], errs[i], ids[0])
		}
	}
	if n := strings.Count(readFile(t, dir), `"type":"opened"`); n != 1 {
		t.Errorf("%d opened lines", n)
	}
}

// A writer that finds a torn tail starts on a new line, records the repair,
// and the log folds cleanly afterwards.
func TestWriterRepairsTornTail(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, reviewlog.DirName), 0o700); err != nil {
		t.Fatal(err)
	}
	const idA = "1b4e28ba-2fa1-4d2c-883f-0016d3cca427"
	const openedA = `{"type":"opened","review_id":"` + idA + `","at":"2026-07-25T12:00:00.000Z","counterparty":"api.example.com","amount":"1","asset":"a","reasons":[]}`
	torn := openedA + "\n" + `{"type":"decided","review_id":"` + idA
	if err := os.WriteFile(filepath.Join(dir, reviewlog.DirName, reviewlog.FileName), []byte(torn), 0o600); err != nil {
		t.Fatal(err)
	}
	l, alice := newSignedLog(t, dir, nil)
	ctx := context.Background()
	if r, err := l.Get(ctx, idA); err != nil || r.Status != reviewlog.Pending {
		t.Fatalf("reader over a torn tail: %+v %v", r, err)
	}
	// The legacy review carries no signed terms: it cannot be decided,
	// and the refusal writes nothing, not even the repair.
	if _, err := l.DecideReview(ctx, idA, reviewlog.Approved, "ok", "alice", alice.sign(t)); !errors.Is(err, reviewlog.ErrTampered) {
		t.Fatalf("deciding a review without signed terms: %v", err)
	}
	if text := readFile(t, dir); text != torn {
		t.Fatalf("a refused decision wrote:\n%s", text)
	}
	if _, _, err := engine.OpenReview(ctx, l, q1, reasons, signTerms(t)); err != nil {
		t.Fatal(err)
	}
	text := readFile(t, dir)
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[2], `{"type":"repair"`) || !strings.Contains(lines[2], `"lines":[2]`) || !strings.HasPrefix(lines[3], `{"type":"opened"`) {
		t.Fatalf("log after repair:\n%s", text)
	}
	if r, err := l.Get(ctx, idA); err != nil || r.Status != reviewlog.Pending {
		t.Errorf("after repair: %+v %v", r, err)
	}
}

// The log records what the decider chose and refuses only what would break
// its records: a review it does not hold, a second use of one approval, an
// answer of no known kind. A refusal writes nothing.
func TestAskRefusesWhatBreaksTheRecords(t *testing.T) {
	dir := t.TempDir()
	l, alice := newSignedLog(t, dir, nil)
	ctx := t.Context()
	r, _, err := engine.OpenReview(ctx, l, q1, reasons, signTerms(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.DecideReview(ctx, r.ID, reviewlog.Approved, "", "alice", alice.sign(t)); err != nil {
		t.Fatal(err)
	}
	req := reviewlog.AskRequest{Caller: engine.OpenReviewCaller, Question: q1}
	plan := func(p reviewlog.AskPlan) func(*reviewlog.AskView) (reviewlog.AskPlan, error) {
		return func(*reviewlog.AskView) (reviewlog.AskPlan, error) { return p, nil }
	}
	noHook := func(reviewlog.Tx, reviewlog.AskOutcome) error { return nil }
	used, err := l.Ask(ctx, req, plan(reviewlog.AskPlan{Kind: reviewlog.AskApproved, Review: r}), noHook)
	if err != nil || used.Kind != reviewlog.AskApproved || used.Review.UsedAt == "" {
		t.Fatalf("first use: %+v %v", used, err)
	}
	before := readFile(t, dir)
	for _, c := range []struct {
		name string
		plan reviewlog.AskPlan
		want error
	}{
		{"a second use", reviewlog.AskPlan{Kind: reviewlog.AskApproved, Review: r}, reviewlog.ErrAlreadyDecided},
		{"an unknown review", reviewlog.AskPlan{Kind: reviewlog.AskApproved, Review: reviewlog.Review{ID: "2c5f39cb-3ab2-4e3d-994a-1127e4ddb538"}}, reviewlog.ErrUnknownReview},
		{"an unknown kind", reviewlog.AskPlan{Kind: "allow_anyway"}, reviewlog.ErrBadInput},
	} {
		t.Run(c.name, func(t *testing.T) {
			hooked := false
			_, err := l.Ask(ctx, req, plan(c.plan), func(reviewlog.Tx, reviewlog.AskOutcome) error { hooked = true; return nil })
			if !errors.Is(err, c.want) || hooked {
				t.Fatalf("Ask = %v (hook ran: %v), want %v and no hook", err, hooked, c.want)
			}
			if after := readFile(t, dir); after != before {
				t.Fatalf("a refused answer wrote:\n%s", strings.TrimPrefix(after, before))
			}
		})
	}
	// What the decider reads, it reads inside the lock: the review and
	// its one use.
	_, err = l.Ask(ctx, req, func(v *reviewlog.AskView) (reviewlog.AskPlan, error) {
		list, err := v.Reviews()
		if err != nil || len(list) != 1 || list[0].ID != r.ID || list[0].Status != reviewlog.Approved || list[0].UsedAt == "" || !list[0].Bound() || !list[0].SignedTerms() {
			t.Errorf("Reviews = %+v, %v", list, err)
		}
		if n := v.Pending(); n != 0 {
			t.Errorf("Pending = %d", n)
		}
		return reviewlog.AskPlan{Kind: reviewlog.AskPlain}, nil
	}, noHook)
	if err != nil {
		t.Fatal(err)
	}
}
