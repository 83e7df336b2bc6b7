package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// mandatePolicy sends every payment above 0.50 to review, and nothing
// else for the amounts asked.
const mandatePolicy = `{"reviewAbove": "0.50", "perCounterpartyLimit": {"amount": "100.00"}}`

// mandateFleet is a fleet whose reviewer alice is trusted, with her
// mandate signer.
func mandateFleet(t *testing.T, kind storeKind, n int, policyJSON string) (*fleet, MandateSigner) {
	t.Helper()
	f := newFleet(t, kind, 0, policyJSON)
	_, alice, _ := ed25519.GenerateKey(rand.Reader)
	f.reviewers = reviewlog.Reviewers{"alice": alice.Public().(ed25519.PublicKey)}
	for range n {
		f.fresh(t)
	}
	return f, MandateSigner{Log: f.logs[0], Key: alice, By: "alice", Tenant: DefaultTenant}
}

// grantTerms are the terms of a mandate to pay sellerA up to max a
// payment, budget in all, count payments, for a day.
func grantTerms(f *fleet, max, budget string, count int) mandate.Record {
	amt := func(s string) string {
		a, err := guard.ParseAmount(s, f.pol.DefaultAsset.Decimals)
		if err != nil {
			panic(err)
		}
		return a.String()
	}
	return mandate.Record{PayTo: sellerA, Asset: f.pol.DefaultAsset.Key, MaxAtomic: amt(max), BudgetAtomic: amt(budget), Count: count,
		Expires: mandate.FormatTime(f.clock().Add(24 * time.Hour))}
}

func mustGrant(t *testing.T, s MandateSigner, g mandate.Record) mandate.Record {
	t.Helper()
	r, err := s.Grant(context.Background(), g)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	return r
}

// A question only review_above sends to review, inside a live mandate,
// is allowed under it and charged to it; what is left is said.
func TestMandateAllowsWhatOnlyTheAmountReviews(t *testing.T) {
	f, s := mandateFleet(t, fileKind, 1, mandatePolicy)
	e := f.engines[0]
	q := Question{Counterparty: sellerA, Amount: "1.00"}
	if a, err := e.Check(t.Context(), "bot", q); err != nil || a.Decision != guard.Review {
		t.Fatalf("before any mandate: %v %+v", err, a)
	}
	m := mustGrant(t, s, grantTerms(f, "2.00", "3.00", 2))
	a, err := e.Check(t.Context(), "bot", q)
	if err != nil || a.Decision != guard.Allow {
		t.Fatalf("inside the mandate: %v %+v", err, a)
	}
	want := "mandate " + m.ID + ": 2.00 USDC and 1 payment left after this one (signed by alice"
	if d := reasonOf(a, RuleMandate); !strings.HasPrefix(d, want) {
		t.Fatalf("mandate reason %q, want it to start %q", d, want)
	}
	if u := e.book.Mandate(m.ID); u.Count != 1 || u.Atomic.String() != "1000000" {
		t.Fatalf("the ledger charged %+v to the mandate, want 1 payment of 1000000", u)
	}
	// A fresh process reads the same use from the ledger: one payment
	// left, and 2.00 of budget — a 2.00 question is allowed, the count is
	// then used up.
	g := f.fresh(t)
	if a, err := g.Check(t.Context(), "bot", Question{Counterparty: sellerA, Amount: "2.00"}); err != nil || a.Decision != guard.Allow ||
		!strings.Contains(reasonOf(a, RuleMandate), "0.00 USDC and 0 payments left") {
		t.Fatalf("the second use: %v %+v", err, a)
	}
	a, err = g.Check(t.Context(), "bot", Question{Counterparty: sellerA, Amount: "0.60"})
	if err != nil || a.Decision != guard.Review || !strings.Contains(reasonOf(a, guard.RuleReviewAbove), "mandate "+m.ID+" does not cover it (its budget left is less than the amount)") {
		t.Fatalf("past the budget: %v %+v", err, a)
	}
	// Below reviewAbove, nothing is charged to the mandate.
	if a, err := g.Check(t.Context(), "bot", Question{Counterparty: sellerA, Amount: "0.10"}); err != nil || a.Decision != guard.Allow || has(a, RuleMandate) {
		t.Fatalf("below reviewAbove: %v %+v", err, a)
	}
	if u := g.book.Mandate(m.ID); u.Count != 2 {
		t.Fatalf("charged %d uses, want 2", u.Count)
	}
}

