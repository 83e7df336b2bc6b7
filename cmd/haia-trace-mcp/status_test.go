package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type statusJSON struct {
	Runs struct {
		Runs, Operations, Full, Partial int
	} `json:"runs"`
	OpenPayments []struct {
		Counterparty string   `json:"counterparty"`
		Operations   int      `json:"operations"`
		Amounts      []string `json:"amounts"`
	} `json:"open_payments"`
	Reviews struct {
		Pending int `json:"pending"`
		ByAge   []struct {
			Age   string `json:"age"`
			Count int    `json:"count"`
		} `json:"by_age"`
	} `json:"reviews"`
	Reservations struct {
		Held     int              `json:"held"`
		Items    []map[string]any `json:"items"`
		Problems []string         `json:"problems"`
	} `json:"reservations"`
	Chains []struct {
		ID, Verdict string
		Receipts    int
	} `json:"chains"`
	Policy struct {
		Source, SHA256 string
	} `json:"policy"`
	Reviewers struct {
		IDs []string `json:"ids"`
	} `json:"reviewers"`
	Problems []string `json:"problems"`
}

func statusOf(t *testing.T, wantCode int, args ...string) statusJSON {
	t.Helper()
	out, errOut, code := runCLI(t, append([]string{"status", "--json"}, args...)...)
	if code != wantCode {
		t.Fatalf("status %v: exit %d, want %d\n%s%s", args, code, wantCode, out, errOut)
	}
	if errOut != "" {
		t.Errorf("status piped wrote to stderr (progress must be quiet off a terminal): %q", errOut)
	}
	var st statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return st
}

