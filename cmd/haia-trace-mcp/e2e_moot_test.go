package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// review list and review show mark a pending review moot exactly when
// get_review_status does — the engine's one judgement, under the policy
// the server recorded, with the reservations its key seals — and say so
// when they cannot judge it here (another configuration directory: the
// server's key is not found, so the reservation held does not verify).
func TestReviewCommandsMarkMootReviews(t *testing.T) {
	root := loopRoot(t)
	cfgDir := t.TempDir()
	env := []string{"HAIA_CONFIG_DIR=" + cfgDir}
	policy := filepath.Join(t.TempDir(), "policy.json")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(policy+".tmp", []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(policy+".tmp", policy); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"reviewAbove": "0.05"}`)
	stderr := &lockedBuffer{}
	// The server keeps its key where the review commands look for it.
	cs, cmd := mcpSessionCmd(t, stderr, "--dir", root, "--guard-config", policy, "--key-file", filepath.Join(cfgDir, "signing-key.pem"))
	const payee = "0x00000000000000000000000000000000000000e5"
	ask := func(amount string) checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": payee, "amount": amount}), &a)
		return a
	}
	if a := ask("0.01"); a.Decision != "allow" {
		t.Fatalf("0.01 under reviewAbove 0.05: %+v", a)
	}
	rv := ask("0.10")
	if rv.Decision != "review" || rv.ReviewID == "" {
		t.Fatalf("0.10 under reviewAbove 0.05: %+v", rv)
	}
	status := func() bool {
		t.Helper()
		var st struct {
			Status string `json:"status"`
			Moot   bool   `json:"moot"`
		}
		decodeStructured(t, callTool(t, cs, "get_review_status", map[string]any{"review_id": rv.ReviewID}), &st)
		if st.Status != "pending" {
			t.Fatalf("get_review_status: %+v", st)
		}
		return st.Moot
	}
	type listed struct {
		Reviews []struct {
			ID   string `json:"review_id"`
			Moot bool   `json:"moot"`
		} `json:"reviews"`
		MootNotJudged string `json:"moot_not_judged"`
	}
	list := func(env []string) (listed, string, string) {
		t.Helper()
		var l listed
		out, errOut, code := runCLIEnv(t, env, "review", "list", "--dir", root, "--json")
		if err := json.Unmarshal([]byte(out), &l); code != 0 || err != nil || len(l.Reviews) != 1 || l.Reviews[0].ID != rv.ReviewID {
			t.Fatalf("review list --json: %d %v %s %s", code, err, out, errOut)
		}
		text, _, code := runCLIEnv(t, env, "review", "list", "--dir", root)
		if code != 0 {
			t.Fatalf("review list: %d %s", code, text)
		}
		show, _, code := runCLIEnv(t, env, "review", "show", rv.ReviewID, "--dir", root)
		if code != 0 {
			t.Fatalf("review show: %d %s", code, show)
		}
		return l, text, show
	}

	// While the question still needs a review: not moot, anywhere.
	if status() {
		t.Fatal("get_review_status: moot while the question still needs a review")
	}
	l, text, show := list(env)
	if l.Reviews[0].Moot || l.MootNotJudged != "" || strings.Contains(text, "MOOT") || strings.Contains(show, "MOOT") || strings.Contains(show, "moot:") {
		t.Fatalf("not moot yet:\n%+v\n%s\n%s", l, text, show)
	}

	// The operator raises reviewAbove: the question would now be allowed.
	write(`{"reviewAbove": "1.00"}`)
	n := strings.Count(stderr.String(), "SIGHUP: guard policy reloaded")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the policy to reload", func() bool { return strings.Count(stderr.String(), "SIGHUP: guard policy reloaded") > n })
	if !status() {
		t.Fatal("get_review_status: not moot once the question would be allowed")
	}
	l, text, show = list(env)
	if !l.Reviews[0].Moot || l.MootNotJudged != "" {
		t.Fatalf("review list --json once moot: %+v", l)
	}
	if !strings.Contains(text, "pending MOOT") || !strings.Contains(text, "1 pending reviews are MOOT") {
		t.Fatalf("review list once moot:\n%s", text)
	}
	if !strings.Contains(show, "MOOT: this question would now be answered without review") {
		t.Fatalf("review show once moot:\n%s", show)
	}
	var shown struct {
		Moot bool `json:"moot"`
	}
	if out, _, code := runCLIEnv(t, env, "review", "show", rv.ReviewID, "--dir", root, "--json"); code != 0 || json.Unmarshal([]byte(out), &shown) != nil || !shown.Moot {
		t.Fatalf("review show --json once moot: %d %s", code, out)
	}

	// Where the server's key is not found, the allow's reservation does not
	// verify: nothing is shown moot, and the commands say why.
	other := []string{"HAIA_CONFIG_DIR=" + t.TempDir()}
	l, text, show = list(other)
	if l.Reviews[0].Moot || !strings.Contains(l.MootNotJudged, "do not verify") || strings.Contains(text, "MOOT") || !strings.Contains(show, "moot: not judged here") {
		t.Fatalf("without the server's key:\n%+v\n%s\n%s", l, text, show)
	}
	if _, errOut, _ := runCLIEnv(t, other, "review", "list", "--dir", root); !strings.Contains(errOut, "which pending reviews are moot is not shown") {
		t.Fatalf("review list without the server's key says nothing on stderr: %s", errOut)
	}
}
