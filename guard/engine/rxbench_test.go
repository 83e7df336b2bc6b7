package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// BenchmarkPostgresFleetAppends is what one decision of one handle costs
// after the rest of the fleet appended N receipts to the decision chains
// since its previous decision (another replica's handle, 16 chains of
// its own, appended between two timed decisions), N = 10 and 1000.
// reads=index reads the receipts and reservations by the store's indexes;
// reads=fold hides both, so the decision reads every receipt appended
// since, as the file store does:
//
//	HAIA_TEST_POSTGRES=postgres://… go test -run '^$' -bench PostgresFleetAppends -benchtime 20x ./guard/engine/
//
// It reports the timed decision's statements and round trips and its
// wall time (ns/op).
func BenchmarkPostgresFleetAppends(b *testing.B) {
	pgtest.DSN(b) // skips, saying why, without a PostgreSQL server
	for _, n := range []int{10, 1000} {
		for _, reads := range []string{"fold", "index"} {
			b.Run(fmt.Sprintf("appended=%d/reads=%s", n, reads), func(b *testing.B) {
				benchFleetAppends(b, n, reads == "fold")
			})
		}
	}
}

func benchFleetAppends(b *testing.B, n int, fold bool) {
	pb := newPgBench(b)
	var c pgstore.Counter
	e := pb.engine(b, &c, fold, reviewlog.Options{LockWait: 30 * time.Second, Parallel: 1})
	// The rest of the fleet: another replica's handle, appending to 16
	// chains of its own (one a key, as its lanes are one a chain).
	other, err := pgstore.Open(b.Context(), pb.dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { other.Close() })
	var fleet []*reviewlog.Chains
	for range 16 {
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		fleet = append(fleet, &reviewlog.Chains{Signer: noa.NewKeySigner(k)})
	}
	appended := 0
	appendFleet := func() {
		err := other.Locked(b.Context(), 30*time.Second, func(w reviewlog.Writer) error {
			for i := range n {
				appended++
				_, err := fleet[i%len(fleet)].Append(b.Context(), w, noa.Draft{TS: time.Now(),
					Agent:      noa.Agent{ID: fmt.Sprintf("fleet-%d", appended), Principal: noa.PrincipalService},
					Action:     noa.Action{ID: "x402.pay", Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: "hmac-sha256:" + strings.Repeat("0", 64)},
					Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictBlocked}})
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	decide := func(i int) {
		a, err := e.Check(ctx, "bench", Question{Counterparty: fmt.Sprintf("0x%040x", i), Amount: "0.01"})
		if err != nil || a.Decision != guard.Allow {
			b.Fatalf("%+v %v", a, err)
		}
	}
	decide(0) // the handle's first decision reads what is there
	var stmts, trips int64
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		appendFleet()
		s0, t0 := c.Statements.Load(), c.RoundTrips.Load()
		b.StartTimer()
		decide(i + 1)
		b.StopTimer()
		stmts += c.Statements.Load() - s0
		trips += c.RoundTrips.Load() - t0
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(stmts)/float64(b.N), "stmts/decision")
	b.ReportMetric(float64(trips)/float64(b.N), "trips/decision")
}
