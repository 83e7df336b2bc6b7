package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
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
	// The notification hook records its environment and what it read.
	hookOut := filepath.Join(t.TempDir(), "hook")
	hook := filepath.Join(t.TempDir(), "hook.sh")
	if err := os.WriteFile(hook, []byte(fmt.Sprintf("#!/bin/sh\n{ printf '%%s\\n' \"$HAIA_REVIEW_ID $HAIA_REVIEW_URL\"; cat; echo; } >> %q\n", hookOut)), 0o755); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "signing.pem")
	cs := mcpSession(t, &serverErr, "--dir", root, "--key-file", key, "--agent-id", "loop-agent",
		"--reviewers", reviewers, "--console", "--console-addr", "127.0.0.1:"+port, "--notify-command", hook)

	// Enrolment: the command prints the link and waits.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// pat is granted tenant acme; a server of one root reads no grant.
	en := startEnrol(ctx, t, base, "--id", "pat", "--tenant", "acme", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "1m")
	link := en.link
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
	if err := en.wait(); err != nil {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}
	if !strings.Contains(en.out.String(), "fingerprint: "+fp) || !strings.Contains(en.out.String(), "(added") {
		t.Fatalf("passkey add did not show the page's fingerprint %s:\n%s", fp, en.out.String())
	}
	if g, err := reviewlog.LoadGrants(reviewers); err != nil || !reflect.DeepEqual(g, reviewlog.Grants{"pat": {"acme"}}) {
		t.Fatalf("passkey add --tenant acme wrote grants %v (%v)", g, err)
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
	res1 := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.1"})
	decodeStructured(t, res1, &first)
	r1 := checkAnswer{Decision: first["decision"].(string), ReviewID: first["review_id"].(string)}
	link1 := base + "reviews/" + r1.ReviewID
	if r1.Decision != "review" || first["review_url"] != link1 {
		t.Fatalf("first answer (review_url %v): %+v", first["review_url"], first)
	}
	if text := resultText(res1); !strings.Contains(text, "A reviewer decides at "+link1+"\n") {
		t.Fatalf("the answer's text does not give the link:\n%s", text)
	}
	// The hook got the link in its environment and in the review it read.
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(hookOut)
		if strings.Contains(string(data), r1.ReviewID+" "+link1+"\n") && strings.Contains(string(data), `"review_url":"`+link1+`"`) &&
			strings.Contains(string(data), "Decide at "+link1+" or with") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the notification hook did not get the link:\n%s\n%s", data, serverErr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// review list and show give the page with the server's console URL.
	out1, errOut1, code1 := runCLI(t, "review", "list", "--dir", root, "--reviewers", reviewers, "--console-url", base)
	if code1 != 0 || !strings.Contains(out1, "LINK") || !strings.Contains(out1, link1) {
		t.Fatalf("review list --console-url: %d\n%s\n%s", code1, out1, errOut1)
	}
	if out, errOut, code := runCLI(t, "review", "show", r1.ReviewID, "--dir", root, "--reviewers", reviewers, "--console-url", base); code != 0 || !strings.Contains(out, "console: "+link1+"\n") {
		t.Fatalf("review show --console-url: %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, "review", "list", "--dir", root, "--reviewers", reviewers, "--console-url", "http://reviews.example/console/"); code != exitUsage || !strings.Contains(errOut, "TLS") {
		t.Fatalf("review list with a plain-http public console URL: %d %s", code, errOut)
	}
	if err := b.SignIn(); err != nil {
		t.Fatal(err)
	}
	if code, page, _ := b.Get(""); code != 200 || !strings.Contains(page, r1.ReviewID) {
		t.Fatalf("queue: %d %s", code, page)
	}
	// The review page draws the guard's recent payments (the loop root's
	// payments to the seller), as inline SVG.
	if code, page, _ := b.Get("reviews/" + r1.ReviewID); code != 200 || !strings.Contains(page, `<svg class="timeline" role="img"`) ||
		!strings.Contains(page, `to this review&#39;s payee`) || !strings.Contains(page, "USDC") {
		t.Fatalf("review page without the timeline: %d %s", code, page)
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

// elicitingSession connects a client that answers elicitations into got
// and declares the elicitation modes caps names.
func elicitingSession(t *testing.T, caps *mcp.ElicitationCapabilities, got chan<- *mcp.ElicitParams, stderr *lockedBuffer, args ...string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-eliciting", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: caps},
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			got <- req.Params
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
	})
	cmd := exec.Command(binPath, args...)
	cmd.Stderr = stderr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v (stderr: %s)", err, stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestConsoleAsksClientToShowLink: a client that declares URL-mode
// elicitation is asked to show the review's console page when an answer is
// "review"; one that declares only form mode is sent nothing.
func TestConsoleAsksClientToShowLink(t *testing.T) {
	for _, c := range []struct {
		name string
		caps *mcp.ElicitationCapabilities
		want bool
	}{
		{"url mode declared", &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}, true},
		{"form mode only", &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := loopRoot(t)
			port := freePort(t)
			base := "http://localhost:" + port + "/console/"
			got := make(chan *mcp.ElicitParams, 4)
			var serverErr lockedBuffer
			cs := elicitingSession(t, c.caps, got, &serverErr, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"), "--agent-id", "loop-agent",
				"--reviewers", filepath.Join(t.TempDir(), "reviewers.json"), "--console", "--console-addr", "127.0.0.1:"+port)
			var a map[string]any
			decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.1"}), &a)
			if a["decision"] != "review" {
				t.Fatalf("answer: %v", a)
			}
			link := base + "reviews/" + a["review_id"].(string)
			// An allow is never followed by a link.
			decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.1", "dry_run": true}), &a)
			select {
			case p := <-got:
				if !c.want {
					t.Fatalf("a client without URL mode was sent %+v", p)
				}
				if p.Mode != "url" || p.URL != link || p.ElicitationID != "review:"+strings.TrimPrefix(link, base+"reviews/") || !strings.Contains(p.Message, "passkey") {
					t.Fatalf("elicitation %+v, want url mode with %s", p, link)
				}
			case <-time.After(3 * time.Second):
				if c.want {
					t.Fatalf("no elicitation arrived (server: %s)", serverErr.String())
				}
			}
			select {
			case p := <-got:
				t.Fatalf("a second elicitation (after a dry run): %+v", p)
			case <-time.After(500 * time.Millisecond):
			}
			// The answer the client got after showing the link is the one
			// computed on the first call (the engine was asked once).
			if kept := strings.Contains(serverErr.String(), `"answer_kept":true`); kept != c.want || strings.Count(serverErr.String(), `"outcome":"opened"`) != 1 ||
				strings.Count(serverErr.String(), `"msg":"check_before_pay"`) != 1 {
				t.Fatalf("the engine was not asked exactly once, or the kept answer was not used:\n%s", serverErr.String())
			}
		})
	}
}

