package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The guard map of the upstream-error tests: every tool of the test
// upstream that pays and then fails, and the ones refused before their
// handler runs, mapped with the default errors setting.
const proxyErrorsMap = `{"tools": {
  "send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "asset": "USDC"},
  "pay_then_internal": {"counterparty": "to", "amount": "amount", "amountUnit": "display"},
  "pay_then_panic": {"counterparty": "to", "amount": "amount", "amountUnit": "display"},
  "pay_then_code": {"counterparty": "to", "amount": "amount", "amountUnit": "display"},
  "pay_then_drop": {"counterparty": "to", "amount": "amount", "amountUnit": "display"},
  "strict_send": {"counterparty": "to", "amount": "amount", "amountUnit": "display"},
  "ghost_send": {"counterparty": "to", "amount": "amount", "amountUnit": "display"},
  "twofaced_send": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "errors": "unpaid"}
}, "unmapped": "forward"}`

// 5.00 per counterparty; each call below is 4.00, so one fits.
const proxyErrorsPolicy = `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "5.00", "windowHours": 24}, "reservationMinutes": 15}`

// proxyWire is the wire client of one proxy in front of the test upstream,
// with what the tests below ask of it.
type proxyWire struct {
	e *proxyEnv
	w *wireClient
}

// call calls a tool, as a task when task is set (the answer is then the
// task's result, or the result the proxy's server answered at once).
func (p proxyWire) call(t *testing.T, tool string, args map[string]any, task bool) map[string]any {
	t.Helper()
	params := map[string]any{"name": tool, "arguments": args}
	if task {
		params["task"] = map[string]any{"ttl": 60000}
	}
	_, res := p.w.request(t, "tools/call", params)
	if _, ok := res["task"]; ok {
		id, _ := taskOf(t, res)
		_, res = p.w.request(t, "tasks/result", map[string]any{"taskId": id})
	}
	return res
}

func (p proxyWire) lastRule(t *testing.T) string {
	t.Helper()
	rs := chainReceipts(t, p.e.root)
	return receiptField(rs[len(rs)-1], "governance", "ruleId")
}

// paidTo counts the calls the upstream carried out for payee.
func (p proxyWire) paidTo(t *testing.T, payee string) (n int, tools []string) {
	t.Helper()
	for _, c := range p.e.paid(t) {
		if strings.Contains(string(mustJSON(c["arguments"])), payee) {
			n++
			tools = append(tools, fmt.Sprint(c["tool"]))
		}
	}
	return n, tools
}

