package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
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

// A client that closes the server's input and kills it a few seconds later
// (the SDK's stdio client: SIGTERM after 5 s, SIGKILL 5 s after that)
// while the server still saves its run index — a big root's first save
// takes longer than that — does not lose the whole save: what was encoded
// is written as the save goes, and the next server takes those runs from
// it and reads only the others. The test hook slows the save of a small
// root to the pace of a big one's.
func TestRunIndexSaveKilledMidwayLeavesWhatItSaved(t *testing.T) {
	root := filepath.Join(t.TempDir(), ".trace")
	events := filepath.Join(root, "events")
	if err := os.MkdirAll(events, 0o755); err != nil {
		t.Fatal(err)
	}
	const runs = 40
	for r := range runs {
		var b strings.Builder
		for i := 1; i <= 6; i++ {
			b.WriteString(goodLine(fmt.Sprintf("op-%d-%d", r, i%3), i, hostileStart.Add(time.Duration(r*10+i)*time.Second)) + "\n")
		}
		if err := os.WriteFile(filepath.Join(events, fmt.Sprintf("r%02d.ndjson", r)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	index := filepath.Join(root, "guard", "run-index.bin")
	start := func(stderr *lockedBuffer) (*mcp.ClientSession, *exec.Cmd) {
		cmd := exec.Command(binPath, "--dir", root, "--log-level", "info")
		cmd.Env = append(os.Environ(), "HAIA_TEST_INDEX_SAVE_DELAY=500ms")
		cmd.Stderr = stderr
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-test", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("connect: %v (stderr: %s)", err, stderr.String())
		}
		return cs, cmd
	}
	var first lockedBuffer
	cs, cmd := start(&first)
	want := resultText(callTool(t, cs, "list_operations", map[string]any{"limit": 100}))
	// The save (40 runs at 0.5 s each) has begun; the client stops the
	// server now.
	began := time.Now()
	cs.Close()
	_ = cmd.Wait()
	if time.Since(began) > 15*time.Second || strings.Contains(first.String(), "the run index could not be saved") {
		t.Fatalf("the server stopped after %s:\n%s", time.Since(began), first.String())
	}
	if _, err := os.Stat(index); err != nil {
		t.Fatalf("no run index was left by a server stopped while saving it: %v\n%s", err, first.String())
	}
	var second lockedBuffer
	cs, cmd = start(&second)
	got := resultText(callTool(t, cs, "list_operations", map[string]any{"limit": 100}))
	if got != want {
		t.Fatalf("the next server answered\n%s\nwant\n%s", got, want)
	}
	cs.Close()
	_ = cmd.Wait()
	m := regexp.MustCompile(`the saved run index is read.*?"?runs"?[=:](\d+)`).FindStringSubmatch(second.String())
	if m == nil {
		t.Fatalf("the next server did not read the saved index:\n%s", second.String())
	}
	if n, _ := strconv.Atoi(m[1]); n < 1 || n >= runs {
		t.Fatalf("the saved index left held %d of %d runs; want some, not all (the save was stopped midway)", n, runs)
	}
}
