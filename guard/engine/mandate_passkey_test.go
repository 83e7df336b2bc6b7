package engine

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

const (
	pkRP     = "localhost"
	pkOrigin = "http://localhost:8787"
)

func pkCredential(a *softauthn.Authenticator) passkey.Credential {
	return passkey.Credential{ID: a.CredentialID(), PublicKey: base64.RawURLEncoding.EncodeToString(a.COSEKey()), RPID: pkRP, Origin: pkOrigin}
}

func pkAssert(t *testing.T, a *softauthn.Authenticator, challenge []byte) passkey.Assertion {
	t.Helper()
	x, err := a.Assert(pkRP, pkOrigin, challenge)
	if err != nil {
		t.Fatal(err)
	}
	return passkey.Assertion{CredentialID: x.CredentialID, AuthenticatorData: x.AuthenticatorData, ClientDataJSON: x.ClientDataJSON, Signature: x.Signature}
}

// An approval with a mandate, one passkey assertion over both: refused,
// nothing written, when the passkey is not trusted, when the terms were
// edited after it signed, when the approval is taken without its
// mandate; written when it holds, and then a later question of the payee
// inside the mandate is allowed under it, on every store; a writer who
// raises its budget afterwards makes every mandate unusable.
func TestMandateGrantedWithPasskeyApproval(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			pat, err := softauthn.New()
			if err != nil {
				t.Fatal(err)
			}
			mallory, err := softauthn.New()
			if err != nil {
				t.Fatal(err)
			}
			f := newFleet(t, kind, 0, mandatePolicy)
			f.passkeys = reviewlog.Passkeys{"pat": {pkCredential(pat)}}
			e := f.fresh(t)
			ctx := t.Context()
			a, err := e.Check(ctx, "bot", Question{Counterparty: sellerA, Amount: "1.00"})
			if err != nil || a.Decision != guard.Review || a.ReviewID == "" {
				t.Fatalf("the first question: %v %+v", err, a)
			}
			rv, err := f.logs[0].Get(ctx, a.ReviewID)
			if err != nil {
				t.Fatal(err)
			}
			dh, err := reviewlog.DecisionHash(rv.TermsHash, reviewlog.Approved, "")
			if err != nil {
				t.Fatal(err)
			}
			id, _ := mandate.NewID()
			g := grantTerms(f, "2.00", "3.00", 2)
			g.Kind, g.ID, g.Tenant, g.Decision, g.At, g.By, g.KID = mandate.KindGrant, id, DefaultTenant, dh, mandate.FormatTime(f.clock()), "pat", mandate.PasskeyKID
			ch, _, err := g.PasskeyChallenge()
			if err != nil {
				t.Fatal(err)
			}
			d := PasskeyDecider{Log: f.logs[0], Chains: e.cfg.Chains, Passkeys: func() (reviewlog.Passkeys, error) { return f.passkeys, nil }}
			nothingWritten := func(what string) {
				t.Helper()
				if n := len(f.mandateLines(t)); n != 0 {
					t.Fatalf("%s: %d mandate records written", what, n)
				}
				if r, err := f.logs[0].Get(ctx, rv.ID); err != nil || r.Status != reviewlog.Pending {
					t.Fatalf("%s: the review is %s (%v), want pending", what, r.Status, err)
				}
			}
			edited := g
			edited.BudgetAtomic = "300000000"
			for _, tc := range []struct {
				name  string
				run   func() error
				want  error
				words string
			}{
				{"mallory's passkey", func() error {
					_, _, err := d.DecideGranting(ctx, rv.ID, "", pkAssert(t, mallory, ch), g)
					return err
				}, reviewlog.ErrUntrusted, "is not in the trusted reviewers file"},
				{"the budget edited after the signature", func() error {
					_, _, err := d.DecideGranting(ctx, rv.ID, "", pkAssert(t, pat, ch), edited)
					return err
				}, reviewlog.ErrUntrusted, "does not sign this approval and the mandate's terms"},
				{"the approval taken without its mandate", func() error {
					_, err := d.Decide(ctx, rv.ID, reviewlog.Approved, "", pkAssert(t, pat, ch))
					return err
				}, reviewlog.ErrUntrusted, "does not sign this decision"},
				{"the grant of another reviewer", func() error {
					other := g
					other.By = "alice"
					_, _, err := d.DecideGranting(ctx, rv.ID, "", pkAssert(t, pat, ch), other)
					return err
				}, reviewlog.ErrUntrusted, `the mandate names reviewer "alice"`},
			} {
				err := tc.run()
				if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.words) {
					t.Fatalf("%s: %v, want %v saying %q", tc.name, err, tc.want, tc.words)
				}
				nothingWritten(tc.name)
			}

			out, rec, err := d.DecideGranting(ctx, rv.ID, "", pkAssert(t, pat, ch), g)
			if err != nil || out.Status != reviewlog.Approved || out.DecidedBy != "pat" || !rec.SignedWithPasskey() {
				t.Fatalf("the approval with its mandate: %v %+v %+v", err, out, rec)
			}
			set, err := ReadMandates(ctx, f.logs[0], "")
			if m := set.Mandates[id]; err != nil || len(set.Findings) > 0 || m == nil || strings.Join(m.Signers, ",") != "pat" {
				t.Fatalf("the mandate records: %v %v %+v", err, set.Findings, m)
			}
			// The receipt of the approval verifies with the assertion that
			// also signs the mandate.
			if r, err := f.logs[0].Get(ctx, rv.ID); err != nil || r.Status != reviewlog.Approved || r.DecidedWith != reviewlog.DecidedWithPasskey || len(r.Integrity) > 0 {
				t.Fatalf("the approved review: %v %+v", err, r)
			}
			a2, err := e.Check(ctx, "bot", Question{Counterparty: sellerA, Amount: "1.50"})
			if err != nil || a2.Decision != guard.Allow || !strings.HasPrefix(reasonOf(a2, RuleMandate), "mandate "+id+": 1.50 USDC and 1 payment left after this one (signed by pat") {
				t.Fatalf("a question inside the mandate: %v %+v", err, a2)
			}
			if a3, err := e.Check(ctx, "bot", Question{Counterparty: sellerA, Amount: "2.50"}); err != nil || a3.Decision != guard.Review {
				t.Fatalf("a question above its most per payment: %v %+v", err, a3)
			}

			lines := f.mandateLines(t)
			lines[0] = []byte(strings.Replace(string(lines[0]), `"budget_atomic":"3000000"`, `"budget_atomic":"300000000"`, 1))
			f.writeMandateLines(t, lines)
			f.advance(time.Minute)
			a4, err := e.Check(ctx, "bot", Question{Counterparty: sellerA, Amount: "0.60"})
			if err != nil || a4.Decision != guard.Review || !strings.Contains(reasonOf(a4, guard.RuleReviewAbove), "the mandate records do not verify") ||
				!strings.Contains(reasonOf(a4, guard.RuleReviewAbove), `not signed by reviewer "pat"'s passkey`) {
				t.Fatalf("after the budget was raised in the store: %v %+v", err, a4)
			}
		})
	}
}

