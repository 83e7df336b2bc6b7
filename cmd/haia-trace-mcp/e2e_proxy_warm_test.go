package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// recordRuns writes n runs into root, run-<i> with one settled payment
// <prefix>-<i> each.
func recordRuns(t *testing.T, root, prefix string, n int) {
	t.Helper()
	for i := range n {
		rec, err := simrec.New(root, fmt.Sprintf("run-%d", i+1), time.Date(2026, 7, 24, 9, i, 0, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: fmt.Sprintf("%s-%d", prefix, i+1), URL: "https://a.example.com/report", PayTo: sellerA, Amount: "250000", Outcome: "settled"}); err != nil {
			t.Fatal(err)
		}
	}
}

// readingSince is /readyz's reason while a root is read at the start.
const readingSince = "the Trace root's runs are being read since the start ("

// probeUntilReady probes p as an orchestrator does while its roots are
// read: /healthz is 200 on every probe; /readyz is 503 with first and
// count (how far the reading went) in its reason on the first probe, 503 saying the runs are being read until it
// is 200, and 200 within a minute.
func probeUntilReady(t *testing.T, p *httpProc, first, count string) {
	t.Helper()
	if code, body := getText(t, p.base+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz while the root is read: %d %q", code, body)
	}
	code, body := getText(t, p.base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, first) || !strings.Contains(body, count) {
		t.Fatalf("readyz while the root is read: %d %q, want 503 with %q and %q\n%s", code, body, first, count, p.logs())
	}
	deadline := time.Now().Add(time.Minute)
	for n := 0; ; n++ {
		if code, body := getText(t, p.base+"/healthz"); code != http.StatusOK {
			t.Fatalf("healthz while the root is read: %d %q", code, body)
		}
		code, body = getText(t, p.base+"/readyz")
		if code == http.StatusOK {
			if n == 0 {
				t.Fatalf("ready on the probe right after a 503: the reading was too quick to be seen")
			}
			return
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, readingSince) {
			t.Fatalf("readyz while the root is read: %d %q", code, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %d %q\n%s", code, body, p.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestProxyNotReadyWhileTheRootIsReadAtTheStart: the guard proxy over
// HTTP reads its Trace root before it is ready, as the server does
// (TestNotReadyWhileTheRootIsReadAtTheStart). Probed the way an
// orchestrator probes it, with four runs each read slowly by the test hook,
// it is live throughout, answers /readyz 503 with how far the reading went,
// then 200; then a question lists every run's operations and a paying call
// goes through the guard to the upstream. A restart finds the index saved
// and is ready as it serves.
func TestProxyNotReadyWhileTheRootIsReadAtTheStart(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, "")
	e.root = filepath.Join(t.TempDir(), ".trace")
	recordRuns(t, e.root, "op", 4)
	bin := payUpstream(t)
	env := []string{readDelayEnv + "=1500ms", "PAY_LOG=" + e.payLog, "PAY_PID_FILE=" + e.pidFile}
	args := []string{"proxy", "--http", "127.0.0.1:0", "--dir", e.root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"),
		"--guard-map", e.mapPath, "--http-insecure-no-auth", "--", bin}
	p := startHTTPCommandEnv(t, env, args...)
	probeUntilReady(t, p, readingSince, " of 4 read)")
	cs, err := httpSession(t, p.resource, func() string { return "" })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	text := resultText(callTool(t, cs, "list_operations", map[string]any{"limit": 10}))
	for i := range 4 {
		if !strings.Contains(text, fmt.Sprintf("op-%d", i+1)) {
			t.Errorf("list_operations lacks op-%d: %s", i+1, text)
		}
	}
	e.cs = cs
	if res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.25"}`); res.IsError {
		t.Fatalf("a paying call once ready: %s\n%s", resultText(res), p.logs())
	}
	if n := len(e.paid(t)); n != 1 {
		t.Fatalf("upstream ran %d calls, want 1", n)
	}

	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d\n%s", code, p.logs())
	}
	again := startHTTPCommandEnv(t, env, args...)
	if code, body := getText(t, again.base+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz after a restart: %d %q\n%s", code, body, again.logs())
	}
}

// TestProxyTenantsNotReadyWhileTheirRootsAreRead: with --tenants-dir the
// proxy reads every tenant's root at the start; /readyz names the first
// tenant still being read until every one is, and then each tenant's
// caller reaches its own runs and pays through its own guard.
func TestProxyTenantsNotReadyWhileTheirRootsAreRead(t *testing.T) {
	tenants := filepath.Join(t.TempDir(), "tenants")
	recordRuns(t, filepath.Join(tenants, "acme"), "acme", 3)
	recordRuns(t, filepath.Join(tenants, "globex"), "globex", 2)
	e := newProxyEnv(t, proxyMapJSON, "")
	bin := payUpstream(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("w", 48))
	secretFile := writeSecret(t, "secret", string(secret))
	const issuer = "http://127.0.0.1/local-as"
	p := startHTTPCommandEnv(t, []string{readDelayEnv + "=1500ms", "PAY_LOG=" + e.payLog, "PAY_PID_FILE=" + e.pidFile},
		"proxy", "--http", "127.0.0.1:0", "--tenants-dir", tenants, "--tenant-claim", "org",
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", issuer, "--auth-hmac-secret", secretFile,
		"--guard-map", e.mapPath, "--", bin)
	probeUntilReady(t, p, `tenant "acme": `+readingSince, " of 3 read)")
	for tenant, runs := range map[string]int{"acme": 3, "globex": 2} {
		tok := signHS256(t, secret, map[string]any{"iss": issuer, "aud": p.resource, "sub": "agent-" + tenant, "org": tenant,
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
		cs, err := httpSession(t, p.resource, func() string { return tok })
		if err != nil {
			t.Fatalf("connect as %s: %v\n%s", tenant, err, p.logs())
		}
		text := resultText(callTool(t, cs, "list_operations", map[string]any{"limit": 10}))
		for i := range runs {
			if !strings.Contains(text, fmt.Sprintf("%s-%d", tenant, i+1)) {
				t.Errorf("%s's list_operations lacks %s-%d: %s", tenant, tenant, i+1, text)
			}
		}
		if other := map[string]string{"acme": "globex-1", "globex": "acme-1"}[tenant]; strings.Contains(text, other) {
			t.Errorf("%s's list_operations holds another tenant's %s: %s", tenant, other, text)
		}
		e.cs = cs
		if res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.25"}`); res.IsError {
			t.Fatalf("%s's paying call once ready: %s\n%s", tenant, resultText(res), p.logs())
		}
	}
	if n := len(e.paid(t)); n != 2 {
		t.Fatalf("upstream ran %d calls, want 2 (one a tenant)", n)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d\n%s", code, p.logs())
	}
}
