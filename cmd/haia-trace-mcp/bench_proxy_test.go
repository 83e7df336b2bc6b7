package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkProxyLatency measures, side by side in one run, a paying call
// made directly to the test upstream over stdio, the same call through the
// proxy (an allow: one engine question and two signed receipts, the
// decision and the outcome), and an unmapped call through the proxy. It
// reports p50 and p99 of each in milliseconds, and, when the run is long
// enough, the p50 of the first and of the last 250 calls of each: every
// proxied paying call is an entry of the spend ledger that counts for the
// whole window, so the last 250 of -benchtime 2250x are answered with
// 2,000 entries live:
//
//	HAIA_E2E_NORACE=1 go test -run '^$' -bench ProxyLatency -benchtime 2250x ./cmd/haia-trace-mcp/
func BenchmarkProxyLatency(b *testing.B) {
	bin := payUpstream(b)
	dir := b.TempDir()
	e := &proxyEnv{root: sampleRoot(b), payLog: filepath.Join(dir, "paid.ndjson"), pidFile: filepath.Join(dir, "pids"),
		mapPath: filepath.Join(dir, "map.json"), config: filepath.Join(dir, "policy.json"), stderr: &lockedBuffer{}}
	if err := os.WriteFile(e.mapPath, []byte(proxyMapJSON), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(e.config, []byte(`{"reviewAbove": "1000000", "perCounterpartyLimit": {"amount": "1000000000", "windowHours": 1}}`), 0o600); err != nil {
		b.Fatal(err)
	}
	connect := func(cmd *exec.Cmd) *mcp.ClientSession {
		cmd.Env = append(os.Environ(), "PAY_LOG="+e.payLog)
		client := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			b.Fatalf("connect: %v (%s)", err, e.stderr)
		}
		b.Cleanup(func() { cs.Close() })
		return cs
	}
	direct := connect(exec.Command(bin))
	var pcmd *exec.Cmd
	if benchSteps() {
		pcmd = e.command(nil, "--log-level", "debug")
		defer func() { reportSteps(e.stderr.String(), "paying call steps") }()
	} else {
		pcmd = e.command(nil)
	}
	proxied := connect(pcmd)
	pay := json.RawMessage(`{"to":"` + sellerA + `","amount":"0.01"}`)
	echo := json.RawMessage(`{"text":"x"}`)
	call := func(cs *mcp.ClientSession, name string, args json.RawMessage) time.Duration {
		start := time.Now()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
		d := time.Since(start)
		if err != nil || res.IsError {
			b.Fatalf("%s: %v %v (%s)", name, err, res, e.stderr)
		}
		return d
	}
	var d, p, u []time.Duration
	b.ResetTimer()
	for range b.N {
		d = append(d, call(direct, "send_usdc", pay))
		p = append(p, call(proxied, "send_usdc", pay))
		u = append(u, call(proxied, "echo", echo))
	}
	b.StopTimer()
	if n := len(e.paid(b)); n != 2*b.N {
		b.Fatalf("the upstream ran %d paying calls, want %d", n, 2*b.N)
	}
	for _, s := range []struct {
		name string
		ds   []time.Duration
	}{{"direct", d}, {"proxied-paying", p}, {"proxied-unmapped", u}} {
		p50, p99 := percentile(s.ds, 50), percentile(s.ds, 99)
		b.ReportMetric(ms(p50), s.name+"-p50-ms")
		b.ReportMetric(ms(p99), s.name+"-p99-ms")
		fmt.Fprintf(os.Stderr, "%-17s n=%d p50=%.2fms p99=%.2fms\n", s.name, len(s.ds), ms(p50), ms(p99))
		reportWindows(b, s.name, s.ds)
	}
}

// benchWindow is how many calls the first and last windows of a long
// benchmark hold.
const benchWindow = 250

// reportWindows reports the p50 of the first and of the last benchWindow
// calls of ds (in the order they were made) when there are at least two
// windows: the cost of a call with no entries live beside its cost with
// len(ds)-benchWindow of them.
func reportWindows(b *testing.B, name string, ds []time.Duration) {
	if len(ds) < 2*benchWindow {
		return
	}
	first, last := percentile(ds[:benchWindow], 50), percentile(ds[len(ds)-benchWindow:], 50)
	b.ReportMetric(ms(first), name+"-first-p50-ms")
	b.ReportMetric(ms(last), name+"-last-p50-ms")
	fmt.Fprintf(os.Stderr, "%-17s first %d p50=%.2fms, last %d (after %d) p50=%.2fms\n", name, benchWindow, ms(first), benchWindow, len(ds)-benchWindow, ms(last))
}

// benchSteps says whether HAIA_BENCH_STEPS asks the paying benchmarks to
// run the binary at --log-level debug and report where the time of the
// last benchWindow calls went (reportSteps).
func benchSteps() bool { return os.Getenv("HAIA_BENCH_STEPS") != "" }

// reportSteps prints the p50 of each step (every number of a step line,
// in ms) over the last benchWindow lines of stderr whose msg is msg.
func reportSteps(stderr, msg string) {
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stderr))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
			lines = append(lines, line)
		}
	}
	if len(lines) > benchWindow {
		lines = lines[len(lines)-benchWindow:]
	}
	steps := map[string][]time.Duration{}
	for _, l := range lines {
		for k, v := range l {
			if f, ok := v.(float64); ok {
				steps[k] = append(steps[k], time.Duration(f))
			}
		}
	}
	names := make([]string, 0, len(steps))
	for k := range steps {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		fmt.Fprintf(os.Stderr, "%s, last %d: %s p50=%.3fms\n", msg, len(lines), k, ms(percentile(steps[k], 50)))
	}
}

func percentile(ds []time.Duration, q int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*q + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
