package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds asserted by the hostile-root test. They are generous on purpose:
// the figures actually seen are logged and written down in SECURITY.md, and
// these only catch a regression by an order of magnitude (a reader that
// buffers a 50 MB line, a listing that blocks on a FIFO).
const (
	// hostileAnswerBound is the most a first listing of the hostile root may take.
	hostileAnswerBound = 60 * time.Second
	// hostilePeakRSSBound bounds the server's peak resident memory (VmHWM)
	// while it serves the hostile root. The binary under test is built with
	// the race detector (about 3-5x the memory of a plain build); see
	// SECURITY.md for the figures of both builds.
	hostilePeakRSSBound       = 256 << 20
	hostilePeakRSSBoundNoRace = 96 << 20
)

// goodLine is one valid event line; op names its operation.
func goodLine(op string, seq int, at time.Time) string {
	return fmt.Sprintf(`{"event_id":"%s-%d","event_type":"x402.payment.required","occurred_at":%q,"seq":%d,"adapter":"trace-x402","role":"client","context_id":%q,"payload":{"x402_version":2}}`,
		op, seq, at.UTC().Format("2006-01-02T15:04:05.000Z"), seq, op)
}

var hostileStart = time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)

// hostileCase is one bad run: what its file holds and the words its reason
// must carry (in list_operations and in get_receipt).
type hostileCase struct {
	run  string
	body func(t *testing.T, path string)
	want []string
}

func writeLines(lines ...string) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// envelope builds an event line from members given in order, raw JSON values.
func envelope(members ...string) string {
	return "{" + strings.Join(members, ",") + "}"
}

const (
	mID      = `"event_id":"e-2"`
	mType    = `"event_type":"x402.payment.required"`
	mAt      = `"occurred_at":"2026-07-24T09:00:01.000Z"`
	mSeq     = `"seq":2`
	mAdapter = `"adapter":"trace-x402"`
	mCtx     = `"context_id":"op-1"`
	mPayload = `"payload":{}`
)