// upstreamBack waits until the upstream restarted after a drop and the
// proxy forwards again.
func (p proxyWire) upstreamBack(t *testing.T, starts int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(readPids(t, p.e.pidFile)) < starts {
		if time.Now().After(deadline) {
			t.Fatalf("the upstream was not restarted; stderr %s", p.e.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		if res := p.call(t, "echo", map[string]any{"text": "back"}, false); res["isError"] != true {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy does not forward after the restart; stderr %s", p.e.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startProxyWire(t *testing.T) proxyWire {
	t.Helper()
	e := newProxyEnv(t, proxyErrorsMap, proxyErrorsPolicy)
	payUpstream(t)
	w := startWire(t, e.command(nil))
	w.initialize(t, nil)
	return proxyWire{e: e, w: w}
}

// An upstream that pays and then fails while answering keeps what the
// call's allow counted, whichever way it fails: five calls of 4.00 under a
// 5.00 limit, one forwarded (it pays, then errs), four refused for the
// limit. Before, every JSON-RPC error answer released the spend as if the
// tool never ran, and all five were forwarded and paid.
func TestProxyUpstreamErrorAfterPayingKeepsTheSpend(t *testing.T) {
	p := startProxyWire(t)
	for i, k := range []struct {
		name, tool string
		extra      map[string]any
		task, drop bool
		// rule is the outcome's governance.ruleId; answer, what the
		// caller reads.
		rule, answer string
	}{
		{name: "JSON-RPC internal error", tool: "pay_then_internal", rule: "upstream_error_unknown", answer: "the receipt service failed after the transfer"},
		{name: "thrown handler error", tool: "pay_then_panic", rule: "upstream_error_unknown", answer: "panic recovered in pay_then_panic tool handler"},
		{name: "server-defined code -32000", tool: "pay_then_code", extra: map[string]any{"code": -32000}, rule: "upstream_error_unknown", answer: "answered -32000 after the transfer"},
		{name: "application code 4001", tool: "pay_then_code", extra: map[string]any{"code": 4001}, rule: "upstream_error_unknown", answer: "answered 4001 after the transfer"},
		{name: "code 0, the Go SDK's thrown error", tool: "pay_then_code", extra: map[string]any{"code": 0}, rule: "upstream_error_unknown", answer: "answered 0 after the transfer"},
		{name: "internal error of a call run as a task", tool: "pay_then_internal", task: true, rule: "upstream_error_unknown", answer: "the receipt service failed after the transfer"},
		{name: "dropped connection", tool: "pay_then_drop", drop: true, rule: "upstream_lost", answer: "is unknown"},
		{name: "dropped connection of a call run as a task", tool: "pay_then_drop", task: true, drop: true, rule: "upstream_lost", answer: "is unknown"},
	} {
		t.Run(k.name, func(t *testing.T) {
			payee := fmt.Sprintf("0xE220000000000000000000000000000000000%03d", i)
			args := map[string]any{"to": payee, "amount": "4.00"}
			for key, v := range k.extra {
				args[key] = v
			}
			starts := len(readPids(t, p.e.pidFile))
			res := p.call(t, k.tool, args, k.task)
			if res["isError"] != true || res["structuredContent"] != nil || !strings.Contains(fmt.Sprint(res["content"]), k.answer) {
				t.Fatalf("first call: want the forwarded call's error naming %q, got %v", k.answer, res)
			}
			if r := p.lastRule(t); r != k.rule {
				t.Fatalf("first call recorded %q, want %q", r, k.rule)
			}
			if k.drop {
				p.upstreamBack(t, starts+1)
			}
			for n := 2; n <= 5; n++ {
				res := p.call(t, k.tool, args, k.task)
				if res["structuredContent"] == nil {
					t.Fatalf("call %d of 4.00 under 5.00 was forwarded: the first call's spend was released (%v)", n, res)
				}
				if d := decisionIn(t, res); d.Decision != "review" || !d.has("per_counterparty_limit") {
					t.Fatalf("call %d: %+v", n, d)
				}
			}
			if n, tools := p.paidTo(t, payee); n != 1 {
				t.Fatalf("the upstream paid %d times (%v), want once", n, tools)
			}
		})
	}
	data, err := os.ReadFile(filepath.Join(p.e.root, "guard", "ledger.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `"kind":"release"`) {
		t.Fatal("a reservation was released after an error that does not prove the call was not run")
	}
}

// What proves the call was not run still releases it: arguments refused
// before the handler runs (-32602 from the upstream's schema validation)
// and a tool the upstream no longer knows (-32602 "tool not found"). Five
// calls of 4.00 under 5.00 are each forwarded, refused and released, none
// pays, and 4.00 then fits and is paid.
func TestProxyUpstreamRefusalBeforeRunningReleases(t *testing.T) {
	p := startProxyWire(t)
	for i, k := range []struct {
		name, tool string
		extra      map[string]any
		vanish     bool
		answer     string
	}{
		{name: "arguments refused before the handler", tool: "strict_send", extra: map[string]any{"memo": "far too long a memo"}, answer: "memo has 19 characters"},
		{name: "unknown tool", tool: "ghost_send", vanish: true, answer: "tool 'ghost_send' not found"},
	} {
		t.Run(k.name, func(t *testing.T) {
			if k.vanish {
				if res := p.call(t, "change_tools", map[string]any{"vanish": true}, false); res["isError"] == true {
					t.Fatalf("change_tools: %v", res)
				}
			}
			payee := fmt.Sprintf("0xE221000000000000000000000000000000000%03d", i)
			args := map[string]any{"to": payee, "amount": "4.00"}
			for key, v := range k.extra {
				args[key] = v
			}
			for n := 1; n <= 5; n++ {
				res := p.call(t, k.tool, args, false)
				if res["isError"] != true || res["structuredContent"] != nil || !strings.Contains(fmt.Sprint(res["content"]), k.answer) || !strings.Contains(fmt.Sprint(res["content"]), "refused it before running it") {
					t.Fatalf("call %d: want the upstream's refusal naming %q, got %v", n, k.answer, res)
				}
				if r := p.lastRule(t); r != "upstream_refused" {
					t.Fatalf("call %d recorded %q, want upstream_refused", n, r)
				}
			}
			if n, tools := p.paidTo(t, payee); n != 0 {
				t.Fatalf("the upstream paid %v", tools)
			}
			if res := p.call(t, "send_usdc", map[string]any{"to": payee, "amount": "4.00"}, false); res["isError"] == true {
				t.Fatalf("4.00 after five refused calls was not forwarded: %v", res)
			}
			if n, _ := p.paidTo(t, payee); n != 1 {
				t.Fatalf("the upstream paid %d times, want once", n)
			}
		})
	}
}

// The upstream's answer to a paying call is read exactly: twofaced_send
// pays, then answers "isError": false with "IsError": true beside it. Read
// without regard to case, that was the tool's error, which its map entry
// ("errors": "unpaid") releases — and all five calls of 4.00 under 5.00
// were forwarded and paid. Refused as an answer that says two things, it is
// an unknown outcome that keeps the spend: one is forwarded, four are
// refused for the limit. The same over a task call, whose answer the
// proxy reads itself.
func TestProxyUpstreamAnswerReadExactly(t *testing.T) {
	p := startProxyWire(t)
	for i, task := range []bool{false, true} {
		t.Run(fmt.Sprintf("task %v", task), func(t *testing.T) {
			payee := fmt.Sprintf("0xE222000000000000000000000000000000000%03d", i)
			args := map[string]any{"to": payee, "amount": "4.00"}
			res := p.call(t, "twofaced_send", args, task)
			text := fmt.Sprint(res["content"])
			if res["isError"] != true || !strings.Contains(text, "the upstream's answer to tools/call cannot be read exactly") || !strings.Contains(text, `"IsError" is "isError" in another case`) {
				t.Fatalf("first call: %v", res)
			}
			if r := p.lastRule(t); r != "upstream_lost" {
				t.Fatalf("recorded %q, want upstream_lost", r)
			}
			for n := 2; n <= 5; n++ {
				res := p.call(t, "twofaced_send", args, task)
				if res["structuredContent"] == nil {
					t.Fatalf("call %d of 4.00 under 5.00 was forwarded: the first call's spend was released (%v)", n, res)
				}
				if d := decisionIn(t, res); d.Decision != "review" || !d.has("per_counterparty_limit") {
					t.Fatalf("call %d: %+v", n, d)
				}
			}
			if n, tools := p.paidTo(t, payee); n != 1 {
				t.Fatalf("the upstream paid %d times (%v), want once", n, tools)
			}
		})
	}
}
