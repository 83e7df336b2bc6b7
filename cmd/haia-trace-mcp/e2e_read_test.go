package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

const (
	sellerA = "0xA11CE00000000000000000000000000000000001"
	sellerB = "0xB0B0000000000000000000000000000000000002"
)

// sampleRoot writes a Trace root with one run: seller A settles, seller B
// never does, and one 402 was walked away from.
func sampleRoot(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), ".trace")
	rec, err := simrec.New(root, "run-1", time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []simrec.Payment{
		{OperationID: "op-a", URL: "https://a.example.com/report", PayTo: sellerA, Amount: "250000", Outcome: "settled"},
		{OperationID: "op-b", URL: "https://b.example.net/data", PayTo: sellerB, Amount: "500000", Outcome: "unsettled"},
		{OperationID: "op-c", URL: "https://b.example.net/data", PayTo: sellerB, Amount: "500000", Outcome: "walked-away"},
	} {
		if err := rec.Pay(p); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s %v: %v", name, args, err)
	}
	return res
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// decodeStructured re-decodes a tool's structured content into v.
func decodeStructured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", resultText(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
}

func TestStdioReadTools(t *testing.T) {
	root := sampleRoot(t)
	var stderr bytes.Buffer
	cs := mcpSession(t, &stderr, "--dir", root)

	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]*mcp.Tool{}
	for _, tool := range tools.Tools {
		names[tool.Name] = tool
	}
	for _, want := range []string{"list_operations", "get_receipt", "explain"} {
		tool, ok := names[want]
		if !ok {
			t.Fatalf("tool %s not listed", want)
		}
		if tool.Annotations == nil || !tool.Annotations.ReadOnlyHint || tool.Annotations.OpenWorldHint == nil || *tool.Annotations.OpenWorldHint {
			t.Errorf("tool %s: annotations %+v, want readOnly and closed-world", want, tool.Annotations)
		}
	}
	for _, name := range []string{"approve", "reject", "decide_review", "approve_review"} {
		if _, ok := names[name]; ok {
			t.Errorf("a tool named %s exists; no tool may decide a review", name)
		}
	}

	var list struct {
		Ops            []map[string]any `json:"operations"`
		RunsScanned    int              `json:"runs_scanned"`
		UnreadableRuns []map[string]any `json:"unreadable_runs"`
	}
	decodeStructured(t, callTool(t, cs, "list_operations", nil), &list)
	if list.RunsScanned != 1 || len(list.Ops) != 3 || len(list.UnreadableRuns) != 0 {
		t.Fatalf("list: %+v", list)
	}
	// Newest first: op-c was recorded last.
	if list.Ops[0]["operation_id"] != "op-c" || list.Ops[2]["operation_id"] != "op-a" {
		t.Fatalf("order: %v", list.Ops)
	}
	if list.Ops[2]["completeness"] != "full" || list.Ops[1]["completeness"] != "partial" {
		t.Fatalf("verdicts: %v", list.Ops)
	}
	if ms := list.Ops[1]["missing_stages"].([]any); len(ms) != 1 || ms[0] != "settlement" {
		t.Fatalf("op-b missing stages: %v", ms)
	}
	decodeStructured(t, callTool(t, cs, "list_operations", map[string]any{"completeness": "full", "run": "latest", "limit": 1}), &list)
	if len(list.Ops) != 1 || list.Ops[0]["operation_id"] != "op-a" {
		t.Fatalf("filtered list: %v", list.Ops)
	}

	// get_receipt equals build's receipt for the same operation, for every operation.
	out, errOut, code := runCLI(t, "build", filepath.Join(root, "events", "run-1.ndjson"))
	if code != 0 {
		t.Fatalf("build: %d %s", code, errOut)
	}
	var built struct {
		Receipts []map[string]any `json:"receipts"`
	}
	if err := json.Unmarshal([]byte(out), &built); err != nil {
		t.Fatal(err)
	}
	if len(built.Receipts) != 3 {
		t.Fatalf("build assembled %d receipts, want 3", len(built.Receipts))
	}
	for _, want := range built.Receipts {
		opID := want["operation"].(map[string]any)["operation_id"].(string)
		res := callTool(t, cs, "get_receipt", map[string]any{"run_id": "run-1", "operation_id": opID})
		var got map[string]any
		decodeStructured(t, res, &got)
		if got["run_id"] != "run-1" {
			t.Fatalf("run_id: %v", got["run_id"])
		}
		delete(got, "run_id")
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		if !bytes.Equal(gb, wb) {
			t.Fatalf("get_receipt %s differs from build:\n got %s\nwant %s", opID, gb, wb)
		}
		// The text rendering is build's own bytes for that receipt.
		if !strings.Contains(out, strings.TrimSpace(indentLines(resultText(res), "    "))) {
			t.Fatalf("text rendering of %s is not build's receipt:\n%s", opID, resultText(res))
		}
	}

	var ex map[string]any
	decodeStructured(t, callTool(t, cs, "explain", map[string]any{"run_id": "run-1", "operation_id": "op-b"}), &ex)
	text, _ := ex["explanation"].(string)
	if ex["completeness"] != "partial" || !strings.Contains(text, "settlement") {
		t.Fatalf("explain: %v", ex)
	}

	bad := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"get_receipt", map[string]any{"run_id": "run-1"}, "operation_id is required"},
		{"get_receipt", map[string]any{"run_id": "nope", "operation_id": "op-a"}, `no run "nope"`},
		{"get_receipt", map[string]any{"run_id": "../events/run-1", "operation_id": "op-a"}, `no run "../events/run-1"`},
		{"get_receipt", map[string]any{"run_id": "run-1", "operation_id": "op-z"}, `has no operation "op-z"`},
		{"get_receipt", map[string]any{"run_id": "run-1", "operation_id": "op-a", "template": "../x"}, "template"},
		{"get_receipt", map[string]any{"run_id": "run-1", "operation_id": "op-a", "template": "no-such"}, `template "no-such"`},
		{"explain", map[string]any{"run_id": 7, "operation_id": "op-a"}, "run_id must be a string"},
		{"list_operations", map[string]any{"limit": 0}, "limit must be an integer from 1 to 100"},
		{"list_operations", map[string]any{"limit": 101}, "limit must be an integer from 1 to 100"},
		{"list_operations", map[string]any{"completeness": "done"}, "completeness"},
		{"list_operations", map[string]any{"bogus": true}, "bogus"},
		{"list_operations", map[string]any{"run": "missing-run"}, `no run "missing-run"`},
	}
	for _, c := range bad {
		res := callTool(t, cs, c.tool, c.args)
		if !res.IsError || !strings.Contains(resultText(res), c.want) {
			t.Errorf("%s %v: isError=%v text %q, want an error mentioning %q", c.tool, c.args, res.IsError, resultText(res), c.want)
		}
		if strings.Contains(resultText(res), "goroutine") || strings.Contains(resultText(res), ".go:") {
			t.Errorf("%s %v leaks Go internals: %q", c.tool, c.args, resultText(res))
		}
	}
}

