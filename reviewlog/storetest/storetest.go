// Package storetest is the contract every reviewlog.Store keeps, as one
// test suite: the file store's tests and the PostgreSQL store's tests run
// the same cases. It drives the review log the way the decision engine
// does (engine.Ask, the engine's review outcome policy over the log, with a
// hook that seals the answer's receipt; DecideReview with a reviewer's
// signature), through several handles on one store at once, as replicas
// would.
package storetest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Factory makes a fresh, empty store for one test: a handle on it, a way
// to open another handle on that same store (another process or
// replica), and the hands of whoever can write the store's medium
// directly (the volume, the database) without the guard's keys.
type Factory func(t testing.TB) (reviewlog.Store, func() reviewlog.Store, Tamperer)

// Tamperer writes a store behind the guard's back, as a volume writer or
// a database writer can.
type Tamperer interface {
	// AppendLogLine appends line (a newline is added) to the review log.
	AppendLogLine(t *testing.T, line []byte)
	// EmptyLog leaves the review log without a line.
	EmptyLog(t *testing.T)
	// EditLog replaces, in place, every old in the line of the review log
	// that holds the review id with new, of the same length (the log keeps
	// its size, so no reader takes it for a rewritten log).
	EditLog(t *testing.T, reviewID string, old, new string)
}

// RowsChecker is a Tamperer of a store that keeps the review state in rows
// beside the log's lines (the PostgreSQL store): CheckRows fails the test
// where the rows and the lines disagree, and says how many reviews the
// rows hold open.
type RowsChecker interface {
	CheckRows(t *testing.T) (open int)
}

// checkRows runs the store's RowsChecker, if it has one, and wants open
// reviews open (-1: any number).
func (f *fixture) checkRows(t *testing.T, open int) {
	t.Helper()
	rc, ok := f.tamper.(RowsChecker)
	if !ok {
		return
	}
	if n := rc.CheckRows(t); open >= 0 && n != open {
		t.Fatalf("the rows hold %d open reviews, want %d", n, open)
	}
}

// fixture is one store under test with its signers and clock.
type fixture struct {
	t        testing.TB
	another  func() reviewlog.Store
	tamper   Tamperer
	service  *reviewlog.Chains
	reviewer *reviewlog.Chains
	trusted  reviewlog.Reviewers
	mu       sync.Mutex
	now      time.Time
}

const (
	reviewerID = "alice"
	tenant     = "contract"
)

func newFixture(t testing.TB, f Factory) *fixture {
	_, sk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, rk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	st, another, tamper := f(t)
	t.Cleanup(func() { st.Close() })
	return &fixture{
		t: t, another: another, tamper: tamper,
		service:  &reviewlog.Chains{Signer: noa.NewKeySigner(sk), Tenant: tenant},
		reviewer: &reviewlog.Chains{Signer: noa.NewKeySigner(rk), Tenant: tenant},
		trusted:  reviewlog.Reviewers{reviewerID: rk.Public().(ed25519.PublicKey)},
		now:      time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC),
	}
}

func (f *fixture) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fixture) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// log opens a review log on a new handle of the store.
func (f *fixture) log(ttl time.Duration) *reviewlog.Log {
	st := f.another()
	f.t.Cleanup(func() { st.Close() })
	return reviewlog.OpenStore(st, reviewlog.Options{Now: f.clock, LockWait: 20 * time.Second, ReviewTTL: ttl,
		Reviewers: func() (reviewlog.Reviewers, error) { return f.trusted, nil }})
}

func question(n int) guard.Question { return questionTo("0xabc", n) }

// questionTo is question n asked of counterparty cp.
func questionTo(cp string, n int) guard.Question {
	return guard.Question{Counterparty: cp, Amount: fmt.Sprintf("0.%02d", n), Asset: "USDC", Template: "x402-buyer"}
}

func paramsHash(n int) string { return fmt.Sprintf("hmac-sha256:%064x", n) }

var reasons = []guard.Reason{{Rule: "open_payments", Detail: "an open paid operation"}}

// ask answers question n for caller as the engine does: the guard says
// decision, and the hook seals the answer's receipt.
func (f *fixture) ask(ctx context.Context, l *reviewlog.Log, caller string, n int, decision string) (reviewlog.AskOutcome, error) {
	return f.askWhy(ctx, l, caller, n, decision, reasons)
}

