// Command holdbench measures check_before_pay as commitments pile up: one
// server over stdio (the MCP transport an agent host uses), every question
// an allow that holds its payment (nothing settles, nothing lapses), and
// the p50 and p99 of a window of questions taken after 0, 2,000 and
// 20,000 holds, with the server's user+sys CPU a question over the window
// (its /proc stat, in ticks of 10 ms: about 0.04 ms a question over 250). It runs several builds side by side in one run, each row
// in turn for every build (A B A B …), on the file store and on
// PostgreSQL, to one payee and to a fresh payee each question.
//
//	go run ./tools/holdbench --build main=./haia-trace-mcp --build old=/tmp/old/haia-trace-mcp \
//	    [--levels 0,2000,20000] [--window 250] [--shapes one,fresh] [--stores file,postgres] \
//	    [--postgres postgres://user:pw@127.0.0.1:5432/postgres] [--rounds 1]
//
// The PostgreSQL rows need a role that may CREATE DATABASE: each row gets
// a database of its own (dropped after), migrated by the build under test.
// It exits 1 when any answer is not the allow expected.
package main

import (
	"context"
	"encoding/json"
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

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) }

type build struct{ label, bin string }

type builds []build

func (b *builds) String() string { return fmt.Sprint(*b) }
func (b *builds) Set(v string) error {
	label, bin, ok := strings.Cut(v, "=")
	if !ok || label == "" || bin == "" {
		return fmt.Errorf("--build %q: want LABEL=PATH", v)
	}
	*b = append(*b, build{label, bin})
	return nil
}

type config struct {
	builds          builds
	levels          []int
	window, rounds  int
	shapes, stores  []string
	postgres        string
	reservationMins int
}

// row is one measurement: a build, a store, a payee shape, a level.
type row struct {
	Build, Store, Shape string
	Holds               int
	P50, P99            float64 // milliseconds
	CPU                 float64 // the server's user+sys milliseconds a question over the window; -1 unknown
	Round               int
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a count", p)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("holdbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.Var(&c.builds, "build", "LABEL=PATH of a haia-trace-mcp binary (repeatable)")
	levels := fs.String("levels", "0,2000,20000", "hold counts at which a window is measured")
	fs.IntVar(&c.window, "window", 250, "questions timed at each level")
	fs.IntVar(&c.rounds, "rounds", 1, "times every row is run")
	shapes := fs.String("shapes", "one,fresh", "payee shapes: one (every question to one payee), fresh (a new payee each)")
	stores := fs.String("stores", "file", "stores: file, postgres")
	fs.StringVar(&c.postgres, "postgres", os.Getenv("HAIA_BENCH_POSTGRES"), "an admin DSN for the postgres rows")
	fs.IntVar(&c.reservationMins, "reservation-minutes", 1440, "reservationMinutes of the policy, where the build knows the key")
	if err := fs.Parse(argv); err != nil {
		return 2
	}
	var err error
	if c.levels, err = parseInts(*levels); err != nil {
		fmt.Fprintf(stderr, "holdbench: --levels: %v\n", err)
		return 2
	}
	c.shapes, c.stores = strings.Split(*shapes, ","), strings.Split(*stores, ",")
	if len(c.builds) == 0 || c.window < 1 {
		fmt.Fprintln(stderr, "holdbench: at least one --build, and --window ≥ 1")
		return 2
	}
	if slices.Contains(c.stores, "postgres") && c.postgres == "" {
		fmt.Fprintln(stderr, "holdbench: the postgres rows need --postgres (or HAIA_BENCH_POSTGRES)")
		return 2
	}
	var rows []row
	for round := range c.rounds {
		for _, st := range c.stores {
			for _, shape := range c.shapes {
				for _, b := range c.builds {
					start := time.Now()
					got, err := measure(ctx, c, b, st, shape, stderr)
					if err != nil {
						fmt.Fprintf(stderr, "holdbench: %s %s %s: %v\n", b.label, st, shape, err)
						return 1
					}
					for i := range got {
						got[i].Round = round
						fmt.Fprintf(stdout, "%s\t%s\t%s\tholds=%d\tp50=%.2fms\tp99=%.2fms\tcpu=%.2fms\n", b.label, st, shape, got[i].Holds, got[i].P50, got[i].P99, got[i].CPU)
					}
					fmt.Fprintf(stderr, "holdbench: %s %s %s took %s (load %s)\n", b.label, st, shape, time.Since(start).Round(time.Second), loadAvg())
					rows = append(rows, got...)
				}
			}
		}
	}
	summary(stdout, c, rows)
	return 0
}

