package storetest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// runQuorum is the two-person rule's part of the contract: a review whose
// signed terms need two approvals is approved, and its approval usable,
// only once two distinct trusted reviewers signed; whatever else is
// written to the store does not count.
func runQuorum(t *testing.T, factory Factory) {
	t.Run("QuorumTwoDistinctReviewers", func(t *testing.T) { testQuorum(t, newQuorumFixture(t, factory)) })
	t.Run("QuorumOneRejectionRejects", func(t *testing.T) { testQuorumRejection(t, newQuorumFixture(t, factory)) })
	t.Run("QuorumSignedTwiceCountsOnce", func(t *testing.T) { testQuorumTwice(t, newQuorumFixture(t, factory)) })
	t.Run("QuorumForgedApprovalsDoNotCount", func(t *testing.T) { testQuorumForged(t, newQuorumFixture(t, factory)) })
	t.Run("QuorumStoreWriterCannotLowerIt", func(t *testing.T) { testQuorumLowered(t, newQuorumFixture(t, factory)) })
	t.Run("QuorumRaisedOpensAnotherReview", func(t *testing.T) { testQuorumRaised(t, newQuorumFixture(t, factory)) })
}

// quorumFixture is a fixture with a second trusted reviewer, bob, and an
// untrusted key.
type quorumFixture struct {
	*fixture
	bob, mallory *reviewlog.Chains
	mallorySK    ed25519.PrivateKey
}

func newQuorumFixture(t *testing.T, factory Factory) *quorumFixture {
	f := newFixture(t, factory)
	_, bk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, mk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f.trusted["bob"] = bk.Public().(ed25519.PublicKey)
	return &quorumFixture{fixture: f, bob: &reviewlog.Chains{Signer: noa.NewKeySigner(bk), Tenant: tenant},
		mallory: &reviewlog.Chains{Signer: noa.NewKeySigner(mk), Tenant: tenant}, mallorySK: mk}
}

// askTwo asks question n of agent-1 under a policy that needs two approvals.
func (f *quorumFixture) askTwo(ctx context.Context, n int) (reviewlog.AskOutcome, error) {
	return f.askQuorum(ctx, f.log(0), "agent-1", "0xabc", n, guard.Review, reasons, 50, 2)
}