// A grant whose challenge was made before another mandate record was
// written names a place that is taken: refused, nothing written, and the
// reviewer approves again (a new challenge after the new head) to success.
func TestMandateGrantedWithPasskeyAfterRecordsMoved(t *testing.T) {
	pat, err := softauthn.New()
	if err != nil {
		t.Fatal(err)
	}
	f, alice := mandateFleet(t, fileKind, 1, mandatePolicy)
	f.passkeys = reviewlog.Passkeys{"pat": {pkCredential(pat)}}
	e := f.fresh(t) // a process that trusts pat's passkey too
	log := f.logs[1]
	alice.Log = log
	ctx := t.Context()
	a, err := e.Check(ctx, "bot", Question{Counterparty: sellerA, Amount: "1.00"})
	if err != nil || a.ReviewID == "" {
		t.Fatalf("the question: %v %+v", err, a)
	}
	rv, err := log.Get(ctx, a.ReviewID)
	if err != nil {
		t.Fatal(err)
	}
	dh, _ := reviewlog.DecisionHash(rv.TermsHash, reviewlog.Approved, "")
	propose := func(prev string) (mandate.Record, []byte) {
		id, _ := mandate.NewID()
		g := grantTerms(f, "2.00", "3.00", 2)
		g.Kind, g.ID, g.Prev, g.Tenant, g.Decision, g.At, g.By, g.KID = mandate.KindGrant, id, prev, DefaultTenant, dh, mandate.FormatTime(f.clock()), "pat", mandate.PasskeyKID
		ch, _, err := g.PasskeyChallenge()
		if err != nil {
			t.Fatal(err)
		}
		return g, ch
	}
	g, ch := propose("")
	mustGrant(t, alice, grantTerms(f, "1.00", "1.00", 1)) // written while pat's passkey signs
	d := PasskeyDecider{Log: log, Chains: e.cfg.Chains, Passkeys: func() (reviewlog.Passkeys, error) { return f.passkeys, nil }}
	if _, _, err := d.DecideGranting(ctx, rv.ID, "", pkAssert(t, pat, ch), g); !errors.Is(err, ErrMandateMoved) || !strings.Contains(err.Error(), "approve again") {
		t.Fatalf("a grant after the records moved: %v, want ErrMandateMoved", err)
	}
	lines := f.mandateLines(t)
	if r, _ := log.Get(ctx, rv.ID); len(lines) != 1 || r.Status != reviewlog.Pending {
		t.Fatalf("after the refusal: %d mandate records, the review %s", len(lines), r.Status)
	}
	g, ch = propose(mandate.Hash(lines[0]))
	if _, _, err := d.DecideGranting(ctx, rv.ID, "", pkAssert(t, pat, ch), g); err != nil {
		t.Fatalf("approved again after the new head: %v", err)
	}
	if set, err := ReadMandates(ctx, log, ""); err != nil || len(set.Findings) > 0 || len(set.Mandates) != 2 {
		t.Fatalf("the records: %v %v %d", err, set.Findings, len(set.Mandates))
	}
}
