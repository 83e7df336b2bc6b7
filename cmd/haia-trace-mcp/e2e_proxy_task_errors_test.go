package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
)

// The guard map of the task tests below: task_send with the default
// errors setting ("unknown": an error may come after the tool paid).
const proxyTaskDefaultErrorsMap = `{"tools": {
  "send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "asset": "USDC"},
  "task_send": {"counterparty": "to", "amount": "amount", "amountUnit": "display"}
}, "unmapped": "forward"}`

const proxyTaskPolicy = `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "1.00", "windowHours": 24}, "reservationMinutes": 15}`

// rpcCall sends one JSON-RPC request to the proxy and returns its result
// (a JSON-RPC error fails the test).
type rpcCall func(t *testing.T, method string, params any) map[string]any

// paidTaskSteps runs, through call, a paying task that pays, then one the
// upstream reports failed under task_send's default errors setting, and
// checks that the failure is recorded upstream_tool_error_unknown with its
// reservation kept: the next call fits only without it and is reviewed.
func paidTaskSteps(t *testing.T, e *proxyEnv, call rpcCall, seller, caller string) {
	t.Helper()
	lastRule := func() string {
		rs := chainReceipts(t, e.root)
		return receiptField(rs[len(rs)-1], "governance", "ruleId")
	}
	runTask := func(args map[string]any) map[string]any {
		t.Helper()
		res := call(t, "tools/call", map[string]any{"name": "task_send", "arguments": args, "task": map[string]any{"ttl": 60000}})
		id, status := taskOf(t, res)
		if status != "working" {
			t.Fatalf("a new task is %q", status)
		}
		return call(t, "tasks/result", map[string]any{"taskId": id})
	}
	if res := runTask(map[string]any{"to": seller, "amount": "0.30", "ms": 100}); res["isError"] == true || !strings.Contains(fmt.Sprint(res["content"]), "paid by task_send") {
		t.Fatalf("allowed task: %v", res)
	}
	if r := lastRule(); r != "upstream_executed" {
		t.Fatalf("outcome of the allowed task: %q", r)
	}
	res := runTask(map[string]any{"to": seller, "amount": "0.60", "fail": true})
	if res["isError"] != true || !strings.Contains(fmt.Sprint(res["content"]), "the wallet is locked") {
		t.Fatalf("failed task: %v", res)
	}
	if r := lastRule(); r != "upstream_tool_error_unknown" {
		t.Fatalf("outcome of the failed task under the default errors setting: %q, want upstream_tool_error_unknown", r)
	}
	data, err := os.ReadFile(filepath.Join(e.root, "guard", "ledger.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(data, []byte(`"kind":"release"`)); n != 0 {
		t.Fatalf("%d releases after a failed task whose errors may mean paid, want none", n)
	}
	// Held: 0.30 executed and the failed 0.60 kept. 0.20 more passes
	// 1.00 only because the failed task's reservation is kept; 0.10 fits.
	over := call(t, "tools/call", map[string]any{"name": "send_usdc", "arguments": map[string]any{"to": seller, "amount": "0.20"}})
	if d := decisionIn(t, over); d.Decision != "review" || !d.has("per_counterparty_limit") {
		t.Fatalf("a call that fits only without the failed task's reservation: %+v", d)
	}
	if fits := call(t, "tools/call", map[string]any{"name": "send_usdc", "arguments": map[string]any{"to": seller, "amount": "0.10"}}); fits["isError"] == true {
		t.Fatalf("0.10 fits beside 0.30 and the kept 0.60: %v", fits)
	}
	if paid := e.paid(t); len(paid) != 2 {
		t.Fatalf("the upstream carried out %v, want task_send and send_usdc once each", paid)
	}
	for _, r := range chainReceipts(t, e.root) {
		if got := receiptField(r, "agent", "id"); got != caller {
			t.Fatalf("a receipt names caller %q, want %q", got, caller)
		}
	}
}

// A paying task whose upstream task fails, with the map's default errors
// setting, over stdio.
func TestProxyTaskFailsWithDefaultErrors(t *testing.T) {
	e := newProxyEnv(t, proxyTaskDefaultErrorsMap, proxyTaskPolicy)
	payUpstream(t)
	w := startWire(t, e.command(nil))
	w.initialize(t, nil)
	paidTaskSteps(t, e, func(t *testing.T, method string, params any) map[string]any {
		t.Helper()
		_, res := w.request(t, method, params)
		return res
	}, "0xC0FFEE0000000000000000000000000000000009", "agent-007")
}

// The same over Streamable HTTP: the proxy served with --http and the
// OAuth test issuer's tokens, reached by a plain HTTP JSON-RPC client (the
// official Go SDK's client has no task-augmented tools/call), its upstream
// the test upstream over stdio. Tasks and their outcomes are the same, and
// every receipt names the token's subject.
func TestProxyPayingTaskOverHTTP(t *testing.T) {
	e := newProxyEnv(t, proxyTaskDefaultErrorsMap, proxyTaskPolicy)
	up := payUpstream(t)
	dir := t.TempDir()
	iss, err := authtest.NewIssuer(dir, "https://as.test.example", "")
	if err != nil {
		t.Fatal(err)
	}
	args := append(e.args()[1:], "--http", "127.0.0.1:0", "--auth-issuer", iss.Issuer, "--auth-jwks", iss.JWKSPath, "--auth-scope", "trace:read")
	p := startHTTPCommandEnv(t, []string{"PAY_LOG=" + e.payLog, "PAY_PID_FILE=" + e.pidFile}, append(append([]string{"proxy"}, args...), "--", up)...)
	iss.Resource = p.resource
	tok, err := iss.Token("agent-http", []string{"trace:read"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := &httpRPC{url: p.resource, token: tok}
	init := c.call(t, "initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "e2e-http-tasks", "version": "1"}})
	if tasks, _ := init["capabilities"].(map[string]any)["tasks"].(map[string]any); tasks == nil {
		t.Fatalf("the proxy over HTTP does not declare tasks: %v", init)
	}
	c.notify(t, "notifications/initialized")
	paidTaskSteps(t, e, func(t *testing.T, method string, params any) map[string]any {
		t.Helper()
		return c.call(t, method, params)
	}, "0xC0FFEE000000000000000000000000000000000A", "agent-http")
}

// httpRPC is a plain Streamable HTTP client: one POST a message, the
// answer as JSON or as an event stream, the session in Mcp-Session-Id.
type httpRPC struct {
	url, token, session string
	ids                 int
}

func (c *httpRPC) post(t *testing.T, msg map[string]any) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(mustJSON(msg)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+c.token)
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if s := resp.Header.Get("Mcp-Session-Id"); s != "" {
		c.session = s
	}
	return resp
}

func (c *httpRPC) notify(t *testing.T, method string) {
	t.Helper()
	resp := c.post(t, map[string]any{"jsonrpc": "2.0", "method": method})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s: HTTP %d", method, resp.StatusCode)
	}
}

func (c *httpRPC) call(t *testing.T, method string, params any) map[string]any {
	t.Helper()
	c.ids++
	id := float64(c.ids)
	resp := c.post(t, map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: HTTP %d: %s", method, resp.StatusCode, body)
	}
	var msgs [][]byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
				msgs = append(msgs, []byte(strings.TrimSpace(data)))
			}
		}
	} else {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, body)
	}
	for _, b := range msgs {
		var m map[string]any
		if json.Unmarshal(b, &m) != nil || m["id"] != id || m["method"] != nil {
			continue
		}
		if e, ok := m["error"]; ok {
			t.Fatalf("%s: error %v", method, e)
		}
		res, _ := m["result"].(map[string]any)
		return res
	}
	t.Fatalf("%s: no answer among %d messages", method, len(msgs))
	return nil
}
