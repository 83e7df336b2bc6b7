// Command benchlist measures list_operations over stdio, as an agent host
// sees it: it starts the real server on a Trace root, times the first (cold)
// listing from the start of the process, then warm listings, then listings
// each right after lines are appended to the newest run, and reports the
// server's peak resident memory from /proc. It copies nothing: the appends
// go to the root it is given, so hand it a scratch copy.
//
//	benchlist --bin ./haia-trace-mcp --dir ROOT [--calls 200] [--appends 20] [--lines 1000] [--limit 50] [--index-max-mb 256]
//	          [--http 127.0.0.1:PORT] [--arg FLAG]...
//
// With --http the server is started on Streamable HTTP (unauthenticated,
// loopback) and connected to as soon as it listens; each --arg is passed to
// it, so that a replica of a PostgreSQL store with --ingest (which copies
// the events table into its run files before it serves) is measured from
// its process's start like a stdio server.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	bin, dir      string
	calls         int
	appends       int
	lines         int
	limit         int
	indexMaxMB    int
	jsonOut       bool
	label         string
	serverTimeout time.Duration
	first         string
	http          string
	idle          bool
	args          stringList
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// report is one root's figures, in milliseconds and MiB.
type report struct {
	Label       string  `json:"label"`
	Runs        int     `json:"runs"`
	Operations  int     `json:"operations_listed_first_page"`
	ColdMS      float64 `json:"cold_ms"`
	ColdStartMS float64 `json:"cold_from_process_start_ms"`
	// ColdCPUMS is the server's CPU time (user and system) when its first
	// answer came: the figure that a loaded machine inflates least.
	ColdCPUMS   float64 `json:"cold_cpu_ms"`
	WarmP50MS   float64 `json:"warm_p50_ms"`
	WarmP99MS   float64 `json:"warm_p99_ms"`
	AppendP50MS float64 `json:"after_append_p50_ms"`
	AppendP99MS float64 `json:"after_append_p99_ms"`
	PeakRSSMiB  float64 `json:"peak_rss_mib"`
	// FirstRSSMiB is the server's peak resident set when its first answer
	// came (a restart decodes the rest of its saved index afterwards).
	FirstRSSMiB float64 `json:"first_answer_peak_rss_mib"`
	// With --idle: when the work the first answer left running in the
	// background (the saved index's decode, the sweep of the Trace's
	// settlements) was done (the last sample where the server's CPU
	// moved), from the process's start, the server's CPU time then, and
	// its peak resident set once idle.
	IdleMS     float64 `json:"idle_from_process_start_ms,omitempty"`
	IdleCPUMS  float64 `json:"idle_cpu_ms,omitempty"`
	IdleRSSMiB float64 `json:"idle_peak_rss_mib,omitempty"`
}

