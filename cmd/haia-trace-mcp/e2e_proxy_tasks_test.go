package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// taskOf is the task a task-augmented tools/call answered with.
func taskOf(t *testing.T, res map[string]any) (id, status string) {
	t.Helper()
	task, _ := res["task"].(map[string]any)
	id, _ = task["taskId"].(string)
	status, _ = task["status"].(string)
	if id == "" {
		t.Fatalf("no task in the answer: %v", res)
	}
	return id, status
}

// decisionIn reads the guard's decision out of a tool result read on the
// wire.
func decisionIn(t *testing.T, res map[string]any) proxyDecision {
	t.Helper()
	var d proxyDecision
	if err := json.Unmarshal(mustJSON(res["structuredContent"]), &d); err != nil || d.Decision == "" {
		t.Fatalf("no decision in %v", res)
	}
	return d
}

// Tasks through the proxy, against the test upstream's task tool: the
// host's task is the proxy's, a paying task is decided before the
// upstream's task is created (block and review never reach it), and the
// outcome is recorded when the upstream's task result is known — executed
// kept, failed released, cancelled kept.
func TestProxyTasks(t *testing.T) {
	const sellerF = "0xC0FFEE0000000000000000000000000000000008"
	e := newProxyEnv(t, proxyMapJSON, `{"denylist": ["`+sellerDenied+`"], "reviewAbove": "100", "perCounterpartyLimit": {"amount": "1.00", "windowHours": 24}, "reservationMinutes": 15}`)
	payUpstream(t)
	w := startWire(t, e.command(nil))
	init := w.initialize(t, nil)
	caps, _ := init["capabilities"].(map[string]any)
	if tasks, _ := caps["tasks"].(map[string]any); tasks == nil || !strings.Contains(string(mustJSON(tasks)), `"call"`) {
		t.Fatalf("the proxy does not declare task-augmented tools/call: %v", caps)
	}
	_, lt := w.request(t, "tools/list", map[string]any{})
	if !strings.Contains(string(mustJSON(lt)), `"name":"task_send"`) || !strings.Contains(string(mustJSON(lt)), `"taskSupport":"optional"`) {
		t.Fatalf("task_send and its task support are not listed through the proxy: %s", mustJSON(lt))
	}
	logPath := filepath.Join(e.root, "guard", "decisions.ndjson")
	lastRule := func() string {
		rs := chainReceipts(t, e.root)
		return receiptField(rs[len(rs)-1], "governance", "ruleId")
	}
	startTask := func(args map[string]any) string {
		t.Helper()
		_, res := w.request(t, "tools/call", map[string]any{"name": "task_send", "arguments": args, "task": map[string]any{"ttl": 60000}})
		id, status := taskOf(t, res)
		if status != "working" {
			t.Fatalf("a new task is %q", status)
		}
		return id
	}
	result := func(id string) map[string]any {
		t.Helper()
		_, res := w.request(t, "tasks/result", map[string]any{"taskId": id})
		return res
	}

	// Allowed: the upstream's task runs and pays once; the result is its.
	id := startTask(map[string]any{"to": sellerF, "amount": "0.30", "ms": 300})
	if _, got := w.request(t, "tasks/get", map[string]any{"taskId": id}); got["taskId"] != id {
		t.Fatalf("tasks/get: %v", got)
	}
	res := result(id)
	if res["isError"] == true || !strings.Contains(fmt.Sprint(res["content"]), "paid by task_send") {
		t.Fatalf("allowed task: %v; stderr %s", res, e.stderr)
	}
	if paid := e.paid(t); len(paid) != 1 || paid[0]["tool"] != "task_send" {
		t.Fatalf("the upstream carried out %v, want task_send once", paid)
	}
	if r := lastRule(); r != "upstream_executed" {
		t.Fatalf("outcome of the allowed task: %q", r)
	}
	if _, got := w.request(t, "tasks/get", map[string]any{"taskId": id}); got["status"] != "completed" {
		t.Fatalf("the finished task: %v", got)
	}

	// Blocked and review: the proxy's task ends with the decision, and
	// the upstream never has a task to run.
	for _, c := range []struct{ to, amount, want string }{{sellerDenied, "0.10", "block"}, {sellerF, "150", "review"}} {
		res := result(startTask(map[string]any{"to": c.to, "amount": c.amount}))
		if d := decisionIn(t, res); res["isError"] != true || d.Decision != c.want {
			t.Fatalf("%s task: %v", c.want, res)
		}
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("the upstream carried out %d calls after block and review, want 1", n)
	}

	// The upstream's task fails: a tool error, released because the map
	// says task_send's errors mean "unpaid".
	res = result(startTask(map[string]any{"to": sellerF, "amount": "0.40", "fail": true}))
	if res["isError"] != true || !strings.Contains(fmt.Sprint(res["content"]), "the wallet is locked") {
		t.Fatalf("failed task: %v", res)
	}
	if r := lastRule(); r != "upstream_tool_error" {
		t.Fatalf("outcome of the failed task: %q", r)
	}
	data, err := os.ReadFile(filepath.Join(filepath.Dir(logPath), "ledger.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(data, []byte(`"kind":"release"`)); n != 1 {
		t.Fatalf("%d releases in the spend ledger after the failed task, want 1", n)
	}

	// Cancelled by the host: the upstream's task is cancelled too, pays
	// nothing, and the outcome is unknown, so its reservation is kept.
	id = startTask(map[string]any{"to": sellerF, "amount": "0.20", "ms": 5000})
	time.Sleep(500 * time.Millisecond)
	if _, got := w.request(t, "tasks/cancel", map[string]any{"taskId": id}); got["status"] != "cancelled" {
		t.Fatalf("tasks/cancel: %v", got)
	}
	deadline := time.Now().Add(20 * time.Second)
	for lastRule() != "upstream_lost" {
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled task's outcome is %q, want upstream_lost; stderr %s", lastRule(), e.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(5 * time.Second) // past the upstream task's own 5 s
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("the cancelled upstream task paid: %v", e.paid(t))
	}
	// Held: 0.30 executed, 0.20 cancelled (kept); the failed 0.40 released.
	// 0.60 more passes 1.00; 0.50 fits.
	if d := decisionIn(t, callWire(t, w, "send_usdc", map[string]any{"to": sellerF, "amount": "0.60"})); d.Decision != "review" || !d.has("per_counterparty_limit") {
		t.Fatalf("after the cancelled task: %+v", d)
	}
	if res := callWire(t, w, "send_usdc", map[string]any{"to": sellerF, "amount": "0.50"}); res["isError"] == true {
		t.Fatalf("0.50 fits beside 0.30 and the cancelled 0.20: %v", res)
	}

	// tasks/list is the proxy's: the five tasks of this client.
	_, list := w.request(t, "tasks/list", map[string]any{})
	if tasks, _ := list["tasks"].([]any); len(tasks) != 5 {
		t.Fatalf("tasks/list: %v", list)
	}
}

func callWire(t *testing.T, w *wireClient, name string, args map[string]any) map[string]any {
	t.Helper()
	_, res := w.request(t, "tools/call", map[string]any{"name": name, "arguments": args})
	return res
}

// everythingTasks runs server-everything's task tool (taskSupport
// "required", an unmapped tool) as a task, directly and through the proxy,
// read on the wire: the proxy declares task-augmented calls, lists the
// tool's task support, and its task's result is the upstream's, with the
// upstream's elicitation (asked through tasks/result, status
// input_required) put to the host whose task it is.
func everythingTasks(t *testing.T, direct, proxied *wireClient) {
	elicited := map[*wireClient]int{}
	for _, w := range []*wireClient{direct, proxied} {
		w.answer = func(method string, _ map[string]any) any {
			if method == "elicitation/create" {
				elicited[w]++
				return map[string]any{"action": "accept", "content": map[string]any{"interpretation": "the host's reading"}}
			}
			return map[string]any{}
		}
	}
	run := func(w *wireClient) (map[string]any, []map[string]any) {
		t.Helper()
		init := w.initialize(t, map[string]any{"elicitation": map[string]any{}})
		if !strings.Contains(string(mustJSON(init["capabilities"])), `"tasks"`) {
			t.Fatalf("no tasks capability: %v", init["capabilities"])
		}
		_, lt := w.request(t, "tools/list", map[string]any{})
		var tool map[string]any
		for _, x := range lt["tools"].([]any) {
			if m := x.(map[string]any); m["name"] == "simulate-research-query" {
				tool = m
			}
		}
		if fmt.Sprint(tool["execution"]) != fmt.Sprint(map[string]any{"taskSupport": "required"}) {
			t.Fatalf("simulate-research-query's execution: %v", tool)
		}
		_, res := w.request(t, "tools/call", map[string]any{"name": "simulate-research-query",
			"arguments": map[string]any{"topic": "guarded payments", "ambiguous": true}, "task": map[string]any{"ttl": 120000}})
		id, status := taskOf(t, res)
		if status != "working" {
			t.Fatalf("new task: %v", res)
		}
		before, out := w.request(t, "tasks/result", map[string]any{"taskId": id})
		_, got := w.request(t, "tasks/get", map[string]any{"taskId": id})
		if got["status"] != "completed" {
			t.Fatalf("the task after its result: %v", got)
		}
		return out, before
	}
	d, _ := run(direct)
	p, _ := run(proxied)
	if !strings.Contains(fmt.Sprint(d["content"]), "the host's reading") {
		t.Fatalf("direct: the research report does not carry the host's answer: %v", d["content"])
	}
	if a, b := mustJSON(d["content"]), mustJSON(p["content"]); !bytes.Equal(a, b) {
		t.Errorf("task result: direct %s\nproxied %s", a, b)
	}
	if elicited[direct] != 1 || elicited[proxied] != 1 {
		t.Errorf("elicitations: direct %d, proxied %d, want one each", elicited[direct], elicited[proxied])
	}
	// The task list is the proxy's own: this client's one task.
	_, list := proxied.request(t, "tasks/list", map[string]any{})
	if tasks, _ := list["tasks"].([]any); len(tasks) != 1 {
		t.Errorf("tasks/list through the proxy: %v", list)
	}
}
