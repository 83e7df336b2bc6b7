package reviewlog_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
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
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// reviewer is a trusted reviewer for tests: its id, its key, and a hook that
// signs a decision the way the review CLI does.
type reviewer struct {
	id     string
	key    ed25519.PrivateKey
	chains *reviewlog.Chains
}

func newReviewer(t testing.TB, id string) *reviewer {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &reviewer{id: id, key: key, chains: &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "test"}}
}

func trust(rs ...*reviewer) func() (reviewlog.Reviewers, error) {
	return func() (reviewlog.Reviewers, error) {
		out := reviewlog.Reviewers{}
		for _, r := range rs {
			out[r.id] = r.key.Public().(ed25519.PublicKey)
		}
		return out, nil
	}
}

// sign is a DecideReview hook that appends the reviewer's HUMAN receipt.
func (rv *reviewer) sign(t testing.TB) reviewlog.Hook {
	return func(tx reviewlog.Tx) error {
		at, err := time.Parse(time.RFC3339Nano, tx.Review.DecidedAt)
		if err != nil {
			return err
		}
		verdict := noa.VerdictBlocked
		if tx.Review.Status == reviewlog.Approved {
			verdict = noa.VerdictAllowed
		}
		rule := reviewlog.RuleHumanReview
		ph, err := reviewlog.DecisionParamsHash(tx.Review, tx.Review.Status)
		if err != nil {
			return err
		}
		_, err = rv.chains.Append(t.Context(), tx.Store, noa.Draft{
			TS:     at,
			Agent:  noa.Agent{ID: rv.id, Principal: noa.PrincipalHuman},
			Action: noa.Action{ID: reviewlog.ActionID(tx.Review.ID), Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: ph},
			Governance: noa.Governance{Mode: "approvals_on", Verdict: verdict, RuleID: &rule,
				Approval: &noa.Approval{By: rv.id, At: noa.FormatTS(at)}},
		})
		return err
	}
}

