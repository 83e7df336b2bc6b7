package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

const mandatePayee = "0x209693bc6afc0c5328ba36faf03c514ef312287c"

// mandateRig is a rig whose policy knows USDC and asks two signatures of
// a mandate of more than 1.00 USDC a payment.
func mandateRig(t *testing.T) *rig {
	return newRig(t, func(c *console.Config) {
		c.Assets = func(string) (string, int, bool) { return "USDC", 6, true }
		c.MandateApprovals = func(max *big.Int, _ string) int {
			if max.Cmp(big.NewInt(1_000_000)) > 0 {
				return 2
			}
			return 1
		}
	})
}

// askPayee opens a review of a payment of amount USDC to mandatePayee
// that only the amount rule asks for.
func (g *rig) askPayee(amount, atomic string, n int) reviewlog.Review {
	g.t.Helper()
	g.amountAtomic = atomic
	defer func() { g.amountAtomic = "" }()
	q := guard.Question{Counterparty: mandatePayee, Amount: amount, Asset: "USDC", Template: "x402-buyer"}
	return g.askAs("agent-1", q, []guard.Reason{{Rule: guard.RuleReviewAbove, Detail: "above 0.05 USDC"}}, n).Review
}

func (g *rig) mandates() mandate.Set {
	g.t.Helper()
	set, err := engine.ReadMandates(context.Background(), g.log, "t1")
	if err != nil {
		g.t.Fatal(err)
	}
	return set
}

// beginGrant asks the options of an approval of review id granting the
// mandate of bounds m; it returns them and the grant proposed.
func (g *rig) beginGrant(b *browser, id string, m map[string]any) (map[string]any, map[string]any) {
	g.t.Helper()
	code, opts := b.post("api/reviews/"+id+"/begin", map[string]any{"decision": "approved", "note": "", "mandate": m})
	if code != 200 {
		g.t.Fatalf("begin with a mandate: %d %v", code, opts)
	}
	grant, ok := opts["grant"].(map[string]any)
	if !ok {
		g.t.Fatalf("begin proposed no grant: %v", opts)
	}
	return opts, grant
}

func (g *rig) finishGrant(b *browser, id string, x softauthn.Assertion, grant map[string]any) (int, map[string]any) {
	j, _ := x.JSON()
	body := map[string]any{"decision": "approved", "note": "", "credential": json.RawMessage(j)}
	if grant != nil {
		body["grant"] = grant
	}
	return b.post("api/reviews/"+id+"/finish", body)
}

func edited(grant map[string]any, key string, v any) map[string]any {
	out := map[string]any{}
	for k, w := range grant {
		out[k] = w
	}
	out[key] = v
	return out
}

