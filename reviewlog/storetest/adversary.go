package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// The adversary of these cases writes the store's medium (the volume, the
// database rows) and holds no key: it edits the unsigned review log
// around a human decision. Every case asks through a fresh handle, as a
// restarted server would, so nothing cached hides an edit.
func runAdversary(t *testing.T, factory Factory) {
	for _, c := range []struct {
		name string
		run  func(t *testing.T, f *fixture)
	}{
		{"EditQuestionAfterApproval", testEditAfterApproval},
		{"EditCallerAfterApproval", testEditCallerAfterApproval},
		{"EditNoteAfterApproval", testEditNoteAfterApproval},
		{"BaitAndSwitchBeforeShow", testBaitAndSwitch},
		{"LiftRejectionByCaller", testLiftRejectionByCaller},
		{"LiftRejectionByQuestion", testLiftRejectionByQuestion},
		{"NewReasonOpensNewReview", testNewReason},
		{"AuditTellsCrashFromTampering", testAuditClasses},
		{"EditedRowsDecideNothing", testEditedRows},
		{"LineNotExactDecidesNothing", testLineNotExact},
	} {
		t.Run("Adversary/"+c.name, func(t *testing.T) { c.run(t, newFixture(t, factory)) })
	}
}

// audit runs the audit with the store's keyring.
func (f *fixture) audit(ctx context.Context) reviewlog.AuditReport {
	f.t.Helper()
	l := f.log(0)
	var kr noa.Keyring
	st := f.another()
	defer st.Close()
	if err := st.View(ctx, func(r reviewlog.Reader) (err error) { kr, err = r.Keyring(ctx); return err }); err != nil {
		f.t.Fatal(err)
	}
	rep, err := l.Audit(ctx, kr)
	if err != nil {
		f.t.Fatal(err)
	}
	return rep
}

func wantTampered(t *testing.T, f *fixture, ctx context.Context, id string) {
	t.Helper()
	r, err := f.log(0).Get(ctx, id)
	if err != nil || !r.Tampered || r.Status == reviewlog.Approved || !strings.Contains(strings.Join(r.Integrity, "\n"), reviewlog.TamperedPrefix) {
		t.Fatalf("the edited review reads %+v %v, want TAMPERED and not approved", r, err)
	}
	rep := f.audit(ctx)
	if !strings.Contains(strings.Join(rep.Findings, "\n"), "review "+id+": "+reviewlog.TamperedPrefix) {
		t.Fatalf("audit: %+v, want the review reported TAMPERED", rep)
	}
}

// The first attack: the question of an approved review is edited
// (amount and the keyed hash, everywhere in the line) to another one the
// agent then asks: it is no approval of that question.
func testEditAfterApproval(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 21, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Approved); err != nil {
		t.Fatal(err)
	}
	f.tamper.EditLog(t, out.Review.ID, `"0.21"`, `"0.99"`)
	f.tamper.EditLog(t, out.Review.ID, paramsHash(21), paramsHash(99))
	got, err := f.ask(ctx, f.log(0), "agent-1", 99, guard.Review)
	if err != nil || got.Kind == reviewlog.AskApproved || got.Review.ID == out.Review.ID {
		t.Fatalf("the edited question: %+v %v, want a new review, never the approval", got, err)
	}
	wantTampered(t, f, ctx, out.Review.ID)
}

// The approval of one caller's question is moved to another caller.
func testEditCallerAfterApproval(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 24, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Approved); err != nil {
		t.Fatal(err)
	}
	f.tamper.EditLog(t, out.Review.ID, `"agent-1"`, `"agent-9"`)
	got, err := f.ask(ctx, f.log(0), "agent-9", 24, guard.Review)
	if err != nil || got.Kind == reviewlog.AskApproved {
		t.Fatalf("another caller after the edit: %+v %v, want no approval", got, err)
	}
	wantTampered(t, f, ctx, out.Review.ID)
}

// The note a reviewer signed is part of the decision: an edited note is
// no approval at all.
func testEditNoteAfterApproval(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 25, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decideNote(ctx, f.log(0), out.Review.ID, reviewlog.Approved, "only to 0xabc"); err != nil {
		t.Fatal(err)
	}
	f.tamper.EditLog(t, out.Review.ID, `"only to 0xabc"`, `"pay anything!"`)
	got, err := f.ask(ctx, f.log(0), "agent-1", 25, guard.Review)
	if err != nil || got.Kind == reviewlog.AskApproved {
		t.Fatalf("after the note was edited: %+v %v, want no approval", got, err)
	}
	wantTampered(t, f, ctx, out.Review.ID)
}

