package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// BenchmarkPostgresCheck is check_before_pay through the engine on
// PostgreSQL, every answer an allow that reserves (reservationMinutes 1, on
// the real clock, so about a minute of allows holds): 16 callers (8 a CPU
// on 2 CPUs), each paying a counterparty of its own (distinct) or all one
// (shared), over 1 and 3 handles (replicas). reads=index is the store as
// the server opens it: a decision reads its reviews and receipts by the
// tables' indexes, with its locks; reads=fold hides every optional
// interface of the store's writers but the scopes, so a decision reads the
// log's fold and the chains as the file store does — both side by side in
// one run:
//
//	HAIA_TEST_POSTGRES=postgres://… go test -run '^$' -bench PostgresCheck -benchtime 5s ./guard/engine/
//
// Besides decisions/s it reports the statements and round trips one
// decision sends to the database, and the CPU time of this process (the
// engines and the load; PostgreSQL's is not in it) per decision, and,
// where the server runs on this machine and /proc may be read, the CPU
// time of the PostgreSQL backends serving the benchmark's database
// (pg-cpu-ms/decision).
func BenchmarkPostgresCheck(b *testing.B) {
	pgtest.DSN(b) // skips, saying why, without a PostgreSQL server
	for _, handles := range []int{1, 3} {
		for _, shape := range []string{"distinct", "shared"} {
			for _, reads := range []string{"fold", "index"} {
				b.Run(fmt.Sprintf("replicas=%d/counterparties=%s/reads=%s", handles, shape, reads), func(b *testing.B) {
					benchPostgresCheck(b, handles, shape == "shared", reads == "fold")
				})
			}
		}
	}
}

func benchPostgresCheck(b *testing.B, handles int, shared, fold bool) {
	pb := newPgBench(b)
	var c pgstore.Counter
	engines := make([]*Engine, handles)
	for i := range engines {
		engines[i] = pb.engine(b, &c, fold, reviewlog.Options{LockWait: 30 * time.Second})
	}
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(8)
	// A server's pool holds its connections for up to an hour (pgxpool's
	// MaxConnLifetime), and a connection's start costs its backend far
	// more than a decision: the fork, the catalog caches filled, and five
	// plans made anew of every statement before PostgreSQL keeps the
	// generic one. Warm every handle's pool as the run will use it — the
	// same goroutines over the same handles, warmDecisions each, with
	// callers and payees of their own — so that what is counted below is
	// the decisions', not the starts' (warmDecisions 0: count both, as
	// the benchmark did before).
	var warm sync.WaitGroup
	errs := make(chan error, 16)
	for g := 1; g <= 16; g++ {
		warm.Add(1)
		go func() {
			defer warm.Done()
			e, cp := engines[g%handles], fmt.Sprintf("0x%040x", 0x1000+g)
			if shared {
				cp = fmt.Sprintf("0x%040x", 0xabc)
			}
			for range max(warmDecisions(b), 1) {
				if _, err := e.Check(ctx, fmt.Sprintf("bench-warm-%d", g), Question{Counterparty: cp, Amount: "0.01"}); err != nil {
					errs <- err
					return
				}
			}
		}()
		if warmDecisions(b) == 0 {
			break // one decision of one handle, as before
		}
	}
	warm.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	backends0 := backendCPU(b, pb.dsn)
	stmts0, trips0, cpu0 := c.Statements.Load(), c.RoundTrips.Load(), cpuTime(b)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1))
		e, caller := engines[i%handles], fmt.Sprintf("bench-%d", i)
		cp := fmt.Sprintf("0x%040x", i)
		if shared {
			cp = fmt.Sprintf("0x%040x", 0xabc)
		}
		for pb.Next() {
			a, err := e.Check(ctx, caller, Question{Counterparty: cp, Amount: "0.01"})
			if err != nil || a.Decision != guard.Allow {
				b.Errorf("%+v %v", a, err)
				return
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(c.Statements.Load()-stmts0)/n, "stmts/decision")
	b.ReportMetric(float64(c.RoundTrips.Load()-trips0)/n, "trips/decision")
	b.ReportMetric(float64(cpuTime(b)-cpu0)/n/1e6, "cpu-ms/decision")
	if ms, ok := backendCPUSince(b, pb.dsn, backends0); ok {
		b.ReportMetric(ms/n, "pg-cpu-ms/decision")
	}
}

