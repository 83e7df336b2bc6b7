package server

import (
	"crypto/ed25519"
	"crypto/rand"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// newTestServer opens dir as a Trace root (creating events/) and builds a
// server with every tool, signing with a fresh key.
func newTestServer(t testing.TB, dir string) *Server {
	t.Helper()
	return newGuardedServer(t, dir, 0)
}

// newGuardedServer is newTestServer with an index budget (0: the default).
func newGuardedServer(t testing.TB, dir string, indexBytes int64) *Server {
	t.Helper()
	return newPolicyServer(t, dir, indexBytes, guard.DefaultConfig())
}

// newPolicyServer is newGuardedServer under a policy of the test's own.
func newPolicyServer(t testing.TB, dir string, indexBytes int64, pol *guard.Config) *Server {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return newPayingServer(t, dir, indexBytes, pol, key, testPayerKey)
}

// newPayingServer is newPolicyServer signing its records with key and
// payments with payerKeyHex.
func newPayingServer(t testing.TB, dir string, indexBytes int64, pol *guard.Config, key ed25519.PrivateKey, payerKeyHex string) *Server {
	t.Helper()
	return newPayingServerLog(t, dir, indexBytes, pol, key, payerKeyHex, nil)
}

// newPayingServerLog is newPayingServer logging to logger (nil: the
// default), the sweep of the Trace saved in the root's guard/ as the
// server saves it.
func newPayingServerLog(t testing.TB, dir string, indexBytes int64, pol *guard.Config, key ed25519.PrivateKey, payerKeyHex string, logger *slog.Logger) *Server {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	events, err := root.OpenDir("events")
	if err != nil {
		t.Fatal(err)
	}
	state, err := root.OpenDirLazy("guard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { state.Close(); events.Close(); root.Close() })
	cat, err := catalog.New(catalog.Config{Root: root, Events: events, Limits: receipt.DefaultLimits(), MaxBytes: indexBytes})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Catalog: cat, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{
		Policy:    pol,
		Templates: receipt.Resolver{},
		History:   cat,
		Log:       reviewlog.OpenStore(filestore.New(root), reviewlog.Options{}),
		Chains:    &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "test"},
		ParamsKey: engine.ParamsKeyFrom(key.Seed()),
	})
	if err != nil {
		t.Fatal(err)
	}
	payerKey, err := x402.ParseKey([]byte(payerKeyHex), nil)
	if err != nil {
		t.Fatal(err)
	}
	pay, err := payment.New(payment.Config{Engine: eng, Signer: x402.NewKeySigner(payerKey), Events: events, State: state, TraceChanges: cat.Changes, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pay.Close)
	if err := s.EnableGuard(&Guard{Engine: eng, AgentID: "test-agent", Payments: pay}); err != nil {
		t.Fatal(err)
	}
	return s
}

// openRoot opens dir as a Trace root for the test's own reads.
func openRoot(t testing.TB, dir string) *confined.Dir {
	t.Helper()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root
}

// testPayerKey is the payer key of the test servers (a test key, nothing
// holds funds with it).
const testPayerKey = "0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"

// paymentRequired is a seller's x402 v2 402 answer for amount atomic
// units of USDC on Base to payTo.
func paymentRequired(amount, payTo string) map[string]any {
	return map[string]any{"x402Version": 2, "resource": map[string]any{"url": "https://api.seller.example/data"},
		"accepts": []any{map[string]any{"scheme": "exact", "network": "eip155:8453", "amount": amount,
			"asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "payTo": payTo, "maxTimeoutSeconds": 120,
			"extra": map[string]any{"name": "USD Coin", "version": "2"}}}}
}