func hostileCases() []hostileCase {
	first := goodLine("op-1", 1, hostileStart)
	bad := func(run string, line string, want ...string) hostileCase {
		return hostileCase{run: run, body: writeLines(first, line), want: append([]string{"line 2"}, want...)}
	}
	return []hostileCase{
		{run: "huge-line", body: func(t *testing.T, path string) {
			// A 50 MB line: a reader must stop at its line limit, not buffer it.
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fmt.Fprintln(f, first)
			fmt.Fprint(f, `{"event_id":"big","event_type":"x","occurred_at":"2026-07-24T09:00:01.000Z","seq":2,"adapter":"a","payload":{"blob":"`)
			chunk := bytes.Repeat([]byte("A"), 1<<20)
			for range 50 {
				if _, err := f.Write(chunk); err != nil {
					t.Fatal(err)
				}
			}
			fmt.Fprintln(f, `"}}`)
			fmt.Fprintln(f, goodLine("op-1", 3, hostileStart.Add(time.Second)))
		}, want: []string{"line 2", "line_size", "line limit"}},
		{run: "deep", body: func(t *testing.T, path string) {
			// JSON nested 200,000 deep inside the payload: refused by depth, no stack blow-up.
			const depth = 200_000
			line := envelope(mID, mType, mAt, mSeq, mAdapter, `"payload":{"x":`+strings.Repeat("[", depth)+strings.Repeat("]", depth)+"}")
			writeLines(first, line)(t, path)
		}, want: []string{"line 2", "json", "nesting deeper than"}},
		{run: "deep-objects", body: func(t *testing.T, path string) {
			const depth = 200_000
			writeLines(first, strings.Repeat(`{"a":`, depth)+"1"+strings.Repeat("}", depth))(t, path)
		}, want: []string{"line 2", "json", "nesting deeper than"}},
		bad("bad-utf8", envelope(mID, mType, mAt, mSeq, mAdapter, `"payload":{"note":"caf`+"\xe9"+`"}`), "utf8", "invalid UTF-8"),
		{run: "bom", body: writeLines("\ufeff" + first), want: []string{"line 1", "byte order mark"}},
		bad("nul-in-string", envelope(mID, mType, mAt, mSeq, mAdapter, `"payload":{"note":"a`+"\x00"+`b"}`), "json", "control character 0x00"),
		bad("nul-line", "\x00\x00\x00\x00", "json"),
		{run: "mid-bad", body: func(t *testing.T, path string) {
			// 6,000 good lines with one broken line in the middle (line 3001).
			var b strings.Builder
			for i := 1; i <= 6001; i++ {
				if i == 3001 {
					b.WriteString(`{"event_id":"broken",` + "\n")
					continue
				}
				b.WriteString(goodLine("op-"+strconv.Itoa(i%50), i, hostileStart.Add(time.Duration(i)*time.Millisecond)))
				b.WriteByte('\n')
			}
			if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}, want: []string{"line 3001", "json"}},
		bad("not-object", `["an","array"]`, "object", "must be a JSON object"),
		bad("seq-string", envelope(mID, mType, mAt, `"seq":"2"`, mAdapter, mCtx, mPayload), "seq", "must be a number, got string"),
		bad("seq-negative", envelope(mID, mType, mAt, `"seq":-1`, mAdapter, mCtx, mPayload), "seq", "non-negative integer"),
		bad("seq-fraction", envelope(mID, mType, mAt, `"seq":1.5`, mAdapter, mCtx, mPayload), "seq", "non-negative integer"),
		bad("seq-missing", envelope(mID, mType, mAt, mAdapter, mCtx, mPayload), "seq", "missing"),
		bad("payload-array", envelope(mID, mType, mAt, mSeq, mAdapter, mCtx, `"payload":[]`), "payload", "must be an object, got array"),
		bad("payload-missing", envelope(mID, mType, mAt, mSeq, mAdapter, mCtx), "payload", "missing"),
		bad("at-not-canonical", envelope(mID, mType, `"occurred_at":"2026-07-24T09:00:01Z"`, mSeq, mAdapter, mCtx, mPayload), "occurred_at", "not canonical"),
		bad("at-offset", envelope(mID, mType, `"occurred_at":"2026-07-24T11:00:01.000+02:00"`, mSeq, mAdapter, mCtx, mPayload), "occurred_at", "not canonical"),
		bad("at-impossible", envelope(mID, mType, `"occurred_at":"2026-02-30T09:00:01.000Z"`, mSeq, mAdapter, mCtx, mPayload), "occurred_at", "not a real instant"),
		bad("at-number", envelope(mID, mType, `"occurred_at":1784883601000`, mSeq, mAdapter, mCtx, mPayload), "occurred_at", "must be a string, got number"),
		bad("id-number", envelope(`"event_id":7`, mType, mAt, mSeq, mAdapter, mCtx, mPayload), "event_id", "must be a string"),
		bad("id-empty", envelope(`"event_id":""`, mType, mAt, mSeq, mAdapter, mCtx, mPayload), "event_id", "non-empty"),
		bad("type-null", envelope(mID, `"event_type":null`, mAt, mSeq, mAdapter, mCtx, mPayload), "event_type", "must be a string, got null"),
		bad("adapter-missing", envelope(mID, mType, mAt, mSeq, mCtx, mPayload), "adapter", "missing"),
		bad("role-object", envelope(mID, mType, mAt, mSeq, mAdapter, `"role":{}`, mCtx, mPayload), "role", "must be a string"),
		bad("context-number", envelope(mID, mType, mAt, mSeq, mAdapter, `"context_id":5`, mPayload), "context_id", "must be a string"),
		{run: "sparse-gib", body: func(t *testing.T, path string) {
			// A 1 GiB file of NUL bytes (sparse: costs no disk). The reader
			// must give up at the line limit instead of reading a gibibyte.
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(1 << 30); err != nil {
				t.Fatal(err)
			}
		}, want: []string{"line 1", "line_size", "line limit"}},
	}
}

// startServer starts the real binary over stdio and returns the session and
// the child process, so its memory can be read from /proc.
func startServer(t *testing.T, stderr *lockedBuffer, args ...string) (*mcp.ClientSession, *exec.Cmd) {
	t.Helper()
	if stderr == nil {
		return mcpSessionCmd(t, nil, args...)
	}
	return mcpSessionCmd(t, stderr, args...)
}