// A repair record naming a decided line cannot reopen the review, and the
// review cannot be decided a second time.
func TestRepairCannotReopenADecision(t *testing.T) {
	dir := t.TempDir()
	l, alice := newSignedLog(t, dir, nil)
	ctx := t.Context()
	terms := signTerms(t)
	out, err := engine.Ask(ctx, l, engine.AskRequest{Caller: "agent", Question: q1, Decision: "review", ParamsHash: "hmac-sha256:" + strings.Repeat("0", 64), Reasons: reasons},
		func(tx reviewlog.Tx, _ reviewlog.AskOutcome) error { return terms(tx) })
	if err != nil {
		t.Fatal(err)
	}
	id := out.Review.ID
	if _, err := l.DecideReview(ctx, id, reviewlog.Approved, "", "alice", alice.sign(t)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, reviewlog.DirName, reviewlog.FileName)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"type":"repair","at":"2026-07-25T12:06:00.000Z","lines":[2]}` + "\n")
	f.Close()
	if r, err := l.Get(ctx, id); err != nil || r.Status != reviewlog.Approved {
		t.Fatalf("after the forged repair: %+v %v", r, err)
	}
	if _, err := l.DecideReview(ctx, id, reviewlog.Rejected, "", "alice", alice.sign(t)); !errors.Is(err, reviewlog.ErrAlreadyDecided) {
		t.Fatalf("second decision: %v, want ErrAlreadyDecided", err)
	}
	findings, _ := l.Findings(ctx)
	if len(findings) != 1 || !strings.Contains(findings[0].What, "repair record names lines [2]") {
		t.Fatalf("findings %+v", findings)
	}
}

// The fold is kept and brought up to date from the bytes appended since;
// a log replaced under the reader is read again and reported.
func TestIncrementalFoldFollowsAppendsAndRewrites(t *testing.T) {
	dir := t.TempDir()
	l, _ := newSignedLog(t, dir, nil)
	other, _ := newSignedLog(t, dir, nil) // another process appending
	ctx := t.Context()
	first, _, err := engine.OpenReview(ctx, l, q1, reasons, signTerms(t))
	if err != nil {
		t.Fatal(err)
	}
	q2 := q1
	q2.Amount = "0.07"
	second, _, err := engine.OpenReview(ctx, other, q2, reasons, signTerms(t))
	if err != nil {
		t.Fatal(err)
	}
	list, err := l.List(ctx, true)
	if err != nil || len(list) != 2 || list[0].ID != first.ID || list[1].ID != second.ID {
		t.Fatalf("after another writer appended: %+v %v", list, err)
	}
	if got, err := l.Get(ctx, second.ID); err != nil || len(got.Reasons) != len(reasons) {
		t.Fatalf("read back from its line: %+v %v", got, err)
	}
	// Replace the log with one that holds only the second review.
	path := filepath.Join(dir, reviewlog.DirName, reviewlog.FileName)
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(data), "\n")
	if err := os.WriteFile(path+".new", []byte(lines[1]), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	list, err = l.List(ctx, true)
	if err != nil || len(list) != 1 || list[0].ID != second.ID {
		t.Fatalf("after the rewrite: %+v %v", list, err)
	}
	findings, _ := l.Findings(ctx)
	if len(findings) != 1 || !strings.Contains(findings[0].What, "replaced or rewritten") {
		t.Fatalf("findings %+v", findings)
	}
}

// Archive moves final reviews out of the log, byte for byte, and the audit
// still checks them against their receipts.
func TestArchiveKeepsEverythingVerifiable(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)}
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	alice := newReviewer(t, "alice")
	server := newReviewer(t, "server")
	l := reviewlog.OpenStore(filestore.New(root), reviewlog.Options{Now: c.now, Reviewers: trust(alice)})
	ctx := t.Context()
	deferHook := func(tx reviewlog.Tx, out reviewlog.AskOutcome) error {
		if out.Kind == reviewlog.AskOpened {
			d, err := reviewlog.TermsDraft(out.Review, tx.At)
			if err != nil {
				return err
			}
			if _, err := server.chains.Append(ctx, tx.Store, d); err != nil {
				return err
			}
		}
		_, err := server.chains.Append(ctx, tx.Store, noa.Draft{TS: tx.At, Agent: noa.Agent{ID: "agent", Principal: noa.PrincipalService},
			Action:     noa.Action{ID: reviewlog.ActionID(out.Review.ID), Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: "hmac-sha256:" + strings.Repeat("0", 64)},
			Governance: noa.Governance{Mode: "approvals_on", Verdict: noa.VerdictDeferred}})
		return err
	}
	var ids []string
	for _, amount := range []string{"0.01", "0.02", "0.03"} {
		q := q1
		q.Amount = amount
		out, err := engine.Ask(ctx, l, engine.AskRequest{Caller: "agent", Question: q, Decision: "review", ParamsHash: "hmac-sha256:" + strings.Repeat("0", 64), Reasons: reasons, Tenant: "test"}, deferHook)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, out.Review.ID)
	}
	for _, id := range ids[:2] {
		if _, err := l.DecideReview(ctx, id, reviewlog.Rejected, "old", "alice", alice.sign(t)); err != nil {
			t.Fatal(err)
		}
	}
	c.t = c.t.Add(48 * time.Hour)
	kr := noa.Keyring{}
	kr.Add(noa.KeyID(alice.key.Public().(ed25519.PublicKey)), alice.key.Public().(ed25519.PublicKey))
	kr.Add(noa.KeyID(server.key.Public().(ed25519.PublicKey)), server.key.Public().(ed25519.PublicKey))
	res, err := l.Archive(ctx, c.t.Add(-24*time.Hour))
	if err != nil || res.Reviews != 2 || res.Lines != 4 {
		t.Fatalf("archive: %+v %v", res, err)
	}
	// An id the guard gave out stays answerable, from the archive.
	if r, err := l.Get(ctx, ids[0]); err != nil || r.Status != reviewlog.Rejected || r.Tampered || r.TermsReceipt == "" {
		t.Errorf("an archived review: %+v %v, want it read from the archive, rejected", r, err)
	}
	if list, err := l.List(ctx, true); err != nil || len(list) != 1 {
		t.Errorf("the log still lists %d reviews (%v), want the pending one", len(list), err)
	}
	if r, err := l.Get(ctx, ids[2]); err != nil || r.Status != reviewlog.Pending {
		t.Errorf("the pending review did not stay: %+v %v", r, err)
	}
	rep, err := l.Audit(ctx, kr)
	if err != nil || len(rep.Findings) != 0 || rep.Reviews != 3 || rep.Archives != 1 {
		t.Fatalf("audit after archiving: %+v %v", rep, err)
	}
	if again, err := l.Archive(ctx, c.t.Add(-24*time.Hour)); err != nil || again.Reviews != 0 {
		t.Fatalf("second archive: %+v %v", again, err)
	}
	// The archived rejection still holds, read from its archive: no
	// integrity warning, the note as decided.
	q := q1
	q.Amount = "0.01"
	held, err := engine.Ask(ctx, l, engine.AskRequest{Caller: "agent", Question: q, Decision: "allow", ParamsHash: "hmac-sha256:" + strings.Repeat("0", 64),
		Reasons: reasons, Tenant: "test", RejectionHold: 365 * 24 * time.Hour}, deferHook)
	if err != nil || held.Kind != reviewlog.AskRejected || len(held.Review.Integrity) != 0 || held.Review.Note != "old" {
		t.Fatalf("the archived rejection: %+v %v", held, err)
	}
	// The log still takes appends, and folds.
	if _, _, err := engine.OpenReview(ctx, l, q2Of(q1), reasons, signTerms(t)); err != nil {
		t.Fatal(err)
	}
}

func q2Of(q guard.Question) guard.Question { q.Amount = "0.09"; return q }

// signTerms is an OpenReview hook that signs an opened review's terms, as
// the engine's does, with a server key of its own (its chain and keyring
// entry are made on the first append).
func signTerms(tb testing.TB) reviewlog.Hook {
	tb.Helper()
	h, err := termsSigner()
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

func termsSigner() (reviewlog.Hook, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	chains := &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: ""}
	return func(tx reviewlog.Tx) error {
		if tx.Kind != "opened" {
			return nil
		}
		d, err := reviewlog.TermsDraft(tx.Review, tx.At)
		if err != nil {
			return err
		}
		_, err = chains.Append(context.Background(), tx.Store, d)
		return err
	}, nil
}
