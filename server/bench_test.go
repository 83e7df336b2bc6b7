package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// benchRoot is a generated Trace root of 60 runs and 300,000 events,
// shared by the listing benchmarks (generated once per process).
type benchRoot struct {
	once sync.Once
	dir  string
	err  error
}

var sharedBenchRoot benchRoot

const (
	benchRuns        = 60
	benchPaysPerRun  = 1250 // 4 events each: 5,000 events a run, 300,000 in all
	benchAppendLines = 1000
)

// get returns $HAIA_BENCH_ROOT when it is set (a Trace root, such as the
// large root made by tools/bench.sh from ../shared/bench), or a root
// generated with simrec.
func (br *benchRoot) get(b *testing.B) string {
	if dir := os.Getenv("HAIA_BENCH_ROOT"); dir != "" {
		return dir
	}
	br.once.Do(func() {
		br.dir, br.err = os.MkdirTemp("", "haia-bench-root-")
		if br.err != nil {
			return
		}
		start := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
		for r := 0; r < benchRuns && br.err == nil; r++ {
			rec, err := simrec.New(br.dir, fmt.Sprintf("run-%03d", r), start.Add(time.Duration(r)*time.Hour))
			if err != nil {
				br.err = err
				return
			}
			ps := make([]simrec.Payment, 0, benchPaysPerRun)
			for i := 0; i < benchPaysPerRun; i++ {
				outcome := "settled"
				if i%7 == 0 {
					outcome = "unsettled"
				}
				ps = append(ps, simrec.Payment{OperationID: fmt.Sprintf("op-%d", i), URL: "https://api.example.com/r",
					PayTo: fmt.Sprintf("0x%040x", i%50+1), Amount: "10000", Outcome: outcome})
			}
			br.err = rec.PayAll(ps)
		}
	})
	if br.err != nil {
		b.Fatal(br.err)
	}
	return br.dir
}

// newBenchServer is a read-only server over dir whose index budget is
// $HAIA_BENCH_INDEX_MB MiB when set (a root ten times the large one needs
// several GiB to stay resident), the default otherwise.
func newBenchServer(b *testing.B, dir string) *Server {
	b.Helper()
	mb, _ := strconv.Atoi(os.Getenv("HAIA_BENCH_INDEX_MB"))
	if mb <= 0 {
		return newTestServer(b, dir)
	}
	root, err := confined.OpenRoot(dir)
	if err != nil {
		b.Fatal(err)
	}
	events, err := root.OpenDir("events")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { events.Close(); root.Close() })
	cat, err := catalog.New(catalog.Config{Root: root, Events: events, Limits: receipt.DefaultLimits(), MaxBytes: int64(mb) << 20})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{Catalog: cat, Version: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func reportPercentiles(b *testing.B, ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	if len(ds) == 0 {
		return
	}
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
}

func listOnce(b *testing.B, s *Server) {
	listWith(b, s, map[string]any{"limit": 50})
}

func listWith(b *testing.B, s *Server, args map[string]any) *listResult {
	res, err := s.listOperations(context.Background(), args)
	if err != nil || res.IsError {
		b.Fatalf("list: %v %v", err, res)
	}
	lr, _ := res.StructuredContent.(listResult)
	return &lr
}

// BenchmarkListWarmFiltered measures warm listings narrowed by completeness,
// by run, and a later page (with a cursor).
func BenchmarkListWarmFiltered(b *testing.B) {
	dir := sharedBenchRoot.get(b)
	s := newBenchServer(b, dir)
	first := listWith(b, s, map[string]any{"limit": 50})
	for _, c := range []struct {
		name string
		args map[string]any
	}{
		{"partial", map[string]any{"limit": 50, "completeness": "partial"}},
		{"latest-run", map[string]any{"limit": 50, "run": "latest"}},
		{"page-2", map[string]any{"limit": 50, "cursor": first.NextCursor}},
		{"limit-1", map[string]any{"limit": 1}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var ds []time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				listWith(b, s, c.args)
				ds = append(ds, time.Since(t0))
			}
			reportPercentiles(b, ds)
		})
	}
}

// BenchmarkListCold measures a listing by a server that has read nothing yet.
func BenchmarkListCold(b *testing.B) {
	dir := sharedBenchRoot.get(b)
	var ds []time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s := newBenchServer(b, dir)
		runtime.GC()
		b.StartTimer()
		t0 := time.Now()
		listOnce(b, s)
		ds = append(ds, time.Since(t0))
	}
	reportPercentiles(b, ds)
}

// BenchmarkListWarm measures repeated listings over an unchanged root, and
// reports the memory the index holds.
func BenchmarkListWarm(b *testing.B) {
	dir := sharedBenchRoot.get(b)
	s := newBenchServer(b, dir)
	listOnce(b, s)
	var after runtime.MemStats
	var ds []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		listOnce(b, s)
		ds = append(ds, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, ds)
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := s.cfg.Catalog.Stats()
	runtime.KeepAlive(s)
	b.ReportMetric(float64(st.Events), "events-indexed")
	b.ReportMetric(float64(st.Bytes)/(1<<20), "index-est-MiB")
	b.ReportMetric(float64(after.HeapAlloc)/(1<<20), "heap-MiB")
}

// BenchmarkListAfterAppend appends 1,000 lines to one run before each
// listing, and reports how many bytes each listing read.
func BenchmarkListAfterAppend(b *testing.B) {
	src := sharedBenchRoot.get(b)
	dir := b.TempDir()
	// A private copy, because this benchmark grows a run.
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		b.Fatal(err)
	}
	s := newBenchServer(b, dir)
	listOnce(b, s)
	rec, err := simrec.New(dir, "run-000", time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		b.Fatal(err)
	}
	var ds []time.Duration
	var readBytes int64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ps := make([]simrec.Payment, benchAppendLines/4)
		for j := range ps {
			ps[j] = simrec.Payment{OperationID: fmt.Sprintf("more-%d-%d", i, j), URL: "https://api.example.com/r", PayTo: "0x00000000000000000000000000000000000000aa", Amount: "1", Outcome: "settled"}
		}
		if err := rec.PayAll(ps); err != nil {
			b.Fatal(err)
		}
		before := s.cfg.Catalog.Stats().BytesRead
		b.StartTimer()
		t0 := time.Now()
		listOnce(b, s)
		ds = append(ds, time.Since(t0))
		readBytes += s.cfg.Catalog.Stats().BytesRead - before
	}
	b.StopTimer()
	reportPercentiles(b, ds)
	b.ReportMetric(float64(readBytes)/float64(b.N), "bytes-read/listing")
	if got := filepath.Join(dir, "events"); got == "" {
		b.Fatal("no events dir")
	}
}
