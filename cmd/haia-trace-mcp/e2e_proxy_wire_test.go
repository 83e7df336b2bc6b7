package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// wireClient speaks JSON-RPC lines to a process over stdio and keeps what
// the process writes in the order it wrote it — what an SDK client's
// callbacks cannot show, since they run on goroutines of their own.
type wireClient struct {
	in   io.WriteCloser
	msgs chan map[string]any
	// answer, when set, answers a request the process sends (sampling,
	// elicitation, roots) with a result; nil answers nothing.
	answer func(method string, params map[string]any) any
	ids    int
	// stderr is the process's, for failures.
	stderr io.Writer
	// exited is closed once the process's output has ended and the
	// process has been waited for; exit then says how it ended.
	exited chan struct{}
	exit   string
}

func startWire(t *testing.T, cmd *exec.Cmd) *wireClient {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &wireClient{in: in, msgs: make(chan map[string]any, 1024), stderr: cmd.Stderr, exited: make(chan struct{})}
	go func() {
		// Wait only after the last read (it closes the pipe), and before
		// msgs closes, so a reader that sees the end can say how it came.
		defer close(w.msgs)
		defer func() {
			if err := cmd.Wait(); err != nil {
				w.exit = err.Error()
			} else {
				w.exit = "exit status 0"
			}
			close(w.exited)
		}()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = map[string]any{"unparsed": sc.Text()}
			}
			w.msgs <- m
		}
	}()
	t.Cleanup(func() {
		in.Close()
		// What the test left unread must not hold the reader up.
		go func() {
			for range w.msgs {
			}
		}()
		select {
		case <-w.exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-w.exited
		}
	})
	return w
}

// ended says how the process ended once its output has closed: its exit
// status or the signal that ended it.
func (w *wireClient) ended() string {
	<-w.exited
	return w.exit
}

func (w *wireClient) send(t *testing.T, msg any) {
	t.Helper()
	b, err := json.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.in.Write(append(b, '\n')); err != nil {
		t.Fatalf("write to the process: %v; its stderr:\n%v", err, w.stderr)
	}
}

// initialize runs the handshake, declaring the given client capabilities.
func (w *wireClient) initialize(t *testing.T, caps map[string]any) map[string]any {
	t.Helper()
	if caps == nil {
		caps = map[string]any{}
	}
	_, res := w.request(t, "initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": caps,
		"clientInfo": map[string]any{"name": "e2e-wire", "version": "1"}})
	w.send(t, map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	return res
}

// request sends one request and returns, in order, every notification
// the process wrote before the response, and the response's result (a
// JSON-RPC error fails the test).
func (w *wireClient) request(t *testing.T, method string, params any) ([]map[string]any, map[string]any) {
	t.Helper()
	before, resp := w.requestRaw(t, method, params)
	if e, ok := resp["error"]; ok {
		t.Fatalf("%s: error %v", method, e)
	}
	res, _ := resp["result"].(map[string]any)
	return before, res
}

// requestRaw is request returning the whole response.
func (w *wireClient) requestRaw(t *testing.T, method string, params any) ([]map[string]any, map[string]any) {
	t.Helper()
	w.ids++
	id := float64(w.ids)
	w.send(t, map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	var before []map[string]any
	timeout := time.After(time.Minute)
	for {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				t.Fatalf("%s: the process closed its output (%s); its stderr:\n%v", method, w.ended(), w.stderr)
			}
			if m["id"] == id && m["method"] == nil {
				return before, m
			}
			if meth, _ := m["method"].(string); meth != "" && m["id"] != nil {
				// A request of the process: answer it.
				var result any = map[string]any{}
				if w.answer != nil {
					p, _ := m["params"].(map[string]any)
					result = w.answer(meth, p)
				}
				w.send(t, map[string]any{"jsonrpc": "2.0", "id": m["id"], "result": result})
				before = append(before, m)
				continue
			}
			before = append(before, m)
		case <-timeout:
			t.Fatalf("%s: no response in a minute", method)
		}
	}
}

// waitFor reads what the process writes (answering its requests) until a
// notification of method comes, and returns it.
func (w *wireClient) waitFor(t *testing.T, method string, within time.Duration) map[string]any {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				t.Fatalf("waiting for %s: the process closed its output (%s); its stderr:\n%v", method, w.ended(), w.stderr)
			}
			if meth, _ := m["method"].(string); meth != "" && m["id"] != nil {
				var result any = map[string]any{}
				if w.answer != nil {
					p, _ := m["params"].(map[string]any)
					result = w.answer(meth, p)
				}
				w.send(t, map[string]any{"jsonrpc": "2.0", "id": m["id"], "result": result})
				continue
			}
			if m["method"] == method {
				return m
			}
		case <-timeout:
			t.Fatalf("no %s within %s", method, within)
		}
	}
}

// notificationsOf keeps those of one method.
func notificationsOf(ms []map[string]any, method string) []map[string]any {
	var out []map[string]any
	for _, m := range ms {
		if m["method"] == method && m["id"] == nil {
			out = append(out, m)
		}
	}
	return out
}

var paidSlowlyRE = regexp.MustCompile(`paid slowly after (\d+) progress notifications`)

// Every notification the upstream sends before a result reaches the caller
// before that result: the progress of a paying call (forwarded after the
// guard's decision) and of an unmapped one, and a log message, each
// checked on the wire, many times over.
func TestProxyNotificationsPrecedeTheResult(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, "")
	payUpstream(t)
	w := startWire(t, e.command(nil))
	w.initialize(t, nil)
	for i := range 12 {
		// A paying call (slow_send, allowed and forwarded) and an unmapped
		// one that logs before it answers (echo), in turn.
		tool, args := "slow_send", map[string]any{"to": sellerA, "amount": fmt.Sprintf("0.0%d", 1+i%9), "ms": 150 + 10*i}
		if i%2 == 1 {
			tool, args = "echo", map[string]any{"text": "x" + strconv.Itoa(i)}
		}
		token := "tok-" + strconv.Itoa(i)
		before, res := w.request(t, "tools/call", map[string]any{"name": tool, "arguments": args, "_meta": map[string]any{"progressToken": token}})
		text := fmt.Sprint(res["content"])
		if res["isError"] == true {
			t.Fatalf("call %d (%s): %s; stderr %s", i, tool, text, e.stderr)
		}
		switch tool {
		case "slow_send":
			m := paidSlowlyRE.FindStringSubmatch(text)
			if m == nil {
				t.Fatalf("call %d: %s", i, text)
			}
			sent, _ := strconv.Atoi(m[1])
			got := notificationsOf(before, "notifications/progress")
			if sent < 2 || len(got) != sent {
				t.Fatalf("call %d: the upstream sent %d progress notifications before its result; %d reached the caller before the result", i, sent, len(got))
			}
			for j, n := range got {
				p, _ := n["params"].(map[string]any)
				if p["progressToken"] != token || p["progress"] != float64(j+1) {
					t.Fatalf("call %d: progress %d out of order or with another token: %v", i, j, p)
				}
			}
		case "echo":
			logs := notificationsOf(before, "notifications/message")
			if len(logs) != 1 || !strings.Contains(fmt.Sprint(logs[0]["params"]), "echoed") {
				t.Fatalf("call %d: the log message the upstream sent before its result did not precede it: %v", i, before)
			}
		}
	}
}
