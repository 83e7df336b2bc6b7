package main

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// The shared flags typed before the command, as a new operator types them
// (haia-trace-mcp --dir .trace status), run the command with them: the
// same answer as typed after it, for status, review list and chain list.
func TestSharedFlagsBeforeTheCommandEndToEnd(t *testing.T) {
	root, _ := demoRoot(t)
	reviewers := filepath.Join(filepath.Dir(root), "keys", "reviewers.json")
	for _, tc := range []struct {
		name          string
		before, after []string
	}{
		{"status", []string{"--dir", root, "--reviewers", reviewers, "status", "--json"}, []string{"status", "--json", "--dir", root, "--reviewers", reviewers}},
		{"review list", []string{"--dir=" + root, "--json", "review", "list", "--all"}, []string{"review", "list", "--all", "--json", "--dir", root}},
		{"chain list", []string{"--dir", root, "chain", "list"}, []string{"chain", "list", "--dir", root}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outB, errB, codeB := runCLI(t, tc.before...)
			outA, errA, codeA := runCLI(t, tc.after...)
			if codeB != 0 || codeA != 0 {
				t.Fatalf("%q: exit %d %s; %q: exit %d %s", tc.before, codeB, errB, tc.after, codeA, errA)
			}
			if strings.HasPrefix(strings.TrimSpace(outB), "{") {
				var a, b map[string]any
				if json.Unmarshal([]byte(outA), &a) != nil || json.Unmarshal([]byte(outB), &b) != nil {
					t.Fatalf("not JSON: %s / %s", outB, outA)
				}
				delete(a, "generated_at")
				delete(b, "generated_at")
				if !reflect.DeepEqual(a, b) {
					t.Errorf("%q:\n%s\nwant, as %q:\n%s", tc.before, outB, tc.after, outA)
				}
			} else if outA != outB {
				t.Errorf("%q:\n%s\nwant, as %q:\n%s", tc.before, outB, tc.after, outA)
			}
		})
	}
}

