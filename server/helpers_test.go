package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// newTestServer opens dir as a Trace root (creating events/) and builds a server.
func newTestServer(t *testing.T, dir string) *Server {
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
	s, err := New(Config{Root: root, Events: events, Limits: receipt.DefaultLimits(), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
