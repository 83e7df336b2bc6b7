package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Two tenants over one server: each sees only its own runs, reviews and
// chain; the other's ids answer as if they did not exist; a token that
// names no tenant, or another one, is refused.
func TestTenantsAreIsolated(t *testing.T) {
	tenants := tenantRoots(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("t", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"tenants": {"acme": {"reviewAbove": "0.05"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startHTTPBinary(t, "--tenants-dir", tenants, "--tenant-claim", "org", "--guard-config", policy,
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile)
	token := func(claims map[string]any) string {
		c := map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": "agent-1", "exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()}
		for k, v := range claims {
			c[k] = v
		}
		return signHS256(t, secret, c)
	}
	acme, globex := tenantCaller(t, p, secret, "acme"), tenantCaller(t, p, secret, "globex")

	_, text, _ := acme("list_operations", map[string]any{})
	if !strings.Contains(text, "op-acme") || strings.Contains(text, "op-globex") {
		t.Fatalf("acme's listing: %s", text)
	}
	if isErr, text, _ := acme("get_receipt", map[string]any{"run_id": "run-globex", "operation_id": "op-globex"}); !isErr || !strings.Contains(text, "no run") {
		t.Errorf("acme reading globex's run: %v %s", isErr, text)
	}
	// globex's review, asked about from acme, does not exist there.
	_, _, ans := globex("check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"})
	id, _ := ans["review_id"].(string)
	if id == "" {
		t.Fatalf("globex's question opened no review: %v", ans)
	}
	if isErr, text, _ := acme("get_review_status", map[string]any{"review_id": id}); !isErr || !strings.Contains(text, "no review") {
		t.Errorf("acme reading globex's review: %v %s", isErr, text)
	}
	if isErr, _, st := globex("get_review_status", map[string]any{"review_id": id}); isErr || st["status"] != "pending" {
		t.Errorf("globex reading its own review: %v %v", isErr, st)
	}
	// The reviewer decides within the tenants the trusted reviewers file
	// grants them; the other tenant's id is unknown there.
	if _, errOut, code := runCLI(t, "review", "reject", id, "--tenants-dir", tenants, "--tenant", "globex"); code != reviewExitUntrusted || !strings.Contains(errOut, `tenant "globex"`) {
		t.Errorf("rejecting globex's review, granted no tenant: %d %s", code, errOut)
	}
	// (The trusted reviewers file is the one every test shares: it is
	// put back as it was.)
	shared, err := defaultConfigPath("reviewers.json")
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(shared)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(shared, before, 0o600) })
	if out, errOut, code := runCLI(t, "reviewer", "init", "--id", "alice", "--tenant", "globex"); code != 0 {
		t.Fatalf("grant alice globex: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, "review", "reject", id, "--tenants-dir", tenants, "--tenant", "acme"); code != reviewExitUnknown {
		t.Errorf("rejecting globex's review in acme: %d %s", code, errOut)
	}
	if out, errOut, code := runCLI(t, "review", "reject", id, "--tenants-dir", tenants, "--tenant", "globex"); code != 0 {
		t.Errorf("rejecting globex's review in globex: %d %s %s", code, out, errOut)
	}
	if _, _, st := globex("get_review_status", map[string]any{"review_id": id}); st["status"] != "rejected" {
		t.Errorf("globex's review after the reviewer: %v", st)
	}
	// The tenant's own policy: acme reviews above 0.05, the default at 1.00.
	// (With the 402's pay_to beside the host: a host alone cannot be told
	// apart from the open payment other sellers declared elsewhere.)
	fresh := map[string]any{"counterparty": "https://fresh.example/", "pay_to": "0xf7e5000000000000000000000000000000000005", "amount": "0.06"}
	_, _, a := acme("check_before_pay", fresh)
	_, _, g := globex("check_before_pay", fresh)
	if a["decision"] != "review" || g["decision"] != "allow" {
		t.Errorf("tenant policies: acme %v, globex %v", a["decision"], g["decision"])
	}
	// Each tenant's chain names it in scope.tenant.
	for _, name := range []string{"acme", "globex"} {
		chains, _ := filepath.Glob(filepath.Join(tenants, name, "guard", "receipts", "*.ndjson"))
		if len(chains) == 0 {
			t.Fatalf("%s has no chain", name)
		}
		for _, c := range chains {
			data, _ := os.ReadFile(c)
			if !strings.Contains(string(data), `"tenant":"`+name+`"`) || strings.Contains(string(data), `"tenant":"haia-trace-mcp"`) {
				t.Errorf("%s's chain %s does not name its tenant", name, filepath.Base(c))
			}
		}
	}
	// No tenant, or an unknown one: 403.
	for _, claims := range []map[string]any{{}, {"org": "initech"}, {"org": 7}} {
		req, _ := http.NewRequest(http.MethodPost, p.resource, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token(claims))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "tenant") {
			t.Errorf("claims %v: %d %s", claims, resp.StatusCode, body)
		}
	}

	// Readiness covers every tenant and names the one that is not: here
	// globex's guard/ is replaced by a file, so its store cannot take a
	// decision while acme's still can.
	if code, body := httpGet(t, p.base+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz with both tenants ready: %d %q", code, body)
	}
	guardDir := filepath.Join(tenants, "globex", "guard")
	if err := os.Rename(guardDir, guardDir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(guardDir, []byte("not a directory\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := httpGet(t, p.base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `tenant "globex"`) || strings.Contains(body, "acme") {
		t.Fatalf("readyz with globex's store broken: %d %q, want 503 naming globex only", code, body)
	}
}
