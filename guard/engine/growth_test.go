package engine

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// growthEngine opens the engine over dir as tools/growthgen builds it (or,
// with empty set, over a fresh root with the same events and keys).
func growthEngine(b *testing.B, dir string, empty bool) (*Engine, *reviewlog.Log, string) {
	b.Helper()
	root := filepath.Join(dir, ".trace")
	if empty {
		root = filepath.Join(b.TempDir(), ".trace")
		rec, err := simrec.New(root, "run-1", time.Now().Add(-time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		if err := rec.PayAll([]simrec.Payment{
			{OperationID: "op-a", URL: "https://a.example.com/x", PayTo: sellerA, Amount: "100000", Outcome: "settled"},
			{OperationID: "op-b", URL: "https://b.example.net/x", PayTo: sellerB, Amount: "100000", Outcome: "unsettled"},
		}); err != nil {
			b.Fatal(err)
		}
	}
	cr, events := openTestRoot(b, root)
	key, err := noa.LoadKeyFile(filepath.Join(dir, "server-key.pem"))
	if err != nil {
		b.Fatal(err)
	}
	trusted, err := reviewlog.LoadReviewers(filepath.Join(dir, "reviewers.json"))
	if err != nil {
		b.Fatal(err)
	}
	pol := guard.DefaultConfig()
	log := reviewlog.OpenStore(filestore.New(cr), reviewlog.Options{ReviewTTL: pol.ReviewTTL, Reviewers: func() (reviewlog.Reviewers, error) { return trusted, nil }})
	eng, err := New(Config{Policy: pol, Templates: receipt.Resolver{}, History: ScanHistory{Events: events}, Log: log,
		Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "haia-trace-mcp"}, ParamsKey: ParamsKeyFrom(ed25519.PrivateKey(key).Seed())})
	if err != nil {
		b.Fatal(err)
	}
	return eng, log, root
}

// BenchmarkGrowth times check_before_pay and get_review_status over a guard
// that has run for a long time (HAIA_GROWTH_DIR, built by tools/growthgen;
// tools/growth.sh runs it all) and over an empty guard/. It reports p50 and
// p99 per call and the live heap after the run; peak RSS is read by the
// script, one benchmark per process.
func BenchmarkGrowth(b *testing.B) {
	dir := os.Getenv("HAIA_GROWTH_DIR")
	if dir == "" {
		b.Skip("HAIA_GROWTH_DIR not set: build a root with go run ./tools/growthgen (see tools/growth.sh)")
	}
	for _, empty := range []bool{true, false} {
		name := "grown"
		if empty {
			name = "empty"
		}
		b.Run(name, func(b *testing.B) {
			eng, log, root := growthEngine(b, dir, empty)
			ctx := context.Background()
			// Warm: the first call folds the log and indexes the chains.
			warm := time.Now()
			if _, err := eng.Check(ctx, "bench-agent", Question{Counterparty: sellerA, Amount: "0.01"}); err != nil {
				b.Fatal(err)
			}
			firstCall := time.Since(warm)
			// A review some caller of the grown log holds (or one opened
			// now on the empty guard), for get_review_status and for the
			// caller's identical question.
			var reviewID string
			if empty {
				a, err := eng.Check(ctx, "agent-7", Question{Counterparty: sellerB, Amount: "0.5"})
				if err != nil {
					b.Fatal(err)
				}
				reviewID = a.ReviewID
				// Decided, like the grown log's middle review, so both read a
				// trusted reviewer's signature.
				rk, err := noa.LoadKeyFile(filepath.Join(dir, "reviewer-key.pem"))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := (Decider{Log: log, Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(rk), Tenant: "haia-trace-mcp"}}).Decide(ctx, reviewID, reviewlog.Rejected, "", "alice"); err != nil {
					b.Fatal(err)
				}
			} else {
				// The middle review of the log (decided: its index is even),
				// found without reading it all.
				data, err := os.ReadFile(filepath.Join(root, "guard", "decisions.ndjson"))
				if err != nil {
					b.Fatal(err)
				}
				mid := data[len(data)/2:]
				if i := strings.Index(string(mid), `"review_id":"`); i >= 0 {
					reviewID = string(mid[i+13 : i+13+36])
				}
				data = nil
				if _, err := log.Get(ctx, reviewID); err != nil {
					b.Fatalf("review %q: %v", reviewID, err)
				}
			}
			check := make([]time.Duration, 0, b.N)
			status := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				amount := guard.FormatAmount(big.NewInt(int64(i%500+1)), 6)
				t0 := time.Now()
				// Alternate a plain answer (a new question to the settled
				// seller) and a review question of a caller with history.
				q := Question{Counterparty: sellerA, Amount: amount}
				caller := "bench-agent"
				if i%2 == 1 {
					q = Question{Counterparty: sellerB, Amount: guard.FormatAmount(big.NewInt(int64(i%2000+1)), 6)}
					caller = fmt.Sprintf("agent-%d", i%1000)
				}
				if _, err := eng.Check(ctx, caller, q); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if _, err := eng.ReviewStatus(ctx, reviewID); err != nil {
					b.Fatal(err)
				}
				check = append(check, t1.Sub(t0))
				status = append(status, time.Since(t1))
			}
			b.StopTimer()
			b.ReportMetric(float64(firstCall.Milliseconds()), "first-call-ms")
			report(b, "check", check)
			report(b, "status", status)
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "live-heap-MiB")
			runtime.KeepAlive(eng)
			runtime.KeepAlive(log)
			if hwm := vmHWM(); hwm > 0 {
				b.ReportMetric(float64(hwm)/(1<<10), "peak-RSS-MiB")
			}
		})
	}
}

func report(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, name+"-p50-ms")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, name+"-p99-ms")
}

// vmHWM is the process's peak resident set in KiB (0 without /proc).
func vmHWM() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb
		}
	}
	return 0
}
