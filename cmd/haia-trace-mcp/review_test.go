package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// reviewRoot makes a Trace root with n pending reviews and returns it with their ids.
func reviewRoot(t *testing.T, n int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	l := reviewlog.Open(root, reviewlog.Options{})
	var ids []string
	for i := range n {
		q := guard.Question{Counterparty: "0xb0b0000000000000000000000000000000000002", Amount: strings.Repeat("1", i+1), Asset: guard.USDCBase, Template: "x402-buyer"}
		out, err := l.Ask(context.Background(), reviewlog.AskRequest{Caller: "agent-1", Question: q, Decision: guard.Review,
			ParamsHash: "hmac-sha256:" + strings.Repeat("ab", 32), Reasons: []guard.Reason{
				{Rule: "open_partial", Detail: "1 partial operation\nwith a line break", Evidence: []guard.Ref{{RunID: "run-1", OperationID: "op-2"}}},
				{Rule: "history", Detail: "read 3 operations"},
			}}, func(reviewlog.Tx, reviewlog.AskOutcome) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, out.Review.ID)
	}
	return dir, ids
}

func reviewCmd(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"review"}, args...), strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

func TestReviewCLI(t *testing.T) {
	dir, ids := reviewRoot(t, 2)

	out, errOut, code := reviewCmd("list", "--dir", dir)
	if code != 0 || !strings.Contains(out, ids[0]) || !strings.Contains(out, ids[1]) || !strings.Contains(out, "open_partial") || strings.Contains(out, "history") {
		t.Fatalf("list: %d %q %q", code, out, errOut)
	}

	out, _, code = reviewCmd("show", ids[0], "--dir", dir)
	if code != 0 || !strings.Contains(out, "run run-1, operation op-2") || !strings.Contains(out, `1 partial operation\nwith a line break`) {
		t.Errorf("show: %d %q", code, out)
	}

	out, errOut, code = reviewCmd("reject", ids[0], "--note", "seller never settled", "--by", "alice", "--dir", dir)
	if code != 0 || !strings.Contains(out, ids[0]+" rejected by alice") {
		t.Fatalf("reject: %d %q %q", code, out, errOut)
	}
	_, errOut, code = reviewCmd("approve", "--dir", dir, ids[0])
	if code != reviewExitDecided || !strings.Contains(errOut, "already decided") {
		t.Errorf("second decision: %d %q", code, errOut)
	}

	out, _, code = reviewCmd("approve", ids[1], "--dir", dir, "--json")
	var r reviewlog.Review
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Status != reviewlog.Approved || r.DecidedBy == "" {
		t.Errorf("approve --json with the OS user: %d %q", code, out)
	}

	out, _, code = reviewCmd("list", "--dir", dir)
	if code != 0 || strings.TrimSpace(out) != "no pending reviews" {
		t.Errorf("list after deciding: %d %q", code, out)
	}
	out, _, code = reviewCmd("list", "--dir", dir, "--all", "--json")
	var listed struct{ Reviews []reviewlog.Review }
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Reviews) != 2 ||
		listed.Reviews[0].Status != reviewlog.Rejected || listed.Reviews[0].Note != "seller never settled" || listed.Reviews[0].DecidedBy != "alice" {
		t.Errorf("list --all --json: %d %q", code, out)
	}
}

func TestReviewCLIExitCodes(t *testing.T) {
	dir, ids := reviewRoot(t, 1)
	tests := []struct {
		name   string
		args   []string
		code   int
		errHas string
	}{
		{"no subcommand", nil, exitUsage, "name a subcommand"},
		{"unknown subcommand", []string{"delete"}, exitUsage, `unknown subcommand "delete"`},
		{"missing id", []string{"approve", "--dir", dir}, exitUsage, "want one review id"},
		{"extra argument", []string{"list", "x", "--dir", dir}, exitUsage, `unexpected argument "x"`},
		{"unknown flag", []string{"list", "--color", "--dir", dir}, exitUsage, "flag provided but not defined"},
		{"bad id", []string{"approve", "not-an-id", "--dir", dir}, exitUsage, "not a review id"},
		{"unknown id", []string{"approve", "1b4e28ba-2fa1-4d2c-883f-0016d3cca427", "--dir", dir}, reviewExitUnknown, "unknown review"},
		{"unknown id (show)", []string{"show", "1b4e28ba-2fa1-4d2c-883f-0016d3cca427", "--dir", dir}, reviewExitUnknown, "unknown review"},
		{"--by another reviewer than the key's", []string{"approve", ids[0], "--by", "a\x1bb", "--dir", dir}, reviewExitUntrusted, `belongs to reviewer alice`},
		{"missing root", []string{"list", "--dir", filepath.Join(dir, "absent")}, exitUsage, "cannot be opened"},
		{"not a Trace root", []string{"list", "--dir", t.TempDir()}, exitUsage, "is not a Trace root"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := reviewCmd(tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.errHas) {
				t.Errorf("exit %d %q, want %d mentioning %q", code, errOut, tc.code, tc.errHas)
			}
		})
	}

	// A lock held by another process → exit 5.
	f, err := os.OpenFile(filepath.Join(dir, reviewlog.DirName, reviewlog.LockName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := reviewCmd("approve", ids[0], "--by", "alice", "--lock-wait", "100ms", "--dir", dir)
	if code != reviewExitLock || !strings.Contains(errOut, "lock not obtained") {
		t.Errorf("held lock: %d %q", code, errOut)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
}

// Several CLI processes decide the same review at once: exactly one
// succeeds, the others exit 4.
func TestReviewCLIProcessesDecideOnce(t *testing.T) {
	dir, ids := reviewRoot(t, 1)
	const procs = 5
	codes := make([]int, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			verb := "approve"
			if i%2 == 1 {
				verb = "reject"
			}
			_, _, codes[i] = runCLI(t, "review", verb, ids[0], "--dir", dir)
		}()
	}
	wg.Wait()
	ok, decided := 0, 0
	for _, c := range codes {
		switch c {
		case 0:
			ok++
		case reviewExitDecided:
			decided++
		}
	}
	if ok != 1 || decided != procs-1 {
		t.Errorf("exit codes %v", codes)
	}
}