func indentLines(s, prefix string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "\n")
}

func TestStdioRefusesLinksAndSpecialFiles(t *testing.T) {
	base := t.TempDir()
	root := sampleRoot(t)
	events := filepath.Join(root, "events")
	outside := filepath.Join(base, "outside.ndjson")
	data, _ := os.ReadFile(filepath.Join(events, "run-1.ndjson"))
	if err := os.WriteFile(outside, data, 0o644); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(outside, filepath.Join(events, "linked-out.ndjson")))
	must(os.Symlink("run-1.ndjson", filepath.Join(events, "linked-in.ndjson")))
	must(syscall.Mkfifo(filepath.Join(events, "pipe.ndjson"), 0o644))
	must(os.Mkdir(filepath.Join(events, "dir.ndjson"), 0o755))

	cs := mcpSession(t, nil, "--dir", root)
	var list struct {
		Ops            []map[string]any    `json:"operations"`
		RunsScanned    int                 `json:"runs_scanned"`
		UnreadableRuns []map[string]string `json:"unreadable_runs"`
	}
	decodeStructured(t, callTool(t, cs, "list_operations", nil), &list)
	if list.RunsScanned != 1 || len(list.Ops) != 3 {
		t.Fatalf("good run not served: %+v", list)
	}
	reasons := map[string]string{}
	for _, u := range list.UnreadableRuns {
		reasons[u["run_id"]] = u["error"]
	}
	for run, want := range map[string]string{"linked-out": "symbolic link", "linked-in": "symbolic link", "pipe": "FIFO", "dir": "directory"} {
		if !strings.Contains(reasons[run], want) {
			t.Errorf("run %s: reason %q, want it to mention %q", run, reasons[run], want)
		}
	}
	for _, run := range []string{"linked-out", "linked-in", "pipe", "dir", "../outside"} {
		res := callTool(t, cs, "get_receipt", map[string]any{"run_id": run, "operation_id": "op-a"})
		if !res.IsError {
			t.Errorf("get_receipt on %s succeeded", run)
		}
	}

	// A symlinked events/ directory is refused at start.
	root2 := filepath.Join(base, "root2")
	must(os.MkdirAll(root2, 0o755))
	must(os.Symlink(events, filepath.Join(root2, "events")))
	_, errOut, code := runCLIStdin(t, "", "--dir", root2)
	if code == 0 || !strings.Contains(errOut, "symbolic link refused") {
		t.Fatalf("symlinked events/: code %d, stderr %q", code, errOut)
	}
}