// warmDecisions is how many decisions each of the 16 goroutines makes
// before the count starts (HAIA_BENCH_WARM, 20 unless set; 0: the pools
// as the first decisions find them, cold).
func warmDecisions(tb testing.TB) int {
	v := os.Getenv("HAIA_BENCH_WARM")
	if v == "" {
		return 20
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		tb.Fatalf("HAIA_BENCH_WARM=%q: want a count of decisions", v)
	}
	return n
}

// pgBench is one benchmark's database, Trace root, policy (every answer
// an allow that reserves, reservationMinutes 1) and signing key.
type pgBench struct {
	dir, dsn string
	pol      *guard.Config
	key      ed25519.PrivateKey
}

func newPgBench(b *testing.B) *pgBench {
	pb := &pgBench{dir: b.TempDir()}
	if err := os.MkdirAll(filepath.Join(pb.dir, "events"), 0o755); err != nil {
		b.Fatal(err)
	}
	var err error
	if pb.pol, err = guard.ParseConfig([]byte(`{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "1000000"}, "reservationMinutes": 1}`), ""); err != nil {
		b.Fatal(err)
	}
	_, pb.key, _ = ed25519.GenerateKey(rand.Reader)
	pb.dsn = pgtest.Database(b, pgtest.DSN(b))
	if _, _, err := pgstore.Migrate(b.Context(), pb.dsn, nil); err != nil {
		b.Fatal(err)
	}
	return pb
}

// engine is one handle (a replica): its own pool counted in c, its
// reads by the store's indexes or (fold) by the folds.
func (pb *pgBench) engine(b *testing.B, c *pgstore.Counter, fold bool, opts reviewlog.Options) *Engine {
	s, err := pgstore.OpenCounted(b.Context(), pb.dsn, c)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	var st reviewlog.Store = s
	if fold {
		st = foldOnly{s}
	}
	_, events := openTestRoot(b, pb.dir)
	e, err := New(Config{Policy: pb.pol, Templates: bundledTemplates(b), History: ScanHistory{Events: events}, Log: reviewlog.OpenStore(st, opts),
		Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(pb.key)}, ParamsKey: ParamsKeyFrom(pb.key.Seed()), Now: time.Now})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// foldOnly is a PostgreSQL store whose writers hide their indexes, so
// that a decision reads the log's fold (the comparison of
// BenchmarkPostgresCheck).
type foldOnly struct{ *pgstore.Store }

func (s foldOnly) Locked(ctx context.Context, wait time.Duration, fn func(w reviewlog.Writer) error) error {
	return s.Store.Locked(ctx, wait, func(w reviewlog.Writer) error { return fn(plainWriter{w}) })
}

func (s foldOnly) LockedScopes(ctx context.Context, wait time.Duration, scopes []reviewlog.Scope, pre *reviewlog.Prefetch, fn func(w reviewlog.Writer) error) error {
	return s.Store.LockedScopes(ctx, wait, scopes, pre, func(w reviewlog.Writer) error { return fn(scopedWriter{w}) })
}

type plainWriter struct{ reviewlog.Writer }

type scopedWriter struct{ reviewlog.Writer }

func (w scopedWriter) Scopes() []reviewlog.Scope { return w.Writer.(reviewlog.ScopedWriter).Scopes() }
func (w scopedWriter) ChainLane() int            { return w.Writer.(reviewlog.ChainLaner).ChainLane() }

// bundledTemplates is the bundled templates, parsed once, as the server
// holds them (a Resolver parses a template at every question).
func bundledTemplates(tb testing.TB) *receipt.TemplateSet {
	set, errs := receipt.NewTemplateSet(func() (*receipt.Registry, []error) { return receipt.LoadRegistry(nil, "", nil) })
	if set == nil {
		tb.Fatal(errs)
	}
	return set
}
