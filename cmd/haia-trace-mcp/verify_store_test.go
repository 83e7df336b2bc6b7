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

	// --reviewers holds the demo's human rejection (signed with the
	// operator's key) to the trusted reviewers file, in every mode: the
	// demo's own file trusts it; another demo's file lists "operator" with
	// another key; with --tenant the operator, granted no tenant, does not
	// count.
	reviewers := filepath.Join(filepath.Dir(root), "keys", "reviewers.json")
	strangers := filepath.Join(filepath.Dir(other), "keys", "reviewers.json")
	files, _ := filepath.Glob(filepath.Join(root, "guard", "receipts", "*.ndjson"))
	var human string
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), `"principal":"HUMAN"`) {
			human = f
		}
	}
	if human == "" {
		t.Fatalf("no chain of the demo holds its human decision: %v", files)
	}
	hchain := strings.TrimSuffix(filepath.Base(human), ".ndjson")
	for _, m := range []struct {
		name string
		args []string
	}{
		{"file", []string{human, "--keyring", keyring}},
		{"follow", []string{human, "--follow", "--keyring", keyring}},
		{"store", []string{hchain, "--store", dsn}},
	} {
		t.Run(m.name+" --reviewers", func(t *testing.T) {
			out, errOut, code := runCLI(t, append([]string{"verify", "--reviewers", reviewers}, m.args...)...)
			if code != 0 || !strings.HasPrefix(out, "VALID") || !strings.Contains(errOut, "note: 1 human decisions held to the trusted reviewers file: each counts") {
				t.Fatalf("verify --reviewers (the demo's own): exit %d %s%s", code, out, errOut)
			}
			out, errOut, code = runCLI(t, append([]string{"verify", "--reviewers", strangers}, m.args...)...)
			if code != 5 || !strings.HasPrefix(out, "UNTRUSTED: human receipt") || !strings.Contains(out, `not signed by reviewer "operator"'s trusted key`) || !strings.Contains(errOut, "untrusted: ") {
				t.Fatalf("verify --reviewers (another key for operator): exit %d %s%s", code, out, errOut)
			}
			out, errOut, code = runCLI(t, append([]string{"verify", "--reviewers", reviewers, "--tenant", "acme"}, m.args...)...)
			if code != 5 || !strings.HasPrefix(out, "UNTRUSTED: ") {
				t.Fatalf("verify --reviewers --tenant acme (operator granted none): exit %d %s%s", code, out, errOut)
			}
		})
	}
}
