package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// loop is an engine with a clock the test moves, a trusted reviewer, and
// the decider the review CLI uses.
type loop struct {
	mu      sync.Mutex
	now     time.Time
	eng     *Engine
	log     *reviewlog.Log
	decider Decider
	dir     string
	trusted reviewlog.Reviewers
	// pol and serverKey build another process over the same root (fresh).
	pol       *guard.Config
	serverKey ed25519.PrivateKey
}

// fresh is the loop as a new process on the same root would see it: a
// new log handle and engine, nothing read yet.
func (l *loop) fresh(t *testing.T) *loop {
	t.Helper()
	root, events := openTestRoot(t, l.dir)
	n := &loop{now: l.clock(), dir: l.dir, trusted: l.trusted, pol: l.pol, serverKey: l.serverKey}
	n.log = reviewlog.OpenStore(filestore.New(root), reviewlog.Options{Now: n.clock, ReviewTTL: l.pol.ReviewTTL,
		Reviewers: func() (reviewlog.Reviewers, error) { return l.trusted, nil }})
	var err error
	n.eng, err = New(Config{Policy: l.pol, Templates: receipt.Resolver{}, History: ScanHistory{Events: events}, Log: n.log,
		Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(l.serverKey)}, ParamsKey: ParamsKeyFrom(l.serverKey.Seed()), Now: n.clock})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (l *loop) clock() time.Time { l.mu.Lock(); defer l.mu.Unlock(); return l.now }
func (l *loop) advance(d time.Duration) {
	l.mu.Lock()
	l.now = l.now.Add(d)
	l.mu.Unlock()
}

func newLoop(t *testing.T, policyJSON string) *loop {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	rec, err := simrec.New(dir, "run-1", start)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(unsettled("op-1", sellerA, "https://api.example.com/x")); err != nil {
		t.Fatal(err)
	}
	root, events := openTestRoot(t, dir)
	pol, err := guard.ParseConfig([]byte(policyJSON), "")
	if err != nil {
		t.Fatal(err)
	}
	_, serverKey, _ := ed25519.GenerateKey(rand.Reader)
	_, aliceKey, _ := ed25519.GenerateKey(rand.Reader)
	l := &loop{now: start.Add(time.Hour), dir: dir}
	trusted := reviewlog.Reviewers{"alice": aliceKey.Public().(ed25519.PublicKey)}
	l.log = reviewlog.OpenStore(filestore.New(root), reviewlog.Options{Now: l.clock, ReviewTTL: pol.ReviewTTL,
		Reviewers: func() (reviewlog.Reviewers, error) { return trusted, nil }})
	l.eng, err = New(Config{Policy: pol, Templates: receipt.Resolver{}, History: ScanHistory{Events: events}, Log: l.log,
		Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(serverKey)}, ParamsKey: ParamsKeyFrom(serverKey.Seed()), Now: l.clock})
	if err != nil {
		t.Fatal(err)
	}
	l.decider = Decider{Log: l.log, Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(aliceKey)}}
	l.trusted, l.pol, l.serverKey = trusted, pol, serverKey
	return l
}

func (l *loop) ask(t *testing.T, caller string) Answer {
	t.Helper()
	a, err := l.eng.Check(context.Background(), caller, Question{Counterparty: sellerA, Amount: "0.10"})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return a
}

func has(a Answer, rule string) bool {
	for _, r := range a.Reasons {
		if r.Rule == rule {
			return true
		}
	}
	return false
}