func runCLIStdin(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errb.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

// TestStdoutCarriesOnlyProtocol drives the binary with raw JSON-RPC at debug
// log level and checks that every stdout line is a JSON-RPC message.
func TestStdoutCarriesOnlyProtocol(t *testing.T) {
	root := sampleRoot(t)
	// A bad run makes the server log on every listing.
	if err := os.WriteFile(filepath.Join(root, "events", "bad.ndjson"), []byte("not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "--dir", root, "--log-level", "debug")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	const calls = 40
	go func() {
		fmt.Fprintln(stdin, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		fmt.Fprintln(stdin, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		for i := 1; i <= calls; i++ {
			switch i % 3 {
			case 0:
				fmt.Fprintf(stdin, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"list_operations","arguments":{}}}`+"\n", i)
			case 1:
				fmt.Fprintf(stdin, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"get_receipt","arguments":{"run_id":"bad","operation_id":"x"}}}`+"\n", i)
			default:
				fmt.Fprintf(stdin, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"explain","arguments":{"run_id":"run-1","operation_id":"op-b"}}}`+"\n", i)
			}
		}
	}()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	answered := 0
	for answered < calls+1 && sc.Scan() {
		var msg map[string]any
		if err := json.Unmarshal(sc.Bytes(), &msg); err != nil || msg["jsonrpc"] != "2.0" {
			t.Fatalf("stdout line is not JSON-RPC: %q", sc.Text())
		}
		if _, ok := msg["id"]; ok {
			answered++
		}
	}
	stdin.Close()
	rest, _ := io.ReadAll(stdout)
	if len(bytes.TrimSpace(rest)) > 0 {
		for _, l := range bytes.Split(bytes.TrimSpace(rest), []byte("\n")) {
			var msg map[string]any
			if json.Unmarshal(l, &msg) != nil || msg["jsonrpc"] != "2.0" {
				t.Fatalf("stdout line is not JSON-RPC: %q", l)
			}
		}
	}
	cmd.Wait()
	if answered != calls+1 {
		t.Fatalf("answered %d of %d requests", answered, calls+1)
	}
	if !strings.Contains(stderr.String(), `"level":"DEBUG"`) || !strings.Contains(stderr.String(), "refused") {
		t.Fatalf("expected the server to log on stderr; got %q", stderr.String())
	}
}
