package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// newToolsEnv starts the proxy with gmap in front of the test upstream and
// returns a channel that hears the client's tools/list_changed.
func newToolsEnv(t *testing.T, gmap string) (*proxyEnv, chan struct{}) {
	t.Helper()
	e := newProxyEnv(t, gmap, proxyErrorsPolicy)
	changed := make(chan struct{}, 16)
	e.start(t, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}})
	return e, changed
}

// changeTools has the upstream change its tools and waits until the
// proxy serves the change (the client hears of it and lists want).
func (e *proxyEnv) changeTools(t *testing.T, changed chan struct{}, args, want string) {
	t.Helper()
	if res := e.callRaw(t, "change_tools", args); res.IsError {
		t.Fatalf("change_tools %s: %s", args, resultText(res))
	}
	deadline := time.After(15 * time.Second)
	for {
		select {
		case <-changed:
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the proxy does not serve the upstream's change (%s); stderr %s", args, e.stderr)
		}
		lt, err := e.cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tool := range lt.Tools {
			if b, _ := json.Marshal(tool); strings.Contains(string(b), want) {
				return
			}
		}
	}
}

// proxyStatus runs `status --json` on the proxy's root.
func (e *proxyEnv) proxyStatus(t *testing.T) (tools map[string]map[string]any, problems []string, code int) {
	t.Helper()
	out, errOut, code := runCLI(t, "status", "--dir", e.root, "--json")
	var rep struct {
		Proxy struct {
			State struct {
				Tools []map[string]any `json:"tools"`
			} `json:"state"`
		} `json:"proxy"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("status --json: %v (%d, %s)", err, code, errOut)
	}
	tools = map[string]map[string]any{}
	for _, tool := range rep.Proxy.State.Tools {
		tools[tool["name"].(string)] = tool
	}
	return tools, rep.Problems, code
}

func problemNaming(problems []string, parts ...string) string {
	for _, p := range problems {
		all := true
		for _, part := range parts {
			all = all && strings.Contains(p, part)
		}
		if all {
			return p
		}
	}
	return ""
}

// sighup re-reads the guard map and waits until the proxy says it did.
func (e *proxyEnv) sighup(t *testing.T) {
	t.Helper()
	before := strings.Count(e.stderr.String(), "SIGHUP: the guard map was re-read")
	if err := e.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for strings.Count(e.stderr.String(), "SIGHUP: the guard map was re-read") == before {
		if time.Now().After(deadline) {
			t.Fatalf("the guard map was not re-read on SIGHUP; stderr %s", e.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Under "unmapped": "forward", a tool the upstream adds after start — one
// that pays — is refused until the guard map is re-read, and a known tool
// whose input schema changes to one that pays is refused the same way; the
// log and `status` name them and say they look like payments. A SIGHUP
// makes them known to the map (forwarded, and flagged by status while
// unmapped); a map that names the new tool makes its calls questions for
// the guard. Before, the new tool was forwarded and paid with no decision
// and no word.
func TestProxyToolsThatAppearLater(t *testing.T) {
	const payee = "0xC0FFEE00000000000000000000000000000000A1"
	e, changed := newToolsEnv(t, proxyMapJSON)
	tools, _, _ := e.proxyStatus(t)
	if tools["echo"]["status"] != "forwarded" || tools["echo"]["payment_like"] != nil || tools["send_usdc"]["status"] != "paying" {
		t.Fatalf("status at start: %v", tools)
	}
	if tools["strict_send"]["status"] != "forwarded" || tools["strict_send"]["payment_like"] == nil {
		t.Fatalf("strict_send, unmapped, is not flagged as payment-like: %v", tools["strict_send"])
	}

	// The upstream adds a paying tool.
	e.changeTools(t, changed, `{"add":"late_send"}`, `"name":"late_send"`)
	res := e.callRaw(t, "late_send", `{"recipientAddress":"`+payee+`","amount":"4.00"}`)
	if !res.IsError || !strings.Contains(resultText(res), "after the guard map was read") || !strings.Contains(resultText(res), "SIGHUP") {
		t.Fatalf("a tool added after start: %s", resultText(res))
	}
	if n, tools := (proxyWire{e: e}).paidTo(t, payee); n != 0 {
		t.Fatalf("the new tool was forwarded and paid: %v", tools)
	}
	logged := e.stderr.String()
	for _, want := range []string{`"msg":"the upstream added a tool the guard map does not name after the map was read; it is refused until the map names it or is re-read (SIGHUP)","tool":"late_send"`,
		`an amount-like property \"amount\" and an address-like property \"recipientAddress\"`} {
		if !strings.Contains(logged, want) {
			t.Fatalf("the log does not say %s:\n%s", want, logged)
		}
	}
	tools, problems, code := e.proxyStatus(t)
	if lt := tools["late_send"]; lt["status"] != "refused_new" || !strings.Contains(lt["payment_like"].(string), "recipientAddress") || lt["new_since"] == nil {
		t.Fatalf("status of the new tool: %v", lt)
	}
	if code != 3 || problemNaming(problems, "late_send", "refuses it until the map names it or is re-read (SIGHUP)", "looks like a payment") == "" {
		t.Fatalf("status: exit %d, problems %q", code, problems)
	}
	out, _, _ := runCLI(t, "status", "--dir", e.root)
	if !strings.Contains(out, "late_send") || !strings.Contains(out, "refused: new since") || !strings.Contains(out, "looks like a payment: its input has an amount-like property") {
		t.Fatalf("status does not show the new tool:\n%s", out)
	}

	// A known unmapped tool whose input schema changes to one that pays.
	e.changeTools(t, changed, `{"reshape":true}`, `"price"`)
	if res := e.callRaw(t, "echo", `{"text":"hi","payee":{"wallet":"`+payee+`"},"price":"4.00"}`); !res.IsError || !strings.Contains(resultText(res), "after the guard map was read") {
		t.Fatalf("echo with a new schema: %s", resultText(res))
	}
	if !strings.Contains(e.stderr.String(), `"msg":"the input schema of an upstream tool the guard map does not name changed after the map was read; it is refused until the map names it or is re-read (SIGHUP)","tool":"echo"`) {
		t.Fatalf("the log does not name the changed tool:\n%s", e.stderr)
	}
	if n, tools := (proxyWire{e: e}).paidTo(t, payee); n != 0 {
		t.Fatalf("a tool refused as new paid: %v", tools)
	}

	// SIGHUP with the map unchanged: every tool listed now is known to
	// it. The new tools are forwarded unchecked, and status flags them.
	e.sighup(t)
	tools, problems, _ = e.proxyStatus(t)
	if tools["late_send"]["status"] != "forwarded" || problemNaming(problems, "late_send", "forwards it unchecked", "looks like a payment") == "" {
		t.Fatalf("after SIGHUP: %v, problems %q", tools["late_send"], problems)
	}
	if res := e.callRaw(t, "echo", `{"text":"hello"}`); res.IsError {
		t.Fatalf("echo after SIGHUP: %s", resultText(res))
	}

	// The operator maps it and re-reads the map: each call is a question.
	gmap := strings.Replace(proxyMapJSON, `"tools": {`, `"tools": {
  "late_send": {"counterparty": "recipientAddress", "amount": "amount", "amountUnit": "display"},`, 1)
	if err := os.WriteFile(e.mapPath, []byte(gmap), 0o600); err != nil {
		t.Fatal(err)
	}
	e.sighup(t)
	if res := e.callRaw(t, "late_send", `{"recipientAddress":"`+payee+`","amount":"4.00"}`); res.IsError {
		t.Fatalf("the mapped tool's allowed call: %s", resultText(res))
	}
	if d := decisionOf(t, e.callRaw(t, "late_send", `{"recipientAddress":"`+payee+`","amount":"4.00"}`)); d.Decision != "review" || !d.has("per_counterparty_limit") {
		t.Fatalf("a second 4.00 under 5.00: %+v", d)
	}
	if n, _ := (proxyWire{e: e}).paidTo(t, payee); n != 1 {
		t.Fatalf("the upstream paid %d times, want once", n)
	}
	if tools, _, _ := e.proxyStatus(t); tools["late_send"]["status"] != "paying" {
		t.Fatalf("status after mapping: %v", tools["late_send"])
	}
}

