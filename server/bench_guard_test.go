package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// BenchmarkCheckBeforePayWarm times check_before_pay in process over a
// warm index on HAIA_BENCH_ROOT (tools/bench.sh builds the large root): the
// guard's hot path, history read under the policy's templates included.
// The benchmark writes its decisions under that root's guard/.
func BenchmarkCheckBeforePayWarm(b *testing.B) {
	root := os.Getenv("HAIA_BENCH_ROOT")
	if root == "" {
		b.Skip("HAIA_BENCH_ROOT not set (tools/bench.sh builds the large root)")
	}
	mb, _ := strconv.Atoi(os.Getenv("HAIA_BENCH_INDEX_MB"))
	s := newGuardedServer(b, root, int64(mb)<<20)
	ctx := context.Background()
	ask := func(i int) {
		if _, err := s.guard.Engine.Check(ctx, "bench", engine.Question{Counterparty: fmt.Sprintf("0x%040x", i%5000+1), Amount: "0.01"}); err != nil {
			b.Fatal(err)
		}
	}
	ask(0) // cold: index every run
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		ask(i)
		ds = append(ds, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, ds)
}

// The cached history follows the runs: an unsettled payment appended to a
// run (or a new run) changes the next answer.
func TestGuardHistoryCacheFollowsAppends(t *testing.T) {
	dir := t.TempDir()
	s := newTestServer(t, dir)
	ctx := context.Background()
	const seller = "0x00000000000000000000000000000000000000aa"
	rec, err := simrec.New(dir, "run-1", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-1", URL: "https://a.example.com/x", PayTo: seller, Amount: "1000", Outcome: "settled"}); err != nil {
		t.Fatal(err)
	}
	ask := func() string {
		a, err := s.guard.Engine.Check(ctx, "agent", engine.Question{Counterparty: seller, Amount: "0.01"})
		if err != nil {
			t.Fatal(err)
		}
		return a.Decision
	}
	if d := ask(); d != "allow" {
		t.Fatalf("settled seller: %s", d)
	}
	if d := ask(); d != "allow" { // served from the cache
		t.Fatalf("settled seller again: %s", d)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-2", URL: "https://a.example.com/x", PayTo: seller, Amount: "1000", Outcome: "unsettled"}); err != nil {
		t.Fatal(err)
	}
	if d := ask(); d != "review" {
		t.Fatalf("after an unsettled payment was appended: %s", d)
	}
	other, err := simrec.New(dir, "run-2", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	const seller2 = "0x00000000000000000000000000000000000000bb"
	a, err := s.guard.Engine.Check(ctx, "agent", engine.Question{Counterparty: seller2, Amount: "0.01"})
	if err != nil || a.Decision != "allow" {
		t.Fatalf("seller 2 before its run: %+v %v", a, err)
	}
	if err := other.Pay(simrec.Payment{OperationID: "op-1", URL: "https://b.example.com/x", PayTo: seller2, Amount: "1000", Outcome: "unsettled"}); err != nil {
		t.Fatal(err)
	}
	if a, err := s.guard.Engine.Check(ctx, "agent", engine.Question{Counterparty: seller2, Amount: "0.01"}); err != nil || a.Decision != "review" {
		t.Fatalf("seller 2 after a new run: %+v %v", a, err)
	}
}

// BenchmarkCheckBeforePayTool times the check_before_pay tool in process,
// as an agent calls it, with a payer configured — the decision and the
// sweep of the Trace's settlements after it — on HAIA_BENCH_ROOT or the
// generated root of 60 runs and 300,000 events. "unchanged": the Trace
// stays as it is; "appended": before each question one event is appended
// to a run, which the run index and the sweep both read.
func BenchmarkCheckBeforePayTool(b *testing.B) {
	root := sharedBenchRoot.get(b)
	mb, _ := strconv.Atoi(os.Getenv("HAIA_BENCH_INDEX_MB"))
	s := newGuardedServer(b, root, int64(mb)<<20)
	ctx := context.Background()
	ask := func(i int) {
		res, err := s.checkBeforePay(ctx, map[string]any{"counterparty": fmt.Sprintf("0x%040x", i%5000+1), "amount": "0.01"})
		if err != nil || res.IsError {
			b.Fatalf("check_before_pay: %v %v", err, res)
		}
	}
	ask(0) // cold: index every run
	entries, err := os.ReadDir(filepath.Join(root, "events"))
	if err != nil || len(entries) == 0 {
		b.Fatalf("the bench root's runs: %v", err)
	}
	run := filepath.Join(root, "events", entries[0].Name())
	for _, tc := range []struct {
		name   string
		append bool
	}{{"unchanged", false}, {"appended", true}} {
		b.Run(tc.name, func(b *testing.B) {
			ds := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				if tc.append {
					b.StopTimer()
					f, err := os.OpenFile(run, os.O_APPEND|os.O_WRONLY, 0)
					if err != nil {
						b.Fatal(err)
					}
					fmt.Fprintf(f, `{"event_id":"bench-%d","event_type":"run.note","occurred_at":"2026-07-01T00:00:00.000Z","seq":%d,"adapter":"bench","role":"client","context_id":"bench-%d","payload":{}}`+"\n", i, 1000000+i, i)
					f.Close()
					b.StartTimer()
				}
				t0 := time.Now()
				ask(i)
				ds = append(ds, time.Since(t0))
			}
			b.StopTimer()
			reportPercentiles(b, ds)
		})
	}
}