// enrolThroughCommand runs `reviewer passkey add` for id against the
// console at base (whose server signs with key), registers a fresh
// software passkey through the printed link (with the command's extra
// flags) and returns a browser holding it.
func enrolThroughCommand(t *testing.T, base, reviewers, key, id string, extra ...string) *softauthn.Browser {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--id", id, "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "1m"}, extra...)
	en := startEnrol(ctx, t, base, args...)
	link := en.link
	a, _ := softauthn.New()
	b, err := softauthn.NewBrowser(base, a)
	if err != nil {
		t.Fatal(err)
	}
	token := link[strings.Index(link, "t=")+2:]
	if _, err := b.Enrol(strings.ReplaceAll(token, "%2F", "/")); err != nil {
		t.Fatal(err)
	}
	if err := en.wait(); err != nil || !strings.Contains(en.out.String(), "(added") {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}
	return b
}

// enrolment is a running `reviewer passkey add` that has printed its
// one-time link.
type enrolment struct {
	cmd  *exec.Cmd
	sc   *bufio.Scanner
	out  strings.Builder
	errb lockedBuffer
	link string
}

// startEnrol starts `reviewer passkey add ARGS…` and reads its output up to
// the enrolment link under base.
func startEnrol(ctx context.Context, t *testing.T, base string, args ...string) *enrolment {
	t.Helper()
	return startEnrolEnv(ctx, t, base, nil, args...)
}

// startEnrolEnv is startEnrol with variables added to the environment.
func startEnrolEnv(ctx context.Context, t *testing.T, base string, env []string, args ...string) *enrolment {
	t.Helper()
	en := &enrolment{cmd: exec.CommandContext(ctx, binPath, append([]string{"reviewer", "passkey", "add"}, args...)...)}
	if env != nil {
		en.cmd.Env = append(os.Environ(), env...)
	}
	stdout, err := en.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	en.cmd.Stderr = &en.errb
	if err := en.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	en.sc = bufio.NewScanner(stdout)
	for en.sc.Scan() {
		en.out.WriteString(en.sc.Text() + "\n")
		if strings.HasPrefix(en.sc.Text(), base+"enrol?t=") {
			en.link = en.sc.Text()
			break
		}
	}
	if en.link == "" {
		t.Fatalf("no link printed: %s %s", en.out.String(), en.errb.String())
	}
	return en
}

// wait reads the rest of the command's output and waits for it to end.
func (en *enrolment) wait() error {
	for en.sc.Scan() {
		en.out.WriteString(en.sc.Text() + "\n")
	}
	return en.cmd.Wait()
}