// askWhy is ask with the reasons the guard gave.
func (f *fixture) askWhy(ctx context.Context, l *reviewlog.Log, caller string, n int, decision string, reasons []guard.Reason) (reviewlog.AskOutcome, error) {
	return f.askOf(ctx, l, caller, "0xabc", n, decision, reasons)
}

// askOf is askWhy asked of counterparty cp.
func (f *fixture) askOf(ctx context.Context, l *reviewlog.Log, caller, cp string, n int, decision string, reasons []guard.Reason) (reviewlog.AskOutcome, error) {
	return f.askCapped(ctx, l, caller, cp, n, decision, reasons, 50)
}

// askCapped is askOf with the caller's pending reviews capped at maxPending.
func (f *fixture) askCapped(ctx context.Context, l *reviewlog.Log, caller, cp string, n int, decision string, reasons []guard.Reason, maxPending int) (reviewlog.AskOutcome, error) {
	return f.askQuorum(ctx, l, caller, cp, n, decision, reasons, maxPending, 0)
}

// askQuorum is askCapped under a policy whose quorum for the amount is
// approvals.
func (f *fixture) askQuorum(ctx context.Context, l *reviewlog.Log, caller, cp string, n int, decision string, reasons []guard.Reason, maxPending, approvals int) (reviewlog.AskOutcome, error) {
	return engine.Ask(ctx, l, engine.AskRequest{Caller: caller, Question: questionTo(cp, n), ParamsHash: paramsHash(n), Decision: decision, Reasons: reasons,
		ApprovalTTL: time.Hour, RejectionHold: time.Hour, MaxPending: maxPending, Tenant: tenant, Approvals: approvals},
		func(tx reviewlog.Tx, out reviewlog.AskOutcome) error {
			if out.Kind == reviewlog.AskOpened {
				d, err := reviewlog.TermsDraft(out.Review, tx.At)
				if err != nil {
					return err
				}
				if _, err := f.service.Append(ctx, tx.Store, d); err != nil {
					return err
				}
			}
			verdict, action := noa.VerdictAllowed, fmt.Sprintf("check:%s:%d", caller, n)
			var rule *string
			switch out.Kind {
			case reviewlog.AskOpened, reviewlog.AskReused:
				verdict, action = noa.VerdictDeferred, reviewlog.ActionID(out.Review.ID)
			case reviewlog.AskApproved:
				r := reviewlog.RuleHumanApproved
				rule, action = &r, reviewlog.ActionID(out.Review.ID)
			case reviewlog.AskRejected:
				verdict, action = noa.VerdictBlocked, reviewlog.ActionID(out.Review.ID)
			}
			_, err := f.service.Append(ctx, tx.Store, noa.Draft{TS: tx.At,
				Agent:      noa.Agent{ID: caller, Principal: noa.PrincipalService},
				Action:     noa.Action{ID: action, Canonical: "payment.x402", RiskClass: "IRREVERSIBLE", ParamsHash: paramsHash(n)},
				Governance: noa.Governance{Mode: "approvals_on", Verdict: verdict, RuleID: rule}})
			return err
		})
}

// decide has the trusted reviewer decide review id, signing it.
func (f *fixture) decide(ctx context.Context, l *reviewlog.Log, id, status string) (reviewlog.Review, error) {
	return f.decideNote(ctx, l, id, status, "contract")
}

// decideNote is decide with the reviewer's note.
func (f *fixture) decideNote(ctx context.Context, l *reviewlog.Log, id, status, note string) (reviewlog.Review, error) {
	return f.decideAs(ctx, l, f.reviewer, reviewerID, id, status, note)
}