// signApproval appends, outside DecideReview (as anyone holding a key can),
// an approval of review id by agent by, signed with chains, over the
// partial approval's hash of the review's signed terms.
func (f *quorumFixture) signApproval(t *testing.T, chains *reviewlog.Chains, by, id string) {
	t.Helper()
	ctx := t.Context()
	r, err := f.log(0).Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ph, err := reviewlog.DecisionHash(r.TermsHash, reviewlog.Approved, "")
	if err != nil {
		t.Fatal(err)
	}
	rule := reviewlog.RuleHumanReview
	err = f.log(0).WithLock(ctx, func(tx reviewlog.Tx) error {
		_, err := chains.Append(ctx, tx.Store, noa.Draft{TS: tx.At,
			Agent:  noa.Agent{ID: by, Principal: noa.PrincipalHuman},
			Action: noa.Action{ID: reviewlog.ActionID(id), Canonical: "payment.x402", RiskClass: "IRREVERSIBLE", ParamsHash: ph},
			Governance: noa.Governance{Mode: "approvals_on", Verdict: noa.VerdictAllowed, RuleID: &rule,
				Approval: &noa.Approval{By: by, At: noa.FormatTS(tx.At)}}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// wantProgress reads review id and wants its status and progress text.
func (f *quorumFixture) wantProgress(t *testing.T, id, status, progress string) reviewlog.Review {
	t.Helper()
	r, err := f.log(0).Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != status || reviewlog.QuorumText(r) != progress {
		t.Fatalf("review %s reads %s, %q; want %s, %q (integrity %v)", id, r.Status, reviewlog.QuorumText(r), status, progress, r.Integrity)
	}
	return r
}

func testQuorum(t *testing.T, f *quorumFixture) {
	ctx := t.Context()
	out, err := f.askTwo(ctx, 31)
	if err != nil || out.Kind != reviewlog.AskOpened {
		t.Fatalf("open: %+v %v", out, err)
	}
	if out.Review.Terms == nil || out.Review.Terms.Approvals != 2 {
		t.Fatalf("the terms do not carry the quorum: %+v", out.Review.Terms)
	}
	id := out.Review.ID
	f.wantProgress(t, id, reviewlog.Pending, "0 of 2 approvals")
	if _, err := f.decideNote(ctx, f.log(0), id, reviewlog.Approved, "fine by me"); !errors.Is(err, reviewlog.ErrBadInput) {
		t.Fatalf("a first approval with a note: %v, want it refused (nothing written)", err)
	}
	r, err := f.decideNote(ctx, f.log(0), id, reviewlog.Approved, "")
	if err != nil || r.Status != reviewlog.Pending || reviewlog.QuorumText(r) != "1 of 2 approvals (alice)" {
		t.Fatalf("alice's approval: %+v %v, want pending, 1 of 2 approvals (alice)", r, err)
	}
	f.wantProgress(t, id, reviewlog.Pending, "1 of 2 approvals (alice)")
	f.advance(time.Second)
	again, err := f.askTwo(ctx, 31)
	if err != nil || again.Kind != reviewlog.AskReused || again.Review.ID != id {
		t.Fatalf("the question after one approval of two: %+v %v, want the review again", again, err)
	}
	r, err = f.decideAs(ctx, f.log(0), f.bob, "bob", id, reviewlog.Approved, "second pair of eyes")
	if err != nil || r.Status != reviewlog.Approved {
		t.Fatalf("bob's approval: %+v %v", r, err)
	}
	done := f.wantProgress(t, id, reviewlog.Approved, "2 of 2 approvals (alice, bob)")
	if done.DecidedBy != "bob" || done.Note != "second pair of eyes" || len(done.Integrity) != 0 {
		t.Fatalf("the approved review: %+v", done)
	}
	if _, err := f.decideAs(ctx, f.log(0), f.bob, "bob", id, reviewlog.Rejected, ""); !errors.Is(err, reviewlog.ErrAlreadyDecided) {
		t.Fatalf("a rejection after the quorum: %v", err)
	}
	used, err := f.askTwo(ctx, 31)
	if err != nil || used.Kind != reviewlog.AskApproved || used.Review.ID != id {
		t.Fatalf("the question after two approvals: %+v %v, want the approval", used, err)
	}
	next, err := f.askTwo(ctx, 31)
	if err != nil || next.Kind != reviewlog.AskOpened {
		t.Fatalf("the approval was honoured twice: %+v %v", next, err)
	}
	f.verifyAll(ctx)
	f.checkRows(t, 1)
	if rep := f.audit(ctx); strings.Contains(strings.Join(append(rep.Findings, rep.Incomplete...), "\n"), id) {
		t.Fatalf("audit of a complete two-person approval: %+v, want nothing said of %s", rep, id)
	}
}

func testQuorumRejection(t *testing.T, f *quorumFixture) {
	ctx := t.Context()
	out, err := f.askTwo(ctx, 32)
	if err != nil {
		t.Fatal(err)
	}
	id := out.Review.ID
	if _, err := f.decideNote(ctx, f.log(0), id, reviewlog.Approved, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := f.decideAs(ctx, f.log(0), f.bob, "bob", id, reviewlog.Rejected, "not this one"); err != nil {
		t.Fatal(err)
	}
	r := f.wantProgress(t, id, reviewlog.Rejected, "1 of 2 approvals (alice)")
	if r.DecidedBy != "bob" || r.Note != "not this one" || len(r.Integrity) != 0 {
		t.Fatalf("the rejected review: %+v", r)
	}
	held, err := f.askTwo(ctx, 32)
	if err != nil || held.Kind != reviewlog.AskRejected || held.Review.ID != id {
		t.Fatalf("the question after the rejection: %+v %v", held, err)
	}
}

// A reviewer's second approval, through the commands or signed by hand,
// counts once.
func testQuorumTwice(t *testing.T, f *quorumFixture) {
	ctx := t.Context()
	out, err := f.askTwo(ctx, 33)
	if err != nil {
		t.Fatal(err)
	}
	id := out.Review.ID
	if _, err := f.decideNote(ctx, f.log(0), id, reviewlog.Approved, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := f.decideNote(ctx, f.log(0), id, reviewlog.Approved, ""); !errors.Is(err, reviewlog.ErrAlreadyDecided) || !strings.Contains(fmt.Sprint(err), "counts once") {
		t.Fatalf("alice's second approval: %v, want it refused", err)
	}
	f.signApproval(t, f.reviewer, reviewerID, id)
	r := f.wantProgress(t, id, reviewlog.Pending, "1 of 2 approvals (alice)")
	if !strings.Contains(strings.Join(r.Integrity, "\n"), "counts once") {
		t.Fatalf("the second receipt is not named: %v", r.Integrity)
	}
	if rep := f.audit(ctx); !strings.Contains(strings.Join(rep.Findings, "\n"), "review "+id+": ") || !strings.Contains(strings.Join(rep.Findings, "\n"), "counts once") {
		t.Fatalf("audit: %+v, want alice's second approval named", rep)
	}
	if again, err := f.askTwo(ctx, 33); err != nil || again.Kind != reviewlog.AskReused {
		t.Fatalf("the question: %+v %v, want the review", again, err)
	}
}

// Approvals no trusted reviewer signed do not count: a key nobody trusts,
// a trusted name on an untrusted key, an approval line in the log.
func testQuorumForged(t *testing.T, f *quorumFixture) {
	ctx := t.Context()
	out, err := f.askTwo(ctx, 34)
	if err != nil {
		t.Fatal(err)
	}
	id := out.Review.ID
	if _, err := f.decideNote(ctx, f.log(0), id, reviewlog.Approved, ""); err != nil {
		t.Fatal(err)
	}
	f.signApproval(t, f.mallory, "mallory", id)
	f.signApproval(t, f.mallory, "bob", id)
	f.wantProgress(t, id, reviewlog.Pending, "1 of 2 approvals (alice)")
	if again, err := f.askTwo(ctx, 34); err != nil || again.Kind != reviewlog.AskReused {
		t.Fatalf("the question after forged approvals: %+v %v, want the review", again, err)
	}
	// A store writer completes it with a decided line: it reads unverified,
	// and is never honoured.
	f.tamper.AppendLogLine(t, []byte(fmt.Sprintf(`{"type":"decided","review_id":%q,"at":"2026-12-01T09:00:30.000Z","status":"approved","by":"bob"}`, id)))
	r := f.wantProgress(t, id, reviewlog.Unverified, "1 of 2 approvals (alice)")
	if !r.Tampered {
		t.Fatalf("a decided line with one approval of two is not tampering: %+v", r)
	}
	if retry, err := f.askTwo(ctx, 34); err != nil || retry.Kind == reviewlog.AskApproved {
		t.Fatalf("the question after the forged line: %+v %v", retry, err)
	}
	if rep := f.audit(ctx); !strings.Contains(strings.Join(rep.Findings, "\n"), "review "+id+": "+reviewlog.TamperedPrefix+"the log says approved by bob, but 1 of 2 approvals (alice)") {
		t.Fatalf("audit: %+v, want the approval checked against its quorum", rep)
	}
}

// The table owner edits the terms in the log to need one approval: the
// terms no longer hash to what the server signed, so nothing counts.
func testQuorumLowered(t *testing.T, f *quorumFixture) {
	ctx := t.Context()
	out, err := f.askTwo(ctx, 35)
	if err != nil {
		t.Fatal(err)
	}
	id := out.Review.ID
	if _, err := f.decideNote(ctx, f.log(0), id, reviewlog.Approved, ""); err != nil {
		t.Fatal(err)
	}
	f.tamper.EditLog(t, id, `"approvals":2`, `"approvals":1`)
	wantTampered(t, f.fixture, ctx, id)
	r, err := f.log(0).Get(ctx, id)
	if err != nil || !r.Tampered || r.Status == reviewlog.Approved {
		t.Fatalf("terms edited to one approval: %+v %v, want TAMPERED and not approved", r, err)
	}
	if _, err := f.decideAs(ctx, f.log(0), f.bob, "bob", id, reviewlog.Approved, ""); !errors.Is(err, reviewlog.ErrTampered) {
		t.Fatalf("a decision on the edited terms: %v, want it refused", err)
	}
	if retry, err := f.askTwo(ctx, 35); err != nil || retry.Kind == reviewlog.AskApproved || retry.Review.ID == id {
		t.Fatalf("the question after the edit: %+v %v", retry, err)
	}
}

// A policy that now needs more approvals than a pending review's signed
// terms is not answered by it: a new review opens, beside it on every
// store; one that needs fewer reuses it, quorum and all.
func testQuorumRaised(t *testing.T, f *quorumFixture) {
	ctx := t.Context()
	one, err := f.askQuorum(ctx, f.log(0), "agent-1", "0xabc", 36, guard.Review, reasons, 50, 0)
	if err != nil {
		t.Fatal(err)
	}
	two, err := f.askTwo(ctx, 36)
	if err != nil || two.Kind != reviewlog.AskOpened || two.Review.ID == one.Review.ID {
		t.Fatalf("the question under a quorum of two: %+v %v, want a review of its own", two, err)
	}
	if _, err := f.decideNote(ctx, f.log(0), one.Review.ID, reviewlog.Approved, ""); err != nil {
		t.Fatal(err)
	}
	if got, err := f.askTwo(ctx, 36); err != nil || got.Kind != reviewlog.AskReused || got.Review.ID != two.Review.ID {
		t.Fatalf("one approval of the review that needed one does not answer a quorum of two: %+v %v", got, err)
	}
	back, err := f.askQuorum(ctx, f.log(0), "agent-1", "0xabc", 37, guard.Review, reasons, 50, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := f.askQuorum(ctx, f.log(0), "agent-1", "0xabc", 37, guard.Review, reasons, 50, 0); err != nil || got.Review.ID != back.Review.ID || got.Kind != reviewlog.AskReused {
		t.Fatalf("a lowered quorum: %+v %v, want the review opened under two reused", got, err)
	}
}