// review → approve → the identical retry is allow (human_approved) once →
// the next identical question follows the rules again.
func TestApprovalIsHonouredOnce(t *testing.T) {
	l := newLoop(t, `{}`)
	first := l.ask(t, "agent-1")
	if first.Decision != guard.Review || first.ReviewID == "" {
		t.Fatalf("first: %+v", first)
	}
	if again := l.ask(t, "agent-1"); again.ReviewID != first.ReviewID {
		t.Fatalf("idempotent retry opened %s, want %s", again.ReviewID, first.ReviewID)
	}
	// Another caller's identical question is its own review.
	if other := l.ask(t, "agent-2"); other.ReviewID == first.ReviewID || other.Decision != guard.Review {
		t.Fatalf("another caller reused the review: %+v", other)
	}
	l.advance(time.Minute)
	if _, err := l.decider.Decide(context.Background(), first.ReviewID, reviewlog.Approved, "ok once", "alice"); err != nil {
		t.Fatal(err)
	}
	// Only the caller that asked benefits.
	if other := l.ask(t, "agent-2"); other.Decision != guard.Review {
		t.Fatalf("another caller got the approval: %+v", other)
	}
	l.advance(time.Minute)
	use := l.ask(t, "agent-1")
	if use.Decision != guard.Allow || !has(use, reviewlog.RuleHumanApproved) || use.ReviewID != first.ReviewID {
		t.Fatalf("retry after approval: %+v", use)
	}
	next := l.ask(t, "agent-1")
	if next.Decision != guard.Review || next.ReviewID == first.ReviewID {
		t.Fatalf("after the one use: %+v", next)
	}
	st, err := l.eng.ReviewStatus(context.Background(), first.ReviewID)
	if err != nil || st.Status != reviewlog.Approved || st.UsedAt == "" || len(st.Receipts) != 4 || len(st.Integrity) != 0 || st.TermsReceipt != st.Receipts[0] {
		t.Fatalf("status: %+v %v (want approved, used, receipts: the signed terms, the DEFERRED (its repeat listed once), the human's, the use)", st, err)
	}
}

func TestApprovalExpires(t *testing.T) {
	l := newLoop(t, `{"approvalTtlMinutes": 30}`)
	first := l.ask(t, "agent-1")
	if _, err := l.decider.Decide(context.Background(), first.ReviewID, reviewlog.Approved, "", "alice"); err != nil {
		t.Fatal(err)
	}
	l.advance(30 * time.Minute)
	if a := l.ask(t, "agent-1"); a.Decision != guard.Review {
		t.Fatalf("an approval past approvalTtlMinutes was honoured: %+v", a)
	}
}

// reject → the identical retry is block (human_rejected) until the hold ends.
func TestRejectionHolds(t *testing.T) {
	l := newLoop(t, `{"rejectionHoldHours": 2}`)
	first := l.ask(t, "agent-1")
	if _, err := l.decider.Decide(context.Background(), first.ReviewID, reviewlog.Rejected, "seller never settled", "alice"); err != nil {
		t.Fatal(err)
	}
	l.advance(time.Hour)
	held := l.ask(t, "agent-1")
	if held.Decision != guard.Block || !has(held, reviewlog.RuleHumanRejected) || held.ReviewID != first.ReviewID ||
		!strings.Contains(held.Reasons[0].Detail, "seller never settled") {
		t.Fatalf("retry after rejection: %+v", held)
	}
	l.advance(time.Hour)
	if a := l.ask(t, "agent-1"); a.Decision != guard.Review || a.ReviewID == first.ReviewID {
		t.Fatalf("after the hold: %+v", a)
	}
}

// A block still wins over an approval.
func TestBlockWinsOverApproval(t *testing.T) {
	l := newLoop(t, `{}`)
	first := l.ask(t, "agent-1")
	if _, err := l.decider.Decide(context.Background(), first.ReviewID, reviewlog.Approved, "", "alice"); err != nil {
		t.Fatal(err)
	}
	// The operator denylists the seller and reloads the policy.
	pol := *l.eng.Policy()
	cp, _ := guard.ParseCounterparty(sellerA)
	pol.Denylist = []guard.Counterparty{cp}
	if err := l.eng.SetPolicy(&pol, nil); err != nil {
		t.Fatal(err)
	}
	a, err := l.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.10"})
	if err != nil || a.Decision != guard.Block || has(a, reviewlog.RuleHumanApproved) {
		t.Fatalf("denylisted after approval: %+v %v", a, err)
	}
	if st, _ := l.eng.ReviewStatus(context.Background(), first.ReviewID); st.UsedAt != "" {
		t.Fatalf("the block used the approval: %+v", st)
	}
}

