package server

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// TestToolSchemasSnapshot compares what agents see in tools/list with the
// reviewed snapshot in testdata/server/tools.json, so that a change to a
// tool's name, description, schema or annotations is always deliberate.
// Regenerate with: go test ./server -run TestToolSchemasSnapshot -update
func TestToolSchemasSnapshot(t *testing.T) {
	s := newTestServer(t, t.TempDir())
	ctx := context.Background()
	s.MCP().HandleMessage(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	resp := s.MCP().HandleMessage(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`))
	raw, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var msg struct {
		Result struct {
			Tools []json.RawMessage `json:"tools"`
		} `json:"result"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil {
		t.Fatal(err)
	}
	if len(msg.Result.Tools) == 0 {
		t.Fatalf("no tools listed: %s", raw)
	}
	var buf bytes.Buffer
	buf.WriteString("[\n")
	for i, tool := range msg.Result.Tools {
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, tool, "  ", "  "); err != nil {
			t.Fatal(err)
		}
		buf.WriteString("  ")
		buf.Write(pretty.Bytes())
		if i < len(msg.Result.Tools)-1 {
			buf.WriteByte(',')
		}
		buf.WriteByte('\n')
	}
	buf.WriteString("]\n")
	golden := filepath.Join("..", "testdata", "server", "tools.json")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read snapshot (run with -update to create it): %v", err)
	}
	if !bytes.Equal(want, buf.Bytes()) {
		t.Fatalf("tools/list differs from %s; if the change is intended, review it and run with -update.\ngot:\n%s", golden, buf.Bytes())
	}
}