// A mandate never lifts anything but an amount rule: each case keeps its
// review or block with the mandate live.
func TestMandateNeverLiftsOtherRules(t *testing.T) {
	const url = "https://api.example.com/report"
	paid := func(id string) simrec.Payment {
		return simrec.Payment{OperationID: id, URL: url, PayTo: sellerA, Amount: "100000", Outcome: "settled"}
	}
	tests := []struct {
		name   string
		policy string
		runs   map[string][]simrec.Payment
		q      Question
		caller string
		want   string
		rule   string
		// before runs before the mandate is granted (the rejection).
		before func(t *testing.T, f *fleet, s MandateSigner)
		terms  func(g *mandate.Record)
	}{
		{name: "denylist", policy: `{"reviewAbove": "0.50", "denylist": ["` + sellerA + `"]}`, want: guard.Block, rule: guard.RuleDenylist},
		{name: "allowlist", policy: `{"reviewAbove": "0.50", "allowlist": ["` + sellerB + `"]}`, want: guard.Review, rule: guard.RuleAllowlist},
		{name: "per-counterparty limit", policy: `{"reviewAbove": "0.50", "perCounterpartyLimit": {"amount": "0.80"}}`, want: guard.Review, rule: guard.RulePerCounterparty},
		{name: "total limit", policy: `{"reviewAbove": "0.50", "totalLimit": {"amount": "0.80"}}`, want: guard.Review, rule: guard.RuleTotalLimit},
		{name: "velocity", policy: `{"reviewAbove": "0.50", "velocity": {"perCounterparty": {"count": 1, "windowMinutes": 120}}}`,
			runs: map[string][]simrec.Payment{"run-1": {paid("op-1")}}, want: guard.Review, rule: guard.RuleVelocity},
		{name: "duplicate", policy: `{"reviewAbove": "0.50", "duplicatePayment": {"windowMinutes": 120}}`,
			runs: map[string][]simrec.Payment{"run-1": {paid("op-1")}}, q: Question{Counterparty: sellerA, Amount: "1.00", Resource: url}, want: guard.Review, rule: guard.RuleDuplicatePayment},
		{name: "open payment", runs: map[string][]simrec.Payment{"run-1": {unsettled("op-1", sellerA, url)}}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "unattributable history", runs: map[string][]simrec.Payment{"run-1": {unsettled("op-1", "seller-a", url)}}, want: guard.Review, rule: guard.RuleUnattributable},
		{name: "unreadable history", runs: map[string][]simrec.Payment{"run-1": {{OperationID: "op-2", URL: url, PayTo: sellerA, Amount: "1", Outcome: "walked-away", OfferExtra: deepJSON(5000)}}},
			want: guard.Review, rule: guard.RuleUnreadable},
		{name: "a rejection's hold", want: guard.Block, rule: reviewlog.RuleHumanRejected,
			before: func(t *testing.T, f *fleet, s MandateSigner) {
				a, err := f.engines[0].Check(t.Context(), "bot", Question{Counterparty: sellerA, Amount: "1.00"})
				if err != nil || a.Decision != guard.Review {
					t.Fatalf("the question to reject: %v %+v", err, a)
				}
				d := Decider{Log: f.logs[0], Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(s.Key), Tenant: DefaultTenant}}
				if _, err := d.Decide(t.Context(), a.ReviewID, reviewlog.Rejected, "no", "alice"); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "more than its most per payment", q: Question{Counterparty: sellerA, Amount: "2.50"}, want: guard.Review, rule: guard.RuleReviewAbove},
		{name: "another caller", terms: func(g *mandate.Record) { g.Agent = "other-bot" }, want: guard.Review, rule: guard.RuleReviewAbove},
		{name: "another host", terms: func(g *mandate.Record) { g.Host = "api.example.com" }, q: Question{Counterparty: "other.example.com", PayTo: sellerA, Amount: "1.00"},
			want: guard.Review, rule: guard.RuleReviewAbove},
		{name: "another payee", q: Question{Counterparty: sellerB, Amount: "1.00"}, want: guard.Review, rule: guard.RuleReviewAbove},
		{name: "a host question without the payee", terms: func(g *mandate.Record) { g.Host = "api.example.com" }, q: Question{Counterparty: "api.example.com", Amount: "1.00"},
			want: guard.Review, rule: guard.RuleReviewAbove},
		{name: "expired", terms: func(g *mandate.Record) { g.Expires = g.At }, want: guard.Review, rule: guard.RuleReviewAbove},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol := tc.policy
			if pol == "" {
				pol = mandatePolicy
			}
			f, s := mandateFleet(t, fileKind, 1, pol)
			for run, ps := range tc.runs {
				rec, err := simrec.New(f.dir, run, start)
				if err != nil {
					t.Fatal(err)
				}
				if err := rec.PayAll(ps); err != nil {
					t.Fatal(err)
				}
			}
			if tc.before != nil {
				tc.before(t, f, s)
			}
			g := grantTerms(f, "2.00", "10.00", 5)
			if tc.terms != nil {
				g.At = mandate.FormatTime(f.clock().Add(time.Minute))
				tc.terms(&g)
			}
			if tc.name == "expired" {
				g.Expires = mandate.FormatTime(f.clock().Add(time.Minute))
			}
			mustGrant(t, s, g)
			if tc.name == "expired" {
				f.advance(time.Minute)
			}
			q := tc.q
			if q.Counterparty == "" {
				q = Question{Counterparty: sellerA, Amount: "1.00"}
			}
			a, err := f.engines[0].Check(t.Context(), "bot", q)
			if err != nil {
				t.Fatal(err)
			}
			if a.Decision != tc.want || !has(a, tc.rule) || has(a, RuleMandate) {
				t.Fatalf("%s: %s %v, want %s with %s and no mandate", tc.name, a.Decision, a.Reasons, tc.want, tc.rule)
			}
			// Nothing was charged to any mandate.
			for _, en := range f.engines[0].book.Live(f.clock()) {
				if en.Mandate != "" {
					t.Fatalf("entry %+v charged to a mandate", en)
				}
			}
		})
	}
}