// The second attack: the line is edited to a harmless question
// before the reviewer looks; the reviewer is shown TAMPERED, and a
// decision is refused with nothing written. Restored, the review is the
// question it always was, still pending.
func testBaitAndSwitch(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 22, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	id := out.Review.ID
	f.tamper.EditLog(t, id, `"0.22"`, `"0.01"`)
	shown, err := f.log(0).Get(ctx, id)
	if err != nil || !shown.Tampered || shown.TermsReceipt != "" {
		t.Fatalf("what the reviewer is shown: %+v %v, want TAMPERED", shown, err)
	}
	before := f.verifyAll(ctx)
	for _, status := range []string{reviewlog.Approved, reviewlog.Rejected} {
		if _, err := f.decide(ctx, f.log(0), id, status); !errors.Is(err, reviewlog.ErrTampered) {
			t.Fatalf("%s over the edited line: %v, want ErrTampered", status, err)
		}
	}
	if after := f.verifyAll(ctx); after != before {
		t.Fatalf("a refused decision wrote %d receipts", after-before)
	}
	f.tamper.EditLog(t, id, `"0.01"`, `"0.22"`)
	r, err := f.log(0).Get(ctx, id)
	if err != nil || r.Status != reviewlog.Pending || r.Tampered || r.TermsReceipt == "" {
		t.Fatalf("restored: %+v %v, want pending with its signed terms", r, err)
	}
	again, err := f.ask(ctx, f.log(0), "agent-1", 22, guard.Review)
	if err != nil || again.Kind != reviewlog.AskReused || again.Review.ID != id {
		t.Fatalf("the question again: %+v %v, want the pending review", again, err)
	}
}

// The third attack: the caller of a rejected review is changed in
// the log; the rejection still holds for the caller the server signed.
func testLiftRejectionByCaller(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 23, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Rejected); err != nil {
		t.Fatal(err)
	}
	f.tamper.EditLog(t, out.Review.ID, `"agent-1"`, `"agent-7"`)
	for _, decision := range []string{guard.Review, guard.Allow} {
		again, err := f.ask(ctx, f.log(0), "agent-1", 23, decision)
		if err != nil || again.Kind != reviewlog.AskRejected || again.Review.ID != out.Review.ID {
			t.Fatalf("the rejected question (guard says %s) after the caller was edited: %+v %v, want the rejection", decision, again, err)
		}
	}
	wantRejectedTampered(t, f, ctx, out.Review.ID)
}

// The same with the question edited: the rejection is found through the
// server's own receipts, whatever the line now asks.
func testLiftRejectionByQuestion(t *testing.T, f *fixture) {
	ctx := t.Context()
	out, err := f.ask(ctx, f.log(0), "agent-1", 27, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Rejected); err != nil {
		t.Fatal(err)
	}
	f.tamper.EditLog(t, out.Review.ID, `"0.27"`, `"0.28"`)
	f.tamper.EditLog(t, out.Review.ID, paramsHash(27), paramsHash(28))
	again, err := f.ask(ctx, f.log(0), "agent-1", 27, guard.Review)
	if err != nil || again.Kind != reviewlog.AskRejected || again.Review.ID != out.Review.ID {
		t.Fatalf("the rejected question after the line was edited: %+v %v, want the rejection", again, err)
	}
	wantRejectedTampered(t, f, ctx, out.Review.ID)
}

