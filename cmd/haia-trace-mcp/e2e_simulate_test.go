package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// simulatePolicy writes a guard policy: the deploy example's, with
// reviewAbove and maxOpenPartialPerCounterparty as given.
func simulatePolicy(t *testing.T, name, reviewAbove string, maxOpen int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	doc := map[string]any{"perCounterpartyLimit": map[string]any{"amount": "5.00", "windowHours": 24}, "maxOpenPartialPerCounterparty": maxOpen,
		"reviewAbove": reviewAbove, "defaultAsset": "eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"}
	b, _ := json.Marshal(doc)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// simulateStory records four decisions under policy (reviewAbove 1.00, no
// open payment tolerated) through the real server: sellerA 0.10 and 0.50
// allowed, sellerA 2.00 sent to review (review_above), sellerB 0.10 sent
// to review (op-b is open). It returns the receipts in the order asked.
func simulateStory(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	var ids []string
	for _, c := range []struct{ who, amount, want string }{
		{sellerA, "0.10", "allow"}, {sellerA, "0.50", "allow"}, {sellerA, "2.00", "review"}, {sellerB, "0.10", "review"},
	} {
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": c.who, "amount": c.amount, "asset": "USDC"}), &a)
		if a.Decision != c.want {
			t.Fatalf("%s %s: %s, want %s: %+v", c.who, c.amount, a.Decision, c.want, a.Reasons)
		}
		ids = append(ids, a.ReceiptID)
	}
	return ids
}

type simulateOut struct {
	Policy   string `json:"policy"`
	Replayed int    `json:"replayed"`
	Changes  []struct {
		At           string `json:"at"`
		Receipt      string `json:"receipt_id"`
		Kind         string `json:"kind"`
		Caller       string `json:"caller"`
		Counterparty string `json:"counterparty"`
		Amount       string `json:"amount"`
		From         string `json:"from"`
		To           string `json:"to"`
		Rule         string `json:"rule"`
		Detail       string `json:"detail"`
	} `json:"changes"`
	Transitions     map[string]int `json:"transitions"`
	Unchanged       int            `json:"unchanged"`
	WithoutQuestion int            `json:"without_question"`
	Unverifiable    []struct {
		Receipt string `json:"receipt_id"`
		Why     string `json:"why"`
	} `json:"unverifiable"`
	Orphans int `json:"orphans"`
}

func (s simulateOut) lines() []string {
	var out []string
	for _, c := range s.Changes {
		out = append(out, c.Receipt+" "+c.Caller+" "+c.Counterparty+" "+c.Amount+" "+c.From+"→"+c.To+" "+c.Rule)
	}
	return out
}

// treeSums is every file under dir with its SHA-256.
func treeSums(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		s := sha256.Sum256(b)
		out[p] = hex.EncodeToString(s[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func runSimulate(t *testing.T, args ...string) simulateOut {
	t.Helper()
	out, errOut, code := runCLI(t, append([]string{"policy", "simulate", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("policy simulate %v: %d %s %s", args, code, out, errOut)
	}
	var s simulateOut
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("policy simulate --json: %v\n%s", err, out)
	}
	return s
}

// TestPolicySimulateFiles records decisions under one policy through the
// real server, then tries a stricter and a looser one on them: exactly the
// decisions each would change are listed, with the rule, and nothing under
// guard/ changes.
func TestPolicySimulateFiles(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	recorded := simulatePolicy(t, "recorded.json", "1.00", 0)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--agent-id", "agent-007", "--guard-config", recorded)
	ids := simulateStory(t, cs)
	cs.Close()
	checkSimulate(t, ids, recorded, []string{"--dir", root, "--key-file", key}, func() map[string]string { return treeSums(t, root) })
}

// checkSimulate tries the stricter and the looser policy and the bad ones.
func checkSimulate(t *testing.T, ids []string, recorded string, where []string, state func() map[string]string) {
	t.Helper()
	before := state()
	same := runSimulate(t, append([]string{"--guard-config", recorded}, where...)...)
	if same.Replayed != 4 || len(same.Changes) != 0 || same.Unchanged != 4 || same.WithoutQuestion != 0 || len(same.Unverifiable) != 0 {
		t.Fatalf("the recorded policy replayed: %+v", same)
	}
	stricter := runSimulate(t, append([]string{"--guard-config", simulatePolicy(t, "stricter.json", "0.20", 0)}, where...)...)
	want := []string{ids[1] + " agent-007 " + strings.ToLower(sellerA) + " 0.5 USDC allow→review review_above"}
	if got := stricter.lines(); strings.Join(got, "\n") != strings.Join(want, "\n") || stricter.Replayed != 4 || stricter.Transitions["allow→review"] != 1 || len(stricter.Transitions) != 1 {
		t.Fatalf("stricter: got\n%s\nwant\n%s\n%+v", strings.Join(got, "\n"), strings.Join(want, "\n"), stricter)
	}
	looser := runSimulate(t, append([]string{"--guard-config", simulatePolicy(t, "looser.json", "5.00", 1)}, where...)...)
	want = []string{
		ids[2] + " agent-007 " + strings.ToLower(sellerA) + " 2 USDC review→allow review_above",
		ids[3] + " agent-007 " + strings.ToLower(sellerB) + " 0.1 USDC review→allow open_partial",
	}
	if got := looser.lines(); strings.Join(got, "\n") != strings.Join(want, "\n") || looser.Transitions["review→allow"] != 2 {
		t.Fatalf("looser: got\n%s\nwant\n%s\n%+v", strings.Join(got, "\n"), strings.Join(want, "\n"), looser)
	}
	// The text names each change and sums them up.
	out, errOut, code := runCLI(t, append([]string{"policy", "simulate", "--guard-config", simulatePolicy(t, "looser2.json", "5.00", 1)}, where...)...)
	if code != 0 || !strings.Contains(out, "4 questions replayed under ") || !strings.Contains(out, "2 would change: 2 review→allow") ||
		!strings.Contains(out, "agent-007  "+strings.ToLower(sellerB)+"  0.1 USDC  review → allow  open_partial") {
		t.Fatalf("text: %d\n%s\n%s", code, out, errOut)
	}
	// A bad candidate names the file, the field and the problem.
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte("{\n  \"reviewAbove\": \"-1\"\n}\n"), 0o600)
	_, errOut, code = runCLI(t, append([]string{"policy", "simulate", "--guard-config", bad}, where...)...)
	if code != exitUsage || !strings.Contains(errOut, bad+":2:") || !strings.Contains(errOut, "reviewAbove") {
		t.Fatalf("bad policy: %d %s", code, errOut)
	}
	_, errOut, code = runCLI(t, append([]string{"policy", "simulate"}, where...)...)
	if code != exitUsage || !strings.Contains(errOut, "--guard-config") {
		t.Fatalf("no policy: %d %s", code, errOut)
	}
	after := state()
	if len(before) == 0 || !mapsEqual(before, after) {
		var diff []string
		for k, v := range after {
			if before[k] != v {
				diff = append(diff, k)
			}
		}
		sort.Strings(diff)
		t.Fatalf("policy simulate wrote: %v (before %d, after %d)", diff, len(before), len(after))
	}
}

func mapsEqual(a, b map[string]string) bool {
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

// pgRows is every table of the store's schema with a digest of its rows.
func pgRows(t *testing.T, dsn string) map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'")
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range names {
		var n2 int64
		var sum *string
		q := "SELECT count(*), md5(string_agg(t::text, '|' ORDER BY t::text)) FROM " + pgx.Identifier{n}.Sanitize() + " t"
		if err := conn.QueryRow(ctx, q).Scan(&n2, &sum); err != nil {
			t.Fatal(err)
		}
		d := ""
		if sum != nil {
			d = *sum
		}
		out[n] = fmt.Sprintf("%d rows %s", n2, d)
	}
	return out
}

// TestPolicySimulatePostgres is TestPolicySimulateFiles on a PostgreSQL
// store: the questions kept in decision_questions, every table's rows the
// same after.
func TestPolicySimulatePostgres(t *testing.T) {
	dsn := e2eDatabase(t)
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	recorded := simulatePolicy(t, "recorded.json", "1.00", 0)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--agent-id", "agent-007", "--guard-config", recorded, "--store", dsn)
	ids := simulateStory(t, cs)
	cs.Close()
	if n := pgRows(t, dsn)["decision_questions"]; !strings.HasPrefix(n, "4 rows") {
		t.Fatalf("decision_questions: %s, want the 4 questions", n)
	}
	checkSimulate(t, ids, recorded, []string{"--dir", root, "--key-file", key, "--store", dsn}, func() map[string]string {
		m := pgRows(t, dsn)
		for k, v := range treeSums(t, root) {
			m[k] = v
		}
		return m
	})
}

// TestPolicySimulateUnverifiableAndSkipped: a kept question altered by a
// store writer (its amount raised, its seal kept) is listed unverifiable,
// not replayed; one whose seal is recomputed without the key too; a
// decision whose question is gone (as before questions were kept) is
// counted as skipped.
func TestPolicySimulateUnverifiableAndSkipped(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	recorded := simulatePolicy(t, "recorded.json", "1.00", 0)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--agent-id", "agent-007", "--guard-config", recorded)
	ids := simulateStory(t, cs)
	cs.Close()
	qf := filepath.Join(root, "guard", "questions.ndjson")
	data, err := os.ReadFile(qf)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	if len(lines) != 4 {
		t.Fatalf("%d kept questions, want 4:\n%s", len(lines), data)
	}
	// The 0.50 question says 0.05 (under any threshold): its seal breaks.
	lines[1] = bytes.Replace(lines[1], []byte(`"amount":"0.5"`), []byte(`"amount":"0.05"`), 1)
	// The 2.00 question's line dropped, as before questions were kept.
	kept := [][]byte{lines[0], lines[1], lines[3]}
	if err := os.WriteFile(qf, append(bytes.Join(kept, []byte("\n")), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	s := runSimulate(t, "--guard-config", simulatePolicy(t, "stricter.json", "0.20", 0), "--dir", root, "--key-file", key)
	if s.Replayed != 2 || s.WithoutQuestion != 1 || len(s.Unverifiable) != 1 || s.Unverifiable[0].Receipt != ids[1] ||
		!strings.Contains(s.Unverifiable[0].Why, "seal does not verify") || len(s.Changes) != 0 {
		t.Fatalf("tampered store: %+v", s)
	}
	out, _, code := runCLI(t, "policy", "simulate", "--guard-config", simulatePolicy(t, "s2.json", "0.20", 0), "--dir", root, "--key-file", key)
	if code != 0 || !strings.Contains(out, "1 decision skipped: signed before questions were kept") || !strings.Contains(out, "1 kept question not replayed, unverifiable:\n  "+ids[1]+": ") {
		t.Fatalf("text: %d\n%s", code, out)
	}
}

// TestPolicySimulateAfterImport: the kept questions travel with store
// import and store export, line for line, and the copy replays as the
// original did.
func TestPolicySimulateAfterImport(t *testing.T) {
	dsn := e2eDatabase(t)
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	recorded := simulatePolicy(t, "recorded.json", "1.00", 0)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--agent-id", "agent-007", "--guard-config", recorded)
	ids := simulateStory(t, cs)
	cs.Close()
	if out, errOut, code := runCLI(t, "store", "import", "--dir", root, "--store", dsn); code != 0 {
		t.Fatalf("store import: %d %s %s", code, out, errOut)
	}
	stricter := simulatePolicy(t, "stricter.json", "0.20", 0)
	s := runSimulate(t, "--guard-config", stricter, "--dir", root, "--key-file", key, "--store", dsn)
	if s.Replayed != 4 || s.WithoutQuestion != 0 || len(s.Changes) != 1 || s.Changes[0].Receipt != ids[1] {
		t.Fatalf("the imported store: %+v", s)
	}
	back := filepath.Join(t.TempDir(), "back")
	if out, errOut, code := runCLI(t, "store", "export", "--store", dsn, "--dir", back); code != 0 {
		t.Fatalf("store export: %d %s %s", code, out, errOut)
	}
	a, _ := os.ReadFile(filepath.Join(root, "guard", "questions.ndjson"))
	b, err := os.ReadFile(filepath.Join(back, "guard", "questions.ndjson"))
	if err != nil || len(a) == 0 || !bytes.Equal(a, b) {
		t.Fatalf("the kept questions after import and export: %v\n%s\nwant\n%s", err, b, a)
	}
}