func TestPendingReviewExpires(t *testing.T) {
	l := newLoop(t, `{"reviewTtlMinutes": 60}`)
	first := l.ask(t, "agent-1")
	l.advance(time.Hour)
	st, err := l.eng.ReviewStatus(context.Background(), first.ReviewID)
	if err != nil || st.Status != reviewlog.Expired {
		t.Fatalf("status: %+v %v", st, err)
	}
	if _, err := l.decider.Decide(context.Background(), first.ReviewID, reviewlog.Approved, "", "alice"); err == nil {
		t.Fatal("an expired review was decided")
	}
	if a := l.ask(t, "agent-1"); a.ReviewID == first.ReviewID {
		t.Fatalf("an expired review answered again: %+v", a)
	}
}

// A reviewer whose program reads a longer time to live than the server's
// (a policy record a store writer lengthened, an older binary) signs an
// approval after the review expired: the server does not honour it, and
// says why.
func TestApprovalSignedAfterExpiryIsNotHonoured(t *testing.T) {
	l := newLoop(t, `{"reviewTtlMinutes": 60}`)
	first := l.ask(t, "agent-1")
	l.advance(2 * time.Hour)
	root, _ := openTestRoot(t, l.dir)
	lenient := reviewlog.OpenStore(filestore.New(root), reviewlog.Options{Now: l.clock, ReviewTTL: 48 * time.Hour,
		Reviewers: func() (reviewlog.Reviewers, error) { return l.trusted, nil }})
	late := Decider{Log: lenient, Chains: l.decider.Chains}
	if _, err := late.Decide(context.Background(), first.ReviewID, reviewlog.Approved, "late", "alice"); err != nil {
		t.Fatalf("the lenient reviewer could not sign (the test needs it to): %v", err)
	}
	a := l.ask(t, "agent-1")
	if a.Decision != guard.Review || has(a, reviewlog.RuleHumanApproved) || a.ReviewID == first.ReviewID {
		t.Fatalf("a late approval was honoured: %+v", a)
	}
	st, err := l.eng.ReviewStatus(context.Background(), first.ReviewID)
	if err != nil || st.Status != reviewlog.Expired || st.UsedAt != "" || len(st.Integrity) == 0 {
		t.Fatalf("status of the late approval: %+v %v (want expired, unused, with a finding)", st, err)
	}
}

func TestPendingCapPerCaller(t *testing.T) {
	l := newLoop(t, `{"maxPendingReviewsPerCaller": 2}`)
	for _, amount := range []string{"0.10", "0.11"} {
		a, err := l.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: amount})
		if err != nil || a.Decision != guard.Review {
			t.Fatalf("%s: %+v %v", amount, a, err)
		}
	}
	a, err := l.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.12"})
	if err != nil || a.Decision != guard.Block || !has(a, RuleQueueFull) || a.ReviewID != "" || a.ReceiptID == "" {
		t.Fatalf("past the cap: %+v %v", a, err)
	}
	if b := l.ask(t, "agent-2"); b.Decision != guard.Review {
		t.Fatalf("another caller was capped: %+v", b)
	}
	pending, _ := l.log.List(context.Background(), false)
	if len(pending) != 3 {
		t.Fatalf("%d pending reviews, want 3 (the capped question opened none)", len(pending))
	}
}

// Anyone who can write guard/ cannot forge a decision: an edited log line
// reads unverified and is not honoured.
func TestForgedDecisionIsNotHonoured(t *testing.T) {
	l := newLoop(t, `{}`)
	first := l.ask(t, "agent-1")
	logPath := filepath.Join(l.dir, "guard", "decisions.ndjson")
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	forged := `{"type":"decided","review_id":"` + first.ReviewID + `","at":"2026-07-24T10:01:00.000Z","status":"approved","by":"alice"}` + "\n"
	if _, err := f.WriteString(forged); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, err := l.eng.ReviewStatus(context.Background(), first.ReviewID)
	if err != nil || st.Status != reviewlog.Unverified || len(st.Integrity) == 0 {
		t.Fatalf("status of a forged approval: %+v %v", st, err)
	}
	if a := l.ask(t, "agent-1"); a.Decision != guard.Review || has(a, reviewlog.RuleHumanApproved) {
		t.Fatalf("a forged approval was honoured: %+v", a)
	}
	rep, err := l.log.Audit(context.Background(), nil)
	if err != nil || len(rep.Findings) == 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
}

