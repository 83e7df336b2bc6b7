package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// grownRoot builds a Trace root whose guard has thousands of reviews and
// receipts, every one signed for real (tools/growthgen).
func grownRoot(t *testing.T, reviews, receipts string) string {
	t.Helper()
	gen := filepath.Join(t.TempDir(), "growthgen")
	if out, err := exec.Command("go", "build", "-o", gen, "../../tools/growthgen").CombinedOutput(); err != nil {
		t.Fatalf("build growthgen: %v\n%s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "grown")
	if out, err := exec.Command(gen, "-dir", dir, "-reviews", reviews, "-receipts", receipts).CombinedOutput(); err != nil {
		t.Fatalf("growthgen: %v\n%s", err, out)
	}
	return dir
}

// A file store with thousands of reviews and receipts moves into
// PostgreSQL and back out byte for byte — the log, an archive, every chain
// segment and the keyring — and audits CONSISTENT in between; a store
// whose chain does not verify is refused before anything is copied.
func TestStoreImportExportRoundTrip(t *testing.T) {
	pgtest.DSN(t)
	dir := grownRoot(t, "2000", "6000")
	root := filepath.Join(dir, ".trace")
	reviewers := filepath.Join(dir, "reviewers.json")
	// Half the story in an archive, so archives travel too.
	if out, errOut, code := runCLI(t, "review", "archive", "--dir", root, "--older-than", "1h", "--reviewers", reviewers); code != 0 || !strings.Contains(out, "archived") {
		t.Fatalf("review archive: %d %s %s", code, out, errOut)
	}
	dsn := e2eDatabase(t)
	out, errOut, code := runCLI(t, "store", "import", "--dir", root, "--store", dsn)
	if code != 0 || !strings.Contains(out, "1 archives") || !strings.Contains(out, "6000 receipts, every one VALID before and after") {
		t.Fatalf("store import: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", root, "--store", dsn, "--reviewers", reviewers); code != 0 || !strings.Contains(out, "CONSISTENT") {
		t.Fatalf("audit of the imported store: %d %s %s", code, out, errOut)
	}
	back := filepath.Join(t.TempDir(), "back")
	if out, errOut, code := runCLI(t, "store", "export", "--store", dsn, "--dir", back); code != 0 {
		t.Fatalf("store export: %d %s %s", code, out, errOut)
	}
	sameTree(t, filepath.Join(root, reviewlog.DirName), filepath.Join(back, reviewlog.DirName))
	if _, errOut, code := runCLI(t, "store", "export", "--store", dsn, "--dir", back); code == 0 || !strings.Contains(errOut, "not empty") {
		t.Fatalf("an export over an existing guard/: %d %s", code, errOut)
	}

	// One signature byte changed: refused with exit 3, nothing copied.
	receipts := filepath.Join(root, reviewlog.DirName, reviewlog.ReceiptsDir)
	entries, err := os.ReadDir(receipts)
	if err != nil || len(entries) == 0 {
		t.Fatal(err)
	}
	victim := filepath.Join(receipts, entries[0].Name())
	data, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, []byte(`"sig":`))
	if i < 0 {
		t.Fatalf("%s has no signature", victim)
	}
	j := bytes.IndexAny(data[i+40:], "ABCDEFGHabcdefgh") + i + 40
	data[j] ^= 0x01
	if err := os.WriteFile(victim, data, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := e2eDatabase(t)
	if out, errOut, code := runCLI(t, "store", "import", "--dir", root, "--store", empty); code != 3 || !strings.Contains(errOut, "does not verify VALID") {
		t.Fatalf("import of a tampered chain: exit %d %s %s, want 3", code, out, errOut)
	}
	if list, _, code := runCLI(t, "chain", "list", "--store", empty); code != 0 || list != "" {
		t.Fatalf("the refused import copied something: %d %q", code, list)
	}
}