// decideAs is decideNote by reviewer by, signing with chains.
func (f *fixture) decideAs(ctx context.Context, l *reviewlog.Log, chains *reviewlog.Chains, by, id, status, note string) (reviewlog.Review, error) {
	return l.DecideReview(ctx, id, status, note, by, func(tx reviewlog.Tx) error {
		at, err := time.Parse(time.RFC3339Nano, tx.Review.DecidedAt)
		if err != nil {
			return err
		}
		verdict := noa.VerdictBlocked
		if status == reviewlog.Approved {
			verdict = noa.VerdictAllowed
		}
		rule := reviewlog.RuleHumanReview
		ph, err := reviewlog.DecisionParamsHash(tx.Review, status)
		if err != nil {
			return err
		}
		_, err = chains.Append(ctx, tx.Store, noa.Draft{TS: at,
			Agent:  noa.Agent{ID: by, Principal: noa.PrincipalHuman},
			Action: noa.Action{ID: reviewlog.ActionID(tx.Review.ID), Canonical: "payment.x402", RiskClass: "IRREVERSIBLE", ParamsHash: ph},
			Governance: noa.Governance{Mode: "approvals_on", Verdict: verdict, RuleID: &rule,
				Approval: &noa.Approval{By: by, At: noa.FormatTS(at)}}})
		return err
	})
}

// verifyAll verifies every chain of the store and returns the receipts.
func (f *fixture) verifyAll(ctx context.Context) int {
	f.t.Helper()
	st := f.another()
	defer st.Close()
	total := 0
	err := st.View(ctx, func(r reviewlog.Reader) error {
		kr, err := r.Keyring(ctx)
		if err != nil {
			return err
		}
		chains, err := reviewlog.ListChains(ctx, r)
		if err != nil {
			return err
		}
		for _, c := range chains {
			res, err := reviewlog.VerifySegments(ctx, r, c.ID, noa.Options{Keyring: kr, InFileOrder: true})
			if err != nil {
				return err
			}
			if res.Verdict != noa.Valid {
				return fmt.Errorf("chain %s: %s", c.ID, res.Line())
			}
			if res.Count != c.Length {
				return fmt.Errorf("chain %s: %d receipts verified, the listing says %d", c.ID, res.Count, c.Length)
			}
			total += res.Count
		}
		return nil
	})
	if err != nil {
		f.t.Fatalf("verify the chains: %v", err)
	}
	return total
}

// Run runs the contract against stores made by factory.
func Run(t *testing.T, factory Factory) {
	t.Run("Decisions", func(t *testing.T) { testDecisions(t, newFixture(t, factory)) })
	t.Run("IdempotentAcrossHandles", func(t *testing.T) { testIdempotent(t, newFixture(t, factory)) })
	t.Run("DecidedOnce", func(t *testing.T) { testDecidedOnce(t, newFixture(t, factory)) })
	t.Run("ApprovalHonouredOnce", func(t *testing.T) { testApproval(t, newFixture(t, factory)) })
	t.Run("RejectionHolds", func(t *testing.T) { testRejection(t, newFixture(t, factory)) })
	t.Run("ChainStaysLinear", func(t *testing.T) { testLinear(t, newFixture(t, factory)) })
	t.Run("Expiry", func(t *testing.T) { testExpiry(t, newFixture(t, factory)) })
	t.Run("FailedHookWritesNothing", func(t *testing.T) { testFailedHook(t, newFixture(t, factory)) })
	t.Run("ReadersBesideWritersSeeNoRewrite", func(t *testing.T) { testReadersBesideWriters(t, newFixture(t, factory)) })
	t.Run("ForgedDecisionReadsUnverified", func(t *testing.T) { testForgedDecision(t, newFixture(t, factory)) })
	t.Run("RejectionSurvivesAnEmptiedLog", func(t *testing.T) { testRejectionSurvives(t, newFixture(t, factory)) })
	t.Run("ExactAcrossManyReplicas", func(t *testing.T) { testManyReplicas(t, newFixture(t, factory)) })
	t.Run("TornTailRepaired", func(t *testing.T) { testTornTail(t, newFixture(t, factory)) })
	runAdversary(t, factory)
	runLedger(t, factory)
	runQuorum(t, factory)
	runFindings(t, factory)
}