// Whoever can write guard/ cannot lift a rejection by editing the log: the
// signed rejection in the chain still holds for the identical question.
func TestRejectionHoldsWhenTheLogLosesIt(t *testing.T) {
	l := newLoop(t, `{"rejectionHoldHours": 2}`)
	first := l.ask(t, "agent-1")
	if _, err := l.decider.Decide(context.Background(), first.ReviewID, reviewlog.Rejected, "never settled", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.dir, "guard", "decisions.ndjson"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l.advance(time.Minute)
	held := l.ask(t, "agent-1")
	if held.Decision != guard.Block || !has(held, reviewlog.RuleHumanRejected) || held.ReviewID != first.ReviewID {
		t.Fatalf("after the log was emptied: %+v", held)
	}
	// Another caller's question, and the same caller after the hold, are not held.
	if a := l.ask(t, "agent-2"); a.Decision == guard.Block {
		t.Fatalf("another caller was held: %+v", a)
	}
	l.advance(2 * time.Hour)
	if a := l.ask(t, "agent-1"); a.Decision == guard.Block {
		t.Fatalf("held past the hold: %+v", a)
	}
}

// An approval covers what the reviewer saw: the same resource, and no
// reason to review beyond the ones it was asked for. A payment to the
// counterparty that stays open after the approval (a new open_partial)
// opens a new review; another resource is another question.
func TestApprovalCoversOnlyWhatWasSeen(t *testing.T) {
	l := newLoop(t, `{"reviewAbove": "0.05"}`)
	const fresh = "0x00000000000000000000000000000000000000c3"
	ctx := context.Background()
	ask := func(resource string) Answer {
		t.Helper()
		a, err := l.eng.Check(ctx, "agent-1", Question{Counterparty: fresh, Amount: "0.10", Resource: resource})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	first := ask("https://a.example/x")
	if first.Decision != guard.Review || !has(first, guard.RuleReviewAbove) || has(first, guard.RuleOpenPartial) {
		t.Fatalf("first: %+v", first)
	}
	st, err := l.eng.ReviewStatus(ctx, first.ReviewID)
	if err != nil || st.Terms == nil || st.Terms.Resource != "https://a.example/x" || st.Terms.AmountAtomic != "100000" || st.TermsReceipt == "" {
		t.Fatalf("the review's terms: %+v %v", st, err)
	}
	if _, err := l.decider.Decide(ctx, first.ReviewID, reviewlog.Approved, "a only", "alice"); err != nil {
		t.Fatal(err)
	}
	if other := ask("https://b.example/y"); other.Decision != guard.Review || other.ReviewID == first.ReviewID {
		t.Fatalf("another resource: %+v, want its own review", other)
	}
	rec, err := simrec.New(l.dir, "run-2", start.Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(unsettled("op-2", fresh, "https://a.example/x")); err != nil {
		t.Fatal(err)
	}
	wider := ask("https://a.example/x")
	if wider.Decision != guard.Review || !has(wider, guard.RuleOpenPartial) || wider.ReviewID == first.ReviewID {
		t.Fatalf("with a new open_partial: %+v, want a new review", wider)
	}
	if st, err := l.eng.ReviewStatus(ctx, first.ReviewID); err != nil || st.UsedAt != "" {
		t.Fatalf("the approval was used for a question it did not cover: %+v %v", st, err)
	}
}

// SetPolicy checks the new policy first: one that reads history under a
// template that does not exist is refused, and the running one stays.
func TestSetPolicyKeepsTheRunningOneOnError(t *testing.T) {
	l := newLoop(t, `{"reviewAbove": "5"}`)
	before := l.eng.Policy()
	bad := *before
	bad.HistoryTemplates = []string{"no-such-template"}
	if err := l.eng.SetPolicy(&bad, nil); err == nil || !strings.Contains(err.Error(), "no-such-template") {
		t.Fatalf("a policy naming a missing template: %v", err)
	}
	if err := l.eng.SetPolicy(nil, nil); err == nil {
		t.Fatal("a nil policy was accepted")
	}
	if l.eng.Policy() != before {
		t.Fatal("a refused policy replaced the running one")
	}
	a, err := l.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "2.00"})
	if err != nil || a.Decision == guard.Review && has(a, guard.RuleReviewAbove) {
		t.Fatalf("the running policy (reviewAbove 5) no longer answers: %+v %v", a, err)
	}
}