// status on the demo's root: the runs, the open payment, the chains VALID
// against the keyring, the reviewers, the policy's source and hash; the
// same on PostgreSQL after an import; nothing written; a tampered chain
// exits 3 and says which.
func TestStatus(t *testing.T) {
	root, _ := demoRoot(t)
	reviewers := filepath.Join(filepath.Dir(root), "keys", "reviewers.json")
	before := snapshotTree(t, root)
	st := statusOf(t, 0, "--dir", root, "--reviewers", reviewers)
	if st.Runs.Runs != 1 || st.Runs.Operations != 2 || st.Runs.Full != 1 || st.Runs.Partial != 1 {
		t.Errorf("runs: %+v", st.Runs)
	}
	if len(st.OpenPayments) != 1 || st.OpenPayments[0].Operations != 1 || len(st.OpenPayments[0].Amounts) != 1 || !strings.HasSuffix(st.OpenPayments[0].Amounts[0], " USDC") {
		t.Errorf("open payments: %+v", st.OpenPayments)
	}
	list, _, _ := runCLI(t, "chain", "list", "--dir", root)
	if len(st.Chains) != strings.Count(list, "\n") || len(st.Chains) == 0 {
		t.Errorf("chains: %+v, chain list:\n%s", st.Chains, list)
	}
	for _, c := range st.Chains {
		if c.Verdict != "VALID" || c.Receipts == 0 {
			t.Errorf("chain %+v", c)
		}
	}
	if len(st.Reviewers.IDs) != 1 || st.Reviewers.IDs[0] != "operator" {
		t.Errorf("reviewers: %+v", st.Reviewers)
	}
	if !strings.Contains(st.Policy.Source, "built-in defaults") || len(st.Policy.SHA256) != 64 {
		t.Errorf("policy: %+v", st.Policy)
	}
	if st.Reservations.Held != len(st.Reservations.Items) || st.Reservations.Items == nil || len(st.Reservations.Problems) != 0 {
		t.Errorf("reservations: %+v", st.Reservations)
	}
	if len(st.Problems) != 0 {
		t.Errorf("problems: %v", st.Problems)
	}
	text, _, code := runCLI(t, "status", "--dir", root, "--reviewers", reviewers)
	for _, want := range []string{"2 operations (1 full, 1 partial)", "VALID", "operator", fmt.Sprintf("%d pending", st.Reviews.Pending)} {
		if code != 0 || !strings.Contains(text, want) {
			t.Errorf("status text lacks %q (exit %d):\n%s", want, code, text)
		}
	}
	if after := snapshotTree(t, root); !equalMaps(before, after) {
		t.Errorf("status wrote under the Trace root:\nbefore %v\nafter  %v", before, after)
	}

	// The policy in effect is the one the server recorded (the demo's
	// server ran on the built-in defaults); a file beside the root that is
	// not it is reported as a problem, not taken in its place.
	cfg := filepath.Join(filepath.Dir(root), "haia-guard.config.json")
	if err := os.WriteFile(cfg, []byte(`{"reviewAbove": "0.50"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := statusOf(t, 3, "--dir", root, "--reviewers", reviewers); !strings.Contains(st.Policy.Source, "built-in defaults") ||
		!strings.Contains(strings.Join(st.Problems, "\n"), cfg) || !strings.Contains(strings.Join(st.Problems, "\n"), "not the policy the server runs with") {
		t.Errorf("policy beside the root, not in force: %+v %v", st.Policy, st.Problems)
	}
	os.Remove(cfg)

	// The same state from PostgreSQL.
	dsn := e2eDatabase(t)
	if out, errOut, code := runCLI(t, "store", "import", "--dir", root, "--store", dsn); code != 0 {
		t.Fatalf("store import: %d %s %s", code, out, errOut)
	}
	pg := statusOf(t, 0, "--dir", root, "--store", dsn, "--reviewers", reviewers)
	if len(pg.Chains) != len(st.Chains) || pg.Runs != st.Runs {
		t.Errorf("status on PostgreSQL: %+v, on files: %+v", pg, st)
	}

	// A receipt edited in place: TAMPERED, exit 3.
	files, _ := filepath.Glob(filepath.Join(root, "guard", "receipts", "*.ndjson"))
	if len(files) == 0 {
		t.Fatal("no chain file")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		edited := strings.Replace(string(data), `"sandboxed":false`, `"sandboxed":true`, 1)
		if edited == string(data) {
			t.Fatalf("%s: nothing to edit", f)
		}
		if err := os.WriteFile(f, []byte(edited), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bad := statusOf(t, 3, "--dir", root, "--reviewers", reviewers)
	if len(bad.Problems) == 0 || !strings.Contains(strings.Join(bad.Problems, "\n"), "TAMPERED") && !strings.Contains(strings.Join(bad.Problems, "\n"), "MALFORMED") {
		t.Errorf("a tampered chain: %+v", bad)
	}
}

// A pending review is counted, by age.
func TestStatusPendingReview(t *testing.T) {
	root := loopRoot(t)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"))
	var a checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &a)
	if a.Decision != "review" {
		t.Fatalf("check: %+v", a)
	}
	var allowed checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": "0x00000000000000000000000000000000000000f1", "amount": "0.06"}), &allowed)
	if allowed.Decision != "allow" {
		t.Fatalf("check: %+v", allowed)
	}
	st := statusOf(t, 0, "--dir", root)
	if st.Reviews.Pending != 1 || st.Reviews.ByAge[0].Count != 1 {
		t.Errorf("reviews: %+v", st.Reviews)
	}
	// The allow holds its payment: status lists it, to whom and how much.
	if st.Reservations.Held != 1 || len(st.Reservations.Items) != 1 || st.Reservations.Items[0]["to"] != "0x00000000000000000000000000000000000000f1" ||
		st.Reservations.Items[0]["amount"] != "0.06 USDC" || st.Reservations.Items[0]["receipt_id"] != allowed.ReceiptID {
		t.Errorf("reservations: %+v (allow %+v)", st.Reservations, allowed)
	}
}

func snapshotTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		out[path] = fmt.Sprintf("%v %v %d", info.Mode(), info.ModTime(), info.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Progress is a line on a terminal and nothing when piped.
func TestProgressQuietWhenPiped(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := newProgress(f, "verify")
	p.step("chain 1 of 2")
	p.done()
	if info, _ := f.Stat(); info.Size() != 0 {
		t.Errorf("progress wrote %d bytes to a file", info.Size())
	}
	var b bytes.Buffer
	tty := &progress{w: &b, name: "verify", tty: true}
	tty.step("chain 1 of 2")
	tty.done()
	if !strings.Contains(b.String(), "verify: chain 1 of 2") || !strings.HasSuffix(b.String(), "\r\033[K") {
		t.Errorf("progress on a terminal: %q", b.String())
	}
}