func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchlist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.bin, "bin", "./haia-trace-mcp", "the server binary")
	fs.StringVar(&c.dir, "dir", "", "the Trace root (appends go to its newest run file)")
	fs.IntVar(&c.calls, "calls", 200, "warm listings to time")
	fs.IntVar(&c.appends, "appends", 20, "listings to time right after an append")
	fs.IntVar(&c.lines, "lines", 1000, "lines appended before each of those listings")
	fs.IntVar(&c.limit, "limit", 50, "list_operations limit")
	fs.IntVar(&c.indexMaxMB, "index-max-mb", 0, "passed to the server when not 0")
	fs.BoolVar(&c.jsonOut, "json", false, "print the report as one JSON object")
	fs.StringVar(&c.label, "label", "", "a name for the root in the report")
	fs.DurationVar(&c.serverTimeout, "timeout", 10*time.Minute, "bound on the whole measurement")
	fs.StringVar(&c.first, "first", "list_operations", "the first call, whose time is the cold figure: list_operations, or check_before_pay (0.01 to api.example.com, whose answer needs every run)")
	fs.StringVar(&c.http, "http", "", "serve Streamable HTTP on this loopback `HOST:PORT` (unauthenticated) instead of stdio")
	fs.BoolVar(&c.idle, "idle", false, "after the first answer, wait until the server's CPU time stays flat (under 20 ms in each 500 ms, for 2 s) and report when it last moved")
	fs.Var(&c.args, "arg", "a `FLAG` passed to the server (repeatable), such as --arg=--store --arg=postgres://…")
	if err := fs.Parse(argv); err != nil {
		return 2
	}
	if c.first != "list_operations" && c.first != "check_before_pay" {
		fmt.Fprintln(stderr, "benchlist: --first is list_operations or check_before_pay")
		return 2
	}
	if c.dir == "" || c.calls < 1 || c.appends < 0 || c.lines < 4 || c.limit < 1 || c.limit > 100 {
		fmt.Fprintln(stderr, "benchlist: --dir is required; --calls ≥ 1, --lines ≥ 4, --limit 1..100")
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, c.serverTimeout)
	defer cancel()
	rep, err := measure(ctx, c)
	if err != nil {
		fmt.Fprintf(stderr, "benchlist: %v\n", err)
		return 1
	}
	if c.jsonOut {
		b, _ := json.Marshal(rep)
		fmt.Fprintln(stdout, string(b))
		return 0
	}
	if c.idle {
		fmt.Fprintf(stdout, "%s: idle %.0f ms from process start, %.0f ms of CPU, peak RSS %.0f MiB then\n", rep.Label, rep.IdleMS, rep.IdleCPUMS, rep.IdleRSSMiB)
	}
	fmt.Fprintf(stdout, "%s: %d runs; cold %.0f ms (%.0f ms from process start, %.0f ms of CPU); warm p50 %.2f ms p99 %.2f ms; after +%d lines p50 %.2f ms p99 %.2f ms; peak RSS %.0f MiB (%.0f MiB at the first answer)\n",
		rep.Label, rep.Runs, rep.ColdMS, rep.ColdStartMS, rep.ColdCPUMS, rep.WarmP50MS, rep.WarmP99MS, c.lines, rep.AppendP50MS, rep.AppendP99MS, rep.PeakRSSMiB, rep.FirstRSSMiB)
	return 0
}