// A line edited so that readers could read it two ways — a field spelled
// in another case, which encoding/json would take for the exact one — is
// reported and applied to nothing: an approval in it is no approval, and a
// rejection still holds through the server's receipts.
func testLineNotExact(t *testing.T, f *fixture) {
	ctx := t.Context()
	approved, err := f.ask(ctx, f.log(0), "agent-1", 31, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), approved.Review.ID, reviewlog.Approved); err != nil {
		t.Fatal(err)
	}
	rejected, err := f.ask(ctx, f.log(0), "agent-1", 32, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), rejected.Review.ID, reviewlog.Rejected); err != nil {
		t.Fatal(err)
	}
	f.tamper.EditLog(t, approved.Review.ID, `"counterparty":`, `"Counterparty":`)
	f.tamper.EditLog(t, rejected.Review.ID, `"counterparty":`, `"counterpartY":`)
	got, err := f.ask(ctx, f.log(0), "agent-1", 31, guard.Review)
	if err != nil || got.Kind == reviewlog.AskApproved || got.Review.ID == approved.Review.ID {
		t.Fatalf("the approved question after its line was made ambiguous: %+v %v, want no approval", got, err)
	}
	again, err := f.ask(ctx, f.log(0), "agent-1", 32, guard.Allow)
	if err != nil || again.Kind != reviewlog.AskRejected {
		t.Fatalf("the rejected question after its line was made ambiguous: %+v %v, want the rejection", again, err)
	}
	rep := f.audit(ctx)
	if n := strings.Count(strings.Join(rep.Findings, "\n"), `is not spelled "counterparty"`); n != 2 {
		t.Fatalf("audit: %+v, want both lines reported", rep.Findings)
	}
}

func wantRejectedTampered(t *testing.T, f *fixture, ctx context.Context, id string) {
	t.Helper()
	r, err := f.log(0).Get(ctx, id)
	if err != nil || r.Status != reviewlog.Rejected || !r.Tampered {
		t.Fatalf("the edited rejected review reads %+v %v, want rejected and TAMPERED", r, err)
	}
	if rep := f.audit(ctx); !strings.Contains(strings.Join(rep.Findings, "\n"), reviewlog.TamperedPrefix) {
		t.Fatalf("audit: %+v, want TAMPERED", rep)
	}
}

// An approval covers the reasons the reviewer saw: a reason it did not
// cover opens a new review; the approved reasons alone still use it.
func testNewReason(t *testing.T, f *fixture) {
	ctx := t.Context()
	seen := []guard.Reason{{Rule: "review_above", Detail: "above 1.00"}}
	more := append([]guard.Reason{{Rule: "open_partial", Detail: "an open paid operation"}}, seen...)
	out, err := f.askWhy(ctx, f.log(0), "agent-1", 26, guard.Review, seen)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, f.log(0), out.Review.ID, reviewlog.Approved); err != nil {
		t.Fatal(err)
	}
	wider, err := f.askWhy(ctx, f.log(0), "agent-1", 26, guard.Review, more)
	if err != nil || wider.Kind != reviewlog.AskOpened || wider.Review.ID == out.Review.ID {
		t.Fatalf("a new reason: %+v %v, want a new review", wider, err)
	}
	if got := wider.Review.Terms.Rules; strings.Join(got, ",") != "open_partial,review_above" {
		t.Fatalf("the new review's rules %v", got)
	}
	same, err := f.askWhy(ctx, f.log(0), "agent-1", 26, guard.Review, seen)
	if err != nil || same.Kind != reviewlog.AskApproved || same.Review.ID != out.Review.ID {
		t.Fatalf("the reasons the reviewer saw: %+v %v, want the approval", same, err)
	}
}