// lockedBuffer collects a child's stderr, which exec copies from another
// goroutine while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// peakRSS reads the peak resident set size (VmHWM) of a live process.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("peak memory not measurable here: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

type listing struct {
	Ops            []map[string]any    `json:"operations"`
	RunsScanned    int                 `json:"runs_scanned"`
	UnreadableRuns []map[string]string `json:"unreadable_runs"`
}

// TestStdioHostileRoot serves a Trace root full of hostile files beside good
// runs and checks that the server answers, names every bad run with its
// reason, serves the good ones, follows no link, never blocks on a FIFO and
// stays within a memory bound.
func TestStdioHostileRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("writes about 60 MB of hostile run files")
	}
	base := t.TempDir()
	root := sampleRoot(t) // run-1: three good operations
	events := filepath.Join(root, "events")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// A second good run, large enough to be real work for the index.
	var good strings.Builder
	for i := 1; i <= 6000; i++ {
		good.WriteString(goodLine("g-"+strconv.Itoa(i%60), i, hostileStart.Add(time.Duration(i)*time.Millisecond)))
		good.WriteByte('\n')
	}
	must(os.WriteFile(filepath.Join(events, "good-6000.ndjson"), []byte(good.String()), 0o644))

	cases := hostileCases()
	for _, c := range cases {
		c.body(t, filepath.Join(events, c.run+".ndjson"))
	}

	// Links and special files. The outside target is a valid run holding an
	// operation id that must never show up: seeing it would mean a link was
	// followed. The outside FIFO would block a reader that followed the link.
	outside := filepath.Join(base, "outside")
	must(os.MkdirAll(outside, 0o755))
	must(os.WriteFile(filepath.Join(outside, "secret.ndjson"), []byte(goodLine("secret-op", 1, hostileStart)+"\n"), 0o644))
	must(syscall.Mkfifo(filepath.Join(outside, "pipe"), 0o644))
	must(os.Symlink(filepath.Join(outside, "secret.ndjson"), filepath.Join(events, "link-out.ndjson")))
	must(os.Symlink("../../outside/secret.ndjson", filepath.Join(events, "link-out-rel.ndjson")))
	must(os.Symlink("run-1.ndjson", filepath.Join(events, "link-in.ndjson")))
	must(os.Symlink(filepath.Join(outside, "pipe"), filepath.Join(events, "link-fifo.ndjson")))
	must(os.Symlink(outside, filepath.Join(events, "link-dir.ndjson")))
	must(os.Symlink("nowhere", filepath.Join(events, "link-dangling.ndjson")))
	must(syscall.Mkfifo(filepath.Join(events, "fifo.ndjson"), 0o644))
	must(os.Mkdir(filepath.Join(events, "dir.ndjson"), 0o755))
	// A file that only looks like a run to a careless matcher: ignored.
	must(os.WriteFile(filepath.Join(events, "notes.ndjson.bak"), []byte("junk\n"), 0o644))

	special := map[string]string{
		"link-out": "symbolic link", "link-out-rel": "symbolic link", "link-in": "symbolic link",
		"link-fifo": "symbolic link", "link-dir": "symbolic link", "link-dangling": "symbolic link",
		"fifo": "FIFO", "dir": "directory",
	}

	var stderr lockedBuffer
	cs, cmd := startServer(t, &stderr, "--dir", root)
	start := time.Now()
	var list listing
	decodeStructured(t, callTool(t, cs, "list_operations", map[string]any{"limit": 100}), &list)
	first := time.Since(start)
	start = time.Now()
	decodeStructured(t, callTool(t, cs, "list_operations", map[string]any{"limit": 100}), &list)
	second := time.Since(start)
	t.Logf("list_operations over the hostile root: first %v, second (indexed) %v", first, second)
	if first > hostileAnswerBound {
		t.Errorf("first listing took %v, over the %v bound", first, hostileAnswerBound)
	}

	// The good runs are served.
	if list.RunsScanned != 2 {
		t.Errorf("runs_scanned %d, want 2 (run-1 and good-6000)", list.RunsScanned)
	}
	perRun := map[string]int{}
	for _, op := range list.Ops {
		perRun[op["run_id"].(string)]++
		if strings.HasPrefix(op["operation_id"].(string), "secret") {
			t.Errorf("an operation from outside the root was listed: %v", op)
		}
	}
	if perRun["run-1"] != 3 || perRun["good-6000"] != 60 {
		t.Errorf("operations per run %v, want run-1:3 good-6000:60", perRun)
	}

	// Every bad run is reported, with its reason.
	reasons := map[string]string{}
	for _, u := range list.UnreadableRuns {
		if _, dup := reasons[u["run_id"]]; dup {
			t.Errorf("run %s reported twice", u["run_id"])
		}
		reasons[u["run_id"]] = u["error"]
	}
	if len(reasons) != len(cases)+len(special) {
		t.Errorf("%d unreadable runs reported, want %d: %v", len(reasons), len(cases)+len(special), reasons)
	}
	check := func(where, run, text string, want []string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s %s: reason %q does not mention %q", where, run, text, w)
			}
		}
		if strings.Contains(text, base) || strings.Contains(text, ".go:") || strings.Contains(text, "goroutine") {
			t.Errorf("%s %s: reason leaks paths or internals: %q", where, run, text)
		}
		if len(text) > 2000 {
			t.Errorf("%s %s: reason is %d bytes long; a bad line must not be echoed whole", where, run, len(text))
		}
	}
	for _, c := range cases {
		check("list_operations", c.run, reasons[c.run], c.want)
	}
	for run, w := range special {
		check("list_operations", run, reasons[run], []string{w})
	}

	// get_receipt on each bad run is a tool error with the reason, never a crash.
	for _, c := range cases {
		res := callTool(t, cs, "get_receipt", map[string]any{"run_id": c.run, "operation_id": "op-1"})
		if !res.IsError {
			t.Errorf("get_receipt on %s succeeded", c.run)
			continue
		}
		check("get_receipt", c.run, resultText(res), append([]string{"cannot be read"}, c.want...))
	}
	for run, w := range special {
		for _, tool := range []string{"get_receipt", "explain"} {
			res := callTool(t, cs, tool, map[string]any{"run_id": run, "operation_id": "secret-op"})
			if !res.IsError {
				t.Errorf("%s on %s succeeded: %s", tool, run, resultText(res))
				continue
			}
			check(tool, run, resultText(res), []string{w})
		}
	}
	// list_operations narrowed to one bad run names its reason too.
	res := callTool(t, cs, "list_operations", map[string]any{"run": "mid-bad"})
	if !res.IsError || !strings.Contains(resultText(res), "line 3001") {
		t.Errorf("list_operations run=mid-bad: isError=%v %q", res.IsError, resultText(res))
	}

	// The good runs still answer after all that.
	var rc map[string]any
	decodeStructured(t, callTool(t, cs, "get_receipt", map[string]any{"run_id": "good-6000", "operation_id": "g-7"}), &rc)
	if evs, _ := rc["events"].([]any); len(evs) != 100 {
		t.Errorf("good-6000/g-7 has %d events, want 100", len(evs))
	}
	var ex map[string]any
	decodeStructured(t, callTool(t, cs, "explain", map[string]any{"run_id": "run-1", "operation_id": "op-b"}), &ex)
	if ex["completeness"] != "partial" {
		t.Errorf("explain run-1/op-b: %v", ex)
	}

	peak := peakRSS(t, cmd.Process.Pid)
	bound := int64(hostilePeakRSSBound)
	if !binRace {
		bound = hostilePeakRSSBoundNoRace
	}
	t.Logf("server peak RSS (VmHWM) %.1f MiB, bound %d MiB (race build: %v)", float64(peak)/(1<<20), bound>>20, binRace)
	if peak > bound {
		t.Errorf("server peak RSS %d MiB, over the %d MiB bound", peak>>20, bound>>20)
	}
	if strings.Contains(stderr.String(), "panic") {
		t.Errorf("server stderr mentions a panic:\n%s", stderr.String())
	}
}

