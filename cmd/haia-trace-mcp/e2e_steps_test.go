package main

import (
	"bufio"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stepLines are the JSON log lines of stderr whose msg is msg.
func stepLines(t *testing.T, stderr, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stderr))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
			out = append(out, line)
		}
	}
	return out
}

// checkSteps: the line has each step's time, none longer than the total,
// and together no longer than it.
func checkSteps(t *testing.T, line map[string]any, steps ...string) {
	t.Helper()
	total, ok := line["total"].(float64)
	if !ok || total <= 0 {
		t.Fatalf("no total in %v", line)
	}
	var sum float64
	for _, s := range steps {
		d, ok := line[s].(float64)
		if !ok || d < 0 {
			t.Fatalf("step %s missing or negative in %v", s, line)
		}
		sum += d
	}
	if sum > total {
		t.Fatalf("the steps (%v ns) are longer than the whole (%v ns): %v", sum, total, line)
	}
}

// At --log-level debug, a server logs where each authorize_payment's time
// went (docs/performance.md); at info level it logs none of it.
func TestStdioAuthorizePaymentLogsItsSteps(t *testing.T) {
	payerKey := writeSecret(t, "payer.key", e2ePayerKey)
	for _, tc := range []struct {
		level string
		want  bool
	}{{"debug", true}, {"info", false}} {
		t.Run(tc.level, func(t *testing.T) {
			stderr := &lockedBuffer{}
			cs := mcpSession(t, stderr, "--dir", sampleRoot(t), "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--payer-key", payerKey, "--log-level", tc.level)
			var a authorizeAnswer
			decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{"payment_required": e2ePaymentRequiredAt("https://steps.example/data", "10000", e2eSeller)}), &a)
			if a.Decision != "allow" {
				t.Fatalf("want an allow: %+v", a)
			}
			cs.Close()
			lines := stepLines(t, stderr.String(), "authorize_payment steps")
			if !tc.want {
				if len(lines) != 0 {
					t.Fatalf("steps logged at %s: %v", tc.level, lines)
				}
				return
			}
			if len(lines) != 1 || lines[0]["decision"] != "allow" || lines[0]["failed"] != false {
				t.Fatalf("want one step line of the allow: %v\n%s", lines, stderr)
			}
			// The authorization is signed and recorded inside decide, in
			// the section that allowed it; signer is the signing's share.
			checkSteps(t, lines[0], "settle_trace", "read_402", "decide")
			if d, ok := lines[0]["signer"].(float64); !ok || d <= 0 || d > lines[0]["decide"].(float64) {
				t.Fatalf("the signer's time is not within decide: %v", lines[0])
			}
		})
	}
}

// At --log-level debug, the proxy logs where each forwarded paying call's
// time went.
func TestProxyPayingCallLogsItsSteps(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, `{"reviewAbove": "1000000"}`)
	payUpstream(t)
	cmd := e.command(nil, "--log-level", "debug")
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-steps", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to the proxy: %v (%s)", err, e.stderr)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "send_usdc", Arguments: json.RawMessage(`{"to":"` + sellerA + `","amount":"0.01"}`)})
	if err != nil || res.IsError {
		t.Fatalf("send_usdc: %v %v (%s)", err, res, e.stderr)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: json.RawMessage(`{"text":"x"}`)}); err != nil {
		t.Fatal(err)
	}
	cs.Close()
	lines := stepLines(t, e.stderr.String(), "paying call steps")
	if len(lines) != 1 || lines[0]["tool"] != "send_usdc" || lines[0]["outcome"] != "upstream_executed" {
		t.Fatalf("want one step line, of send_usdc: %v\n%s", lines, e.stderr)
	}
	checkSteps(t, lines[0], "read", "decide", "forward", "record_outcome")
}