// A revoked mandate allows nothing from the next question on, on another
// replica too; a reviewer not trusted (or not granted the tenant) signs
// none.
func TestMandateRevokedAndUntrusted(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f, s := mandateFleet(t, kind, 2, mandatePolicy)
			m := mustGrant(t, s, grantTerms(f, "2.00", "10.00", 0))
			q := Question{Counterparty: sellerA, Amount: "1.00"}
			for i, e := range f.engines {
				if a, err := e.Check(t.Context(), "bot", q); err != nil || a.Decision != guard.Allow || !strings.Contains(reasonOf(a, RuleMandate), "USDC left") {
					t.Fatalf("replica %d before the revocation: %v %+v", i, err, a)
				}
			}
			// Revoked through the second replica's log.
			s2 := s
			s2.Log = f.logs[1]
			if _, err := s2.Revoke(t.Context(), m.ID); err != nil {
				t.Fatal(err)
			}
			for i, e := range f.engines {
				a, err := e.Check(t.Context(), "bot", q)
				if err != nil || a.Decision != guard.Review || !strings.Contains(reasonOf(a, guard.RuleReviewAbove), "mandate "+m.ID+" does not cover it (revoked by alice at ") {
					t.Fatalf("replica %d after the revocation: %v %+v", i, err, a)
				}
			}
			if _, err := s.Revoke(t.Context(), m.ID); !errors.Is(err, ErrMandateDone) {
				t.Fatalf("a second revocation: %v, want ErrMandateDone", err)
			}
			// Mallory's key is not trusted: nothing is written.
			_, mallory, _ := ed25519.GenerateKey(rand.Reader)
			bad := MandateSigner{Log: f.logs[0], Key: mallory, By: "alice", Tenant: DefaultTenant}
			if _, err := bad.Grant(t.Context(), grantTerms(f, "2.00", "10.00", 0)); !errors.Is(err, reviewlog.ErrUntrusted) {
				t.Fatalf("an untrusted key: %v, want ErrUntrusted", err)
			}
			set, err := f.engines[0].MandatesNow(t.Context())
			if err != nil || len(set.Order) != 1 || set.Lines != 2 {
				t.Fatalf("after the refused grant: %v, %d mandates in %d records, want 1 in 2", err, len(set.Order), set.Lines)
			}
		})
	}
}

// Ten questions at once against a mandate of three payments: exactly
// three are allowed under it, on files and across PostgreSQL replicas.
func TestMandateCountHoldsUnderConcurrency(t *testing.T) {
	for _, kind := range stores(t) {
		for _, replicas := range []int{1, 2} {
			t.Run(string(kind)+"/replicas="+string(rune('0'+replicas)), func(t *testing.T) {
				f, s := mandateFleet(t, kind, replicas, mandatePolicy)
				m := mustGrant(t, s, grantTerms(f, "2.00", "100.00", 3))
				got := f.askAll(t, 10, Question{Counterparty: sellerA, Amount: "1.00"})
				if got[guard.Allow] != 3 || got[guard.Review] != 7 {
					t.Fatalf("got %v, want 3 allow and 7 review", got)
				}
				g := f.fresh(t)
				if _, _, err := g.Committed(t.Context()); err != nil {
					t.Fatal(err)
				}
				if u := g.book.Mandate(m.ID); u.Count != 3 {
					t.Fatalf("the ledger charged %d uses to the mandate, want 3", u.Count)
				}
				// audit's reading agrees: three uses, each within the mandate.
				rep := ledger.Audit(f.ledgerLines(t), ParamsKeyFrom(f.key.Seed()), "", nil)
				set, err := g.MandatesNow(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if out := mandate.Audit(set, rep.Mandated); len(rep.Mandated) != 3 || len(out) != 0 {
					t.Fatalf("audit: %d uses, findings %v", len(rep.Mandated), out)
				}
			})
		}
	}
}
