package guard

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Every bundled template's example run decodes line by line, assembles to
// full, and is read by the guard as the guide says: an x402 example names
// its payee, amount and asset and is settled by its payload; the escrow
// example is attributed to no seller.
func TestGuideExampleIsReadAsTheGuideSays(t *testing.T) {
	for _, name := range receipt.BundledNames() {
		t.Run(name, func(t *testing.T) {
			tmpl, err := receipt.Bundled(name)
			if err != nil {
				t.Fatal(err)
			}
			g := GuideFor(tmpl)
			if g.Completeness != receipt.Full || g.Why != "" || len(g.Example) != len(tmpl.Stages) || len(g.Stages) != len(tmpl.Stages) {
				t.Fatalf("%s: example %s (%s), %d lines for %d stages", name, g.Completeness, g.Why, len(g.Example), len(tmpl.Stages))
			}
			var events []receipt.Event
			for _, l := range g.Example {
				ev, err := receipt.DecodeLine(l)
				if err != nil {
					t.Fatalf("example line %s: %v", l, err)
				}
				events = append(events, ev)
			}
			res := receipt.Assemble(events, tmpl)
			if len(res.Receipts) != 1 || res.Receipts[0].Completeness != receipt.Full {
				t.Fatalf("the example does not assemble to one full receipt: %+v", res.Receipts)
			}
			op := OpFromReceipt("run-1", &res.Receipts[0])
			if !op.RolesKnown || op.Open || !op.PaidConfirmed || !op.OutcomeConfirmed || op.SettlementUnconfirmed {
				t.Fatalf("the guard reads the example as %+v", op)
			}
			if name == "escrow-arc" {
				if op.Unattributable != whyEscrow || op.Money != nil {
					t.Fatalf("escrow example: %+v", op)
				}
				return
			}
			if op.Money == nil || op.Unattributable != "" || op.Money.Problem != "" || op.Money.Atomic.String() != "250000" ||
				op.Money.Asset != USDCBase || len(op.Money.PayTos) != 1 || len(op.Money.Hosts) != 1 || op.Money.Hosts[0] != "api.example.com" {
				t.Fatalf("the guard reads the example's money as %+v (%s)", op.Money, op.Unattributable)
			}
			// The stages the guard reads are labelled, with their fields.
			var paid, outcome *StageGuide
			for i := range g.Stages {
				switch g.Stages[i].Role {
				case "paid":
					paid = &g.Stages[i]
				case "outcome":
					outcome = &g.Stages[i]
				}
			}
			if paid == nil || outcome == nil || len(paid.Fields) != 5 || len(outcome.Fields) != 1 || outcome.Fields[0].Path != "payload.settle.success" {
				t.Fatalf("stage roles and fields: %+v", g.Stages)
			}
		})
	}
}

// The guard's reading of a payment that settles rests on settle.success:
// the example with it removed is, for the guard, not settled. The guide's
// field is what the guard checks.
func TestGuideSettleFieldIsWhatTheGuardChecks(t *testing.T) {
	tmpl, err := receipt.Bundled("x402-buyer")
	if err != nil {
		t.Fatal(err)
	}
	g := GuideFor(tmpl)
	var events []receipt.Event
	for _, l := range g.Example {
		s := strings.Replace(string(l), `"success":true`, `"success":"true"`, 1)
		ev, err := receipt.DecodeLine([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, ev)
	}
	res := receipt.Assemble(events, tmpl)
	op := OpFromReceipt("run-1", &res.Receipts[0])
	if res.Receipts[0].Completeness != receipt.Full || op.OutcomeConfirmed || !op.SettlementUnconfirmed || !op.Open {
		t.Fatalf("a settle.success that is not true: %s, %+v", res.Receipts[0].Completeness, op)
	}
}

// An operator's template gets an example from its own stages; one whose
// required stage is closed only by an exception says no run can be full.
func TestGuideOperatorTemplates(t *testing.T) {
	for _, tc := range []struct {
		yaml, want, why string
	}{
		{`template: my-flow
version: 1
stages:
  - id: paid
    required: true
    match:
      - event: x402.payment.submitted
        role: client
  - id: delivered
    required: true
    match:
      - event: x402.payment.responded
        role: client
exceptions:
  - x402.payment.failed
`, receipt.Full, ""},
		{`template: broken-flow
version: 1
stages:
  - id: paid
    required: true
    match:
      - event: x402.payment.failed
exceptions:
  - x402.payment.failed
`, receipt.Partial, "every event that closes stage paid is also an exception"},
	} {
		tmpl, err := receipt.ParseTemplate("test", []byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		g := GuideFor(tmpl)
		if g.Completeness != tc.want || !strings.Contains(g.Why, tc.why) {
			t.Errorf("%s: %s (%s), want %s (%s)", tmpl.Name, g.Completeness, g.Why, tc.want, tc.why)
		}
		if !strings.Contains(g.Reading, "knows no stage roles") {
			t.Errorf("%s: reading %q", tmpl.Name, g.Reading)
		}
		if _, err := json.Marshal(g); err != nil {
			t.Fatal(err)
		}
	}
}
