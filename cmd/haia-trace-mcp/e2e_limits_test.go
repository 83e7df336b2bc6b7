package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// limitsPolicyFile is a guard config with every limit of issue 17 and a
// tighter policy of its own for the caller "agent-small".
const limitsPolicyFile = `{
  "reviewAbove": "1000",
  "perCounterpartyLimit": {"amount": "10000"},
  "totalLimit": {"amount": "10", "windowHours": 24},
  "velocity": {"perCounterparty": {"count": 5, "windowMinutes": 60}},
  "duplicatePayment": {"windowMinutes": 120},
  "agents": {"agent-small": {"totalLimit": {"amount": "3.5"}, "velocity": {"perCounterparty": {"count": 2}}}}
}`

// limitsRoot holds three settled payments of 1 USDC made half an hour ago:
// two to sellerA (for /report and /other), one to sellerB.
func limitsRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), ".trace")
	rec, err := simrec.New(root, "run-1", time.Now().Add(-30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.PayAll([]simrec.Payment{
		{OperationID: "op-1", URL: "https://api.s1.example/report?week=30", PayTo: sellerA, Amount: "1000000", Outcome: "settled"},
		{OperationID: "op-2", URL: "https://api.s1.example/other", PayTo: sellerA, Amount: "1000000", Outcome: "settled"},
		{OperationID: "op-3", URL: "https://b.example.net/data", PayTo: sellerB, Amount: "1000000", Outcome: "settled"},
	}); err != nil {
		t.Fatal(err)
	}
	return root
}

// Each limit, and each agent's own policy, over stdio and over HTTP through
// the real binary. Over stdio the caller is --agent-id, over HTTP the token's
// subject: two agents with different subjects get their own limits.
func TestLimitsEndToEnd(t *testing.T) {
	root := limitsRoot(t)
	cfgDir := t.TempDir()
	cfg := filepath.Join(cfgDir, "haia-guard.config.json")
	if err := os.WriteFile(cfg, []byte(limitsPolicyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	const sellerC = "0xC0C0000000000000000000000000000000000003"
	type check struct {
		args     map[string]any
		decision string
		rule     string // a rule the answer must carry ("" for allow)
		evidence string // an operation the rule's evidence must name
	}
	small := []check{
		{map[string]any{"counterparty": sellerC, "amount": "0.5"}, "allow", "", ""},                      // 3 + 0.5 is exactly 3.5
		{map[string]any{"counterparty": sellerC, "amount": "0.500001"}, "review", "total_limit", "op-3"}, // one atomic unit over
		{map[string]any{"counterparty": sellerA, "amount": "0.01"}, "review", "velocity_limit", "op-2"},  // the third payment to sellerA
	}
	big := []check{
		{map[string]any{"counterparty": sellerC, "amount": "7"}, "allow", "", ""},
		{map[string]any{"counterparty": sellerC, "amount": "7.000001"}, "review", "total_limit", "op-1"},
		{map[string]any{"counterparty": sellerA, "amount": "0.01"}, "allow", "", ""},
		{map[string]any{"counterparty": sellerC, "amount": "0.02", "resource": "https://API.s1.example:443/./report?week=30#top"}, "review", "duplicate_payment", "op-1"},
		{map[string]any{"counterparty": sellerC, "amount": "0.02", "resource": "https://api.s1.example/report?week=31"}, "allow", "", ""},
	}
	run := func(t *testing.T, cs *mcp.ClientSession, checks []check, policy string) {
		t.Helper()
		for _, c := range checks {
			// Each question is asked as a dry run: an allow would reserve
			// its payment, and the next question would count it.
			args := map[string]any{"dry_run": true}
			for k, v := range c.args {
				args[k] = v
			}
			var a checkAnswer
			decodeStructured(t, callTool(t, cs, "check_before_pay", args), &a)
			hist := a.Reasons[len(a.Reasons)-1]
			if a.Decision != c.decision || (c.rule != "" && !hasRule(a, c.rule)) || !strings.HasSuffix(hist.Detail, "policy: "+policy) {
				t.Errorf("%v: %s, want %s with rule %q under %q; reasons %+v", c.args, a.Decision, c.decision, c.rule, policy, a.Reasons)
				continue
			}
			if c.decision == "allow" && (len(a.Reasons) != 2 || a.Reasons[0].Rule != "dry_run") {
				t.Errorf("%v: allowed with reasons %+v", c.args, a.Reasons)
			}
			for _, r := range a.Reasons {
				if r.Rule != c.rule || c.evidence == "" {
					continue
				}
				found := false
				for _, e := range r.Evidence {
					found = found || (e.RunID == "run-1" && e.OperationID == c.evidence)
				}
				if !found {
					t.Errorf("%v: %s evidence %+v, want run-1/%s", c.args, r.Rule, r.Evidence, c.evidence)
				}
			}
		}
		// Without a resource the duplicate rule cannot apply, and says so.
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerC, "amount": "0.03", "dry_run": true}), &a)
		if !strings.Contains(a.Reasons[len(a.Reasons)-1].Detail, "names no resource, so duplicate_payment could not apply") {
			t.Errorf("the history line must say the duplicate rule could not apply: %+v", a.Reasons)
		}
		res := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerC, "amount": "0.03", "resource": "ftp://api.s1.example/report"})
		if !res.IsError || !strings.Contains(resultText(res), "resource") || strings.Contains(resultText(res), "guard.") {
			t.Errorf("a resource that is no http(s) URL: %v %q, want a tool error naming resource", res.IsError, resultText(res))
		}
	}
	key := filepath.Join(t.TempDir(), "signing.pem")

	t.Run("stdio", func(t *testing.T) {
		run(t, mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--agent-id", "agent-small"), small, "defaults + file + agent agent-small")
		run(t, mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--agent-id", "agent-big"), big, "defaults + file")
	})

	t.Run("http", func(t *testing.T) {
		dir := t.TempDir()
		secret := []byte(strings.Repeat("s", 48))
		secretFile := filepath.Join(dir, "secret")
		if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
			t.Fatal(err)
		}
		p := startHTTPBinary(t, "--dir", root, "--key-file", key, "--guard-config", cfg,
			"--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile)
		session := func(sub string) *mcp.ClientSession {
			tok := signHS256(t, secret, map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": sub,
				"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
			cs, err := httpSession(t, p.resource, func() string { return tok })
			if err != nil {
				t.Fatalf("connect as %s: %v\n%s", sub, err, p.logs())
			}
			t.Cleanup(func() { cs.Close() })
			return cs
		}
		run(t, session("agent-small"), small, "defaults + file + agent agent-small")
		run(t, session("agent-big"), big, "defaults + file")
	})
}
