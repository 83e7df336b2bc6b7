package server

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// paymentRequiredAt is paymentRequired for the resource url.
func paymentRequiredAt(url, amount, payTo string) map[string]any {
	pr := paymentRequired(amount, payTo)
	pr["resource"] = map[string]any{"url": url}
	return pr
}

// hasRule is authorize with the rules of the answer's reasons.
func hasRule(t *testing.T, s *Server, args map[string]any) (authorizeAnswer, []string) {
	t.Helper()
	isErr, text, st := callTool(t, s, "authorize_payment", args)
	if isErr {
		t.Fatalf("authorize_payment refused: %s", text)
	}
	var a authorizeAnswer
	var r struct {
		Reasons []struct {
			Rule string `json:"rule"`
		} `json:"reasons"`
	}
	if err := json.Unmarshal(st, &a); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(st, &r)
	var out []string
	for _, x := range r.Reasons {
		out = append(out, x.Rule)
	}
	return a, out
}

// The seller's host is judged beside the payee address: a seller that
// names a new payTo in every 402 is still one counterparty, for its open
// payments, its limit, and the lists that name its host.
func TestAuthorizePaymentJudgesTheSellerHost(t *testing.T) {
	payee := func(i int) string { return fmt.Sprintf("0x%040x", 0xbeef00+i) }
	policy := func(t *testing.T, text string) *Server {
		pol, err := guard.ParseConfig([]byte(text), "")
		if err != nil {
			t.Fatal(err)
		}
		return newPolicyServer(t, t.TempDir(), 0, pol)
	}
	t.Run("open payment to the host", func(t *testing.T) {
		s := policy(t, `{"maxOpenPartialPerCounterparty":0}`)
		first, _ := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt("https://api.seller.example/a", "1000000", payee(1))})
		if first.Decision != "allow" {
			t.Fatalf("first: %+v", first)
		}
		second, why := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt("https://api.seller.example/b", "1000000", payee(2))})
		if second.Decision != "review" || second.Payment != nil || !slices.Contains(why, guard.RuleOpenPartial) {
			t.Fatalf("a new payTo at the same host, its first payment open: %s %v", second.Decision, why)
		}
		// Another host with another payee is another counterparty.
		other, _ := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt("https://other.example/a", "1000000", payee(3))})
		if other.Decision != "allow" {
			t.Fatalf("another seller: %+v", other)
		}
	})
	t.Run("limit of the host", func(t *testing.T) {
		s := policy(t, `{"maxOpenPartialPerCounterparty":100,"perCounterpartyLimit":{"amount":"5.00","windowHours":24},"velocity":null}`)
		signed := 0
		for i := 0; i < 7; i++ {
			a, why := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt(fmt.Sprintf("https://api.seller.example/item/%d", i), "1000000", payee(i)),
				"resource": fmt.Sprintf("https://api.seller.example/item/%d", i)})
			if a.Payment != nil {
				signed++
			}
			if i >= 5 && (a.Decision != "review" || !slices.Contains(why, guard.RulePerCounterparty)) {
				t.Fatalf("payment %d of 1.00 to the host, past its 5.00: %s %v", i+1, a.Decision, why)
			}
		}
		if signed != 5 {
			t.Fatalf("%d × 1.00 signed to one host under a limit of 5.00", signed)
		}
	})
	t.Run("denylisted host", func(t *testing.T) {
		s := policy(t, `{"denylist":["api.seller.example"]}`)
		a, why := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt("https://API.Seller.example:443/x", "10000", payee(1))})
		if a.Decision != "block" || a.Payment != nil || !slices.Contains(why, guard.RuleDenylist) || a.Accepted.Host != "api.seller.example" {
			t.Fatalf("a 402 of a denylisted host: %s %v %+v", a.Decision, why, a.Accepted)
		}
	})
	t.Run("allowlisted host", func(t *testing.T) {
		s := policy(t, `{"allowlist":["api.seller.example"]}`)
		if a, why := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt("https://api.seller.example/x", "10000", payee(1))}); a.Decision != "allow" {
			t.Fatalf("an allowlisted host: %s %v", a.Decision, why)
		}
		if a, why := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt("https://elsewhere.example/x", "10000", payee(2))}); a.Decision != "review" || !slices.Contains(why, guard.RuleAllowlist) {
			t.Fatalf("a host off the allowlist: %s %v", a.Decision, why)
		}
	})
}

