package engine

import (
	"context"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// A settled payment's last event comes 3.31 s after its run starts (simrec:
// 402 +1 s, creating +120 ms, submitted +360 ms, responded +1830 ms).
const settleTook = 3310 * time.Millisecond

const sellerC = "0xC0C0000000000000000000000000000000000003"

// payment is one settled payment, recorded in a run of its own that starts
// at at, so that its last event is at at+settleTook.
type payment struct {
	run, payTo, url, amount string
	at                      time.Time
}

func TestLimitsThroughTheEngine(t *testing.T) {
	const base = `"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "10000"}`
	const url = "https://api.example.com/reports/weekly"
	t0 := start
	last := t0.Add(settleTook) // the last event of a payment made at t0
	paid := func(run, payTo, url, amount string) payment { return payment{run, payTo, url, amount, t0} }
	tests := []struct {
		name     string
		policy   string
		history  []payment
		now      time.Time
		caller   string
		question Question
		want     string
		rule     string // a rule the answer must carry (or, for allow, must not)
		detail   string // in the history line, when set
	}{
		{name: "total: exactly at the limit", policy: `{` + base + `, "totalLimit": {"amount": "3", "windowHours": 1}}`,
			history: []payment{paid("r1", sellerA, url, "1000000"), paid("r2", sellerB, url, "1000000")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerC, Amount: "1"}, want: guard.Allow, rule: guard.RuleTotalLimit},
		{name: "total: one atomic unit over", policy: `{` + base + `, "totalLimit": {"amount": "3", "windowHours": 1}}`,
			history: []payment{paid("r1", sellerA, url, "1000000"), paid("r2", sellerB, url, "1000000")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerC, Amount: "1.000001"}, want: guard.Review, rule: guard.RuleTotalLimit},
		{name: "total: the window edge is inside", policy: `{` + base + `, "totalLimit": {"amount": "3", "windowHours": 1}}`,
			history: []payment{paid("r1", sellerA, url, "1000000"), paid("r2", sellerB, url, "1000000")}, now: last.Add(time.Hour),
			question: Question{Counterparty: sellerC, Amount: "1.000001"}, want: guard.Review, rule: guard.RuleTotalLimit},
		{name: "total: one millisecond later it is outside", policy: `{` + base + `, "totalLimit": {"amount": "3", "windowHours": 1}}`,
			history: []payment{paid("r1", sellerA, url, "1000000"), paid("r2", sellerB, url, "1000000")}, now: last.Add(time.Hour + time.Millisecond),
			question: Question{Counterparty: sellerC, Amount: "1.000001"}, want: guard.Allow, rule: guard.RuleTotalLimit},

		{name: "velocity per counterparty: this one makes the count", policy: `{` + base + `, "velocity": {"perCounterparty": {"count": 3, "windowMinutes": 10}}}`,
			history: []payment{paid("r1", sellerA, url, "1"), paid("r2", sellerA, url, "1"), paid("r3", sellerB, url, "1")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerA, Amount: "0.01"}, want: guard.Allow, rule: guard.RuleVelocity},
		{name: "velocity per counterparty: one over", policy: `{` + base + `, "velocity": {"perCounterparty": {"count": 2, "windowMinutes": 10}}}`,
			history: []payment{paid("r1", sellerA, url, "1"), paid("r2", sellerA, url, "1"), paid("r3", sellerB, url, "1")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerA, Amount: "0.01"}, want: guard.Review, rule: guard.RuleVelocity},
		{name: "velocity per counterparty: another seller is not counted", policy: `{` + base + `, "velocity": {"perCounterparty": {"count": 2, "windowMinutes": 10}}}`,
			history: []payment{paid("r1", sellerA, url, "1"), paid("r2", sellerA, url, "1"), paid("r3", sellerB, url, "1")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerB, Amount: "0.01"}, want: guard.Allow, rule: guard.RuleVelocity},
		{name: "velocity per counterparty: the window edge is inside", policy: `{` + base + `, "velocity": {"perCounterparty": {"count": 2, "windowMinutes": 10}}}`,
			history: []payment{paid("r1", sellerA, url, "1"), paid("r2", sellerA, url, "1")}, now: last.Add(10 * time.Minute),
			question: Question{Counterparty: sellerA, Amount: "0.01"}, want: guard.Review, rule: guard.RuleVelocity},
		{name: "velocity per counterparty: one millisecond later it is outside", policy: `{` + base + `, "velocity": {"perCounterparty": {"count": 2, "windowMinutes": 10}}}`,
			history: []payment{paid("r1", sellerA, url, "1"), paid("r2", sellerA, url, "1")}, now: last.Add(10*time.Minute + time.Millisecond),
			question: Question{Counterparty: sellerA, Amount: "0.01"}, want: guard.Allow, rule: guard.RuleVelocity},
		{name: "velocity total: one over, whoever was paid", policy: `{` + base + `, "velocity": {"total": {"count": 2, "windowMinutes": 10}}}`,
			history: []payment{paid("r1", sellerA, url, "1"), paid("r2", sellerB, url, "1")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerC, Amount: "0.01"}, want: guard.Review, rule: guard.RuleVelocity},

		{name: "duplicate: the same resource, spelled otherwise", policy: `{` + base + `, "duplicatePayment": {"windowMinutes": 30}}`,
			history: []payment{paid("r1", sellerA, url, "1")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerB, Amount: "0.01", Resource: "https://API.example.com:443/reports/./weekly#x"}, want: guard.Review, rule: guard.RuleDuplicatePayment},
		{name: "duplicate: the window edge is inside", policy: `{` + base + `, "duplicatePayment": {"windowMinutes": 30}}`,
			history: []payment{paid("r1", sellerA, url, "1")}, now: last.Add(30 * time.Minute),
			question: Question{Counterparty: sellerA, Amount: "0.01", Resource: url}, want: guard.Review, rule: guard.RuleDuplicatePayment},
		{name: "duplicate: one millisecond later it is outside", policy: `{` + base + `, "duplicatePayment": {"windowMinutes": 30}}`,
			history: []payment{paid("r1", sellerA, url, "1")}, now: last.Add(30*time.Minute + time.Millisecond),
			question: Question{Counterparty: sellerA, Amount: "0.01", Resource: url}, want: guard.Allow, rule: guard.RuleDuplicatePayment},
		{name: "duplicate: another resource", policy: `{` + base + `, "duplicatePayment": {"windowMinutes": 30}}`,
			history: []payment{paid("r1", sellerA, url, "1")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerA, Amount: "0.01", Resource: url + "?week=2"}, want: guard.Allow, rule: guard.RuleDuplicatePayment},
		{name: "duplicate: no resource, and the history line says so", policy: `{` + base + `, "duplicatePayment": {"windowMinutes": 30}}`,
			history: []payment{paid("r1", sellerA, url, "1")}, now: last.Add(time.Minute),
			question: Question{Counterparty: sellerA, Amount: "0.01"}, want: guard.Allow, rule: guard.RuleDuplicatePayment, detail: "could not apply"},

		{name: "agents: the caller's own limit", policy: `{` + base + `, "agents": {"bot-small": {"totalLimit": {"amount": "1"}}}}`,
			history: []payment{paid("r1", sellerA, url, "1000000")}, now: last.Add(time.Minute), caller: "bot-small",
			question: Question{Counterparty: sellerB, Amount: "0.01"}, want: guard.Review, rule: guard.RuleTotalLimit, detail: "policy: defaults + file + agent bot-small"},
		{name: "agents: another caller gets the default", policy: `{` + base + `, "agents": {"bot-small": {"totalLimit": {"amount": "1"}}}}`,
			history: []payment{paid("r1", sellerA, url, "1000000")}, now: last.Add(time.Minute), caller: "bot-big",
			question: Question{Counterparty: sellerB, Amount: "0.01"}, want: guard.Allow, rule: guard.RuleTotalLimit, detail: "policy: defaults + file"},
		{name: "agents: an agent turns a default rule off", policy: `{` + base + `, "velocity": {"total": {"count": 1}}, "agents": {"batch": {"velocity": null}}}`,
			history: []payment{paid("r1", sellerA, url, "1")}, now: last.Add(time.Minute), caller: "batch",
			question: Question{Counterparty: sellerA, Amount: "0.01"}, want: guard.Allow, rule: guard.RuleVelocity, detail: "policy: defaults + file + agent batch"},
		{name: "agents: and the default keeps it", policy: `{` + base + `, "velocity": {"total": {"count": 1}}, "agents": {"batch": {"velocity": null}}}`,
			history: []payment{paid("r1", sellerA, url, "1")}, now: last.Add(time.Minute), caller: "interactive",
			question: Question{Counterparty: sellerA, Amount: "0.01"}, want: guard.Review, rule: guard.RuleVelocity, detail: "policy: defaults + file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, t.TempDir(), tc.policy)
			for i, p := range tc.history {
				rec, err := simrec.New(f.dir, p.run, p.at)
				if err != nil {
					t.Fatal(err)
				}
				if err := rec.Pay(simrec.Payment{OperationID: "op-" + string(rune('a'+i)), URL: p.url, PayTo: p.payTo, Amount: p.amount, Outcome: "settled"}); err != nil {
					t.Fatal(err)
				}
			}
			now := tc.now
			f.eng.cfg.Now = func() time.Time { return now }
			caller := tc.caller
			if caller == "" {
				caller = "agent-1"
			}
			ans, err := f.eng.Check(context.Background(), caller, tc.question)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			fired := strings.Contains(","+strings.Join(rules(ans), ",")+",", ","+tc.rule+",")
			if ans.Decision != tc.want || fired != (tc.want != guard.Allow) {
				t.Fatalf("decision %s (rule %s fired: %v), want %s; reasons %+v", ans.Decision, tc.rule, fired, tc.want, ans.Reasons)
			}
			hist := ans.Reasons[len(ans.Reasons)-1]
			if tc.detail != "" && !strings.Contains(hist.Detail, tc.detail) {
				t.Errorf("history line %q, want it to mention %q", hist.Detail, tc.detail)
			}
			if ans.ReceiptID == "" || (ans.Decision == guard.Review) != (ans.ReviewID != "") {
				t.Errorf("answer not recorded as it should be: %+v", ans)
			}
		})
	}
}

