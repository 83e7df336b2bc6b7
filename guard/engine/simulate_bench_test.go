package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// fixedHistory is a Trace read once (the benchmark's operations).
type fixedHistory struct{ h guard.History }

func (f fixedHistory) History(context.Context, *receipt.Template) (guard.History, error) {
	return f.h, nil
}

// BenchmarkSimulate replays 20,000 recorded decisions — 30 days of one
// agent paying 20 payees, each allow followed by its payment in the Trace
// a minute later and held in the spend ledger until then — under a
// stricter policy, and reports decisions replayed per second:
//
//	go test -run '^$' -bench Simulate -benchtime 3x ./guard/engine/
func BenchmarkSimulate(b *testing.B) {
	n := benchN(20000, "HAIA_SIMULATE_N")
	f := newFixture(b, b.TempDir(), `{"reviewAbove": "0.40", "perCounterpartyLimit": {"amount": "5.00", "windowHours": 24}, "reservationMinutes": 15}`)
	pol := f.eng.Policy()
	key := f.eng.cfg.ParamsKey
	asset := pol.DefaultAsset
	days := benchN(30, "HAIA_SIMULATE_DAYS")
	t0 := start.Add(-time.Duration(days+1) * 24 * time.Hour)
	step := time.Duration(days) * 24 * time.Hour / time.Duration(n)
	var (
		lines [][]byte
		raws  []ledger.Raw
		ops   []guard.Op
	)
	recs := map[string]*decision{}
	gen := ledger.Entry{Kind: ledger.KindGenesis, At: ledger.FormatTime(t0), Receipt: "rcpt_genesis", Caller: "haia-trace-mcp", Tenant: "test"}
	prev, off := "", int64(0)
	appendEntry := func(e ledger.Entry) {
		e.Lane, e.Seq, e.Prev = 0, int64(len(raws)), prev
		line, err := e.Seal(key)
		if err != nil {
			b.Fatal(err)
		}
		raws = append(raws, ledger.Raw{Pos: ledger.Pos{Lane: 0, Seq: e.Seq, Off: off}, Line: line})
		off += int64(len(line)) + 1
		prev = ledger.Hash(line)
	}
	appendEntry(gen)
	for i := range n {
		at := t0.Add(time.Duration(i+1) * step)
		payee := fmt.Sprintf("0x%040x", 0xA000+i%20)
		atomic := big.NewInt(int64(50000 * (1 + i%10))) // 0.05 … 0.50
		q := guard.Question{Counterparty: payee, Amount: guard.FormatAmount(atomic, asset.Decimals), Asset: asset.Key, Template: guard.DefaultTemplate}
		id := fmt.Sprintf("rcpt_%08d", i)
		ph, err := QuestionHash(key, q, "")
		if err != nil {
			b.Fatal(err)
		}
		verdict := guard.Allow
		if atomic.Cmp(pol.ReviewAbove) > 0 {
			verdict = guard.Review
		}
		recs[id] = &decision{id: id, caller: "bot", paramsHash: ph, verdict: verdict, at: at}
		kq := KeptQuestion{V: questionVersion, Receipt: id, Kind: QuestionCheck, Caller: "bot", Question: q}
		if kq.MAC, err = questionSeal(key, kq); err != nil {
			b.Fatal(err)
		}
		line, _ := json.Marshal(kq)
		lines = append(lines, line)
		if verdict != guard.Allow {
			continue
		}
		appendEntry(ledger.Entry{Kind: ledger.KindHold, At: ledger.FormatTime(at), Until: ledger.FormatTime(at.Add(15 * time.Minute)), Receipt: id, Caller: "bot",
			Tenant: "test", PayTo: payee, Atomic: atomic.String(), Asset: asset.Key})
		paid := at.Add(time.Minute).Format(time.RFC3339Nano)
		ops = append(ops, guard.Op{RunID: fmt.Sprintf("run-%d", i/100), OperationID: fmt.Sprintf("op-%d", i), Template: guard.DefaultTemplate, Completeness: receipt.Full,
			RolesKnown: true, PaidConfirmed: true, OutcomeConfirmed: true, Spent: true, FirstEventAt: paid, LastEventAt: paid,
			Money: &guard.Money{PayTos: []string{payee}, Atomic: atomic, Asset: asset.Key}})
	}
	stricter, err := guard.ParseConfig([]byte(`{"reviewAbove": "0.20", "perCounterpartyLimit": {"amount": "2.00", "windowHours": 24}, "reservationMinutes": 15}`), "")
	if err != nil {
		b.Fatal(err)
	}
	cfg := SimulateConfig{Policy: stricter, Templates: f.eng.cfg.Templates, History: fixedHistory{h: guard.History{Ops: ops, Runs: n / 100}},
		Log: f.log, Tenant: "test", ParamsKey: key}
	ctx := context.Background()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	start := time.Now()
	var sim *Simulation
	for range b.N {
		if sim, err = replay(ctx, cfg, lines, raws, recs); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	if sim.Replayed != n || len(sim.LedgerFindings) != 0 || len(sim.Unverifiable) != 0 || sim.Transitions["allow→review"] == 0 {
		b.Fatalf("replayed %d, findings %v, unverifiable %v, transitions %v", sim.Replayed, sim.LedgerFindings, sim.Unverifiable, sim.Transitions)
	}
	b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "decisions/s")
	// On a shared machine the wall clock says as much about the neighbours.
	b.ReportMetric(float64(n*b.N)/(cpuTime(b)-cpu0).Seconds(), "decisions/cpu-s")
	b.Logf("%d replayed, %d would change: %v", sim.Replayed, len(sim.Changes), sim.Transitions)
}

// benchN is def, or the environment variable's value (a quicker profile,
// another span).
func benchN(def int, env string) int {
	if v, err := strconv.Atoi(os.Getenv(env)); err == nil && v > 0 {
		return v
	}
	return def
}