// A 402 that names no host the guard can read is refused, with nothing
// asked: a host the guard cannot judge would let a new payTo escape.
func TestAuthorizePaymentNeedsAHost(t *testing.T) {
	s := newTestServer(t, t.TempDir())
	v1 := map[string]any{"x402Version": 1, "accepts": []any{map[string]any{"scheme": "exact", "network": "base", "maxAmountRequired": "10000",
		"asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "payTo": sellerA, "maxTimeoutSeconds": 120,
		"extra": map[string]any{"name": "USD Coin", "version": "2"}}}}
	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"relative url", map[string]any{"payment_required": paymentRequiredAt("/data", "10000", sellerA)}, "names no host"},
		{"no resource at all", map[string]any{"payment_required": v1}, "declares no resource URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isErr, text, _ := callTool(t, s, "authorize_payment", tc.args)
			if !isErr || !strings.Contains(text, tc.want) || !strings.Contains(text, "nothing was asked or signed") {
				t.Fatalf("isError %v: %s", isErr, text)
			}
		})
	}
	// With the resource the agent requested, the same v1 402 is judged.
	if a, _ := hasRule(t, s, map[string]any{"payment_required": v1, "resource": "https://api.seller.example/data"}); a.Decision != "allow" || a.Accepted.Host != "api.seller.example" {
		t.Fatalf("v1 with resource: %+v", a)
	}
}

// Duplicates are judged on the resource the agent requested, in canonical
// form, with the seller's declaration as a second key: a seller that
// spells its declaration another way on each 402 (host case, a dot
// segment, a default port, a fragment) meets the payment already made,
// and one that adds a query the agent did not ask for is refused.
func TestAuthorizePaymentDuplicateOnTheRequestedResource(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"maxOpenPartialPerCounterparty":100,"duplicatePayment":{"windowMinutes":1440}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rec, err := simrec.New(dir, "run-1", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// The Trace records what the seller declared: the path only.
	if err := rec.PayAll([]simrec.Payment{{OperationID: "op-1", URL: "https://trace.seller.example/report", PayTo: sellerA, Amount: "10000", Outcome: "settled"}}); err != nil {
		t.Fatal(err)
	}
	s := newPolicyServer(t, dir, 0, pol)
	const asked = "https://api.seller.example/data"
	ask := func(declared, resource string) (authorizeAnswer, []string) {
		return hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt(declared, "10000", sellerA), "resource": resource})
	}
	if a, why := ask(asked, asked); a.Decision != "allow" {
		t.Fatalf("first payment: %s %v", a.Decision, why)
	}
	for _, declared := range []string{
		"https://API.Seller.EXAMPLE/data",
		"https://api.seller.example/./data",
		"https://api.seller.example/x/../data",
		"https://api.seller.example:443/data#again",
		"https://api.seller.example./data",
	} {
		if a, why := ask(declared, asked); a.Decision != "review" || a.Payment != nil || !slices.Contains(why, guard.RuleDuplicatePayment) {
			t.Errorf("declared %s for the same request: %s %v", declared, a.Decision, why)
		}
	}
	// The agent's own spelling of the same resource is the same resource.
	if a, why := ask(asked, "https://API.seller.example:443/./data#top"); a.Decision != "review" || !slices.Contains(why, guard.RuleDuplicatePayment) {
		t.Errorf("the request spelled another way: %s %v", a.Decision, why)
	}
	// A query the agent did not request: nothing is asked or signed.
	for _, declared := range []string{asked + "?n=2", asked + "?n=3"} {
		isErr, text, _ := callTool(t, s, "authorize_payment", map[string]any{"payment_required": paymentRequiredAt(declared, "10000", sellerA), "resource": asked})
		if !isErr || !strings.Contains(text, "a declared query must be the one requested") || !strings.Contains(text, "nothing was asked or signed") {
			t.Errorf("declared %s for %s: %v %s", declared, asked, isErr, text)
		}
	}
	// A query the agent requested is its own resource: not a duplicate.
	if a, why := ask(asked+"?page=2", asked+"?page=2"); a.Decision != "allow" {
		t.Errorf("another query the agent requested: %s %v", a.Decision, why)
	}
	// The seller's declaration is the second key: the Trace's payment for
	// the path it declared meets a request that carries a query.
	if a, why := ask("https://trace.seller.example/report", "https://trace.seller.example/report?fmt=pdf"); a.Decision != "review" || !slices.Contains(why, guard.RuleDuplicatePayment) {
		t.Errorf("a request whose declaration the Trace paid: %s %v", a.Decision, why)
	}
}

