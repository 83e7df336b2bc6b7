package server

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
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
	t.Cleanup(func() { events.Close(); root.Close() })
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Root: root, Events: events, Limits: receipt.DefaultLimits(), Version: "test", IndexMaxBytes: indexBytes})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{
		Policy:    guard.DefaultConfig(),
		Templates: receipt.Resolver{},
		History:   s.History(),
		Log:       reviewlog.Open(root, reviewlog.Options{}),
		Chains:    &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "test"},
		ParamsKey: engine.ParamsKeyFrom(key.Seed()),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EnableGuard(&Guard{Engine: eng, AgentID: "test-agent"}); err != nil {
		t.Fatal(err)
	}
	return s
}
