package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The real server saves its run index in guard/, the next one answers from
// it, and one whose saved index was tampered with (and whose run grew)
// answers what the run files say, not what the index said.
func TestSavedRunIndexAcrossRestartsEndToEnd(t *testing.T) {
	root := filepath.Join(t.TempDir(), ".trace")
	events := filepath.Join(root, "events")
	if err := os.MkdirAll(events, 0o755); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(events, "r1.ndjson")
	var b strings.Builder
	for i := 1; i <= 30; i++ {
		b.WriteString(goodLine("op-"+string(rune('a'+i%10)), i, hostileStart.Add(time.Duration(i)*time.Second)) + "\n")
	}
	if err := os.WriteFile(run, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(root, "guard", "run-index.bin")
	list := func(stderr *lockedBuffer) string {
		t.Helper()
		cs, cmd := startServer(t, stderr, "--dir", root)
		text := resultText(callTool(t, cs, "list_operations", map[string]any{"limit": 100}))
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := os.Stat(index); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cs.Close()
		_ = cmd.Wait()
		return text
	}
	first := list(nil)
	saved, err := os.ReadFile(index)
	if err != nil {
		t.Fatalf("no saved run index after the first server: %v", err)
	}
	if second := list(nil); second != first {
		t.Fatalf("restart answered\n%s\nwant\n%s", second, first)
	}
	// Tamper: another completeness in place of one, then append an
	// operation to the run.
	i := bytes.Index(saved, []byte("partial"))
	if i < 0 {
		t.Fatal("no completeness in the saved index")
	}
	copy(saved[i:], "fulllll")
	if err := os.WriteFile(index, saved, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(run, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(goodLine("op-new", 31, hostileStart.Add(time.Hour)) + "\n")
	f.Close()
	var stderr lockedBuffer
	third := list(&stderr)
	if !strings.Contains(stderr.String(), "the saved run index is not used") {
		t.Errorf("the server did not say it set the tampered index aside:\n%s", stderr.String())
	}
	if !strings.Contains(third, "op-new") || strings.Count(third, ": partial,") != strings.Count(first, ": partial,")+1 {
		t.Fatalf("after tampering and an append the server answered\n%s\nbefore\n%s", third, first)
	}
}
