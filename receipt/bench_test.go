package receipt

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// writeBuyerRun writes a generated x402 buyer run of n events (four per
// operation, ~650 bytes each, the shape the trace-x402 recorder writes).
func writeBuyerRun(tb testing.TB, path string, n int) int64 {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriter(f)
	types := []string{"x402.payment.required", "x402.payment.submitted", "x402.payment.responded", "x402.payment.failed"}
	for i := 0; i < n; i++ {
		op := i / 4
		typ := types[i%4]
		if i%4 == 3 && op%5 != 0 {
			typ = "x402.http.response"
		}
		ms := int64(i) * 7
		at := fmt.Sprintf("2026-07-24T%02d:%02d:%02d.%03dZ", ms/3600000%24, ms/60000%60, ms/1000%60, ms%1000)
		fmt.Fprintf(w, `{"event_id":"%08x-4c1e-4b8a-9d3f-%012x","event_type":%q,"occurred_at":%q,"seq":%d,"adapter":"trace-x402","role":"client","context_id":"op-%d",`+
			`"payload":{"x402_version":2,"resource":{"url":"https://api.example.com/r/%d","mime_type":"application/json"},`+
			`"requirements":{"scheme":"exact","network":"eip155:8453","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","amount":"%d","pay_to":"0xB0B0000000000000000000000000000000000002","max_timeout_seconds":300},`+
			`"settle":{"success":true,"transaction":"0xabababababababababababababababababababababababababababababababab","network":"base","payer":"0x1199C34AF7B1d56A1348E1F0D8E86b6C425ac2c0"}}}`+"\n",
			i*2654435761%(1<<32), i, typ, at, i, op, op%97, 1000+op)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	st, _ := f.Stat()
	f.Close()
	return st.Size()
}

// peakRSSMiB reads the process's high-water resident set from Linux.
func peakRSSMiB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return float64(kb) / 1024
		}
	}
	return 0
}

// BenchmarkBuild100k is the build command's work on a generated 100k-event
// buyer run: read and validate, assemble, write the JSON.
func BenchmarkBuild100k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "big.ndjson")
	size := writeBuyerRun(b, path, 100_000)
	tm, err := Bundled("x402-buyer")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Start each build from a collected heap so the peak is one build's.
		b.StopTimer()
		runtime.GC()
		b.StartTimer()
		_, evs, err := ReadRunFile(path, DefaultLimits())
		if err != nil {
			b.Fatal(err)
		}
		if err := WriteBuild(bufio.NewWriterSize(io.Discard, 1<<20), evs, tm); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(peakRSSMiB(), "peak-RSS-MiB")
}

func TestWriteJSONEqualsAppendJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.ndjson")
	writeBuyerRun(t, path, 400)
	tm, _ := Bundled("x402-buyer")
	_, evs, err := ReadRunFile(path, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	// Some unassigned events too.
	evs = append(evs, decodeAll(t, evLine("u1", "trace.attached", "2026-07-24T00:00:00.000Z", 0, "-", "-"))...)
	res := Assemble(evs, tm)
	var buf bytes.Buffer
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), res.AppendJSON(nil)) {
		t.Error("WriteJSON and AppendJSON differ")
	}
	if len(res.Receipts) != 100 || res.Receipts[0].Completeness != Partial || res.Receipts[1].Completeness != Full {
		t.Errorf("%d receipts; first %s, second %s", len(res.Receipts), res.Receipts[0].Completeness, res.Receipts[1].Completeness)
	}
}

// benchRun returns the build run of $HAIA_SHARED/bench (gen_run.py, 30,000
// operations: 108k events, 64 MB), generated once into dir, or skips.
func benchRun(b *testing.B, dir string) string {
	b.Helper()
	shared := os.Getenv("HAIA_SHARED")
	if shared == "" {
		b.Skip("HAIA_SHARED not set: skipping the shared bench run")
	}
	path := filepath.Join(dir, "big.ndjson")
	cmd := exec.Command("python3", filepath.Join(shared, "bench", "gen_run.py"), path, "30000")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Skipf("cannot generate the bench run with python3: %v: %s", err, out)
	}
	return path
}

// BenchmarkBuildBenchRun is the build command's work on the shared 108k-event
// bench run, written through the same buffered writer as the command.
func BenchmarkBuildBenchRun(b *testing.B) {
	path := benchRun(b, b.TempDir())
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	tm, err := Bundled("x402-buyer")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		runtime.GC()
		b.StartTimer()
		_, evs, err := ReadRunFile(path, DefaultLimits())
		if err != nil {
			b.Fatal(err)
		}
		if err := WriteBuild(bufio.NewWriterSize(io.Discard, 1<<20), evs, tm); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(peakRSSMiB(), "peak-RSS-MiB")
}

// benchText returns the text of a generated buyer run of n events.
func benchText(b *testing.B, n int) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "run.ndjson")
	writeBuyerRun(b, path, n)
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	return string(data)
}

// BenchmarkDecodeText is the build's parsing alone: every line of a 20k-event
// run checked against the envelope rules (run with -cpu 1 for one core's
// cost).
func BenchmarkDecodeText(b *testing.B) {
	text := benchText(b, 20_000)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		if _, err := decodeText(text, DefaultLimits(), false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrintEvents is the build's printing of events alone: 20k plain
// events indented as a receipt's events are, into one reused buffer.
func BenchmarkPrintEvents(b *testing.B) {
	text := benchText(b, 20_000)
	evs, err := decodeText(text, DefaultLimits(), false)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	var o out
	defer reportCPU(b)()
	for b.Loop() {
		o.Reset(o.Buf[:0], "      ", "  ")
		o.events(evs)
	}
}

// reportCPU reports the process's CPU time (user + system) per operation
// from its call to the returned function's: a figure that a loaded
// machine's other work moves far less than the wall time.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
