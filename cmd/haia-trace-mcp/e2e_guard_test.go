package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type checkAnswer struct {
	Decision string `json:"decision"`
	Reasons  []struct {
		Rule     string `json:"rule"`
		Detail   string `json:"detail"`
		Evidence []struct {
			RunID       string `json:"run_id"`
			OperationID string `json:"operation_id"`
		} `json:"evidence"`
	} `json:"reasons"`
	ReviewID  string `json:"review_id"`
	ReceiptID string `json:"receipt_id"`
}

// chainFile returns the server's single decision chain under root and its
// length; the test reviewer's own chain (her signed decisions) and the
// spend ledger's start (its chain "ledger-<kid>") are left out.
func chainFile(t *testing.T, root string) (string, int) {
	t.Helper()
	out, errOut, code := runCLI(t, "chain", "list", "--dir", root)
	if code != 0 {
		t.Fatalf("chain list: %d %s", code, errOut)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(l, aliceChains(t).ChainID()+"\t") && !strings.HasPrefix(l, "ledger-") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("want one server chain beside the reviewer's, got %q", out)
	}
	f := strings.Split(lines[0], "\t")
	if len(f) != 5 {
		t.Fatalf("chain list line %q", lines[0])
	}
	var n int
	fmt.Sscan(f[2], &n)
	return f[1], n
}

func verifyChain(t *testing.T, root, chain string, extra ...string) (string, int) {
	t.Helper()
	args := append([]string{"verify", chain, "--keyring", filepath.Join(root, "guard", "keyring.json")}, extra...)
	out, errOut, code := runCLI(t, args...)
	return out + errOut, code
}