// measure runs one build on one store and shape through every level.
func measure(ctx context.Context, c config, b build, store, shape string, stderr io.Writer) ([]row, error) {
	dir, err := os.MkdirTemp("", "holdbench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, ".trace")
	if err := os.MkdirAll(filepath.Join(root, "events"), 0o755); err != nil {
		return nil, err
	}
	args := []string{"--dir", root, "--key-file", filepath.Join(dir, "signing-key.pem"), "--agent-id", "bench"}
	env := append(os.Environ(), "HAIA_CONFIG_DIR="+filepath.Join(dir, "config"))
	if store == "postgres" {
		dsn, drop, err := database(ctx, c.postgres)
		if err != nil {
			return nil, err
		}
		defer drop()
		cmd := exec.CommandContext(ctx, b.bin, "store", "migrate", "--store", dsn)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("store migrate: %v: %s", err, out)
		}
		args = append(args, "--store", dsn)
	}
	// A policy every question is allowed under; reservationMinutes where
	// the build knows it (a build before reservations refuses the key).
	policy := map[string]any{"reviewAbove": "1000000", "perCounterpartyLimit": map[string]any{"amount": "100000000"}, "reservationMinutes": c.reservationMins}
	cs, pid, stop, err := start(ctx, b.bin, dir, args, env, policy, stderr)
	if err != nil {
		delete(policy, "reservationMinutes")
		if cs, pid, stop, err = start(ctx, b.bin, dir, args, env, policy, stderr); err != nil {
			return nil, err
		}
	}
	defer stop()
	n := 0
	ask := func() (time.Duration, error) {
		cp := "0xb0b0000000000000000000000000000000000002"
		if shape == "fresh" {
			cp = fmt.Sprintf("0x%040x", 0xc0ffee0000+n)
		}
		n++
		t0 := time.Now()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": cp, "amount": "0.01"}})
		d := time.Since(t0)
		if err != nil {
			return d, err
		}
		var a struct {
			Decision string `json:"decision"`
		}
		raw, _ := json.Marshal(res.StructuredContent)
		if res.IsError || json.Unmarshal(raw, &a) != nil || a.Decision != "allow" {
			return d, fmt.Errorf("question %d: not the allow expected: %s", n, text(res))
		}
		return d, nil
	}
	var out []row
	held := 0
	for _, level := range c.levels {
		for held < level {
			if _, err := ask(); err != nil {
				return nil, err
			}
			held++
		}
		ds := make([]time.Duration, 0, c.window)
		cpu0 := cpuTime(pid)
		for range c.window {
			d, err := ask()
			if err != nil {
				return nil, err
			}
			ds = append(ds, d)
			held++
		}
		cpu := -1.0
		if cpu1 := cpuTime(pid); cpu0 >= 0 && cpu1 >= 0 {
			cpu = ms(cpu1-cpu0) / float64(c.window)
		}
		slices.Sort(ds)
		out = append(out, row{Build: b.label, Store: store, Shape: shape, Holds: level, P50: ms(ds[len(ds)/2]), P99: ms(ds[len(ds)*99/100]), CPU: cpu})
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

// start writes the policy and starts the server over stdio; it fails when
// the server refuses the policy.
func start(ctx context.Context, bin, dir string, args, env []string, policy map[string]any, stderr io.Writer) (*mcp.ClientSession, int, func(), error) {
	data, _ := json.Marshal(policy)
	cfg := filepath.Join(dir, "haia-guard.config.json")
	if err := os.WriteFile(cfg, data, 0o600); err != nil {
		return nil, 0, nil, err
	}
	cmd := exec.CommandContext(ctx, bin, append(args, "--guard-config", cfg)...)
	cmd.Env = env
	var logs strings.Builder
	cmd.Stderr = &logs
	client := mcp.NewClient(&mcp.Implementation{Name: "holdbench", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("start %s: %v: %s", bin, err, lastLine(logs.String()))
	}
	// A first question proves the server accepted the policy.
	if _, err := cs.ListTools(ctx, nil); err != nil {
		cs.Close()
		return nil, 0, nil, fmt.Errorf("%s: %v: %s", bin, err, lastLine(logs.String()))
	}
	return cs, cmd.Process.Pid, func() { cs.Close() }, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// database makes a fresh database for one row.
func database(ctx context.Context, admin string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, err
	}
	name := fmt.Sprintf("holdbench_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	dsn := fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, name)
	return dsn, func() {
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		conn.Close(context.Background())
	}, nil
}

// cpuTime is the user+sys time of process pid so far, every thread's
// (Linux: /proc/PID/stat, in clock ticks of 10 ms), or -1 where it cannot
// be read.
func cpuTime(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command's name, in parentheses, may hold spaces: fields count
	// from after its closing parenthesis (state is field 3, utime 14).
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return -1
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	return time.Duration(utime+stime) * tick
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// summary prints, per store, shape and build, the median p50 over the
// rounds at each level, the last level's p50 against the first level's,
// and the median server CPU a question at each level.
func summary(w io.Writer, c config, rows []row) {
	fmt.Fprintln(w, "\nstore\tshape\tbuild\t"+levelHeads("p50@", c.levels)+"\tlast/first\t"+levelHeads("cpu@", c.levels))
	median := func(b build, st, shape string, level int, of func(row) float64) (float64, bool) {
		var vs []float64
		for _, r := range rows {
			if r.Build == b.label && r.Store == st && r.Shape == shape && r.Holds == level {
				vs = append(vs, of(r))
			}
		}
		if len(vs) == 0 {
			return 0, false
		}
		slices.Sort(vs)
		return vs[len(vs)/2], true
	}
	for _, st := range c.stores {
		for _, shape := range c.shapes {
			for _, b := range c.builds {
				var cells, cpus []string
				var first, last float64
				for i, level := range c.levels {
					m, ok := median(b, st, shape, level, func(r row) float64 { return r.P50 })
					if !ok {
						cells, cpus = append(cells, "-"), append(cpus, "-")
						continue
					}
					if i == 0 {
						first = m
					}
					last = m
					cells = append(cells, fmt.Sprintf("%.2f", m))
					cpu, _ := median(b, st, shape, level, func(r row) float64 { return r.CPU })
					cpus = append(cpus, fmt.Sprintf("%.2f", cpu))
				}
				ratio := "-"
				if first > 0 {
					ratio = fmt.Sprintf("%.2f", last/first)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", st, shape, b.label, strings.Join(cells, "\t"), ratio, strings.Join(cpus, "\t"))
			}
		}
	}
}

func levelHeads(prefix string, levels []int) string {
	var hs []string
	for _, l := range levels {
		hs = append(hs, prefix+strconv.Itoa(l))
	}
	return strings.Join(hs, "\t")
}
