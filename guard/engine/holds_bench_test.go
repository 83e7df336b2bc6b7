package engine

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// BenchmarkHolds times check_before_pay after 0, 2,000 and 20,000 allows
// that each hold an entry of the ledger (nothing settles, nothing lapses),
// on each store, to one payee and to a fresh payee each question: the
// issue's measure that a decision costs the same whatever the number of
// live commitments. It reports the p50 and p99 of the 250 questions asked
// after the allows, each itself an allow that holds.
//
//	go test ./guard/engine -run '^$' -bench BenchmarkHolds -benchtime 1x
//
// (HAIA_TEST_POSTGRES for the PostgreSQL rows; HAIA_BENCH_HOLDS=0,2000
// chooses the levels.)
func BenchmarkHolds(b *testing.B) {
	levels := []int{0, 2000, 20000}
	if v := os.Getenv("HAIA_BENCH_HOLDS"); v != "" {
		levels = nil
		var n int
		for _, part := range splitComma(v) {
			if _, err := fmt.Sscan(part, &n); err == nil {
				levels = append(levels, n)
			}
		}
	}
	const policy = `{"reviewAbove": "1000000", "perCounterpartyLimit": {"amount": "1000000000.00"}, "maxOpenPartialPerCounterparty": 100000, "reservationMinutes": 1440}`
	kinds := []storeKind{fileKind}
	if os.Getenv("HAIA_TEST_POSTGRES") != "" {
		kinds = append(kinds, pgKind)
	}
	for _, kind := range kinds {
		for _, shape := range []string{"one-payee", "fresh-payees"} {
			for _, n := range levels {
				b.Run(fmt.Sprintf("%s/%s/holds=%d", kind, shape, n), func(b *testing.B) {
					f := newFleet(b, kind, 1, policy)
					e := f.engines[0]
					ctx := context.Background()
					i := 0
					ask := func() time.Duration {
						q := Question{Counterparty: sellerA, Amount: "0.01"}
						if shape == "fresh-payees" {
							q.Counterparty = fmt.Sprintf("0x%040x", 0xb0b0000+i)
						}
						i++
						f.advance(time.Millisecond)
						t0 := time.Now()
						a, err := e.Check(ctx, "bench", q)
						d := time.Since(t0)
						if err != nil || a.Decision != guard.Allow {
							b.Fatalf("question %d: %v %+v", i, err, a.Reasons)
						}
						return d
					}
					for range n {
						ask()
					}
					b.ResetTimer()
					var ds []time.Duration
					for range b.N {
						for range 250 {
							ds = append(ds, ask())
						}
					}
					b.StopTimer()
					sort.Slice(ds, func(x, y int) bool { return ds[x] < ds[y] })
					b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
				})
			}
		}
	}
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}