// A log that ends in a line the log cannot read (a write cut short on a
// volume; on a database, only a writer behind the guard's back leaves
// one) is repaired by the next decision: its record follows a repair
// record naming the line, and the log reads whole after it — a decision
// that reads by index runs on the fold for it.
func testTornTail(t *testing.T, f *fixture) {
	ctx := t.Context()
	if _, err := f.ask(ctx, f.log(0), "agent-1", 13, guard.Review); err != nil {
		t.Fatal(err)
	}
	f.tamper.AppendLogLine(t, []byte(`{"type":"opened","review_id":"torn`))
	out, err := f.ask(ctx, f.log(0), "agent-1", 14, guard.Review)
	if err != nil || out.Kind != reviewlog.AskOpened {
		t.Fatalf("the question after a torn tail: %+v %v, want a review opened", out, err)
	}
	all, err := f.log(0).List(ctx, true)
	if err != nil || len(all) != 2 {
		t.Fatalf("the log after the repair: %d reviews, %v; want both, read whole", len(all), err)
	}
	if again, err := f.ask(ctx, f.log(0), "agent-1", 14, guard.Review); err != nil || again.Kind != reviewlog.AskReused || again.Review.ID != out.Review.ID {
		t.Fatalf("the question again: %+v %v, want the review reused", again, err)
	}
}

// A decided line written behind the guard's back, with no reviewer's
// signature, decides nothing: the review reads unverified and the caller's
// retry is never the approval.
func testForgedDecision(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 11, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	f.tamper.AppendLogLine(t, []byte(fmt.Sprintf(`{"type":"decided","review_id":%q,"at":"2026-12-01T09:00:30.000Z","status":"approved","by":%q}`, out.Review.ID, reviewerID)))
	r, err := f.log(0).Get(ctx, out.Review.ID)
	if err != nil || r.Status != reviewlog.Unverified || len(r.Integrity) == 0 {
		t.Fatalf("after a forged approval: %+v %v, want unverified with the reason", r, err)
	}
	retry, err := f.ask(ctx, f.log(0), "agent-1", 11, guard.Review)
	if err != nil || retry.Kind == reviewlog.AskApproved {
		t.Fatalf("the retry after a forged approval: %+v %v", retry, err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Approved); !errors.Is(err, reviewlog.ErrAlreadyDecided) {
		t.Fatalf("a real decision on the forged one: %v (the log says decided: the agent's next question opens one to sign)", err)
	}
	f.checkRows(t, 1)
}

// A signed rejection holds even where the review log lost every line: the
// chains' receipts name the caller's question.
func testRejectionSurvives(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 12, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Rejected); err != nil {
		t.Fatal(err)
	}
	f.tamper.EmptyLog(t)
	if list, err := f.log(0).List(ctx, true); err != nil || len(list) != 0 {
		t.Fatalf("the emptied log still lists %d reviews (%v): the tamperer did not empty it", len(list), err)
	}
	again, err := f.ask(ctx, f.log(0), "agent-1", 12, guard.Allow)
	if err != nil || again.Kind != reviewlog.AskRejected {
		t.Fatalf("the question after the log was emptied: %+v %v, want the rejection to hold", again, err)
	}
}

func testDecisions(t *testing.T, f *fixture) {
	ctx := t.Context()
	l := f.log(0)
	plain, err := f.ask(ctx, l, "agent-1", 1, guard.Allow)
	if err != nil || plain.Kind != reviewlog.AskPlain {
		t.Fatalf("allow: %+v %v", plain, err)
	}
	out, err := f.ask(ctx, l, "agent-1", 2, guard.Review)
	if err != nil || out.Kind != reviewlog.AskOpened || out.Review.Status != reviewlog.Pending {
		t.Fatalf("review: %+v %v", out, err)
	}
	r, ids, err := f.log(0).Verified(ctx, out.Review.ID)
	if err != nil || r.Status != reviewlog.Pending || len(ids) != 2 || r.Tampered || r.TermsReceipt != ids[0] {
		t.Fatalf("another handle reads the review: %+v %v %v", r, ids, err)
	}
	list, err := f.log(0).List(ctx, false)
	if err != nil || len(list) != 1 || list[0].ID != out.Review.ID || list[0].Caller != "agent-1" || list[0].Amount != "0.02" {
		t.Fatalf("pending list: %+v %v", list, err)
	}
	if n := f.verifyAll(ctx); n != 3 {
		t.Fatalf("%d receipts, want 3 (the allow, the review's signed terms and its answer)", n)
	}
}