// What the official facilitator would refuse is refused before the engine
// is asked, so nothing is reserved for it: a 402 valid for 5 seconds, an
// entry that asks for Permit2 (skipped when another entry can be paid), a
// policy whose maxAuthorizationSeconds is too short to settle.
func TestAuthorizePaymentRefusesWhatCannotSettle(t *testing.T) {
	dir := t.TempDir()
	s := newTestServer(t, dir) // maxOpenPartial 0: a reserved hold would make the next answer review
	entry := func(mod func(e map[string]any)) map[string]any {
		e := paymentRequired("10000", sellerA)["accepts"].([]any)[0].(map[string]any)
		mod(e)
		return e
	}
	with := func(entries ...any) map[string]any {
		pr := paymentRequired("10000", sellerA)
		pr["accepts"] = entries
		return pr
	}
	short := entry(func(e map[string]any) { e["maxTimeoutSeconds"] = 5 })
	permit2 := entry(func(e map[string]any) {
		e["extra"] = map[string]any{"name": "USD Coin", "version": "2", "assetTransferMethod": "permit2"}
	})
	for _, tc := range []struct {
		name string
		pr   map[string]any
		want string
	}{
		{"valid 5 seconds", with(short), "maxTimeoutSeconds is 5 seconds"},
		{"permit2", with(permit2), "assetTransferMethod is permit2"},
		{"both", with(permit2, short), "accepts[1]: maxTimeoutSeconds is 5 seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isErr, text, _ := callTool(t, s, "authorize_payment", map[string]any{"payment_required": tc.pr})
			if !isErr || !strings.Contains(text, tc.want) || !strings.Contains(text, "nothing was asked or signed") {
				t.Fatalf("isError %v: %s", isErr, text)
			}
		})
	}
	// Nothing was reserved: the payable 402 of the same seller is allowed,
	// and a 402 offering Permit2 first is paid by its EIP-3009 entry.
	a := authorize(t, s, map[string]any{"payment_required": with(permit2, entry(func(map[string]any) {}))})
	if a.Decision != "allow" || a.Payment == nil {
		t.Fatalf("after the refusals: %+v", a)
	}
	var idx struct {
		Accepted struct {
			Index int `json:"index"`
		} `json:"accepted"`
	}
	_, _, st := callTool(t, s, "authorize_payment", map[string]any{"payment_required": with(permit2, entry(func(map[string]any) {}))})
	if json.Unmarshal(st, &idx); idx.Accepted.Index != 1 {
		t.Fatalf("chose accepts[%d], not the EIP-3009 entry", idx.Accepted.Index)
	}

	pol, err := guard.ParseConfig([]byte(`{"maxAuthorizationSeconds":10}`), "")
	if err != nil {
		t.Fatal(err)
	}
	p := newPolicyServer(t, t.TempDir(), 0, pol)
	isErr, text, _ := callTool(t, p, "authorize_payment", map[string]any{"payment_required": paymentRequired("10000", sellerA)})
	if !isErr || !strings.Contains(text, "maxAuthorizationSeconds is 10") || !strings.Contains(text, "nothing was asked or signed") {
		t.Fatalf("a policy too short to settle: %v %s", isErr, text)
	}
}
