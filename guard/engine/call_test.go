package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

func TestCallParamsHash(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	h1, err := CallParamsHash(key, Call{Tool: "send", Arguments: []byte(`{"amount":"1","to":"0xA"}`)})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		c    Call
		same bool
		err  string
	}{
		{"same call", Call{Tool: "send", Arguments: []byte(`{"amount":"1","to":"0xA"}`)}, true, ""},
		{"another tool", Call{Tool: "send2", Arguments: []byte(`{"amount":"1","to":"0xA"}`)}, false, ""},
		{"another argument", Call{Tool: "send", Arguments: []byte(`{"amount":"1","memo":"x","to":"0xA"}`)}, false, ""},
		{"not canonical", Call{Tool: "send", Arguments: []byte(`{"to":"0xA","amount":"1"}`)}, false, "canonical"},
		{"duplicate key", Call{Tool: "send", Arguments: []byte(`{"amount":"1","amount":"2"}`)}, false, "duplicate"},
		{"no tool", Call{Arguments: []byte(`{}`)}, false, "no tool"},
	}
	for _, c := range cases {
		h, err := CallParamsHash(key, c.c)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: want %q, got %v", c.name, c.err, err)
			}
			continue
		}
		if err != nil || (h == h1) != c.same || !strings.HasPrefix(h, "hmac-sha256:") {
			t.Errorf("%s: %s (%v), first %s", c.name, h, err, h1)
		}
	}
}

// A forwarded call's decision and its outcome are two receipts with one
// action and one paramsHash — the call's, not the question's.
func TestCheckCallRecordsTheCallAndItsOutcome(t *testing.T) {
	f := newFixture(t, t.TempDir(), lenientPolicy)
	ctx := context.Background()
	q := Question{Counterparty: "0xA11CE00000000000000000000000000000000001", Amount: "0.25"}
	call := Call{Tool: "send_usdc", Arguments: []byte(`{"amount":"0.25","to":"0xA11CE00000000000000000000000000000000001"}`)}
	ans, err := f.eng.CheckCall(ctx, "agent", q, call)
	if err != nil || ans.Decision != guard.Allow {
		t.Fatalf("%+v %v", ans, err)
	}
	want, _ := CallParamsHash(f.eng.cfg.ParamsKey, call)
	plain, _ := ParamsHash(f.eng.cfg.ParamsKey, guard.Question{Counterparty: strings.ToLower(q.Counterparty), Amount: "0.25", Asset: f.eng.Policy().DefaultAsset.Key, Template: guard.DefaultTemplate})
	if ans.ParamsHash != want || ans.ParamsHash == plain || ans.ActionID == "" {
		t.Fatalf("paramsHash %s, want the call's %s (not the question's %s)", ans.ParamsHash, want, plain)
	}
	for _, o := range []Outcome{OutcomeExecuted, OutcomeToolError, OutcomeLost} {
		if _, err := f.eng.RecordOutcome(ctx, "agent", ans, o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.eng.RecordOutcome(ctx, "agent", Answer{}, OutcomeExecuted); err == nil {
		t.Fatal("an outcome without a recorded decision was recorded")
	}
	var rs []noa.Receipt
	err = f.log.Store().View(ctx, func(r reviewlog.Reader) error {
		var err error
		rs, err = reviewlog.ReadChainFile(ctx, r, f.eng.cfg.Chains.ChainID())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 { // the ledger's start is signed into a chain of its own
		t.Fatalf("%d receipts, want the decision and three outcomes", len(rs))
	}
	verdicts := []string{}
	for _, r := range rs {
		if r.Action.ID != ans.ActionID || r.Action.ParamsHash != want {
			t.Fatalf("receipt %s: action %s %s", r.ID, r.Action.ID, r.Action.ParamsHash)
		}
		verdicts = append(verdicts, r.Governance.Verdict)
	}
	if strings.Join(verdicts, ",") != "ALLOWED,EXECUTED,FAILED,FAILED" {
		t.Fatalf("verdicts %v", verdicts)
	}
	if !OutcomeToolError.Settled() || !OutcomeRefused.Settled() || OutcomeToolErrorUnknown.Settled() || OutcomeErrorUnknown.Settled() || OutcomeLost.Settled() || OutcomeTimeout.Settled() || OutcomeExecuted.Settled() {
		t.Fatal("Settled")
	}
}