func testIdempotent(t *testing.T, f *fixture) {
	ctx := t.Context()
	const askers = 12
	logs := make([]*reviewlog.Log, 3)
	for i := range logs {
		logs[i] = f.log(0)
	}
	var wg sync.WaitGroup
	outs := make([]reviewlog.AskOutcome, askers)
	errs := make([]error, askers)
	for i := range askers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = f.ask(ctx, logs[i%len(logs)], "agent-1", 7, guard.Review)
		}()
	}
	wg.Wait()
	opened := 0
	for i, o := range outs {
		if errs[i] != nil {
			t.Fatalf("asker %d: %v", i, errs[i])
		}
		if o.Review.ID != outs[0].Review.ID {
			t.Fatalf("asker %d got review %s, asker 0 %s: one question opened two reviews", i, o.Review.ID, outs[0].Review.ID)
		}
		if o.Kind == reviewlog.AskOpened {
			opened++
		} else if o.Kind != reviewlog.AskReused {
			t.Fatalf("asker %d: %s", i, o.Kind)
		}
	}
	if opened != 1 {
		t.Fatalf("%d askers opened the review, want 1", opened)
	}
	f.checkRows(t, 1)
	// Twelve answers, twelve receipts in the chain; the review lists the
	// one that opened it (the same answer again says nothing new), so
	// reading it costs the same however often it was asked about.
	if _, ids, err := f.log(0).Verified(ctx, outs[0].Review.ID); err != nil || len(ids) != 2 {
		t.Fatalf("the review's receipts: %v %v, want its signed terms and the one DEFERRED", ids, err)
	}
	// Another caller's identical question is another review.
	other, err := f.ask(ctx, logs[0], "agent-2", 7, guard.Review)
	if err != nil || other.Kind != reviewlog.AskOpened || other.Review.ID == outs[0].Review.ID {
		t.Fatalf("another caller: %+v %v", other, err)
	}
	// One receipt an answer, and the signed terms of the two reviews.
	if n := f.verifyAll(ctx); n != askers+1+2 {
		t.Fatalf("%d receipts, want %d", n, askers+1+2)
	}
	// Asked again a day later, the pending review still answers: one open
	// review per question, whatever its age.
	f.advance(24 * time.Hour)
	if later, err := f.ask(ctx, logs[1], "agent-1", 7, guard.Review); err != nil || later.Kind != reviewlog.AskReused || later.Review.ID != outs[0].Review.ID {
		t.Fatalf("a day later: %+v %v, want review %s reused", later, err, outs[0].Review.ID)
	}
	f.checkRows(t, 2)
}

func testDecidedOnce(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 3, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	const deciders = 4
	var wg sync.WaitGroup
	errs := make([]error, deciders)
	for i := range deciders {
		l := f.log(0)
		status := reviewlog.Approved
		if i%2 == 1 {
			status = reviewlog.Rejected
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = f.decide(ctx, l, out.Review.ID, status)
		}()
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, reviewlog.ErrAlreadyDecided):
			t.Fatalf("decider %d: %v, want success or ErrAlreadyDecided", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d decisions won, want 1", won)
	}
	r, ids, err := f.log(0).Verified(ctx, out.Review.ID)
	if err != nil || (r.Status != reviewlog.Approved && r.Status != reviewlog.Rejected) || len(ids) != 3 || len(r.Integrity) != 0 {
		t.Fatalf("decided review: %+v receipts %v %v", r, ids, err)
	}
	if _, err := f.log(0).DecideReview(ctx, "00000000-0000-4000-8000-000000000000", reviewlog.Approved, "", reviewerID, nil); !errors.Is(err, reviewlog.ErrUnknownReview) {
		t.Fatalf("unknown review: %v", err)
	}
	f.verifyAll(ctx)
}

