package main

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// The reviewer console with the real binary: the operator's `reviewer
// passkey add` prints a one-time link and waits; the reviewer's browser
// (a software authenticator making real WebAuthn bytes) registers; the
// command writes the passkey into the trusted reviewers file. The reviewer
// signs in, approves the agent's review with one assertion; the agent's
// identical question is honoured once; get_review_status says the passkey
// proved it; a second review is rejected; audit agrees (exit 0). A passkey
// nobody enrolled cannot sign in.
func TestConsoleEndToEnd(t *testing.T) {
	root := loopRoot(t)
	reviewers := filepath.Join(t.TempDir(), "reviewers.json")
	port := freePort(t)
	base := "http://localhost:" + port + "/console/"
	var serverErr lockedBuffer
	cs := mcpSession(t, &serverErr, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"), "--agent-id", "loop-agent",
		"--reviewers", reviewers, "--console", "--console-addr", "127.0.0.1:"+port)

	// Enrolment: the command prints the link and waits.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	add := exec.CommandContext(ctx, binPath, "reviewer", "passkey", "add", "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--yes", "--wait", "1m")
	stdout, err := add.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var addErr lockedBuffer
	add.Stderr = &addErr
	if err := add.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	var link string
	var out strings.Builder
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), base+"enrol?t=") {
			link = sc.Text()
			break
		}
	}
	if link == "" {
		t.Fatalf("no link printed: %s %s", out.String(), addErr.String())
	}
	pat, _ := softauthn.New()
	b, err := softauthn.NewBrowser(base, pat)
	if err != nil {
		t.Fatalf("%v (server: %s)", err, serverErr.String())
	}
	if code, page, _ := b.Get(strings.TrimPrefix(link, base)); code != 200 || !strings.Contains(page, "Register passkey") {
		t.Fatalf("enrol page: %d %s", code, page)
	}
	token := link[strings.Index(link, "t=")+2:]
	fp, err := b.Enrol(strings.ReplaceAll(token, "%2F", "/"))
	if err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
	}
	if err := add.Wait(); err != nil {
		t.Fatalf("passkey add: %v\n%s\n%s", err, out.String(), addErr.String())
	}
	if !strings.Contains(out.String(), "fingerprint: "+fp) || !strings.Contains(out.String(), "(added") {
		t.Fatalf("passkey add did not show the page's fingerprint %s:\n%s", fp, out.String())
	}

	// A passkey nobody enrolled cannot sign in.
	mallory, _ := softauthn.New()
	mb, _ := softauthn.NewBrowser(base, mallory)
	if err := mb.SignIn(); err == nil {
		t.Fatal("an unenrolled passkey signed in")
	}

	ask := func(amount string) checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": amount}), &a)
		return a
	}
	var first map[string]any
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.1"}), &first)
	r1 := checkAnswer{Decision: first["decision"].(string), ReviewID: first["review_id"].(string)}
	if r1.Decision != "review" || first["review_url"] != base+"reviews/"+r1.ReviewID {
		t.Fatalf("first answer (review_url %v): %+v", first["review_url"], first)
	}
	if err := b.SignIn(); err != nil {
		t.Fatal(err)
	}
	if code, page, _ := b.Get(""); code != 200 || !strings.Contains(page, r1.ReviewID) {
		t.Fatalf("queue: %d %s", code, page)
	}
	if res, err := b.Decide(r1.ReviewID, "approved", "fine from the console"); err != nil || res["status"] != "approved" || res["decided_by"] != "pat" {
		t.Fatalf("approve: %v %v", res, err)
	}
	if a := ask("0.1"); a.Decision != "allow" || !hasRule(a, "human_approved") {
		t.Fatalf("the approved question: %+v", a)
	}
	if a := ask("0.1"); a.Decision == "allow" {
		t.Fatalf("the approval was honoured twice: %+v", a)
	}
	var st map[string]any
	decodeStructured(t, callTool(t, cs, "get_review_status", map[string]any{"review_id": r1.ReviewID}), &st)
	if st["status"] != "approved" || st["decided_by"] != "pat" || st["decided_with"] != "passkey" || st["tampered"] == true || st["review_url"] != base+"reviews/"+r1.ReviewID {
		t.Fatalf("get_review_status: %v", st)
	}
	r2 := ask("0.2")
	if res, err := b.Decide(r2.ReviewID, "rejected", "no"); err != nil || res["status"] != "rejected" {
		t.Fatalf("reject: %v %v", res, err)
	}
	if a := ask("0.2"); a.Decision != "block" || !hasRule(a, "human_rejected") {
		t.Fatalf("the rejected question: %+v", a)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", root, "--reviewers", reviewers); code != 0 {
		t.Fatalf("audit: %d\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "review", "list", "--all", "--dir", root, "--reviewers", reviewers); code != 0 || strings.Contains(out, "unverified") {
		t.Fatalf("review list: %d\n%s\n%s", code, out, errOut)
	}
	// The operator removes the passkey: the decisions no longer count.
	if out, errOut, code := runCLI(t, "reviewer", "passkey", "remove", "--id", "pat", "--reviewers", reviewers); code != 0 {
		t.Fatalf("remove: %d %s %s", code, out, errOut)
	}
	decodeStructured(t, callTool(t, cs, "get_review_status", map[string]any{"review_id": r1.ReviewID}), &st)
	if st["status"] == "approved" {
		t.Fatalf("an approval by a removed passkey still counts: %v", st)
	}
}