// TestStdioGuardStory plays the story end to end: two sellers, one never
// settles; the guard says review for it with that operation as evidence; a
// human rejects from the CLI; the agent reads the decision; the settled
// seller gets allow; the decision chain verifies, across a restart too.
func TestStdioGuardStory(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--agent-id", "agent-007")

	var first checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10", "asset": "USDC"}), &first)
	if first.Decision != "review" || first.ReviewID == "" || first.ReceiptID == "" {
		t.Fatalf("seller B: %+v", first)
	}
	var evidence []string
	for _, r := range first.Reasons {
		if r.Rule == "open_partial" {
			for _, e := range r.Evidence {
				evidence = append(evidence, e.RunID+"/"+e.OperationID)
			}
		}
	}
	if strings.Join(evidence, ",") != "run-1/op-b" {
		t.Fatalf("open_partial evidence %v, want run-1/op-b only (op-c paid nothing): %+v", evidence, first.Reasons)
	}
	if last := first.Reasons[len(first.Reasons)-1]; last.Rule != "history" {
		t.Fatalf("reasons must end with history: %+v", first.Reasons)
	}
	var again checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": strings.ToLower(sellerB), "amount": "0.1"}), &again)
	if again.ReviewID != first.ReviewID {
		t.Fatalf("same question while its review is pending opened review %s, want %s", again.ReviewID, first.ReviewID)
	}

	out, errOut, code := runCLI(t, "review", "reject", first.ReviewID, "--note", "B never settled op-b", "--by", "alice", "--dir", root)
	if code != 0 {
		t.Fatalf("review reject: %d %s %s", code, out, errOut)
	}
	_, errOut, code = runCLI(t, "review", "approve", first.ReviewID, "--dir", root)
	if code != 4 || !strings.Contains(errOut, "already") {
		t.Fatalf("second decision: code %d, %s", code, errOut)
	}

	var status map[string]any
	decodeStructured(t, callTool(t, cs, "get_review_status", map[string]any{"review_id": first.ReviewID}), &status)
	if status["status"] != "rejected" || status["note"] != "B never settled op-b" || status["counterparty"] != strings.ToLower(sellerB) {
		t.Fatalf("status: %v", status)
	}
	if rs, _ := status["receipts"].([]any); len(rs) != 3 || status["terms_receipt"] != rs[0] {
		t.Fatalf("review receipts %v, want the terms the server signed, the guard's answer (given twice, listed once) and the human decision", status["receipts"])
	}

	var allow checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": "0.25"}), &allow)
	if allow.Decision != "allow" || allow.ReviewID != "" {
		t.Fatalf("seller A: %+v", allow)
	}
	var walked checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": "https://b.example.net/data", "amount": "5.01"}), &walked)
	if walked.Decision != "review" {
		t.Fatalf("host counterparty over the limit: %+v", walked)
	}

	bad := []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"amount": "1"}, "counterparty is required"},
		{map[string]any{"counterparty": "not a host!", "amount": "1"}, "counterparty"},
		{map[string]any{"counterparty": sellerA, "amount": true}, "amount must be a decimal string"},
		{map[string]any{"counterparty": sellerA, "amount": json.Number("1e2")}, "exponent"},
		{map[string]any{"counterparty": sellerA, "amount": "1", "approve": true}, "unknown argument"},
	}
	for _, c := range bad {
		res := callTool(t, cs, "check_before_pay", c.args)
		if !res.IsError || !strings.Contains(resultText(res), c.want) {
			t.Errorf("%v: %q, want an error mentioning %q", c.args, resultText(res), c.want)
		}
	}
	var unknownAsset checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": "0.25", "asset": "DOGE"}), &unknownAsset)
	if unknownAsset.Decision != "review" || !hasRule(unknownAsset, "unknown_asset") {
		t.Fatalf("unknown asset: %+v", unknownAsset)
	}
	res := callTool(t, cs, "get_review_status", map[string]any{"review_id": "00000000-0000-4000-8000-000000000000"})
	if !res.IsError || !strings.Contains(resultText(res), "no review") {
		t.Fatalf("unknown review: %q", resultText(res))
	}

	chain, n := chainFile(t, root)
	if got, code := verifyChain(t, root, chain); code != 0 || !strings.HasPrefix(got, "VALID") {
		t.Fatalf("verify: %d %s", code, got)
	}

	// A restart continues the same chain.
	cs.Close()
	cs2 := mcpSession(t, nil, "--dir", root, "--key-file", key)
	decodeStructured(t, callTool(t, cs2, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": "0.01"}), &allow)
	chain2, n2 := chainFile(t, root)
	if chain2 != chain || n2 != n+1 {
		t.Fatalf("after restart: chain %s len %d, want %s len %d", chain2, n2, chain, n+1)
	}
	if got, code := verifyChain(t, root, chain); code != 0 {
		t.Fatalf("verify after restart: %d %s", code, got)
	}

	// Export and a checkpoint: other verifiers read the array form, and the
	// checkpoint catches a cut tail.
	arr, errOut, code := runCLI(t, "chain", "export", filepath.Base(strings.TrimSuffix(chain, ".ndjson")), "--dir", root)
	if code != 0 {
		t.Fatalf("export: %s", errOut)
	}
	arrPath := filepath.Join(t.TempDir(), "chain.json")
	os.WriteFile(arrPath, []byte(arr), 0o644)
	if got, code := verifyChain(t, root, arrPath); code != 0 {
		t.Fatalf("verify export: %d %s", code, got)
	}
	cp, errOut, code := runCLI(t, "chain", "checkpoint", filepath.Base(strings.TrimSuffix(chain, ".ndjson")), "--dir", root, "--key-file", key)
	if code != 0 {
		t.Fatalf("checkpoint: %s", errOut)
	}
	// A key that does not sign the chain cannot checkpoint it.
	other := filepath.Join(t.TempDir(), "other.pem")
	if _, errOut, code := runCLI(t, "chain", "checkpoint", filepath.Base(strings.TrimSuffix(chain, ".ndjson")), "--dir", root, "--key-file", other); code != 2 || !strings.Contains(errOut, "not by this key") {
		t.Fatalf("checkpoint with another key: %d %s", code, errOut)
	}
	cpPath := filepath.Join(t.TempDir(), "checkpoint.json")
	os.WriteFile(cpPath, []byte(cp), 0o644)
	if got, code := verifyChain(t, root, chain, "--checkpoint", cpPath); code != 0 {
		t.Fatalf("verify with checkpoint: %d %s", code, got)
	}
	data, _ := os.ReadFile(chain)
	lines := bytes.SplitAfter(bytes.TrimSpace(data), []byte("\n"))
	cut := filepath.Join(t.TempDir(), "cut.ndjson")
	os.WriteFile(cut, bytes.Join(lines[:len(lines)-1], nil), 0o644)
	if got, code := verifyChain(t, root, cut, "--checkpoint", cpPath); code != 2 {
		t.Fatalf("cut tail with checkpoint: %d %s, want 2 TAMPERED", code, got)
	}
}

func hasRule(a checkAnswer, rule string) bool {
	for _, r := range a.Reasons {
		if r.Rule == rule {
			return true
		}
	}
	return false
}

// TestChainStaysLinearAcrossProcesses has two server processes answer many
// questions at once; the chain stays one valid line.
func TestChainStaysLinearAcrossProcesses(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	// Create the key once, so both processes use it.
	runCLI(t, "chain", "list", "--dir", root)
	a := mcpSession(t, nil, "--dir", root, "--key-file", key)
	b := mcpSession(t, nil, "--dir", root, "--key-file", key)
	var wg sync.WaitGroup
	const each = 12
	for _, s := range []*mcp.ClientSession{a, b} {
		for j := 0; j < each; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var ans checkAnswer
				decodeStructured(t, callTool(t, s, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": fmt.Sprintf("0.0%d", j%9+1)}), &ans)
			}()
		}
	}
	wg.Wait()
	chain, n := chainFile(t, root)
	if n != 2*each {
		t.Fatalf("chain has %d receipts, want %d", n, 2*each)
	}
	if got, code := verifyChain(t, root, chain); code != 0 {
		t.Fatalf("verify: %d %s", code, got)
	}
}

// TestSignerProcessFailsClosed signs through a real signer process, then
// kills it: the next decision is an error, no receipt is written and the
// chain stays valid.
func TestSignerProcessFailsClosed(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "signer.sock")
	signer := exec.Command(binPath, "signer", "--key-file", filepath.Join(dir, "key.pem"), "--listen", "unix:"+sock)
	var serr bytes.Buffer
	signer.Stderr = &serr
	if err := signer.Start(); err != nil {
		t.Fatal(err)
	}
	defer signer.Process.Kill()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st, err := os.Stat(sock); err == nil {
			if st.Mode().Perm() != 0o600 {
				t.Fatalf("socket mode %v, want 0600", st.Mode().Perm())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("signer did not listen: %s", serr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cs := mcpSession(t, nil, "--dir", root, "--signer", "unix:"+sock, "--params-key-file", filepath.Join(dir, "params.pem"))
	var ans checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": "0.10"}), &ans)
	if ans.Decision != "allow" || ans.ReceiptID == "" {
		t.Fatalf("through the signer: %+v", ans)
	}
	if err := signer.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	signer.Wait()
	res := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": "0.20"})
	if !res.IsError || !strings.Contains(resultText(res), "fail closed") {
		t.Fatalf("after the signer died: isError=%v %q", res.IsError, resultText(res))
	}
	chain, n := chainFile(t, root)
	if n != 1 {
		t.Fatalf("chain length %d after a failed signature, want 1", n)
	}
	if got, code := verifyChain(t, root, chain); code != 0 {
		t.Fatalf("verify: %d %s", code, got)
	}
}

// TestSameQuestionAcrossServerProcesses has three real server processes,
// each with several concurrent callers, ask the same question at once:
// exactly one review opens and every answer carries its id.
func TestSameQuestionAcrossServerProcesses(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "key.pem")
	runCLI(t, "chain", "checkpoint", "none", "--dir", root, "--key-file", key) // creates the key once; the chain does not exist
	var sessions []*mcp.ClientSession
	for i := 0; i < 3; i++ {
		sessions = append(sessions, mcpSession(t, nil, "--dir", root, "--key-file", key))
	}
	var mu sync.Mutex
	ids := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, s := range sessions {
		for g := 0; g < 5; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var ans checkAnswer
				decodeStructured(t, callTool(t, s, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.30"}), &ans)
				mu.Lock()
				ids[ans.ReviewID]++
				mu.Unlock()
			}()
		}
	}
	close(start)
	wg.Wait()
	if len(ids) != 1 {
		t.Fatalf("15 concurrent askers in 3 processes got review ids %v, want exactly one", ids)
	}
	for id, n := range ids {
		if id == "" || n != 15 {
			t.Fatalf("answers %v: every answer must carry the one review id", ids)
		}
	}
	out, _, code := runCLI(t, "review", "list", "--dir", root, "--json")
	if code != 0 || strings.Count(out, `"created_at"`) != 1 {
		t.Fatalf("review log: %s", out)
	}
}

// /readyz says not ready, and why, while the signer process is down.
func TestReadyzWhileTheSignerIsDown(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "signer.sock")
	signer := exec.Command(binPath, "signer", "--key-file", filepath.Join(dir, "key.pem"), "--listen", "unix:"+sock)
	if err := signer.Start(); err != nil {
		t.Fatal(err)
	}
	defer signer.Process.Kill()
	waitFor(t, "the signer socket", func() bool { _, err := os.Stat(sock); return err == nil })
	p := startHTTPBinary(t, "--dir", root, "--signer", "unix:"+sock, "--params-key-file", filepath.Join(dir, "params.pem"), "--http-insecure-no-auth")
	ready := func() (int, string) { return getText(t, p.base+"/readyz") }
	if code, body := ready(); code != http.StatusOK {
		t.Fatalf("readyz with the signer up: %d %q", code, body)
	}
	signer.Process.Signal(syscall.SIGKILL)
	signer.Wait()
	if code, body := ready(); code != http.StatusServiceUnavailable || !strings.Contains(body, "signer does not answer") {
		t.Fatalf("readyz with the signer down: %d %q", code, body)
	}
}