// The duplicate's evidence is the earlier operation, and a reviewer's
// approval of the repeat is honoured once, like any review.
func TestDuplicateEvidenceIsTheEarlierOperation(t *testing.T) {
	f := newFixture(t, t.TempDir(), `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "10000"}, "duplicatePayment": {}}`)
	f.pay(t, "run-1", settled("op-1", sellerA, "https://api.example.com/a"), settled("op-2", sellerA, "https://api.example.com/b"))
	ans, err := f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.10", Resource: "https://api.example.com/b"})
	if err != nil {
		t.Fatal(err)
	}
	var dup *guard.Reason
	for i := range ans.Reasons {
		if ans.Reasons[i].Rule == guard.RuleDuplicatePayment {
			dup = &ans.Reasons[i]
		}
	}
	if ans.Decision != guard.Review || dup == nil || len(dup.Evidence) != 1 || dup.Evidence[0] != (guard.Ref{RunID: "run-1", OperationID: "op-2"}) {
		t.Fatalf("%+v", ans)
	}
	_, err = f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.10", Resource: "ftp://api.example.com/b"})
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(refused.Message, "resource:") {
		t.Fatalf("a resource that is no http(s) URL must be refused by name: %v", err)
	}
}

// Every new figure reaches the custom-rules snapshot, and only when its
// rule is configured.
func TestSnapshotCarriesTheNewFigures(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove": "1000", "totalLimit": {"amount": "50"}, "velocity": {"perCounterparty": {"count": 9}, "total": {"count": 9}},
		"duplicatePayment": {}, "agents": {"bot": {}}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	p := pol.For("bot")
	req, err := guard.ParseRequest(guard.RawRequest{Counterparty: sellerA, Amount: "0.5", Resource: "https://api.example.com/a"}, p)
	if err != nil {
		t.Fatal(err)
	}
	now := start.Add(time.Hour)
	ops := []guard.Op{{RunID: "r", OperationID: "o", RolesKnown: true, PaidConfirmed: true, OutcomeConfirmed: true, Spent: true,
		Money:       &guard.Money{PayTos: []string{strings.ToLower(sellerA)}, Hosts: []string{"api.example.com"}, Resources: []string{"https://api.example.com/a"}, Atomic: big.NewInt(2_000_000), Asset: guard.USDCBase},
		LastEventAt: now.Add(-time.Minute).Format(time.RFC3339Nano)}}
	dec := guard.Decide(req, guard.History{Ops: ops, Runs: 1}, p, now)
	snap, err := ruleSnapshot(req, &dec)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]policy.Scalar{
		"args.resource":                      policy.String("https://api.example.com/a"),
		"policy.agent":                       policy.String("bot"),
		"history.spendTotalInWindowAtomic":   policy.Int(2_000_000),
		"history.spendTotalWithAmountAtomic": policy.Int(2_500_000),
		"history.totalWindowOperations":      policy.Int(1),
		"history.totalMixedAssets":           policy.Int(0),
		"history.totalUnparseableHistory":    policy.Int(0),
		"history.paymentsInWindow":           policy.Int(1),
		"history.paymentsTotalInWindow":      policy.Int(1),
		"history.duplicatePayments":          policy.Int(1),
		"history.paidWithoutResource":        policy.Int(0),
	} {
		if got, ok := snap[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	plain := guard.DefaultConfig()
	req, _ = guard.ParseRequest(guard.RawRequest{Counterparty: sellerA, Amount: "0.5"}, plain)
	dec = guard.Decide(req, guard.History{Ops: ops, Runs: 1}, plain, now)
	snap, err = ruleSnapshot(req, &dec)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"args.resource", "history.spendTotalInWindowAtomic", "history.paymentsInWindow", "history.paymentsTotalInWindow", "history.duplicatePayments"} {
		if _, ok := snap[key]; ok {
			t.Errorf("%s is present although its rule is not configured", key)
		}
	}
	if snap["policy.agent"] != policy.String("") {
		t.Errorf("policy.agent of the default policy: %v", snap["policy.agent"])
	}
}