func testApproval(t *testing.T, f *fixture) {
	ctx := t.Context()
	l := f.log(0)
	out, err := f.ask(ctx, l, "agent-1", 4, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Approved); err != nil {
		t.Fatal(err)
	}
	other, err := f.ask(ctx, f.log(0), "agent-2", 4, guard.Review)
	if err != nil || other.Kind != reviewlog.AskOpened {
		t.Fatalf("another caller is not covered by the approval: %+v %v", other, err)
	}
	first, err := f.ask(ctx, f.log(0), "agent-1", 4, guard.Review)
	if err != nil || first.Kind != reviewlog.AskApproved || first.Review.ID != out.Review.ID {
		t.Fatalf("retry after the approval: %+v %v", first, err)
	}
	second, err := f.ask(ctx, l, "agent-1", 4, guard.Review)
	if err != nil || second.Kind != reviewlog.AskOpened {
		t.Fatalf("the approval was honoured twice: %+v %v", second, err)
	}
	blocked, err := f.ask(ctx, l, "agent-1", 5, guard.Block)
	if err != nil || blocked.Kind != reviewlog.AskPlain {
		t.Fatalf("block: %+v %v", blocked, err)
	}
	r, ids, err := f.log(0).Verified(ctx, out.Review.ID)
	if err != nil || r.Status != reviewlog.Approved || r.UsedAt == "" || len(ids) != 4 {
		t.Fatalf("used approval: %+v %v %v (want the terms, DEFERRED, HUMAN and the use)", r, ids, err)
	}
	f.verifyAll(ctx)
}

func testRejection(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 6, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Rejected); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		again, err := f.ask(ctx, f.log(0), "agent-1", 6, guard.Review)
		if err != nil || again.Kind != reviewlog.AskRejected || again.Review.ID != out.Review.ID {
			t.Fatalf("ask %d after the rejection: %+v %v", i, again, err)
		}
	}
	if _, ids, err := f.log(0).Verified(ctx, out.Review.ID); err != nil || len(ids) != 4 {
		t.Fatalf("the rejected review's receipts: %v %v, want the terms, DEFERRED, HUMAN and the first hold", ids, err)
	}
	allowed, err := f.ask(ctx, f.log(0), "agent-1", 6, guard.Allow)
	if err != nil || allowed.Kind != reviewlog.AskRejected {
		t.Fatalf("the guard now says allow, the hold still holds: %+v %v", allowed, err)
	}
	f.advance(2 * time.Hour)
	after, err := f.ask(ctx, f.log(0), "agent-1", 6, guard.Review)
	if err != nil || after.Kind != reviewlog.AskOpened {
		t.Fatalf("after the hold: %+v %v", after, err)
	}
	f.verifyAll(ctx)
}

