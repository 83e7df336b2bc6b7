package guard

import (
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

func loadOps(t testing.TB, runFile string, tmpl *receipt.Template) []Op {
	t.Helper()
	runID, events, err := receipt.ReadRunFile(runFile, receipt.DefaultLimits())
	if err != nil {
		t.Fatalf("%s: %v", runFile, err)
	}
	res := receipt.Assemble(events, tmpl)
	ops := make([]Op, 0, len(res.Receipts))
	for i := range res.Receipts {
		ops = append(ops, OpFromReceipt(runID, &res.Receipts[i]))
	}
	return ops
}

func bundled(t testing.TB, name string) *receipt.Template {
	t.Helper()
	tmpl, err := receipt.Bundled(name)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func TestOpFromReceiptBuyer(t *testing.T) {
	ops := loadOps(t, filepath.Join("..", "testdata", "guard", "buyer-run.ndjson"), bundled(t, "x402-buyer"))
	a, b := strings.ToLower(addrA), strings.ToLower(addrB)
	type want struct {
		completeness         string
		paid, outcome, fault bool
		money                *Money
		why                  string
	}
	wants := map[string]want{
		"op-1": {"full", true, true, false, &Money{PayTos: []string{a}, Hosts: []string{"api.example.com"}, Resources: []string{"https://api.example.com/reports/weekly"}, Atomic: big.NewInt(250000), Asset: USDCBase}, ""},
		"op-2": {"partial", true, false, false, &Money{PayTos: []string{b}, Hosts: []string{"data.example.net"}, Resources: []string{"https://data.example.net/r/1"}, Atomic: big.NewInt(1000000), Asset: USDCBase}, ""},
		"op-3": {"partial", false, false, false, nil, whyNoReqs},
		"op-4": {"full", true, true, false, &Money{PayTos: []string{b}, Hosts: []string{"data.example.net"}, Resources: []string{"https://data.example.net/r/3"}, Atomic: big.NewInt(50000), Asset: USDCBaseSepolia}, ""},
		"op-5": {"full", true, true, false, &Money{PayTos: []string{a}, Hosts: []string{"api.example.com"}, Resources: []string{"https://api.example.com/r/5"}, Problem: "event op-5-13: requirements.amount is a number, not a string of atomic units"}, ""},
		"op-6": {"partial", true, false, true, &Money{PayTos: []string{a}, Hosts: []string{"api.example.com"}, Resources: []string{"https://api.example.com/r/6"}, Atomic: big.NewInt(100000), Asset: USDCBase}, ""},
		"op-7": {"partial", true, false, false, &Money{PayTos: []string{a, b}, Hosts: []string{"api.example.com"}, Resources: []string{"https://api.example.com/r/7"}, Atomic: big.NewInt(1), Asset: USDCBase}, ""},
		"op-8": {"partial", true, false, false, &Money{Hosts: []string{"api.example.com"}, Resources: []string{"https://api.example.com/r/8"}, Atomic: big.NewInt(7), Asset: USDCBase}, ""},
		"op-9": {"partial", true, false, false, &Money{PayTos: []string{a}, Hosts: []string{"api.example.com"}, Resources: []string{"https://api.example.com/r/9"}, Problem: `event op-9-23: requirements.network: network "solana-devnet" is neither a known x402 name (base, base-sepolia) nor a CAIP-2 id such as eip155:8453`}, ""},
	}
	if len(ops) != len(wants) {
		t.Fatalf("%d operations, want %d", len(ops), len(wants))
	}
	for _, o := range ops {
		w, ok := wants[o.OperationID]
		if !ok {
			t.Errorf("unexpected operation %s", o.OperationID)
			continue
		}
		if o.RunID != "buyer-run" || o.Template != "x402-buyer" || !o.RolesKnown || o.LastEventAt == "" {
			t.Errorf("%s: %+v", o.OperationID, o)
		}
		if o.Completeness != w.completeness || o.PaidConfirmed != w.paid || o.OutcomeConfirmed != w.outcome || o.Faulted != w.fault {
			t.Errorf("%s: completeness %s paid %v outcome %v fault %v, want %+v", o.OperationID, o.Completeness, o.PaidConfirmed, o.OutcomeConfirmed, o.Faulted, w)
		}
		if !reflect.DeepEqual(o.Money, w.money) || o.Unattributable != w.why {
			t.Errorf("%s: money %+v (%q), want %+v (%q)", o.OperationID, o.Money, o.Unattributable, w.money, w.why)
		}
	}
}

func TestOpFromReceiptEscrowAndCustom(t *testing.T) {
	for _, o := range loadOps(t, filepath.Join("..", "testdata", "guard", "escrow-run.ndjson"), bundled(t, "escrow-arc")) {
		if o.Money != nil || o.Unattributable != whyEscrow || !o.RolesKnown || !o.PaidConfirmed || o.OutcomeConfirmed {
			t.Errorf("escrow: %+v", o)
		}
	}
	tmpl, err := receipt.LoadTemplateFile(filepath.Join("..", "testdata", "guard", "my-flow.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ops := loadOps(t, filepath.Join("..", "testdata", "guard", "custom-run.ndjson"), tmpl)
	if len(ops) != 2 {
		t.Fatalf("%d custom operations", len(ops))
	}
	for _, o := range ops {
		if o.RolesKnown || o.Money == nil || !reflect.DeepEqual(o.Money.PayTos, []string{strings.ToLower(addrA)}) {
			t.Errorf("custom: %+v", o)
		}
	}
}

// The story of SPEC §12 from the guard's side: seller B's payment never
// settled, so paying B again goes to review with that operation as
// evidence; seller A settled, so a small payment to A is allowed.
func TestDecideOverRealRuns(t *testing.T) {
	buyer := bundled(t, "x402-buyer")
	var ops []Op
	for _, o := range loadOps(t, filepath.Join("..", "testdata", "guard", "buyer-run.ndjson"), buyer) {
		if o.OperationID == "op-1" || o.OperationID == "op-2" || o.OperationID == "op-3" {
			ops = append(ops, o)
		}
	}
	ops = append(ops, loadOps(t, filepath.Join("..", "testdata", "guard", "escrow-run.ndjson"), bundled(t, "escrow-arc"))...)
	cfg := DefaultConfig()
	now := time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)

	req, _ := ParseRequest(RawRequest{Counterparty: addrB, Amount: "0.05"}, cfg)
	d := Decide(req, History{Ops: ops, Runs: 2}, cfg, now)
	if d.Decision != Review || d.Reasons[0].Rule != RuleOpenPartial || !reflect.DeepEqual(d.Reasons[0].Evidence, []Ref{{"buyer-run", "op-2"}}) {
		t.Errorf("seller B: %+v", d)
	}
	// The escrow deposit is paid and not disposed of, and cannot be
	// attributed: it may be with anyone, so the guard does not allow.
	req, _ = ParseRequest(RawRequest{Counterparty: "https://api.example.com/reports/weekly", Amount: "0.25"}, cfg)
	d = Decide(req, History{Ops: ops, Runs: 2}, cfg, now)
	if d.Decision != Review || d.Reasons[0].Rule != RuleUnattributable || !strings.Contains(d.Reasons[0].Detail, whyEscrow) {
		t.Errorf("seller A: %+v", d)
	}
	lenient := mustConfig(t, `{"unattributableHistory":"ignore"}`)
	req, _ = ParseRequest(RawRequest{Counterparty: "https://api.example.com/reports/weekly", Amount: "0.25"}, lenient)
	d = Decide(req, History{Ops: ops, Runs: 2}, lenient, now)
	if d.Decision != Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0].Detail, whyEscrow) {
		t.Errorf("seller A, unattributable ignored: %+v", d)
	}
}

// Every shared fixture and parity run reads into operations without a panic,
// and the x402 ones are attributed.
func TestOpFromReceiptSharedRuns(t *testing.T) {
	shared := os.Getenv("HAIA_SHARED")
	if shared == "" {
		t.Skip("HAIA_SHARED not set: skipping attribution over the shared fixtures and parity runs")
	}
	files, _ := filepath.Glob(filepath.Join(shared, "haia-trace", "fixtures", "*.ndjson"))
	cases, _ := filepath.Glob(filepath.Join(shared, "parity", "cases", "*", "run.ndjson"))
	attributed := 0
	for _, f := range append(files, cases...) {
		_, events, err := receipt.ReadRunFile(f, receipt.DefaultLimits())
		if err != nil {
			continue // unreadable runs are the reader's business
		}
		for _, name := range receipt.BundledNames() {
			res := receipt.Assemble(events, bundled(t, name))
			for i := range res.Receipts {
				o := OpFromReceipt("r", &res.Receipts[i])
				if o.Money != nil {
					attributed++
				} else if o.Unattributable == "" {
					t.Errorf("%s/%s: no money and no reason", f, o.OperationID)
				}
			}
		}
	}
	if attributed == 0 {
		t.Errorf("no operation in the shared runs was attributed")
	}
}
