package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemo runs the demo as a new user would and checks its milestones.
func TestDemo(t *testing.T) {
	keep := filepath.Join(t.TempDir(), "demo")
	out, errOut, code := runCLI(t, "demo", "--keep", keep)
	if code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	milestones := []string{
		"op-2: paid 400000 atomic USDC",
		"$ haia-trace-mcp reviewer init --id operator --key-file",
		"no tool that approves or rejects",
		"run-demo / op-2: partial (missing: settlement)",
		"run-demo / op-1: full",
		"decision: REVIEW",
		"- open_partial:",
		"review_url: http://localhost:",
		"/console/reviews/",
		"the reviewer console",
		"$ haia-trace-mcp review list",
		"--console-url http://localhost:",
		"LINK",
		"$ haia-trace-mcp review reject",
		"--reviewer-key",
		"rejected by operator",
		": rejected — \"op-2 never settled; ask the seller first\"",
		"look the same",
		"BLOCK (human_rejected)",
		"decision: ALLOW",
		"$ haia-trace-mcp payer address --payer-key",
		"decision: ALLOW — signed an EIP-3009 authorization for exactly 250000 atomic USDC",
		"PAYMENT-SIGNATURE header",
		"the silent seller's 402 for 0.40 USDC: REVIEW — nothing is signed",
		"$ haia-trace-mcp authorization show 0x",
		"CONSISTENT: the terms, the payer's signature and the signed receipts agree",
		"$ haia-trace-mcp audit",
		"CONSISTENT",
		"$ haia-trace-mcp verify",
		"VALID: ",
		"$ haia-trace-mcp verify",
		"VALID: ",
		"Demo complete",
	}
	rest := out
	for _, m := range milestones {
		i := strings.Index(rest, m)
		if i < 0 {
			t.Fatalf("transcript lacks %q after the earlier milestones:\n%s", m, out)
		}
		rest = rest[i+len(m):]
	}
	if _, err := os.Stat(filepath.Join(keep, ".trace", "guard", "decisions.ndjson")); err != nil {
		t.Fatalf("--keep did not keep the root: %v", err)
	}
	if _, _, code := runCLI(t, "demo", "--keep", keep); code == 0 {
		t.Fatal("demo reused an existing --keep directory")
	}
}