func measure(ctx context.Context, c config) (report, error) {
	rep := report{Label: c.label}
	if rep.Label == "" {
		rep.Label = filepath.Base(c.dir)
	}
	args := []string{"--dir", c.dir, "--log-level", "error"}
	if c.indexMaxMB > 0 {
		args = append(args, "--index-max-mb", strconv.Itoa(c.indexMaxMB))
	}
	args = append(args, c.args...)
	if c.http != "" {
		args = append(args, "--http", c.http, "--http-insecure-no-auth")
	}
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Stderr = os.Stderr
	start := time.Now()
	client := mcp.NewClient(&mcp.Implementation{Name: "benchlist", Version: "1"}, nil)
	var (
		cs  *mcp.ClientSession
		err error
	)
	if c.http == "" {
		cs, err = client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	} else {
		var stop func()
		cs, stop, err = connectHTTP(ctx, client, cmd, c.http)
		if err == nil {
			// After the session's close below: the server saves its
			// index as it stops, which the next start reads.
			defer stop()
		}
	}
	if err != nil {
		return rep, fmt.Errorf("start %s: %w", c.bin, err)
	}
	defer cs.Close()
	list := func() (time.Duration, int, error) {
		t0 := time.Now()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_operations", Arguments: map[string]any{"limit": c.limit}})
		d := time.Since(t0)
		if err != nil {
			return d, 0, err
		}
		if res.IsError {
			return d, 0, fmt.Errorf("list_operations: %v", res.Content)
		}
		var out struct {
			Operations []json.RawMessage `json:"operations"`
		}
		raw, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(raw, &out)
		return d, len(out.Operations), nil
	}
	first := list
	if c.first == "check_before_pay" {
		first = func() (time.Duration, int, error) {
			t0 := time.Now()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": "api.example.com", "amount": "0.01"}})
			d := time.Since(t0)
			if err == nil && res.IsError {
				err = fmt.Errorf("check_before_pay: %v", res.Content)
			}
			return d, 0, err
		}
	}
	d, n, err := first()
	if err != nil {
		return rep, err
	}
	rep.ColdMS, rep.ColdStartMS, rep.Operations = ms(d), ms(time.Since(start)), n
	if cmd.Process != nil {
		rep.ColdCPUMS = cpuMS(cmd.Process.Pid)
		rep.FirstRSSMiB = peakRSS(cmd.Process.Pid)
		if c.idle {
			// Flat for 2 s, not one sample: a server waiting on the disk
			// (a big root's pages evicted) is not done.
			for last, flat := rep.ColdCPUMS, 0; flat < 4; {
				select {
				case <-ctx.Done():
					return rep, ctx.Err()
				case <-time.After(500 * time.Millisecond):
				}
				now := cpuMS(cmd.Process.Pid)
				if flat++; now-last >= 20 {
					flat = 0
					rep.IdleMS, rep.IdleCPUMS = ms(time.Since(start)), now
				}
				last = now
			}
			if rep.IdleMS == 0 {
				rep.IdleMS, rep.IdleCPUMS = rep.ColdStartMS, rep.ColdCPUMS
			}
			rep.IdleRSSMiB = peakRSS(cmd.Process.Pid)
		}
	}
	// Counted after the first answer: a replica of an ingest store fills
	// an empty root with its copy of the events before it serves.
	newest, runs, err := newestRun(filepath.Join(c.dir, "events"))
	if err != nil {
		return rep, err
	}
	rep.Runs = runs
	warm := make([]time.Duration, 0, c.calls)
	for range c.calls {
		d, _, err := list()
		if err != nil {
			return rep, err
		}
		warm = append(warm, d)
	}
	rep.WarmP50MS, rep.WarmP99MS = percentiles(warm)
	if c.appends > 0 {
		rec, err := simrec.New(c.dir, strings.TrimSuffix(newest, ".ndjson"), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
		if err != nil {
			return rep, err
		}
		grown := make([]time.Duration, 0, c.appends)
		for i := range c.appends {
			ps := make([]simrec.Payment, c.lines/4)
			for j := range ps {
				ps[j] = simrec.Payment{OperationID: fmt.Sprintf("bench-%d-%d", i, j), URL: "https://api.example.com/r",
					PayTo: "0x00000000000000000000000000000000000000aa", Amount: "10000", Outcome: "settled"}
			}
			if err := rec.PayAll(ps); err != nil {
				return rep, err
			}
			d, _, err := list()
			if err != nil {
				return rep, err
			}
			grown = append(grown, d)
		}
		rep.AppendP50MS, rep.AppendP99MS = percentiles(grown)
	}
	if cmd.Process != nil {
		rep.PeakRSSMiB = peakRSS(cmd.Process.Pid)
	}
	return rep, nil
}

// connectHTTP starts cmd and connects to its Streamable HTTP endpoint as
// soon as it answers (every 10 ms until then); stop interrupts the server
// and waits for it to exit.
func connectHTTP(ctx context.Context, client *mcp.Client, cmd *exec.Cmd, addr string) (cs *mcp.ClientSession, stop func(), err error) {
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		tr := &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", MaxRetries: -1}
		cs, err := client.Connect(ctx, tr, nil)
		if err == nil {
			return cs, func() { _ = cmd.Process.Signal(os.Interrupt); <-exited }, nil
		}
		select {
		case err := <-exited:
			return nil, nil, fmt.Errorf("the server exited before it served: %v", err)
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// newestRun returns the run file that sorts last (recorders name runs by
// their start time) and how many run files there are.
func newestRun(events string) (string, int, error) {
	ents, err := os.ReadDir(events)
	if err != nil {
		return "", 0, err
	}
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".ndjson") && e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return "", 0, errors.New("no run files under " + events)
	}
	slices.Sort(names)
	return names[len(names)-1], len(names), nil
}

func percentiles(ds []time.Duration) (p50, p99 float64) {
	slices.Sort(ds)
	return ms(ds[len(ds)/2]), ms(ds[min(len(ds)-1, len(ds)*99/100)])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// peakRSS reads a process's high-water resident set (VmHWM) from Linux.
func peakRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
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

// cpuMS reads a process's CPU time so far (utime and stime, in clock
// ticks of 1/100 s on Linux) from /proc; 0 when it cannot.
func cpuMS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces: the fields start after its ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return float64(u+s) * 10
}
