package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
