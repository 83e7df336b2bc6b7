package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// From an empty directory, with no flag beyond what init prints: init,
// serve over stdio with the official SDK client, ask, review reject, audit
// and verify.
func TestRootFromNothing(t *testing.T) {
	work := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "config")
	env := append(os.Environ(), "HAIA_CONFIG_DIR="+cfg)
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(binPath, args...)
		cmd.Dir, cmd.Env = work, env
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	out, errOut, code := cli("init", "--reviewer-id", "ops")
	if code != 0 {
		t.Fatalf("init: %d %s %s", code, out, errOut)
	}
	// The two commands init printed, word for word.
	var serveArgs, listArgs []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		cmdline, _, _ := strings.Cut(line, "#")
		fields := strings.Fields(cmdline)
		if len(fields) < 2 || fields[0] != "haia-trace-mcp" {
			continue
		}
		if fields[1] == "review" {
			listArgs = fields[1:]
		} else {
			serveArgs = fields[1:]
		}
	}
	if serveArgs == nil || listArgs == nil {
		t.Fatalf("init did not print the next two commands:\n%s", out)
	}
	root := filepath.Join(work, ".trace")

	// A server on the fresh root (events/ empty) lists nothing, then a
	// recorder writes a run that never settles.
	cmd := exec.Command(binPath, serveArgs...)
	cmd.Dir, cmd.Env = work, env
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-init", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var list struct {
		Operations []any `json:"operations"`
	}
	decodeStructured(t, callTool(t, cs, "list_operations", map[string]any{}), &list)
	if len(list.Operations) != 0 {
		t.Fatalf("a fresh root lists %d operations", len(list.Operations))
	}
	rec, err := simrec.New(root, "run-1", time.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-1", URL: "https://b.example.net/x", PayTo: sellerB, Amount: "100000", Outcome: "unsettled"}); err != nil {
		t.Fatal(err)
	}
	var a checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &a)
	if a.Decision != "review" {
		t.Fatalf("ask: %+v", a)
	}
	if out, errOut, code := cli(listArgs...); code != 0 || !strings.Contains(out, a.ReviewID) {
		t.Fatalf("review list: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := cli("review", "reject", a.ReviewID, "--note", "not yet", "--dir", root); code != 0 || !strings.Contains(out, "rejected by ops") {
		t.Fatalf("review reject: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := cli("audit", "--dir", root); code != 0 || !strings.HasPrefix(out, "CONSISTENT") {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
	out, _, code = cli("chain", "list", "--dir", root)
	if code != 0 {
		t.Fatalf("chain list: %d", code)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 2 {
			t.Fatalf("chain list line %q", line)
		}
		if out, errOut, code := cli("verify", f[1], "--keyring", filepath.Join(root, "guard", "keyring.json")); code != 0 || !strings.HasPrefix(out, "VALID") {
			t.Fatalf("verify %s: %d %s %s", f[1], code, out, errOut)
		}
	}
	// init again makes nothing and overwrites nothing.
	if out, _, code := cli("init"); code != 0 || !strings.Contains(out, "nothing was made") {
		t.Fatalf("second init: %d %s", code, out)
	}
}