// A decision that would not count is refused, nothing written: a reviewer
// the trusted reviewers file does not grant a tenant cannot decide that
// tenant's review from the command line — through --tenants-dir --tenant,
// and through the tenant's own root given as --dir, which the server
// recorded it serves as that tenant — and is told which grant is missing.
// Once granted, the same command decides and the server reads the
// decision as made.
func TestUngrantedReviewerIsRefusedEndToEnd(t *testing.T) {
	tenants := tenantRoots(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("t", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	reviewers := filepath.Join(dir, "reviewers.json")
	bob := filepath.Join(dir, "bob.pem")
	if out, errOut, code := runCLI(t, "reviewer", "init", "--id", "bob", "--key-file", bob, "--reviewers", reviewers, "--tenant", "acme"); code != 0 {
		t.Fatalf("reviewer init: %d %s %s", code, out, errOut)
	}
	p := startHTTPBinary(t, "--tenants-dir", tenants, "--tenant-claim", "org", "--reviewers", reviewers,
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile)
	globex := tenantCaller(t, p, secret, "globex")
	_, _, ans := globex("check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"})
	id, _ := ans["review_id"].(string)
	if id == "" {
		t.Fatalf("globex's question opened no review: %v", ans)
	}
	guardDir := filepath.Join(tenants, "globex", "guard")
	before := snapshotTree(t, guardDir)
	for _, where := range [][]string{{"--dir", filepath.Join(tenants, "globex")}, {"--tenants-dir", tenants, "--tenant", "globex"}} {
		for _, verb := range []string{"approve", "reject"} {
			args := append([]string{"review", verb, id, "--reviewers", reviewers, "--reviewer-key", bob}, where...)
			out, errOut, code := runCLI(t, args...)
			if code != reviewExitUntrusted || out != "" || !strings.Contains(errOut, `reviewer "bob"`) || !strings.Contains(errOut, `tenant "globex"`) ||
				!strings.Contains(errOut, "reviewer init") || !strings.Contains(errOut, "--tenant globex") || !strings.Contains(errOut, "nothing was written") {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d naming the missing grant", args, code, out, errOut, reviewExitUntrusted)
			}
		}
	}
	if after := snapshotTree(t, guardDir); !equalMaps(before, after) {
		t.Errorf("a refused decision wrote to globex's store")
	}
	if _, _, st := globex("get_review_status", map[string]any{"review_id": id}); st["status"] != "pending" {
		t.Errorf("after the refusals the server reads %v, want pending", st["status"])
	}
	// Granted globex, bob decides through the tenant's own root, and the
	// server reads the decision as bob's.
	if out, errOut, code := runCLI(t, "reviewer", "init", "--id", "bob", "--key-file", bob, "--reviewers", reviewers, "--tenant", "globex"); code != 0 {
		t.Fatalf("grant bob globex: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "review", "reject", id, "--dir", filepath.Join(tenants, "globex"), "--reviewers", reviewers, "--reviewer-key", bob); code != 0 || !strings.Contains(out, "rejected by bob") {
		t.Fatalf("granted, reject: %d %s %s", code, out, errOut)
	}
	if _, _, st := globex("get_review_status", map[string]any{"review_id": id}); st["status"] != "rejected" {
		t.Errorf("after the granted reviewer's decision the server reads %v, want rejected", st["status"])
	}
	// status on the tenant's root says whose decisions count there.
	out, errOut, code := runCLI(t, "status", "--dir", filepath.Join(tenants, "acme"), "--reviewers", reviewers)
	if code != 0 || !strings.Contains(out, "tenant      acme") || !strings.Contains(out, "bob  key haia-") || !strings.Contains(out, "tenants acme, globex") {
		t.Errorf("status of acme: %d\n%s%s", code, out, errOut)
	}
}

// The serving flags that act only beside another are refused by name when
// it is absent, before anything is opened: the tenants' fair share and
// claim without --tenants-dir, the HTTP endpoint's settings over stdio,
// the console's placement without --console.
func TestIdleServingFlagsAreRefusedEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	for _, tc := range []struct {
		args  []string
		names []string
		needs string
	}{
		{[]string{"--http", "127.0.0.1:0", "--http-insecure-no-auth", "--tenant-slots", "2", "--tenant-queue", "8"}, []string{"--tenant-slots", "--tenant-queue"}, "--tenants-dir"},
		{[]string{"--http", "127.0.0.1:0", "--http-insecure-no-auth", "--tenant-fair-share=false"}, []string{"--tenant-fair-share"}, "--tenants-dir"},
		{[]string{"--http", "127.0.0.1:0", "--http-insecure-no-auth", "--tenant-max-in-flight", "1", "--tenant-wait", "1s", "--tenant-claim", "org"}, []string{"--tenant-max-in-flight", "--tenant-wait", "--tenant-claim"}, "--tenants-dir"},
		{[]string{"--auth-issuer", "http://127.0.0.1/as", "--rate-limit", "5"}, []string{"--auth-issuer", "--rate-limit"}, "--http"},
		{[]string{"--console-url", "http://localhost:1/console/"}, []string{"--console-url"}, "--console"},
		{[]string{"--http-allow-remote"}, []string{"--http-allow-remote"}, "--http or --console"},
	} {
		before := snapshotTree(t, root)
		_, errOut, code := runCLI(t, append([]string{"--dir", root}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, "without "+tc.needs) {
			t.Errorf("%v: exit %d, stderr %q; want %d saying they need %s", tc.args, code, errOut, exitUsage, tc.needs)
		}
		for _, n := range tc.names {
			if !strings.Contains(errOut, n) {
				t.Errorf("%v: stderr %q does not name %s", tc.args, errOut, n)
			}
		}
		if after := snapshotTree(t, root); !equalMaps(before, after) {
			t.Errorf("%v: the refused start changed the Trace root", tc.args)
		}
	}
	// The proxy takes the same flags and refuses them the same way.
	_, errOut, code := runCLI(t, "proxy", "--dir", root, "--guard-map", filepath.Join(t.TempDir(), "map.json"), "--tenant-slots", "2", "--", "true")
	if code != exitUsage || !strings.Contains(errOut, "--tenant-slots does nothing without --tenants-dir") {
		t.Errorf("proxy --tenant-slots without --tenants-dir: exit %d, stderr %q", code, errOut)
	}
}

// A start the server refuses changes nothing in the store: status, and
// every command, still go by the policy the server last served with.
// Then the server started with that file serves and records it.
func TestRefusedStartRecordsNoPolicy(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "signing.pem")
	served := filepath.Join(dir, "served.json")
	other := filepath.Join(dir, "other.json")
	if err := os.WriteFile(served, []byte(`{"reviewAbove": "1.00"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte(`{"reviewAbove": "0.50"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startHTTPBinary(t, "--dir", root, "--key-file", key, "--guard-config", served, "--http-insecure-no-auth")
	if code := p.stop(t); code != 0 {
		t.Fatalf("serving %s: exit %d\n%s", served, code, p.logs())
	}
	policyOf := func() statusJSON {
		t.Helper()
		return statusOf(t, 0, "--dir", root, "--guard-config", served)
	}
	want := policyOf().Policy
	if !strings.Contains(want.Source, "served.json") {
		t.Fatalf("after serving served.json, status says the policy is %+v", want)
	}
	guardDir := filepath.Join(root, "guard")
	before := snapshotTree(t, guardDir)
	for _, refused := range [][]string{
		{"--http", "127.0.0.1:0"}, // no authentication flags
		{"--http", "127.0.0.1:0", "--auth-issuer", "http://127.0.0.1/as", "--auth-hmac-secret", filepath.Join(dir, "absent")}, // a secret that cannot be read
		{"--http", "127.0.0.1:0", "--http-insecure-no-auth", "--tenant-slots", "2"},                                           // a flag that would do nothing
	} {
		args := append([]string{"--dir", root, "--key-file", key, "--guard-config", other}, refused...)
		if _, errOut, code := runCLI(t, args...); code == 0 {
			t.Fatalf("%v started: %s", refused, errOut)
		}
		if got := policyOf().Policy; got != want {
			t.Errorf("after a start refused (%v), status says the policy is %+v, want %+v", refused, got, want)
		}
	}
	if after := snapshotTree(t, guardDir); !equalMaps(before, after) {
		t.Errorf("a refused start changed the guard's store")
	}
}

// status reads as plain English: one run, one operation, one receipt and
// one segment in the singular; every amount in one form, at least two
// decimals and its symbol (0.40 USDC beside 0.25 USDC); every trusted
// reviewer listed — one with passkeys only too — with the kinds of key it
// signs with and its tenants.
func TestStatusReadsAsEnglishEndToEnd(t *testing.T) {
	work := t.TempDir()
	root := filepath.Join(work, ".trace")
	rec, err := simrec.New(root, "run-1", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-1", URL: "https://a.example/x", PayTo: sellerA, Amount: "250000", Outcome: "unsettled"}); err != nil {
		t.Fatal(err)
	}
	keys := t.TempDir()
	reviewers := filepath.Join(keys, "reviewers.json")
	if out, errOut, code := runCLI(t, "reviewer", "init", "--id", "alice", "--key-file", filepath.Join(keys, "alice.pem"), "--reviewers", reviewers); code != 0 {
		t.Fatalf("reviewer init: %d %s %s", code, out, errOut)
	}
	for _, r := range []struct {
		id      string
		n       int
		tenants []string
	}{{"pat", 2, []string{"*"}}, {"alice", 1, []string{"globex", "acme"}}} {
		for range r.n {
			a, err := softauthn.New()
			if err != nil {
				t.Fatal(err)
			}
			c := passkey.Credential{ID: a.CredentialID(), PublicKey: base64.RawURLEncoding.EncodeToString(a.COSEKey()), RPID: "localhost", Origin: "http://localhost:8787"}
			if _, err := reviewlog.AddPasskey(reviewers, r.id, c, r.tenants...); err != nil {
				t.Fatal(err)
			}
		}
	}
	cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(keys, "signing.pem"), "--reviewers", reviewers)
	res := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": "0xf7e5000000000000000000000000000000000005", "amount": "0.4"})
	if res.IsError || !strings.Contains(resultText(res), "allow") {
		t.Fatalf("check_before_pay: %s", resultText(res))
	}
	cs.Close()

	out, errOut, code := runCLI(t, "--dir", root, "--reviewers", reviewers, "status")
	if code != 0 {
		t.Fatalf("status: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"runs        1 run, 1 operation (0 full, 1 partial)",
		"1 operation",
		"0.25 USDC",
		"reserved    1 amount held by an earlier allow",
		"0.40 USDC to 0xf7e5000000000000000000000000000000000005",
		"1 receipt, 1 segment, head",
		"reviewers   2 reviewers trusted in " + reviewers + " (a single root: every trusted reviewer decides, no grant is read)",
		"alice  key haia-",
		", 1 passkey; tenants acme, globex",
		"pat    2 passkeys; every tenant",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	for _, wrong := range []string{"1 runs", "1 operations", "1 receipts", "1 segments", " 0.4 USDC", "(s)"} {
		if strings.Contains(out, wrong) {
			t.Errorf("status says %q:\n%s", wrong, out)
		}
	}
	var st struct {
		Reviewers statusReviewers `json:"reviewers"`
	}
	js, _, _ := runCLI(t, "status", "--json", "--dir", root, "--reviewers", reviewers)
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	pat := statusReviewer{ID: "pat", SignsWith: []string{"passkey"}, Passkeys: 2, Tenants: []string{"*"}, Decides: true}
	if len(st.Reviewers.Entries) != 2 || !reflect.DeepEqual(st.Reviewers.Entries[1], pat) || !reflect.DeepEqual(st.Reviewers.Entries[0].SignsWith, []string{"key", "passkey"}) ||
		!reflect.DeepEqual(st.Reviewers.IDs, []string{"alice", "pat"}) {
		t.Errorf("status --json reviewers: %+v", st.Reviewers)
	}
}

// policy check tells the two kinds of policy file apart and validates each
// with the server's loader: the guard policy init writes is valid, and what
// it sets is said; a guard policy with five kinds of mistakes gets every
// one with its JSON path and line (the server refuses it too, naming
// policy check); a rule file, good and bad, the same; a guard policy's
// custom rules and history templates are checked as the server checks them.
func TestPolicyCheckBothKindsEndToEnd(t *testing.T) {
	work := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "config")
	env := []string{"HAIA_CONFIG_DIR=" + cfg}
	root := filepath.Join(work, ".trace")
	if out, errOut, code := runCLIEnv(t, env, "init", root); code != 0 {
		t.Fatalf("init: %d %s %s", code, out, errOut)
	}
	initFile := filepath.Join(work, "haia-guard.config.json")
	out, errOut, code := runCLI(t, "policy", "check", initFile, "--dir", root)
	if code != 0 || errOut != "" {
		t.Fatalf("policy check on init's file: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		initFile + ": a guard policy, valid",
		"review above  1.00 USDC",
		"limits        5.00 USDC to one counterparty per day; no total limit; 0 payments whose outcome is not confirmed tolerated per counterparty",
		"lists         no allowlist (any counterparty may be paid); no denylist",
		"history       read under x402-buyer",
		"windows       a review expires after 1 day; an approval is honoured for 1 hour; a rejection holds for 1 day",
		"layers        none",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("policy check on init's file lacks %q:\n%s", want, out)
		}
	}

	// Five kinds of mistakes: a value of the wrong form, a value out of
	// range, an unknown key, a key a layer may not set, a template that
	// does not exist — and a list entry of the wrong type, in a layer.
	bad := writeFile(t, "bad.json", `{
  "reviewAbove": "lots",
  "reviewTtlMinutes": 0,
  "colour": "blue",
  "tenants": {
    "acme": {"historyTemplates": ["x402-buyer"],
             "denylist": ["evil.example", 7]}
  },
  "historyTemplates": ["x402-buyer", "no-such-template"]
}`)
	out, errOut, code = runCLI(t, "policy", "check", bad, "--dir", root)
	if code != 1 || out != "" || !strings.Contains(errOut, "a guard policy with 6 problems:") {
		t.Fatalf("policy check on a bad file: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		bad + `:2:3: $.reviewAbove: reviewAbove in USDC: unreadable amount`,
		bad + `:3:3: $.reviewTtlMinutes: reviewTtlMinutes must be between 1`,
		bad + `:4:3: $.colour: unknown key "colour"`,
		bad + `:6:14: $.tenants["acme"].historyTemplates: tenants["acme"].historyTemplates applies to every tenant and cannot be set per tenant`,
		bad + `:7:43: $.tenants["acme"].denylist[1]: tenants["acme"].denylist[1] must be a string`,
		bad + `:9:38: $.historyTemplates[1]: history template "no-such-template" cannot be used`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("policy check lacks %q:\n%s", want, errOut)
		}
	}
	var js struct {
		Kind     string
		Valid    bool
		Problems []struct {
			Path string
			Line int
		}
	}
	jout, _, code := runCLI(t, "policy", "check", "--json", bad, "--dir", root)
	if err := json.Unmarshal([]byte(jout), &js); err != nil || code != 1 || js.Valid || js.Kind != "guard policy" || len(js.Problems) != 6 || js.Problems[4].Path != `$.tenants["acme"].denylist[1]` || js.Problems[4].Line != 7 {
		t.Errorf("policy check --json on the bad file: exit %d %+v (%v)\n%s", code, js, err, jout)
	}
	// The server refuses the same file and points at policy check.
	_, errOut, code = runCLI(t, "--dir", root, "--guard-config", bad, "--key-file", filepath.Join(t.TempDir(), "k.pem"))
	if code == 0 || !strings.Contains(errOut, "policy check "+bad+" lists each with its line") {
		t.Errorf("serving the bad file: exit %d %s", code, errOut)
	}

	// A rule file, good and bad, and a guard policy that names one.
	rules := writeFile(t, "rules.json", cliPolicy)
	out, errOut, code = runCLI(t, "policy", "check", rules)
	if code != 0 || !strings.Contains(out, "a noa.policy/0.2 rule file, valid") || !strings.Contains(out, "rules         2 rules in order: big, ok") {
		t.Errorf("policy check on a rule file: exit %d\n%s%s", code, out, errOut)
	}
	badRules := writeFile(t, "bad-rules.json", `{"spec":"noa.policy/0.2","id":"r","requiredPaths":[],
 "rules":[{"id":"a","when":{"op":"exists","path":"x"},"then":"MAYBE"}]}`)
	layered := writeFile(t, "layered.json", `{"reviewAbove": "2", "agents": {"bot": {"reviewAbove": "0.5"}}, "policy": "`+rules+`"}`)
	out, errOut, code = runCLI(t, "policy", "check", layered, "--dir", root)
	if code != 0 || !strings.Contains(out, "layers        agent bot: review above 0.50 USDC") || !strings.Contains(out, "custom rules  "+rules+", valid:") {
		t.Errorf("policy check on a layered policy: exit %d\n%s%s", code, out, errOut)
	}
	layered = writeFile(t, "layered-bad.json", `{"policy": "`+badRules+`"}`)
	_, errOut, code = runCLI(t, "policy", "check", layered, "--dir", root)
	if code != 1 || !strings.Contains(errOut, layered+`:1:2: $.policy: the custom rules `+badRules+` are invalid (1 problem, below)`) ||
		!strings.Contains(errOut, badRules+`:2:55: $.rules[0].then: must be exactly "ALLOW" or "DENY"`) {
		t.Errorf("policy check on a policy naming bad rules: exit %d\n%s", code, errOut)
	}
}