// A map that says "newTools": "forward" forwards a tool added after start
// as every unmapped tool; the log and status still name it and flag it.
func TestProxyNewToolsForward(t *testing.T) {
	const payee = "0xC0FFEE00000000000000000000000000000000A2"
	e, changed := newToolsEnv(t, strings.Replace(proxyMapJSON, `"unmapped": "forward"`, `"unmapped": "forward", "newTools": "forward"`, 1))
	e.changeTools(t, changed, `{"add":"late_send"}`, `"name":"late_send"`)
	if res := e.callRaw(t, "late_send", `{"recipientAddress":"`+payee+`","amount":"4.00"}`); res.IsError {
		t.Fatalf("newTools forward: %s", resultText(res))
	}
	if n, _ := (proxyWire{e: e}).paidTo(t, payee); n != 1 {
		t.Fatalf("the upstream paid %d times, want once", n)
	}
	if !strings.Contains(e.stderr.String(), `"msg":"the upstream added a tool the guard map does not name that looks like a payment; it is forwarded unchecked (newTools: forward)","tool":"late_send"`) {
		t.Fatalf("the log does not name the new tool:\n%s", e.stderr)
	}
	tools, problems, _ := e.proxyStatus(t)
	if tools["late_send"]["status"] != "forwarded_new" || problemNaming(problems, "late_send", "forwards it unchecked") == "" {
		t.Fatalf("status: %v, problems %q", tools["late_send"], problems)
	}
}