func testLinear(t *testing.T, f *fixture) {
	ctx := t.Context()
	const handles, each = 3, 8
	var wg sync.WaitGroup
	errs := make(chan error, handles*each)
	for h := range handles {
		l := f.log(0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				decision := guard.Allow
				if i%3 == 0 {
					decision = guard.Review
				}
				if _, err := f.ask(ctx, l, fmt.Sprintf("agent-%d", h), 10+i, decision); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// One receipt an answer, and the signed terms of each review opened.
	if n := f.verifyAll(ctx); n != handles*each+handles*3 {
		t.Fatalf("%d receipts verified, want %d", n, handles*each+handles*3)
	}
	list, err := f.log(0).List(ctx, true)
	if err != nil || len(list) != handles*3 {
		t.Fatalf("%d reviews, want %d: %v", len(list), handles*3, err)
	}
}

func testExpiry(t *testing.T, f *fixture) {
	ctx := t.Context()
	l := f.log(time.Minute)
	out, err := f.ask(ctx, l, "agent-1", 8, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	f.advance(2 * time.Minute)
	if r, err := f.log(time.Minute).Get(ctx, out.Review.ID); err != nil || r.Status != reviewlog.Expired {
		t.Fatalf("after the TTL: %+v %v", r, err)
	}
	if _, err := f.decide(ctx, f.log(time.Minute), out.Review.ID, reviewlog.Approved); !errors.Is(err, reviewlog.ErrExpired) {
		t.Fatalf("deciding an expired review: %v, want ErrExpired", err)
	}
	again, err := f.ask(ctx, l, "agent-1", 8, guard.Review)
	if err != nil || again.Kind != reviewlog.AskOpened || again.Review.ID == out.Review.ID {
		t.Fatalf("the question after expiry opens a new review: %+v %v", again, err)
	}
	f.checkRows(t, 1)
}

func testFailedHook(t *testing.T, f *fixture) {
	ctx := t.Context()
	l := f.log(0)
	boom := errors.New("the signer is down")
	_, err := engine.Ask(ctx, l, engine.AskRequest{Caller: "agent-1", Question: question(9), ParamsHash: paramsHash(9), Decision: guard.Review, Reasons: reasons},
		func(reviewlog.Tx, reviewlog.AskOutcome) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Ask with a failing hook: %v", err)
	}
	list, err := f.log(0).List(ctx, true)
	if err != nil || len(list) != 0 {
		t.Fatalf("a failed answer left a review: %+v %v", list, err)
	}
	if n := f.verifyAll(ctx); n != 0 {
		t.Fatalf("a failed answer left %d receipts", n)
	}
	if out, err := f.ask(ctx, l, "agent-1", 9, guard.Review); err != nil || out.Kind != reviewlog.AskOpened || !strings.Contains(out.Review.ParamsHash, "hmac-sha256:") {
		t.Fatalf("after the failure: %+v %v", out, err)
	}
}

// Readers of one log handle running beside its writers never see the log
// go backwards: a read that began before an append must not make the fold
// think the log was rewritten (a false finding, and a full re-read).
func testReadersBesideWriters(t *testing.T, f *fixture) {
	ctx := t.Context()
	l := f.log(0)
	other := f.log(0)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				writer := l
				if i%2 == 1 {
					writer = other
				}
				if _, err := f.ask(ctx, writer, fmt.Sprintf("agent-%d", w), 20+i, guard.Review); err != nil {
					errs <- err
				}
			}
		}()
	}
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				if _, err := l.List(ctx, true); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	findings, err := l.Findings(ctx)
	if err != nil || len(findings) != 0 {
		t.Fatalf("findings after concurrent reads and appends: %+v %v, want none", findings, err)
	}
	if list, err := l.List(ctx, true); err != nil || len(list) != 20 {
		t.Fatalf("%d reviews, want 20: %v", len(list), err)
	}
}

// Bench measures answering check_before_pay through the store: 8
// goroutines a CPU, each a caller of its own asking 8 questions in turn
// (half allow, half review: a pending review reused after its first
// answer), spread over handles handles on the store (replicas). With
// shared, every caller asks of one counterparty; otherwise each caller
// asks of its own. count, when set, says how many statements and round
// trips the store has sent so far; the bench reports them per decision.
func Bench(b *testing.B, factory Factory, handles int, shared bool, count func() (statements, trips int64)) {
	f := newFixture(b, factory)
	logs := make([]*reviewlog.Log, handles)
	for i := range logs {
		logs[i] = f.log(0)
	}
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(8)
	b.ReportAllocs()
	var stmts0, trips0 int64
	if count != nil {
		stmts0, trips0 = count()
	}
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1))
		l, caller := logs[i%handles], fmt.Sprintf("bench-%d", i)
		cp := fmt.Sprintf("0x%040x", i)
		if shared {
			cp = "0xabc"
		}
		for k := 0; pb.Next(); k++ {
			decision := guard.Allow
			if k%2 == 1 {
				decision = guard.Review
			}
			if _, err := f.askOf(ctx, l, caller, cp, k%8, decision, reasons); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	b.StopTimer()
	if count != nil {
		stmts, trips := count()
		b.ReportMetric(float64(stmts-stmts0)/float64(b.N), "stmts/decision")
		b.ReportMetric(float64(trips-trips0)/float64(b.N), "trips/decision")
	}
	f.verifyAll(ctx)
}

