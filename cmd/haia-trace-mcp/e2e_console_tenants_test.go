package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

// The console of a --tenants-dir server, with the real binary: each
// tenant's console under /console/t/<tenant>/ trusts only the reviewers
// the trusted reviewers file grants it. alice, granted acme, approves
// acme's review (written to acme's chain); she cannot sign in at globex's
// console, and from acme's she can neither read nor decide globex's review
// (URL tampering, a cookie carried over): it stays pending until bob,
// granted globex, decides it. Once the operator withdraws her grant, her
// session ends.
func TestConsoleTenants(t *testing.T) {
	ts := startTenantConsoles(t)
	tenants, dir, reviewers, console, acmeBase, globexBase := ts.tenants, ts.dir, ts.reviewers, ts.console, ts.acmeBase, ts.globexBase
	call, ask := ts.call, ts.ask

	// /console/ itself says where each tenant's console is and names none;
	// a tenant this server does not serve has no console.
	for path, want := range map[string]int{"": http.StatusOK, "t/initech/": http.StatusNotFound, "reviews/x": http.StatusNotFound} {
		resp, err := http.Get(console + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || !strings.Contains(string(body), "/console/t/") || strings.Contains(string(body), "acme") || strings.Contains(string(body), "globex") {
			t.Fatalf("GET %s: %d %q, want %d saying where a tenant's console is, naming none", console+path, resp.StatusCode, body, want)
		}
	}

	alice := enrolThroughCommand(t, acmeBase, reviewers, ts.key(), "alice", "--tenant", "acme")
	bob := enrolThroughCommand(t, globexBase, reviewers, ts.key(), "bob", "--tenant", "globex")

	acmeQ, globexQ := ask("acme", "2.50"), ask("globex", "2.50")
	acmeID, _ := acmeQ["review_id"].(string)
	globexID, _ := globexQ["review_id"].(string)
	if acmeQ["decision"] != "review" || globexQ["decision"] != "review" || acmeID == "" || globexID == "" {
		t.Fatalf("the questions opened no reviews: %v %v\n%s", acmeQ, globexQ, ts.p.logs())
	}
	if acmeQ["review_url"] != acmeBase+"reviews/"+acmeID || globexQ["review_url"] != globexBase+"reviews/"+globexID {
		t.Fatalf("review_url is not the tenant's console: %v %v", acmeQ["review_url"], globexQ["review_url"])
	}

	if err := alice.SignIn(); err != nil {
		t.Fatalf("alice signs in at acme: %v\n%s", err, ts.p.logs())
	}
	if code, page, _ := alice.Get(""); code != 200 || !strings.Contains(page, acmeID) || strings.Contains(page, globexID) {
		t.Fatalf("acme's queue for alice: %d, acme's review shown %v, globex's shown %v", code, strings.Contains(page, acmeID), strings.Contains(page, globexID))
	}
	// globex's review id under acme's console does not exist there.
	if code, page, _ := alice.Get("reviews/" + globexID); code == 200 || strings.Contains(page, "Approve") {
		t.Fatalf("alice read globex's review through acme's console: %d", code)
	}
	if res, err := alice.Decide(globexID, "approved", "tampered"); err == nil {
		t.Fatalf("alice decided globex's review through acme's console: %v", res)
	}
	// alice's passkey is no passkey at globex's console.
	aliceAtGlobex, err := softauthn.NewBrowser(globexBase, alice.Auth)
	if err != nil {
		t.Fatal(err)
	}
	if err := aliceAtGlobex.SignIn(); err == nil {
		t.Fatal("alice, granted acme alone, signed in at globex's console")
	}
	// Her acme session cookie, carried to globex's console, is no session.
	au, _ := http.NewRequest(http.MethodGet, acmeBase, nil)
	var cookies []string
	for _, ck := range alice.Client.Jar.Cookies(au.URL) {
		cookies = append(cookies, ck.Name+"="+ck.Value)
	}
	for _, path := range []string{"", "reviews/" + globexID} {
		req, _ := http.NewRequest(http.MethodGet, globexBase+path, nil)
		req.Header.Set("Cookie", strings.Join(cookies, "; "))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "Approve") || (path == "" && strings.Contains(string(body), globexID)) {
			t.Fatalf("acme's session cookie read globex's console at %q: %d", path, resp.StatusCode)
		}
	}
	if res, err := aliceAtGlobex.Decide(globexID, "approved", "carried over"); err == nil {
		t.Fatalf("alice decided globex's review at globex's console: %v", res)
	}

	// alice approves acme's review; it is written to acme's store and chain.
	if res, err := alice.Decide(acmeID, "approved", "fine for acme"); err != nil || res["status"] != "approved" || res["decided_by"] != "alice" {
		t.Fatalf("alice approves acme's review: %v %v", res, err)
	}
	if a := ask("acme", "2.50"); a["decision"] != "allow" {
		t.Fatalf("acme's approved question: %v", a)
	}
	if a := ask("globex", "2.50"); a["decision"] == "allow" {
		t.Fatalf("globex's question was allowed by acme's approval: %v", a)
	}
	for name, want := range map[string]bool{"acme": true, "globex": false} {
		chains, _ := filepath.Glob(filepath.Join(tenants, name, "guard", "receipts", "*.ndjson"))
		var all strings.Builder
		for _, c := range chains {
			data, _ := os.ReadFile(c)
			all.Write(data)
		}
		if got := strings.Contains(all.String(), "webauthn-assertion:"); got != want {
			t.Errorf("%s's chain holds a passkey decision: %v, want %v", name, got, want)
		}
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", filepath.Join(tenants, "acme"), "--reviewers", reviewers); code != 0 {
		t.Fatalf("audit acme: %d\n%s\n%s", code, out, errOut)
	}
	// verify with the reviewers file holds acme's chains' decisions to
	// alice's grant, which holds.
	if out, code := verifyChains(t, filepath.Join(tenants, "acme"), "--reviewers", reviewers, "--tenant", "acme"); code != 0 || !strings.Contains(out, "VALID") {
		t.Fatalf("verify acme's chains against alice's grant: exit %d\n%s", code, out)
	}
	// globex's review waited for globex's reviewer.
	if err := bob.SignIn(); err != nil {
		t.Fatal(err)
	}
	if code, page, _ := bob.Get(""); code != 200 || !strings.Contains(page, globexID) || strings.Contains(page, acmeID) {
		t.Fatalf("globex's queue for bob: %d", code)
	}
	if res, err := bob.Decide(globexID, "rejected", "not for globex"); err != nil || res["status"] != "rejected" || res["decided_by"] != "bob" {
		t.Fatalf("bob rejects globex's review: %v %v", res, err)
	}
	// The operator withdraws alice's grant: her acme session ends at the
	// next request and she cannot sign in again.
	data, err := os.ReadFile(reviewers)
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]map[string]any
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	delete(file["alice"], "tenants")
	if data, err = json.Marshal(file); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(reviewers, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r3 := ask("acme", "2.75")["review_id"].(string)
	if code, page, _ := alice.Get(""); strings.Contains(page, r3) || strings.Contains(page, acmeID) {
		t.Fatalf("alice still reads acme's queue after her grant was withdrawn: %d", code)
	}
	if res, err := alice.Decide(r3, "approved", "after withdrawal"); err == nil {
		t.Fatalf("alice decided after her grant was withdrawn: %v", res)
	}
	if err := alice.SignIn(); err == nil {
		t.Fatal("alice signed in at acme after her grant was withdrawn")
	}

	// Grants bind decisions, not only the console: her approval of acme's
	// review no longer counts — get_review_status and the tenant's audit
	// say so, while the root read alone (no grant) still counts it.
	if st := call("acme", "get_review_status", map[string]any{"review_id": acmeID}); st["status"] == "approved" || !strings.Contains(fmt.Sprint(st["integrity"]), `does not grant them tenant "acme"`) {
		t.Fatalf("get_review_status of alice's approval once her grant is gone: %v", st)
	}
	if out, _, code := runCLI(t, "audit", "--tenants-dir", tenants, "--tenant", "acme", "--reviewers", reviewers); code != 2 || !strings.Contains(out, `does not grant them tenant "acme"`) {
		t.Fatalf("audit of acme with alice's grant gone: exit %d\n%s", code, out)
	}
	if out, _, code := runCLI(t, "review", "show", acmeID, "--tenants-dir", tenants, "--tenant", "acme", "--reviewers", reviewers); code != 0 || !strings.Contains(out, "status       unverified") || !strings.Contains(out, `does not grant them tenant "acme"`) {
		t.Fatalf("review show of alice's approval once her grant is gone: exit %d\n%s", code, out)
	}
	// verify reports it too when asked to hold the chain to the grants;
	// by default it checks the keys alone, and without --tenant the file's
	// keys and passkeys (a single root's reading), which still hold.
	acmeRoot := filepath.Join(tenants, "acme")
	if out, code := verifyChains(t, acmeRoot, "--reviewers", reviewers, "--tenant", "acme"); code != 5 || !strings.Contains(out, `UNTRUSTED: human receipt`) || !strings.Contains(out, `does not grant them tenant "acme"`) {
		t.Fatalf("verify acme's chains with alice's grant gone: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{nil, {"--reviewers", reviewers}} {
		if out, code := verifyChains(t, acmeRoot, args...); code != 0 || strings.Contains(out, "UNTRUSTED") {
			t.Fatalf("verify %v of acme's chains: exit %d\n%s", args, code, out)
		}
	}
	if out, code := verifyChains(t, acmeRoot, "--reviewers", reviewers, "--tenant", "globex"); code != 5 || !strings.Contains(out, `is tenant "acme"'s, not "globex"'s`) {
		t.Fatalf("verify acme's chains as globex's: exit %d\n%s", code, out)
	}
	if _, _, code := runCLI(t, "verify", filepath.Join(acmeRoot, "guard", "keyring.json"), "--tenant", "acme"); code != exitVerifyUsage {
		t.Fatalf("verify --tenant without --reviewers: exit %d, want usage", code)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", filepath.Join(tenants, "globex"), "--reviewers", reviewers); code != 0 {
		t.Fatalf("audit globex (bob's grant holds): %d\n%s\n%s", code, out, errOut)
	}
	// A reviewer key granted no tenant signs nothing for acme.
	carol := filepath.Join(dir, "carol.pem")
	if out, errOut, code := runCLI(t, "reviewer", "init", "--id", "carol", "--key-file", carol, "--reviewers", reviewers); code != 0 {
		t.Fatalf("reviewer init carol: %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, "review", "approve", r3, "--tenants-dir", tenants, "--tenant", "acme", "--reviewers", reviewers, "--reviewer-key", carol); code != reviewExitUntrusted || !strings.Contains(errOut, `tenant "acme"`) {
		t.Fatalf("carol, granted no tenant, approves acme's review: exit %d\n%s", code, errOut)
	}
	if a := ask("acme", "2.75"); a["decision"] != "review" {
		t.Fatalf("acme's question after carol's refused approval: %v", a)
	}
}

// tenantConsoleServer is a --tenants-dir server (the real binary) serving the
// tenants acme and globex over HTTP with tokens, and their consoles under
// console (/console/t/acme/, /console/t/globex/) on a listener of their
// own; the trusted reviewers file is reviewers, empty at first.
type tenantConsoleServer struct {
	t                             *testing.T
	p                             *httpProc
	secret                        []byte
	tenants, dir, reviewers       string
	console, acmeBase, globexBase string
}

func startTenantConsoles(t *testing.T) *tenantConsoleServer {
	t.Helper()
	ts := &tenantConsoleServer{t: t, tenants: filepath.Join(t.TempDir(), "tenants"), dir: t.TempDir(), secret: []byte(strings.Repeat("t", 48))}
	for _, name := range []string{"acme", "globex"} {
		rec, err := simrec.New(filepath.Join(ts.tenants, name), "run-"+name, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: "op-" + name, URL: "https://" + name + ".example/x", PayTo: sellerA, Amount: "100000", Outcome: "settled"}); err != nil {
			t.Fatal(err)
		}
	}
	secretFile := filepath.Join(ts.dir, "secret")
	if err := os.WriteFile(secretFile, ts.secret, 0o600); err != nil {
		t.Fatal(err)
	}
	ts.reviewers = filepath.Join(ts.dir, "reviewers.json")
	port := freePort(t)
	ts.console = "http://localhost:" + port + "/console/"
	ts.acmeBase, ts.globexBase = ts.console+"t/acme/", ts.console+"t/globex/"
	ts.p = startHTTPBinary(t, "--tenants-dir", ts.tenants, "--tenant-claim", "org", "--reviewers", ts.reviewers,
		"--key-file", ts.key(), "--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile,
		"--console", "--console-addr", "127.0.0.1:"+port)
	return ts
}

// key is the server's signing key file.
func (ts *tenantConsoleServer) key() string { return filepath.Join(ts.dir, "signing.pem") }

// call calls tool as agent-1 of tenant and returns its structured content.
func (ts *tenantConsoleServer) call(tenant, tool string, args map[string]any) map[string]any {
	t := ts.t
	t.Helper()
	tok := signHS256(t, ts.secret, map[string]any{"iss": "http://127.0.0.1/local-as", "aud": ts.p.resource, "sub": "agent-1", "org": tenant,
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	cs, err := httpSession(t, ts.p.resource, func() string { return tok })
	if err != nil {
		t.Fatalf("connect as %s: %v\n%s", tenant, err, ts.p.logs())
	}
	defer cs.Close()
	var m map[string]any
	b, _ := json.Marshal(callTool(t, cs, tool, args).StructuredContent)
	json.Unmarshal(b, &m)
	return m
}

// ask asks check_before_pay of tenant: amount to sellerB.
func (ts *tenantConsoleServer) ask(tenant, amount string) map[string]any {
	ts.t.Helper()
	return ts.call(tenant, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": amount})
}

// verifyChains runs verify --follow over every chain under root's
// guard/receipts with root's keyring and args, and returns what each said
// (stdout and stderr) and the highest exit code.
func verifyChains(t *testing.T, root string, args ...string) (string, int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "guard", "receipts", "*.ndjson"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no chains under %s: %v", root, err)
	}
	var all strings.Builder
	worst := 0
	for _, f := range files {
		out, errOut, code := runCLI(t, append([]string{"verify", f, "--keyring", filepath.Join(root, "guard", "keyring.json"), "--follow"}, args...)...)
		fmt.Fprintf(&all, "%s: exit %d\n%s%s", filepath.Base(f), code, out, errOut)
		worst = max(worst, code)
	}
	return all.String(), worst
}