// TestConsoleOnHTTPListener: with --http and no --console-addr the console
// is served on the MCP server's own listener, behind its Host guard; the
// review answers over HTTP link to it; a reviewer decides there.
func TestConsoleOnHTTPListener(t *testing.T) {
	root := loopRoot(t)
	reviewers := filepath.Join(t.TempDir(), "reviewers.json")
	port := freePort(t)
	base := "http://localhost:" + port + "/console/"
	key := filepath.Join(t.TempDir(), "signing.pem")
	p := startHTTPCommand(t, "--http", "127.0.0.1:"+port, "--http-insecure-no-auth", "--dir", root, "--key-file", key,
		"--agent-id", "loop-agent", "--reviewers", reviewers, "--console")
	if !strings.Contains(p.logs(), "serving the reviewer console on the --http listener") {
		t.Fatalf("no console on the listener:\n%s", p.logs())
	}
	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "Sign in with passkey") || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("console on the listener: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// The listener's DNS-rebinding guard covers the console too.
	req, _ := http.NewRequest("GET", base, nil)
	req.Host = "evil.example:" + port
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a foreign Host reached the console: %v %v", resp, err)
	}

	b := enrolThroughCommand(t, base, reviewers, key, "pat")
	cs, err := httpSession(t, p.resource, func() string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var a map[string]any
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.1"}), &a)
	id, _ := a["review_id"].(string)
	if a["decision"] != "review" || a["review_url"] != base+"reviews/"+id {
		t.Fatalf("answer over HTTP: %v", a)
	}
	if err := b.SignIn(); err != nil {
		t.Fatalf("sign in: %v\n%s", err, p.logs())
	}
	if res, err := b.Decide(id, "approved", "from the console on the MCP listener"); err != nil || res["status"] != "approved" {
		t.Fatalf("approve: %v %v", res, err)
	}
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.1"}), &a)
	if a["decision"] != "allow" {
		t.Fatalf("the approved question: %v", a)
	}

	// On --http port 0 the console's address cannot be known: refused.
	cmd := exec.Command(binPath, "--http", "127.0.0.1:0", "--http-insecure-no-auth", "--dir", root, "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--console")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() == 0 || !strings.Contains(string(out), "--console-url") {
		t.Fatalf("console on port 0: %d %s", cmd.ProcessState.ExitCode(), out)
	}
}

// TestConsoleLinkAndProxyFlags: `reviewer passkey add` signs the link with
// a key derived from the server's; given another key (or none), it asks
// the console first and stops before printing a link nobody could use.
// The trusted-proxy flags do nothing without --console or a proxy, and a
// proxy that is no address is refused.
func TestConsoleLinkAndProxyFlags(t *testing.T) {
	root := loopRoot(t)
	reviewers := filepath.Join(t.TempDir(), "reviewers.json")
	port := freePort(t)
	base := "http://localhost:" + port + "/console/"
	var serverErr lockedBuffer
	mcpSession(t, &serverErr, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"), "--agent-id", "loop-agent",
		"--reviewers", reviewers, "--console", "--console-addr", "127.0.0.1:"+port)
	other := filepath.Join(t.TempDir(), "other.pem")
	if _, _, err := noa.LoadOrCreateKeyFile(other); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, "reviewer", "passkey", "add", "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--key-file", other, "--yes", "--wait", "10s")
	if code != exitFail || strings.Contains(out, "enrol?t=") || !strings.Contains(errOut, "refuses a link signed with this key") || !strings.Contains(errOut, "--key-file") {
		t.Fatalf("passkey add with another key: %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code = runCLI(t, "reviewer", "passkey", "add", "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--key-file", filepath.Join(t.TempDir(), "none.pem"), "--yes")
	if code != exitFail || strings.Contains(out, "enrol?t=") || !strings.Contains(errOut, "--key-file") {
		t.Fatalf("passkey add with a missing key: %d\n%s\n%s", code, out, errOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--console-trusted-proxy", "10.0.0.5"}, "--console-trusted-proxy does nothing without --console"},
		{[]string{"--console", "--console-proxy-header", "Forwarded"}, "--console-proxy-header does nothing without --console --console-trusted-proxy"},
		{[]string{"--console", "--console-trusted-proxy", "proxy.internal"}, `"proxy.internal" is not an IP address`},
		{[]string{"--console", "--console-trusted-proxy", "10.0.0.5", "--console-proxy-header", "X-Real-IP"}, "X-Forwarded-For or Forwarded"},
	} {
		_, errOut, code := runCLI(t, append([]string{"--dir", root, "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--reviewers", reviewers}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}
