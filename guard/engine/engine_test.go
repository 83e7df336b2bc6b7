package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const (
	sellerA = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	sellerB = "0xB0B0000000000000000000000000000000000002"
)

var start = time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)

// lenientPolicy leaves only the history rules to decide: no amount limit
// fires for the small amounts these tests ask about.
const lenientPolicy = `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "10000", "windowHours": 48}}`

type fixture struct {
	dir  string
	root *confined.Dir
	eng  *Engine
	log  *reviewlog.Log
}

// newFixture builds an engine over a real Trace root in a temporary
// directory: history is read from the run files, the templates are loaded
// once into a registry, decisions go to a real review log and chain.
func newFixture(t testing.TB, dir, policyJSON string) *fixture {
	t.Helper()
	for _, d := range []string{"events", "templates"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root, events := openTestRoot(t, dir)
	pol, err := guard.ParseConfig([]byte(policyJSON), "")
	if err != nil {
		t.Fatal(err)
	}
	tdir := filepath.Join(dir, "templates")
	set, errs := receipt.NewTemplateSet(func() (*receipt.Registry, []error) {
		ents, err := os.ReadDir(tdir)
		if err != nil {
			return nil, []error{err}
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return receipt.LoadRegistry(os.DirFS(tdir), "templates", names)
	})
	if set == nil {
		t.Fatal(errs)
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	log := reviewlog.OpenStore(filestore.New(root), reviewlog.Options{})
	eng, err := New(Config{
		Policy:    pol,
		Templates: set,
		History:   ScanHistory{Events: events},
		Log:       log,
		Chains:    &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "test"},
		ParamsKey: ParamsKeyFrom(key.Seed()),
		Now:       func() time.Time { return start.Add(time.Hour) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{dir: dir, root: root, eng: eng, log: log}
}

// openTestRoot opens dir as a Trace root with its events/ directory, both
// closed when the test ends.
func openTestRoot(tb testing.TB, dir string) (root, events *confined.Dir) {
	tb.Helper()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		tb.Fatal(err)
	}
	events, err = root.OpenDir("events")
	if err != nil {
		root.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { events.Close(); root.Close() })
	return root, events
}

func (f *fixture) pay(t testing.TB, run string, ps ...simrec.Payment) {
	t.Helper()
	rec, err := simrec.New(f.dir, run, start)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.PayAll(ps); err != nil {
		t.Fatal(err)
	}
}

func settled(id, payTo, url string) simrec.Payment {
	return simrec.Payment{OperationID: id, URL: url, PayTo: payTo, Amount: "100000", Outcome: "settled"}
}

func unsettled(id, payTo, url string) simrec.Payment {
	return simrec.Payment{OperationID: id, URL: url, PayTo: payTo, Amount: "100000", Outcome: "unsettled"}
}

func rules(a Answer) []string {
	var out []string
	for _, r := range a.Reasons {
		if r.Rule != guard.RuleHistory {
			out = append(out, r.Rule)
		}
	}
	return out
}

func deepJSON(depth int) json.RawMessage {
	return json.RawMessage(strings.Repeat("[", depth) + strings.Repeat("]", depth))
}

// Every attack of issue 12 is a case here: each turned a review into an
// allow on version 1. The first two cases show the fixture can tell the two
// apart.
func TestAttacksAnswerReviewOrBlock(t *testing.T) {
	withSettle := func(p simrec.Payment, settle any) simrec.Payment { p.Settle = settle; return p }
	const url = "https://api.example.com/reports/weekly"
	tests := []struct {
		name     string
		runs     map[string][]simrec.Payment
		question Question
		want     string // decision
		rule     string // a rule the answer must carry
	}{
		{name: "baseline: a settled seller is allowed",
			runs: map[string][]simrec.Payment{"run-1": {settled("op-1", sellerA, url)}}, question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Allow},
		{name: "baseline: an unsettled seller is reviewed",
			runs: map[string][]simrec.Payment{"run-1": {unsettled("op-1", sellerA, url)}}, question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},

		{name: "seller: a 402 answer nested past the depth bound makes the run unreadable",
			runs:     map[string][]simrec.Payment{"run-1": {unsettled("op-1", sellerA, url), {OperationID: "op-2", URL: url, PayTo: sellerA, Amount: "1", Outcome: "walked-away", OfferExtra: deepJSON(5000)}}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleUnreadable},
		{name: "seller: a 402 answer longer than the line bound makes the run unreadable",
			runs:     map[string][]simrec.Payment{"run-1": {unsettled("op-1", sellerA, url), {OperationID: "op-2", URL: url, PayTo: sellerA, Amount: "1", Outcome: "walked-away", OfferExtra: json.RawMessage(`"` + strings.Repeat("x", 5<<20) + `"`)}}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleUnreadable},
		{name: "seller: an unreadable run does not hide another run's debt",
			runs:     map[string][]simrec.Payment{"run-1": {unsettled("op-1", sellerA, url)}, "run-2": {{OperationID: "x", URL: url, PayTo: sellerA, Amount: "1", Outcome: "walked-away", OfferExtra: deepJSON(5000)}}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "seller: settle.success false is not a settlement",
			runs:     map[string][]simrec.Payment{"run-1": {withSettle(settled("op-1", sellerA, url), map[string]any{"success": false, "error_reason": "insufficient_funds"})}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "seller: settle.success \"true\" (a string) is not a settlement",
			runs:     map[string][]simrec.Payment{"run-1": {withSettle(settled("op-1", sellerA, url), map[string]any{"success": "true"})}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "seller: a settlement answer without settle is not a settlement",
			runs:     map[string][]simrec.Payment{"run-1": {withSettle(settled("op-1", sellerA, url), map[string]any{})}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "seller: pay_to spelled 0X",
			runs:     map[string][]simrec.Payment{"run-1": {unsettled("op-1", "0X"+strings.ToUpper(sellerA[2:]), url)}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "seller: pay_to with surrounding spaces",
			runs:     map[string][]simrec.Payment{"run-1": {unsettled("op-1", "  "+sellerA+"\t", url)}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "seller: pay_to that is no address leaves the debt unattributable",
			runs:     map[string][]simrec.Payment{"run-1": {unsettled("op-1", "seller-a", url)}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleUnattributable},
		{name: "seller: events that disagree on pay_to count against the first",
			runs:     map[string][]simrec.Payment{"run-1": {{OperationID: "op-1", URL: url, PayTo: sellerA, SubmittedPayTo: sellerB, Amount: "100000", Outcome: "unsettled"}}},
			question: Question{Counterparty: sellerA, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "seller: events that disagree on pay_to count against the second",
			runs:     map[string][]simrec.Payment{"run-1": {{OperationID: "op-1", URL: url, PayTo: sellerA, SubmittedPayTo: sellerB, Amount: "100000", Outcome: "unsettled"}}},
			question: Question{Counterparty: sellerB, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial},
		{name: "host question: history with no usable host is unattributable",
			runs:     map[string][]simrec.Payment{"run-1": {unsettled("op-1", sellerA, "ftp://api.example.com/x")}},
			question: Question{Counterparty: "api.example.com", Amount: "0.10"}, want: guard.Review, rule: guard.RuleUnattributable},
	}
	for _, spelling := range []struct{ history, question string }{
		{"https://API.EXAMPLE.COM/x", "api.example.com"},
		{"https://api.example.com./x", "api.example.com"},
		{"https://api.example.com/x", "API.example.com."},
		{"https://user:secret@api.example.com/x", "api.example.com"},
		{"https://api.example.com:443/x", "api.example.com"},
		{"http://api.example.com:80/x", "https://api.example.com/"},
		{"https://api.example.com:8443/x", "api.example.com"},
		{"https://api.example.com:/x", "api.example.com"},
		{"https://%61pi.example.com/x", "api.example.com"},
		{"https://api%2Eexample.com/x", "api.example.com"},
		{"https://bücher.example/x", "xn--bcher-kva.example"},
		{"https://xn--bcher-kva.example/x", "bücher.example"},
		{"https://BÜCHER.example/x", "https://bücher.example/"},
		{"https://[::ffff:10.1.2.3]/x", "10.1.2.3"},
		{"https://10.1.2.3/x", "https://[::ffff:10.1.2.3]/"},
		{"https://[2001:DB8::1]/x", "2001:db8:0:0::1"},
		{"https://api.example.com\\@evil.example/x", "api.example.com"},
	} {
		tests = append(tests, struct {
			name     string
			runs     map[string][]simrec.Payment
			question Question
			want     string
			rule     string
		}{
			name:     "host spelling: history " + spelling.history + ", question " + spelling.question,
			runs:     map[string][]simrec.Payment{"run-1": {unsettled("op-1", sellerA, spelling.history)}},
			question: Question{Counterparty: spelling.question, Amount: "0.10"}, want: guard.Review, rule: guard.RuleOpenPartial,
		})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, t.TempDir(), lenientPolicy)
			for run, ps := range tc.runs {
				f.pay(t, run, ps...)
			}
			ans, err := f.eng.Check(context.Background(), "agent-1", tc.question)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if ans.Decision != tc.want {
				t.Fatalf("decision %s, want %s; reasons %+v", ans.Decision, tc.want, ans.Reasons)
			}
			if tc.rule != "" && !strings.Contains(strings.Join(rules(ans), ","), tc.rule) {
				t.Errorf("rules %v, want %s among them; reasons %+v", rules(ans), tc.rule, ans.Reasons)
			}
			if ans.ReceiptID == "" || (ans.Decision == guard.Review) != (ans.ReviewID != "") {
				t.Errorf("answer not recorded as it should be: %+v", ans)
			}
		})
	}
}

// The agent cannot pick the lens history is read through: a template the
// policy does not read history under is refused, and nothing is recorded.
func TestTemplateArgumentMayOnlyNameAHistoryTemplate(t *testing.T) {
	f := newFixture(t, t.TempDir(), lenientPolicy)
	f.pay(t, "run-1", unsettled("op-1", sellerA, "https://api.example.com/x"))
	for _, tmpl := range []string{"x402-seller", "x402-facilitator", "escrow-arc", "my-own", "../x"} {
		_, err := f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.10", Template: tmpl})
		var refused *RefusedError
		if !errors.As(err, &refused) || !strings.Contains(refused.Message, "x402-buyer") {
			t.Errorf("template %q: error %v, want a refusal naming the allowed templates", tmpl, err)
		}
	}
	ans, err := f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.10", Template: "x402-buyer"})
	if err != nil || ans.Decision != guard.Review {
		t.Fatalf("x402-buyer: %+v, %v", ans, err)
	}
	reviews, err := f.log.List(context.Background(), true)
	if err != nil || len(reviews) != 1 {
		t.Errorf("the refused questions must record nothing: %d reviews, %v", len(reviews), err)
	}
}

// historyTemplates: the worst case over every template the policy names.
func TestHistoryUnderSeveralTemplatesTakesTheWorstCase(t *testing.T) {
	dir := t.TempDir()
	// An operator template under which the buyer's unsettled payment looks
	// complete: only the 402 is required.
	if err := os.MkdirAll(filepath.Join(dir, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	lax := "template: lax\nversion: 1\nstages:\n  - id: seen\n    required: true\n    match:\n      - event: x402.payment.required\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "lax.yaml"), []byte(lax), 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, dir, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "10000", "windowHours": 48}, "historyTemplates": ["lax", "x402-buyer"]}`)
	f.pay(t, "run-1", unsettled("op-1", sellerA, "https://api.example.com/x"))
	ans, err := f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.10", Template: "lax"})
	if err != nil || ans.Decision != guard.Review || !strings.Contains(ans.Reasons[len(ans.Reasons)-1].Detail, "lax, x402-buyer") {
		t.Fatalf("%+v, %v", ans, err)
	}
}

// Templates are fixed when the engine is built: a file written into
// templates/ afterwards, named like a bundled template, changes nothing.
func TestTemplatesWrittenAfterStartChangeNothing(t *testing.T) {
	f := newFixture(t, t.TempDir(), lenientPolicy)
	f.pay(t, "run-1", unsettled("op-1", sellerA, "https://api.example.com/x"))
	evil := "template: x402-buyer\nversion: 2\nstages:\n  - id: challenge\n    required: true\n    match:\n      - event: x402.payment.required\n"
	if err := os.WriteFile(filepath.Join(f.dir, "templates", "x402-buyer.yaml"), []byte(evil), 0o644); err != nil {
		t.Fatal(err)
	}
	ans, err := f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.10"})
	if err != nil || ans.Decision != guard.Review {
		t.Fatalf("%+v, %v", ans, err)
	}
}

// An operator template that overrides a bundled one is the operator's
// choice: it is used, and the history line names it.
func TestOverriddenBundledTemplateIsNamed(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "receipt", "templates", "x402-buyer.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "templates", "x402-buyer.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, dir, lenientPolicy)
	ans, err := f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.10"})
	if err != nil || !strings.Contains(ans.Reasons[len(ans.Reasons)-1].Detail, "replaces the bundled x402-buyer") {
		t.Fatalf("%+v, %v", ans, err)
	}
}

// A policy naming a template that does not exist stops the start.
func TestUnknownHistoryTemplateRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	pol, err := guard.ParseConfig([]byte(`{"historyTemplates": ["x402-buyr"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, err = New(Config{Policy: pol, Templates: receipt.Resolver{}, History: ScanHistory{}, Log: reviewlog.OpenStore(filestore.New(root), reviewlog.Options{}),
		Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(key)}, ParamsKey: []byte("k")})
	if err == nil || !strings.Contains(err.Error(), "x402-buyr") {
		t.Fatalf("err %v, want one naming the template", err)
	}
}

// An amount that is not a plain decimal string is refused and records
// nothing; one in the right form that the asset cannot hold stays a review.
func TestAmountMustBePlainDecimal(t *testing.T) {
	f := newFixture(t, t.TempDir(), lenientPolicy)
	for _, amount := range []string{"1e3", "-1", "+1", " 1", "1,5", "0x10", ".5", "1.", "１"} {
		_, err := f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: amount})
		var refused *RefusedError
		if !errors.As(err, &refused) || !strings.Contains(refused.Message, "plain decimal string") {
			t.Errorf("amount %q: %v, want a refusal", amount, err)
		}
	}
	if _, err := os.Stat(filepath.Join(f.dir, "guard", "decisions.ndjson")); err == nil {
		t.Error("a refused amount wrote to the review log")
	}
	ans, err := f.eng.Check(context.Background(), "agent-1", Question{Counterparty: sellerA, Amount: "0.0000001"})
	if err != nil || ans.Decision != guard.Review || !strings.Contains(strings.Join(rules(ans), ","), guard.RuleUnparseableAmount) {
		t.Fatalf("seven decimals of USDC: %+v %v", ans, err)
	}
}