// TestStdioListWhileAppending lists a run while a writer appends to it,
// tearing lines on purpose (half a line written, a pause, the rest). A torn
// tail must never be an error, the operation count must only grow, and the
// last listing must see every line.
func TestStdioListWhileAppending(t *testing.T) {
	root := filepath.Join(t.TempDir(), ".trace")
	events := filepath.Join(root, "events")
	if err := os.MkdirAll(events, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(events, "live.ndjson")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const (
		lines = 3000
		ops   = 40
	)
	cs, _ := startServer(t, nil, "--dir", root)

	var wg sync.WaitGroup
	done := make(chan struct{})
	writeErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			writeErr <- err
			return
		}
		defer f.Close()
		for i := 1; i <= lines; i++ {
			l := goodLine("op-"+strconv.Itoa(i%ops), i, hostileStart.Add(time.Duration(i)*time.Millisecond)) + "\n"
			if i%7 == 0 {
				// A torn write: the reader may see the first half alone.
				cut := len(l) / 2
				if _, err := f.WriteString(l[:cut]); err != nil {
					writeErr <- err
					return
				}
				time.Sleep(time.Millisecond)
				l = l[cut:]
			}
			if _, err := f.WriteString(l); err != nil {
				writeErr <- err
				return
			}
			if i%4 == 0 {
				// Pace the writer so that many listings interleave with it.
				time.Sleep(time.Millisecond)
			}
		}
	}()

	listings, lastOps, lastAt := 0, 0, ""
	poll := func() {
		t.Helper()
		var l listing
		decodeStructured(t, callTool(t, cs, "list_operations", map[string]any{"limit": 100}), &l)
		listings++
		if len(l.UnreadableRuns) != 0 {
			t.Fatalf("listing %d: a run being appended to was reported unreadable: %v", listings, l.UnreadableRuns)
		}
		if len(l.Ops) < lastOps {
			t.Fatalf("listing %d: %d operations, fewer than the %d seen before", listings, len(l.Ops), lastOps)
		}
		lastOps = len(l.Ops)
		if len(l.Ops) > 0 {
			at := l.Ops[0]["last_event_at"].(string)
			if at < lastAt {
				t.Fatalf("listing %d: newest event %s is older than %s seen before", listings, at, lastAt)
			}
			lastAt = at
		}
	}
	began := time.Now()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		poll()
		// Reading one operation in full goes through the other reader path.
		res := callTool(t, cs, "get_receipt", map[string]any{"run_id": "live", "operation_id": "op-1"})
		if res.IsError && !strings.Contains(resultText(res), `has no operation "op-1"`) {
			t.Fatalf("get_receipt while appending: %s", resultText(res))
		}
	}
	wg.Wait()
	writing := time.Since(began)
	select {
	case err := <-writeErr:
		t.Fatal(err)
	default:
	}
	poll()
	t.Logf("%d listings in %v while %d lines were appended (every 7th torn)", listings, writing, lines)
	if lastOps != ops {
		t.Fatalf("final listing has %d operations, want %d", lastOps, ops)
	}
	total := 0
	for i := range ops {
		var rc map[string]any
		decodeStructured(t, callTool(t, cs, "get_receipt", map[string]any{"run_id": "live", "operation_id": "op-" + strconv.Itoa(i)}), &rc)
		evs, _ := rc["events"].([]any)
		total += len(evs)
	}
	if total != lines {
		t.Fatalf("the operations hold %d events in all, want %d", total, lines)
	}

	// A tail that is never finished stays invisible and harmless.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"event_id":"torn-for-good","event_t`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	poll()
	if lastOps != ops {
		t.Fatalf("after a torn tail: %d operations, want %d", lastOps, ops)
	}
	// Completing the torn line with garbage makes the run unreadable, and
	// the error names the right line although the file was read in pieces.
	f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var l listing
	decodeStructured(t, callTool(t, cs, "list_operations", nil), &l)
	want := fmt.Sprintf("line %d", lines+1)
	if len(l.UnreadableRuns) != 1 || !strings.Contains(l.UnreadableRuns[0]["error"], want) {
		t.Fatalf("after completing the torn line with garbage: %v, want one unreadable run naming %s", l.UnreadableRuns, want)
	}
}
