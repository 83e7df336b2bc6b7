package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// demoRoot plays the demo into a kept directory and returns its Trace root
// and the id of its longest chain.
func demoRoot(t *testing.T) (root, chain string) {
	t.Helper()
	keep := filepath.Join(t.TempDir(), "demo")
	if out, errOut, code := runCLI(t, "demo", "--keep", keep); code != 0 {
		t.Fatalf("demo: %d\n%s%s", code, out, errOut)
	}
	root = filepath.Join(keep, ".trace")
	list, errOut, code := runCLI(t, "chain", "list", "--dir", root)
	if code != 0 {
		t.Fatalf("chain list: %d %s", code, errOut)
	}
	best := -1
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 3 {
			t.Fatalf("chain list line %q", line)
		}
		if n, err := strconv.Atoi(f[2]); err == nil && n > best {
			chain, best = f[0], n
		}
	}
	return root, chain
}

// verify with the PostgreSQL store checks the signatures against the
// store's keyring (VALID, not UNVERIFIED), prints each warning once in
// every mode, and takes an empty checkpoint file for MALFORMED (exit 3).
func TestVerifyStoreKeyringAndWarnings(t *testing.T) {
	root, chain := demoRoot(t)
	dsn := e2eDatabase(t)
	if out, errOut, code := runCLI(t, "store", "import", "--dir", root, "--store", dsn); code != 0 {
		t.Fatalf("store import: %d %s %s", code, out, errOut)
	}
	file := filepath.Join(root, "guard", "receipts", chain+".ndjson")
	keyring := filepath.Join(root, "guard", "keyring.json")
	empty := filepath.Join(t.TempDir(), "empty-checkpoint.json")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	modes := []struct {
		name string
		args []string
	}{
		{"file", []string{file, "--keyring", keyring}},
		{"follow", []string{file, "--follow", "--keyring", keyring}},
		{"store with its keyring", []string{chain, "--store", dsn}},
		{"store with --keyring", []string{chain, "--store", dsn, "--keyring", keyring}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, append([]string{"verify"}, m.args...)...)
			if code != 0 || !strings.HasPrefix(out, "VALID") {
				t.Fatalf("verify %v: exit %d %s%s", m.args, code, out, errOut)
			}
			seen := map[string]bool{}
			for _, l := range strings.Split(strings.TrimSpace(errOut), "\n") {
				if !strings.HasPrefix(l, "warning: ") {
					continue
				}
				if seen[l] {
					t.Errorf("warning printed twice: %q\n%s", l, errOut)
				}
				seen[l] = true
			}
			if len(seen) == 0 {
				t.Errorf("no warning at all (want the offline limits once each):\n%s", errOut)
			}
			out, errOut, code = runCLI(t, append([]string{"verify", "--checkpoint", empty}, m.args...)...)
			if code != 3 || !strings.HasPrefix(out, "MALFORMED") {
				t.Errorf("verify with an empty checkpoint file: exit %d %s%s, want 3 MALFORMED", code, out, errOut)
			}
		})
	}
	// A keyring given by flag is the one used: a stranger's keyring makes
	// the store's chain fail, not fall back to the store's own keys.
	other, _ := demoRoot(t)
	stranger := filepath.Join(other, "guard", "keyring.json")
	if out, _, code := runCLI(t, "verify", chain, "--store", dsn, "--keyring", stranger); code != 2 || !strings.HasPrefix(out, "TAMPERED") {
		t.Errorf("verify --store with a stranger's keyring: exit %d %s", code, out)
	}
}