// Every commitment holds when many replicas answer many callers at once,
// each on its own counterparty (so that a store with finer locks runs
// them side by side): a question asked of every replica at once opens one
// review; an approval is used once; a rejection holds for every retry;
// the pending cap lets exactly the cap through. Every chain verifies.
func testManyReplicas(t *testing.T, f *fixture) {
	ctx := t.Context()
	const replicas, callers, rounds = 6, 4, 6
	logs := make([]*reviewlog.Log, replicas)
	for i := range logs {
		logs[i] = f.log(0)
	}
	cp := func(c int) string { return fmt.Sprintf("0x%040x", c+1) }
	who := func(c int) string { return fmt.Sprintf("agent-%d", c) }
	// For each caller: question 20 approved, question 21 rejected.
	approved := make([]string, callers)
	for c := range callers {
		for n, status := range map[int]string{20: reviewlog.Approved, 21: reviewlog.Rejected} {
			out, err := f.askOf(ctx, logs[c%replicas], who(c), cp(c), n, guard.Review, reasons)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.decide(ctx, logs[(c+1)%replicas], out.Review.ID, status); err != nil {
				t.Fatal(err)
			}
			if status == reviewlog.Approved {
				approved[c] = out.Review.ID
			}
		}
	}
	type result struct {
		caller, n int
		out       reviewlog.AskOutcome
		err       error
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	for c := range callers {
		for r := range rounds {
			for _, n := range []int{20, 21, 22} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, err := f.askOf(ctx, logs[(c+r+n)%replicas], who(c), cp(c), n, guard.Review, reasons)
					mu.Lock()
					results = append(results, result{c, n, out, err})
					mu.Unlock()
				}()
			}
			// The cap: a caller of its own asks distinct questions with at
			// most 3 pending.
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := f.askCapped(ctx, logs[(c+r)%replicas], "capped-"+who(c), cp(c), 30+r, guard.Review, reasons, 3)
				mu.Lock()
				results = append(results, result{c, 30, out, err})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	type tally struct{ used, rejected, opened, reused, full int }
	per := make([]tally, callers)
	pending := map[int]map[string]bool{}
	for _, r := range results {
		if r.err != nil {
			t.Fatalf("caller %d question %d: %v", r.caller, r.n, r.err)
		}
		tl := &per[r.caller]
		switch {
		case r.n == 20 && r.out.Kind == reviewlog.AskApproved:
			if r.out.Review.ID != approved[r.caller] {
				t.Fatalf("caller %d used review %s, not its approval %s", r.caller, r.out.Review.ID, approved[r.caller])
			}
			tl.used++
		case r.n == 21:
			if r.out.Kind != reviewlog.AskRejected {
				t.Fatalf("caller %d: the rejected question answered %s, want the rejection to hold", r.caller, r.out.Kind)
			}
			tl.rejected++
		case r.n == 30 && r.out.Kind == reviewlog.AskQueueFull:
			tl.full++
		case r.out.Kind == reviewlog.AskOpened:
			tl.opened++
			if r.n == 22 {
				if pending[r.caller] == nil {
					pending[r.caller] = map[string]bool{}
				}
				pending[r.caller][r.out.Review.ID] = true
			}
		case r.out.Kind == reviewlog.AskReused:
			tl.reused++
		default:
			t.Fatalf("caller %d question %d: %s", r.caller, r.n, r.out.Kind)
		}
	}
	for c, tl := range per {
		// Question 20: one use of the approval, then a review opened
		// once and reused; question 22: opened once and reused; the
		// capped caller: 3 opened, the rest refused.
		if tl.used != 1 {
			t.Errorf("caller %d used its approval %d times, want once", c, tl.used)
		}
		if tl.rejected != rounds {
			t.Errorf("caller %d: the rejection held %d times, want %d", c, tl.rejected, rounds)
		}
		if tl.opened != 2+3 || tl.reused != 2*rounds-1-2 || tl.full != rounds-3 {
			t.Errorf("caller %d: %d opened, %d reused, %d refused by the cap; want 5 (questions 20 and 22, and 3 under the cap), %d and %d", c, tl.opened, tl.reused, tl.full, 2*rounds-1-2, rounds-3)
		}
		if len(pending[c]) > 1 {
			t.Errorf("caller %d: question 22 opened %d reviews, want 1", c, len(pending[c]))
		}
	}
	n := f.verifyAll(ctx)
	// Per caller: question 20 opened again after its approval's use,
	// question 22, and 3 under the cap.
	f.checkRows(t, callers*5)
	var chains []reviewlog.ChainInfo
	if err := logs[0].Store().View(ctx, func(r reviewlog.Reader) (err error) {
		chains, err = reviewlog.ListChains(ctx, r)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d receipts in %d chains", n, len(chains))
}