// Approving with "and allow this payee": the review page offers the
// payee's mandate prefilled from the review; one passkey assertion signs
// the approval and the grant's terms (the challenge binds both); the
// console refuses, writing nothing, a grant edited after the signature,
// the approval taken without its grant, another passkey's assertion, a
// grant for another payee or with fewer signatures than the quorum asks;
// the real one records both, the page shows the mandate, the audit
// agrees; a mandate past the quorum's threshold is recorded needing the
// other signatures; a budget raised in the store afterwards no longer
// verifies.
func TestConsoleApproveWithMandate(t *testing.T) {
	g := mandateRig(t)
	alice, _ := softauthn.New()
	mallory, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	rv := g.askPayee("0.25", "250000", 1)
	code, page := b.get("reviews/" + rv.ID)
	for _, want := range []string{"and allow this payee", `id="m-max" inputmode="decimal" autocomplete="off" value="0.25"`, `value="2.50"`, `id="m-count" type="number" min="0" step="1" value="10"`, "only for caller agent-1"} {
		if code != 200 || !strings.Contains(page, want) {
			t.Fatalf("the review page does not offer %q (%d):\n%s", want, code, page)
		}
	}

	bounds := map[string]any{"max_amount": "0.50", "budget": "2.00", "count": 4, "expires": "24h", "agent": true}
	opts, grant := g.beginGrant(b, rv.ID, bounds)
	raw, _ := json.Marshal(grant)
	var rec mandate.Record
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	ch, _, err := rec.PasskeyChallenge()
	if err != nil || string(ch) != string(challengeOf(t, opts)) || rec.Decision != opts["decision_hash"] || rec.PayTo != mandatePayee ||
		rec.MaxAtomic != "500000" || rec.BudgetAtomic != "2000000" || rec.Count != 4 || rec.Agent != "agent-1" || rec.By != "alice" || rec.Approvals != 0 {
		t.Fatalf("the challenge is not the grant's bound to the decision: %+v", rec)
	}

	x, _ := alice.Assert(g.rpID, g.origin, challengeOf(t, opts))
	before := g.receipts()
	for _, tc := range []struct {
		name  string
		x     softauthn.Assertion
		grant map[string]any
		code  int
		words string
	}{
		{"the budget raised after the signature", x, edited(grant, "budget_atomic", "200000000"), http.StatusForbidden, "does not sign this approval and the mandate's terms"},
		{"the count dropped after the signature", x, edited(grant, "count", 0), http.StatusForbidden, "does not sign this approval and the mandate's terms"},
		{"the approval without its grant", x, nil, http.StatusForbidden, "does not sign this decision"},
		{"another payee", x, edited(grant, "pay_to", "0x"+strings.Repeat("ab", 20)), http.StatusBadRequest, "another payee"},
		{"mallory's passkey", func() softauthn.Assertion { y, _ := mallory.Assert(g.rpID, g.origin, challengeOf(t, opts)); return y }(), grant, http.StatusForbidden, "not one of alice's"},
	} {
		code, res := g.finishGrant(b, rv.ID, tc.x, tc.grant)
		if code != tc.code || !strings.Contains(fmt.Sprint(res["error"]), tc.words) {
			t.Fatalf("%s: %d %v, want %d saying %q", tc.name, code, res, tc.code, tc.words)
		}
		if set := g.mandates(); set.Lines != 0 {
			t.Fatalf("%s: %d mandate records written", tc.name, set.Lines)
		}
		if n := g.receipts(); n != before {
			t.Fatalf("%s: %d receipts written", tc.name, n-before)
		}
	}
	if code, res := b.post("api/reviews/"+rv.ID+"/begin", map[string]any{"decision": "rejected", "mandate": bounds}); code != http.StatusBadRequest {
		t.Fatalf("a mandate with a rejection: %d %v", code, res)
	}
	if code, res := b.post("api/reviews/"+rv.ID+"/begin", map[string]any{"decision": "approved", "mandate": edited(bounds, "expires", "9000h")}); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(res["error"]), "at most") {
		t.Fatalf("a mandate of more than a year: %d %v", code, res)
	}

	code, res := g.finishGrant(b, rv.ID, x, grant)
	if code != 200 || res["status"] != "approved" || res["mandate_id"] != rec.ID || res["mandate_needs"] != nil {
		t.Fatalf("the approval with its mandate: %d %v", code, res)
	}
	set := g.mandates()
	m := set.Mandates[rec.ID]
	if len(set.Findings) > 0 || m == nil || !m.Complete() || m.Signers[0] != "alice" || !m.Grant.SignedWithPasskey() {
		t.Fatalf("the mandate records: %v %+v", set.Findings, m)
	}
	if v, _, err := g.log.Verified(context.Background(), rv.ID); err != nil || v.Status != reviewlog.Approved || v.DecidedWith != reviewlog.DecidedWithPasskey {
		t.Fatalf("the review: %+v %v", v, err)
	}
	if rep, err := g.log.Audit(context.Background(), g.keyring()); err != nil || len(rep.Findings) != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
	if _, page := b.get("reviews/" + rv.ID); !strings.Contains(page, "Standing approvals granted with this review") || !strings.Contains(page, rec.ID+"</code>: live") ||
		!strings.Contains(page, "up to 0.50 USDC a payment to "+mandatePayee+" by agent-1, 2.00 USDC in all in at most 4 payments") {
		t.Fatalf("the decided review's page does not show its mandate:\n%s", page)
	}

	// Past the quorum's threshold: recorded, needing another signature.
	rv2 := g.askPayee("1.50", "1500000", 2)
	opts2, grant2 := g.beginGrant(b, rv2.ID, edited(bounds, "max_amount", "2.00"))
	if grant2["approvals"] != float64(2) {
		t.Fatalf("a mandate of 2.00 USDC a payment asks %v signatures, want 2", grant2["approvals"])
	}
	x2, _ := alice.Assert(g.rpID, g.origin, challengeOf(t, opts2))
	if code, res := g.finishGrant(b, rv2.ID, x2, edited(grant2, "approvals", 0)); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(res["error"]), "the policy's quorum asks 2") {
		t.Fatalf("a grant that dropped its quorum: %d %v", code, res)
	}
	code, res = g.finishGrant(b, rv2.ID, x2, grant2)
	if code != 200 || !strings.Contains(fmt.Sprint(res["mandate_needs"]), "1 more signature from other trusted reviewers before it can be used: each runs haia-trace-mcp mandate sign "+fmt.Sprint(grant2["id"])) {
		t.Fatalf("the approval with a mandate past the quorum: %d %v", code, res)
	}
	if _, page := b.get("reviews/" + rv2.ID); !strings.Contains(page, "signed by 1 of the 2 reviewers it needs") || !strings.Contains(page, "haia-trace-mcp mandate sign") {
		t.Fatalf("the page of a mandate needing a signature:\n%s", page)
	}

	// A writer of the volume raises the first mandate's budget.
	path := filepath.Join(g.dir, reviewlog.DirName, filestore.MandatesFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), `"budget_atomic":"2000000"`, `"budget_atomic":"200000000"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if set := g.mandates(); len(set.Findings) == 0 || !strings.Contains(set.Findings[0], `grant of mandate `+rec.ID+` is not trusted: not signed by reviewer "alice"'s passkey`) {
		t.Fatalf("after the budget was raised: %v", set.Findings)
	}
	if _, page := b.get("reviews/" + rv.ID); !strings.Contains(page, "do not verify") {
		t.Fatalf("the page after the budget was raised does not say the records do not verify:\n%s", page)
	}
}
