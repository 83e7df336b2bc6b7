package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// tenantsRoot writes a --tenants-dir with one recorded run per tenant.
func tenantsRoot(t *testing.T, names ...string) string {
	t.Helper()
	tenants := filepath.Join(t.TempDir(), "tenants")
	for _, name := range names {
		rec, err := simrec.New(filepath.Join(tenants, name), "run-"+name, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: "op-" + name, URL: "https://" + name + ".example/x", PayTo: sellerA, Amount: "100000", Outcome: "settled"}); err != nil {
			t.Fatal(err)
		}
	}
	return tenants
}

// TestCallersKeptApartEndToEnd runs the real binary with two tenants and a
// tight rate limit: the same subject in two tenants has two buckets, so a
// caller of one tenant cannot exhaust a caller of another; and a token whose
// sub holds a control character is refused with a challenge saying why.
func TestCallersKeptApartEndToEnd(t *testing.T) {
	tenants := tenantsRoot(t, "acme", "globex")
	dir := t.TempDir()
	secret := []byte(strings.Repeat("r", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	const issuer = "http://127.0.0.1/local-as"
	p := startHTTPBinary(t, "--tenants-dir", tenants, "--tenant-claim", "org",
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", issuer, "--auth-hmac-secret", secretFile,
		"--rate-limit", "0.01", "--rate-burst", "3")
	token := func(sub, org string) string {
		return signHS256(t, secret, map[string]any{"iss": issuer, "aud": p.resource, "sub": sub, "org": org,
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	}
	attacker := token("bot", "globex")
	for i, want := range []int{200, 200, 200, 429, 429} {
		if status, _ := rawInitialize(t, p.resource, attacker); status != want {
			t.Fatalf("globex's bot, request %d: %d, want %d\n%s", i, status, want, p.logs())
		}
	}
	victim := token("bot", "acme")
	for i := range 3 {
		if status, _ := rawInitialize(t, p.resource, victim); status != 200 {
			t.Fatalf("acme's bot, request %d, while globex's bot is limited: %d, want 200 — buckets are shared across tenants", i, status)
		}
	}

	for _, sub := range []string{"bot\x00admin", "bot\nlevel=ERROR", "bot\u0085", "bot\x7f", "\x1b[31mbot"} {
		status, challenge := rawInitialize(t, p.resource, token(sub, "acme"))
		if status != 401 || !strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, "token subject holds control characters") {
			t.Errorf("sub %q: %d %q, want 401 saying the subject holds control characters", sub, status, challenge)
		}
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d\n%s", code, p.logs())
	}
}

// TestRateBurstFollowsRate: --rate-limit 5 alone lets about five requests
// through at once, not a fixed burst of 100.
func TestRateBurstFollowsRate(t *testing.T) {
	root := sampleRoot(t)
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"),
		"--http-insecure-no-auth", "--rate-limit", "5")
	served, limited := 0, 0
	start := time.Now()
	for range 30 {
		switch status, _ := rawInitialize(t, p.resource, ""); status {
		case 200:
			served++
		case 429:
			limited++
		default:
			t.Fatalf("status %d", status)
		}
	}
	// Five at once, plus at most what 5/s refills while the loop ran.
	most := 5 + int(time.Since(start).Seconds()*5) + 1
	if served < 5 || served > most || limited == 0 {
		t.Fatalf("--rate-limit 5 alone: %d served, %d refused in %s; want 5 at once (at most %d with the refill)", served, limited, time.Since(start), most)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d\n%s", code, p.logs())
	}
}

// TestNotifyHookEnvironmentEndToEnd: the real server, its store on
// PostgreSQL through HAIA_STORE (the DSN with the database password), runs
// --notify-command for an opened review; the hook's environment holds its
// own variables, PATH and the one variable named with --notify-env — not
// HAIA_STORE, not any other variable of the server.
func TestNotifyHookEnvironmentEndToEnd(t *testing.T) {
	dsn := e2eDatabase(t)
	root := loopRoot(t)
	dir := t.TempDir()
	seen := filepath.Join(dir, "hook-env")
	script := filepath.Join(dir, "notify.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat /proc/$$/environ > "+seen+".tmp && mv "+seen+".tmp "+seen+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"), "--agent-id", "hook-agent",
		"--notify-command", script, "--notify-env", "PAGER_TOKEN")
	cmd.Env = append(os.Environ(), "HAIA_STORE="+dsn, "CLOUD_SECRET=cloud-secret-value", "PAGER_TOKEN=pager-value")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-hook", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	defer cs.Close()
	var a checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &a)
	if a.Decision != "review" || a.ReviewID == "" {
		t.Fatalf("the question opened no review: %+v", a)
	}
	var data []byte
	waitFor(t, "the hook to run", func() bool {
		data, err = os.ReadFile(seen)
		return err == nil
	})
	env := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
	slices.Sort(env)
	want := []string{"HAIA_NOTIFY_EVENT=review.opened", "HAIA_REVIEW_ID=" + a.ReviewID, "PAGER_TOKEN=pager-value", "PATH=" + os.Getenv("PATH")}
	if !slices.Equal(env, want) {
		t.Fatalf("the hook's environment\n got %q\nwant %q", env, want)
	}
	for _, secret := range []string{dsn, "cloud-secret-value", "HAIA_STORE"} {
		if strings.Contains(string(data), secret) {
			t.Fatalf("the hook saw %q", secret)
		}
	}
	// The server did run on the database the hook never saw.
	if out, errOut, code := runCLI(t, "review", "list", "--dir", root, "--store", dsn, "--json"); code != 0 || !strings.Contains(out, a.ReviewID) {
		t.Fatalf("review list on the database: %d %s %s", code, out, errOut)
	}
}

// TestPolicyLayersEndToEnd: the real server with tenants over HTTP, a caller
// with an entry under agents (and another under its tenant's agents) keeps
// its tenant's denylist and every key its own layers do not name; another
// tenant's caller of the same name gets none of that tenant's layers; the
// history line names every layer applied.
func TestPolicyLayersEndToEnd(t *testing.T) {
	tenants := tenantsRoot(t, "acme", "globex")
	dir := t.TempDir()
	secret := []byte(strings.Repeat("p", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policy, []byte(`{
	  "denylist": ["evil.example"],
	  "agents": {"agent-1": {"reviewAbove": "10.00", "perCounterpartyLimit": {"amount": "100"}}},
	  "tenants": {"acme": {"denylist": ["`+sellerB+`"], "reviewAbove": "0.05", "totalLimit": {"amount": "0.15"},
	                       "agents": {"agent-1": {"velocity": {"total": {"count": 50}}}}}}
	}`), 0o644); err != nil {
		t.Fatal(err)
	}
	const issuer = "http://127.0.0.1/local-as"
	p := startHTTPBinary(t, "--tenants-dir", tenants, "--tenant-claim", "org", "--guard-config", policy,
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", issuer, "--auth-hmac-secret", secretFile)
	ask := func(sub, org, counterparty, amount string) checkAnswer {
		t.Helper()
		tok := signHS256(t, secret, map[string]any{"iss": issuer, "aud": p.resource, "sub": sub, "org": org,
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
		cs, err := httpSession(t, p.resource, func() string { return tok })
		if err != nil {
			t.Fatalf("connect as %s in %s: %v\n%s", sub, org, err, p.logs())
		}
		defer cs.Close()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": counterparty, "amount": amount, "dry_run": true}), &a)
		return a
	}
	const (
		all      = "defaults + file + tenant acme + agent agent-1 + tenant acme agent agent-1"
		tenant   = "defaults + file + tenant acme"
		agentTop = "defaults + file + agent agent-1"
	)
	for _, c := range []struct {
		name, sub, org, counterparty, amount string
		decision, rule, layers               string
	}{
		{"the agent keeps its tenant's denylist", "agent-1", "acme", sellerB, "0.01", "block", "denylist", all},
		{"and the file's", "agent-1", "acme", "https://evil.example/pay", "0.01", "block", "denylist", all},
		{"and its tenant's totalLimit, which no layer of its own names", "agent-1", "acme", sellerA, "0.10", "review", "total_limit", all},
		{"its own reviewAbove replaces its tenant's", "agent-1", "acme", sellerA, "0.04", "allow", "", all},
		{"another caller of the tenant gets the tenant's layer alone", "agent-2", "acme", sellerA, "0.04", "allow", "", tenant},
		{"and the tenant's reviewAbove", "agent-2", "acme", sellerA, "0.06", "review", "review_above", tenant},
		{"agent-1 of another tenant: none of acme's layers", "agent-1", "globex", sellerB, "0.50", "allow", "", agentTop},
		{"but the file's denylist", "agent-1", "globex", "evil.example", "0.01", "block", "denylist", agentTop},
	} {
		a := ask(c.sub, c.org, c.counterparty, c.amount)
		hist := a.Reasons[len(a.Reasons)-1]
		if a.Decision != c.decision || (c.rule != "" && !hasRule(a, c.rule)) || !strings.HasSuffix(hist.Detail, "; policy: "+c.layers) {
			t.Errorf("%s: %s %+v; want %s by %q under %q", c.name, a.Decision, a.Reasons, c.decision, c.rule, c.layers)
		}
	}
}

// TestAmountAsJSONNumberEndToEnd: the official SDK client sends the amount
// as a JSON number (as the MCP Inspector's CLI does); the real server reads
// it exactly — 1.0000000000000001 is not 1.
func TestAmountAsJSONNumberEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"))
	for _, c := range []struct {
		amount   json.Number
		decision string
		detail   string
	}{
		{"0.30", "allow", ""},
		{"1.0000000000000001", "review", "16 decimal places"},
	} {
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": "api.numbers.example", "pay_to": "0x0b0b000000000000000000000000000000000009", "amount": c.amount}), &a)
		if a.Decision != c.decision || (c.detail != "" && !strings.Contains(fmt.Sprint(a.Reasons), c.detail)) {
			t.Errorf("amount %s: %s %+v; want %s mentioning %q", c.amount, a.Decision, a.Reasons, c.decision, c.detail)
		}
	}
}

func listedTools(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

// TestToolsListedByScopeEndToEnd: over HTTP a token sees in tools/list only
// the tools its scopes let it call; the one it lacks a scope for is neither
// listed nor callable.
func TestToolsListedByScopeEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("s", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	const issuer = "http://127.0.0.1/local-as"
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", issuer, "--auth-hmac-secret", secretFile, "--auth-scope", "trace:read",
		"--auth-tool-scope", "check_before_pay=trace:pay", "--auth-tool-scope", "get_review_status=trace:review")
	session := func(scope string) *mcp.ClientSession {
		tok := signHS256(t, secret, map[string]any{"iss": issuer, "aud": p.resource, "sub": "agent-s", "scope": scope,
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
		cs, err := httpSession(t, p.resource, func() string { return tok })
		if err != nil {
			t.Fatalf("connect with %q: %v\n%s", scope, err, p.logs())
		}
		return cs
	}
	for _, c := range []struct {
		scope string
		want  []string
	}{
		{"trace:read", []string{"explain", "get_receipt", "list_operations"}},
		{"trace:read trace:pay", []string{"check_before_pay", "explain", "get_receipt", "list_operations"}},
		{"trace:read trace:review", []string{"explain", "get_receipt", "get_review_status", "list_operations"}},
		{"trace:read trace:pay trace:review", []string{"check_before_pay", "explain", "get_receipt", "get_review_status", "list_operations"}},
	} {
		if got := listedTools(t, session(c.scope)); !slices.Equal(got, c.want) {
			t.Errorf("scope %q lists %v, want %v", c.scope, got, c.want)
		}
	}
	// The unlisted tool is still refused if called by name (403 insufficient_scope).
	tok := signHS256(t, secret, map[string]any{"iss": issuer, "aud": p.resource, "sub": "agent-s", "scope": "trace:read",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	req, _ := http.NewRequest(http.MethodPost, p.resource, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"check_before_pay","arguments":{"counterparty":"a.example","amount":"0.01"}}}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("calling the unlisted tool: %d, want 403", resp.StatusCode)
	}
}

// TestReadOnlyEndToEnd: --read-only serves the read tools alone, opens no
// guard (no key is created, nothing is written under the root), and refuses
// the guard's flags, which would do nothing.
func TestReadOnlyEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	cfg := t.TempDir()
	var stderr strings.Builder
	cmd := exec.Command(binPath, "--dir", root, "--read-only")
	cmd.Env = append(os.Environ(), "HAIA_CONFIG_DIR="+cfg, "XDG_CONFIG_HOME="+cfg)
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-ro", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	if got, want := listedTools(t, cs), []string{"explain", "get_receipt", "list_operations"}; !slices.Equal(got, want) {
		t.Fatalf("--read-only lists %v, want %v", got, want)
	}
	callTool(t, cs, "list_operations", nil)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": "a.example", "amount": "0.01"}})
	if err == nil && !res.IsError {
		t.Fatalf("check_before_pay answered under --read-only: %+v", res)
	}
	cs.Close()
	if _, err := os.Stat(filepath.Join(root, "guard")); !os.IsNotExist(err) {
		t.Errorf("--read-only wrote guard/ under the root: %v", err)
	}
	if entries, _ := os.ReadDir(cfg); len(entries) != 0 {
		t.Errorf("--read-only created configuration files (a key?): %v", entries)
	}
	for _, extra := range [][]string{{"--guard-config", "x.json"}, {"--notify-command", "/bin/true"}, {"--key-file", "k.pem"}} {
		_, errOut, code := runCLI(t, append([]string{"--dir", root, "--read-only"}, extra...)...)
		if code != exitUsage || !strings.Contains(errOut, extra[0]) || !strings.Contains(errOut, "--read-only") {
			t.Errorf("--read-only %v: exit %d, %q; want a usage error naming both", extra, code, errOut)
		}
	}
}