// Audit tells what a crash leaves — the receipts of an opening whose log
// line was never written — from what only tampering makes.
func testAuditClasses(t *testing.T, f *fixture) {
	ctx := t.Context()
	if _, err := f.ask(ctx, f.log(0), "agent-1", 28, guard.Review); err != nil {
		t.Fatal(err)
	}
	const lost = "6f1c7e0a-3b2d-4c5e-8f90-a1b2c3d4e5f6"
	terms := reviewlog.Terms{ReviewID: lost, Caller: "agent-1", Tenant: tenant, Counterparty: "0xabc", Amount: "0.29",
		Asset: "USDC", Template: "x402-buyer", Rules: []string{"open_payments"}, ParamsHash: paramsHash(29)}
	err := f.log(0).WithLock(ctx, func(tx reviewlog.Tx) error {
		d, err := reviewlog.TermsDraft(reviewlog.Review{ID: lost, Terms: &terms}, tx.At)
		if err != nil {
			return err
		}
		if _, err := f.service.Append(ctx, tx.Store, d); err != nil {
			return err
		}
		_, err = f.service.Append(ctx, tx.Store, noa.Draft{TS: tx.At, Agent: noa.Agent{ID: "agent-1", Principal: noa.PrincipalService},
			Action:     noa.Action{ID: reviewlog.ActionID(lost), Canonical: "payment.x402", RiskClass: "IRREVERSIBLE", ParamsHash: paramsHash(29)},
			Governance: noa.Governance{Mode: "approvals_on", Verdict: noa.VerdictDeferred}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rep := f.audit(ctx)
	if len(rep.Findings) != 0 || len(rep.Incomplete) != 1 || !strings.Contains(rep.Incomplete[0], lost) {
		t.Fatalf("audit after a crash's leftovers: %+v, want one incomplete opening and no finding", rep)
	}
	out, err := f.ask(ctx, f.log(0), "agent-1", 30, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	f.tamper.EditLog(t, out.Review.ID, `"0.30"`, `"0.03"`)
	rep = f.audit(ctx)
	if len(rep.Findings) == 0 || len(rep.Incomplete) != 1 {
		t.Fatalf("audit after tampering: %+v, want the finding beside the leftover", rep)
	}
}

// RowsTamperer is a Tamperer of a store that keeps the review state in
// rows: ForgeRows marks every review's row approved and used by no one,
// and deletes the row of review id; EditRows runs one statement on the
// rows ($1 and $2 are the ids given), as a database writer can.
type RowsTamperer interface {
	ForgeRows(t *testing.T, deleted string)
	EditRows(t *testing.T, sql string, id, other string)
}

// A database writer who forges or deletes the review rows decides
// nothing: a decision reads the rows by index and each row is checked
// against its review's lines and signatures, so a pending review whose
// row is gone is no approval (the question opens a review again), a
// signed rejection still holds, and a new question still opens a review
// of its own.
func testEditedRows(t *testing.T, f *fixture) {
	rt, ok := f.tamper.(RowsTamperer)
	if !ok {
		t.Skip("the store keeps no review rows")
	}
	ctx := t.Context()
	l := f.log(0)
	pending, err := f.ask(ctx, l, "agent-1", 40, guard.Review)
	if err != nil || pending.Kind != reviewlog.AskOpened {
		t.Fatalf("open: %+v %v", pending, err)
	}
	rejected, err := f.ask(ctx, l, "agent-1", 41, guard.Review)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.decide(ctx, l, rejected.Review.ID, reviewlog.Rejected); err != nil {
		t.Fatal(err)
	}
	rt.ForgeRows(t, pending.Review.ID)
	for _, l := range []*reviewlog.Log{l, f.log(0)} {
		if again, err := f.ask(ctx, l, "agent-1", 40, guard.Review); err != nil || (again.Kind != reviewlog.AskReused && again.Kind != reviewlog.AskOpened) {
			t.Fatalf("the pending review's question after the rows were forged: %+v %v, want a review", again, err)
		}
		if again, err := f.ask(ctx, l, "agent-1", 41, guard.Review); err != nil || again.Kind != reviewlog.AskRejected {
			t.Fatalf("the rejected question after the rows were forged: %+v %v, want the rejection to hold", again, err)
		}
	}
	if other, err := f.ask(ctx, l, "agent-1", 42, guard.Review); err != nil || other.Kind != reviewlog.AskOpened {
		t.Fatalf("a new question after the rows were forged: %+v %v", other, err)
	}
	// The rejection's row gone: the server's own receipts name the review,
	// and its signed rejection holds.
	rt.EditRows(t, `DELETE FROM reviews WHERE review_id = $1 AND $2 <> ''`, rejected.Review.ID, "-")
	if again, err := f.ask(ctx, f.log(0), "agent-1", 41, guard.Allow); err != nil || again.Kind != reviewlog.AskRejected || again.Review.ID != rejected.Review.ID {
		t.Fatalf("the rejected question after its row was deleted: %+v %v, want the rejection to hold", again, err)
	}
	testEditedApprovalRows(t, f, rt)
	testErasedUse(t, f, rt)
}

// An approval is used once even where a database writer erases every
// unsigned trace of its use — the row's use, the used line's index
// columns and the review_uses row the database refuses a second use by:
// the server's receipt of the use is signed, and a decision reads it
// through the receipts' index.
func testErasedUse(t *testing.T, f *fixture, rt RowsTamperer) {
	ctx := t.Context()
	l := f.log(0)
	out, err := f.ask(ctx, l, "agent-3", 90, guard.Review)
	if err != nil || out.Kind != reviewlog.AskOpened {
		t.Fatalf("open: %+v %v", out, err)
	}
	if _, err := f.decide(ctx, l, out.Review.ID, reviewlog.Approved); err != nil {
		t.Fatal(err)
	}
	if used, err := f.ask(ctx, l, "agent-3", 90, guard.Review); err != nil || used.Kind != reviewlog.AskApproved {
		t.Fatalf("the approval's first use: %+v %v", used, err)
	}
	for _, sql := range []string{
		`UPDATE reviews SET used_at = NULL, used_stream = NULL, used_off = NULL WHERE review_id = $1 AND $2 <> ''`,
		`DELETE FROM review_uses WHERE review_id = $1 AND $2 <> ''`,
		`UPDATE review_lines SET review_id = NULL, kind = NULL WHERE review_id = $1 AND kind = 'used' AND $2 <> ''`,
	} {
		rt.EditRows(t, sql, out.Review.ID, "-")
	}
	for _, l := range []*reviewlog.Log{l, f.log(0)} {
		got, err := f.ask(ctx, l, "agent-3", 90, guard.Review)
		if err != nil || got.Kind == reviewlog.AskApproved || got.Kind == reviewlog.AskPlain {
			t.Fatalf("the approved question after its use was erased from the rows: %+v %v, want a review, never a second use", got, err)
		}
	}
}

// Each edit of the row of a trusted, unused approval — the one review
// state that turns a review into an allow — gives review: an approval is
// honoured only from a row that its lines and signatures bear out. With
// the rows not read (the fold alone) every case would be allowed.
func testEditedApprovalRows(t *testing.T, f *fixture, rt RowsTamperer) {
	ctx := t.Context()
	for i, tc := range []struct{ name, sql string }{
		{"row deleted", `DELETE FROM reviews WHERE review_id = $1 AND $2 <> ''`},
		{"status edited", `UPDATE reviews SET status = 'pending', decided_at = NULL WHERE review_id = $1 AND $2 <> ''`},
		{"moved to another caller", `UPDATE reviews SET caller = 'agent-9' WHERE review_id = $1 AND $2 <> ''`},
		{"moved to another question", `UPDATE reviews SET question_key = md5(question_key) WHERE review_id = $1 AND $2 <> ''`},
		{"terms key edited", `UPDATE reviews SET terms_key = md5(terms_key) WHERE review_id = $1 AND $2 <> ''`},
		{"moved to another tenant", `UPDATE reviews SET tenant = 'globex' WHERE review_id = $1 AND $2 <> ''`},
		{"opened line of another review", `UPDATE reviews SET opened_off = (SELECT opened_off FROM reviews WHERE review_id = $2) WHERE review_id = $1`},
		{"decided line of another review", `UPDATE reviews SET decided_off = (SELECT opened_off FROM reviews WHERE review_id = $2) WHERE review_id = $1`},
		{"decided line moved off", `UPDATE reviews SET decided_off = decided_off + 1 WHERE review_id = $1 AND $2 <> ''`},
		{"used line pointed at", `UPDATE reviews SET used_at = now(), used_stream = opened_stream, used_off = opened_off WHERE review_id = $1 AND $2 <> ''`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := f.log(0)
			n := 60 + i
			other, err := f.ask(ctx, l, "agent-2", n, guard.Review)
			if err != nil {
				t.Fatal(err)
			}
			out, err := f.ask(ctx, l, "agent-1", n, guard.Review)
			if err != nil || out.Kind != reviewlog.AskOpened {
				t.Fatalf("open: %+v %v", out, err)
			}
			if _, err := f.decide(ctx, l, out.Review.ID, reviewlog.Approved); err != nil {
				t.Fatal(err)
			}
			rt.EditRows(t, tc.sql, out.Review.ID, other.Review.ID)
			for _, l := range []*reviewlog.Log{l, f.log(0)} {
				got, err := f.ask(ctx, l, "agent-1", n, guard.Review)
				if err != nil || got.Kind == reviewlog.AskApproved || got.Kind == reviewlog.AskPlain {
					t.Fatalf("the approved question after the row was edited: %+v %v, want a review, never the approval", got, err)
				}
				if got.Review.ID == out.Review.ID && !got.Review.Tampered {
					t.Fatalf("the edited review answers untampered: %+v", got.Review)
				}
			}
		})
	}
}
