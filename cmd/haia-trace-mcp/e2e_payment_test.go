package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// The e2e payer: a test key that holds nothing anywhere.
const (
	e2ePayerKey  = "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"
	e2ePayerAddr = "0x2c7536E3605D9C16a7a3D7b1898e529396a65c23"
	e2eSeller    = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	e2eDenied    = "0x1111111111111111111111111111111111111111"
)

type authorizeAnswer struct {
	Decision  string `json:"decision"`
	ReceiptID string `json:"receipt_id"`
	ReviewID  string `json:"review_id"`
	Reasons   []struct {
		Rule   string `json:"rule"`
		Detail string `json:"detail"`
	} `json:"reasons"`
	Accepted struct {
		PayTo  string `json:"pay_to"`
		Atomic string `json:"amount_atomic"`
	} `json:"accepted"`
	Payment *struct {
		Payload    json.RawMessage `json:"payload"`
		Header     string          `json:"header"`
		HeaderName string          `json:"header_name"`
	} `json:"payment"`
	Authorization *struct {
		Payer     string `json:"payer"`
		Nonce     string `json:"nonce"`
		ReceiptID string `json:"receipt_id"`
	} `json:"authorization"`
}

func e2ePaymentRequired(amount, payTo string) map[string]any {
	return map[string]any{"x402Version": 2, "resource": map[string]any{"url": "https://api.seller.example/data"},
		"accepts": []any{map[string]any{"scheme": "exact", "network": "eip155:8453", "amount": amount,
			"asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "payTo": payTo, "maxTimeoutSeconds": 120,
			"extra": map[string]any{"name": "USD Coin", "version": "2"}}}}
}

// e2ePaymentRequiredAt is e2ePaymentRequired for the resource url.
func e2ePaymentRequiredAt(url, amount, payTo string) map[string]any {
	pr := e2ePaymentRequired(amount, payTo)
	pr["resource"] = map[string]any{"url": url}
	return pr
}

func writeSecret(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func authorizeCall(t *testing.T, cs *mcp.ClientSession, pr any) authorizeAnswer {
	t.Helper()
	var a authorizeAnswer
	decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{"payment_required": pr}), &a)
	if (a.Payment != nil) != (a.Decision == "allow") {
		t.Fatalf("%s with payment %v", a.Decision, a.Payment != nil)
	}
	return a
}

// TestStdioAuthorizePaymentStory: the agent pays only through the guard.
// allow signs exactly the 402's terms; review signs nothing until a human
// approves, then once; block never; the proof command shows each
// authorization bound to its signed receipts and says TAMPERED when the
// unsigned copy is edited; verify and audit cover the chain.
func TestStdioAuthorizePaymentStory(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"1.00","denylist":["`+e2eDenied+`"],"maxAuthorizationSeconds":90}`)

	out, errOut, code := runCLI(t, "payer", "address", "--payer-key", payerKey)
	if code != 0 || strings.TrimSpace(out) != e2ePayerAddr || strings.Contains(out+errOut, e2ePayerKey) {
		t.Fatalf("payer address: %d %q %q", code, out, errOut)
	}
	var stderr lockedBuffer
	cs := mcpSession(t, &stderr, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey,
		"--tools", "list_operations,get_receipt,explain,get_review_status,authorize_payment")

	// --tools took check_before_pay away: the agent has one way to pay.
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools.Tools {
		if tl.Name == "check_before_pay" {
			t.Fatal("check_before_pay is served despite --tools")
		}
	}

	allow := authorizeCall(t, cs, e2ePaymentRequired("250000", e2eSeller))
	if allow.Decision != "allow" || allow.Authorization.Payer != e2ePayerAddr {
		t.Fatalf("allow: %+v", allow)
	}
	var sent struct {
		Payload x402.ExactPayload `json:"payload"`
	}
	hb, _ := base64.StdEncoding.DecodeString(allow.Payment.Header)
	json.Unmarshal(hb, &sent)
	if a := sent.Payload.Authorization; a.Value != "250000" || a.To != e2eSeller || a.From != e2ePayerAddr {
		t.Fatalf("signed %+v", a)
	}
	if a := sent.Payload.Authorization; len(a.ValidBefore) == 0 || mustInt(a.ValidBefore)-mustInt(a.ValidAfter) != 90+60 {
		t.Fatalf("maxAuthorizationSeconds 90 did not cap the validity: %+v", a)
	}

	review := authorizeCall(t, cs, e2ePaymentRequired("5000000", e2eSeller))
	if review.Decision != "review" || review.ReviewID == "" {
		t.Fatalf("review: %+v", review)
	}
	if again := authorizeCall(t, cs, e2ePaymentRequired("5000000", e2eSeller)); again.Decision != "review" {
		t.Fatalf("asked again before a human decided: %+v", again)
	}
	if _, errOut, code := runCLI(t, "review", "approve", review.ReviewID, "--dir", root, "--note", "ok once"); code != 0 {
		t.Fatalf("approve: %d %s", code, errOut)
	}
	approved := authorizeCall(t, cs, e2ePaymentRequired("5000000", e2eSeller))
	if approved.Decision != "allow" || approved.ReviewID != review.ReviewID {
		t.Fatalf("after approval: %+v", approved)
	}
	if replay := authorizeCall(t, cs, e2ePaymentRequired("5000000", e2eSeller)); replay.Decision == "allow" {
		t.Fatalf("the approval was used twice: %+v", replay)
	}
	if block := authorizeCall(t, cs, e2ePaymentRequired("1", e2eDenied)); block.Decision != "block" {
		t.Fatalf("block: %+v", block)
	}

	// The proof, by nonce and by receipt id.
	for _, id := range []string{allow.Authorization.Nonce, allow.ReceiptID, approved.Authorization.ReceiptID} {
		out, errOut, code := runCLI(t, "authorization", "show", id, "--dir", root)
		if code != 0 || !strings.Contains(out, "CONSISTENT") || !strings.Contains(out, e2ePayerAddr) {
			t.Fatalf("authorization show %s: %d\n%s%s", id, code, out, errOut)
		}
	}
	// The value reads as every other amount of the command line, with its
	// symbol; the asset is named; the EIP-712 domain has a line of its own
	// with its name and version apart.
	out, _, _ = runCLI(t, "authorization", "show", allow.Authorization.Nonce, "--dir", root)
	for _, line := range []string{
		"  value          0.25 USDC (250000 atomic units)\n",
		"  asset          USDC on Base (eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913)\n",
		"  eip712 domain  name \"USD Coin\", version \"2\", chain eip155:8453, verifying contract 0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913\n",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("authorization show lacks %q:\n%s", line, out)
		}
	}
	if strings.Contains(out, "USD Coin 2") {
		t.Errorf("authorization show runs the domain's name and version together:\n%s", out)
	}
	out, _, code = runCLI(t, "authorization", "show", approved.Authorization.Nonce, "--dir", root, "--json")
	var shown struct {
		Approval *struct {
			Status    string `json:"status"`
			DecidedBy string `json:"decided_by"`
		} `json:"approval"`
		Consistent bool   `json:"consistent"`
		Value      string `json:"value"`
		Amount     string `json:"amount"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil || code != 0 || !shown.Consistent || shown.Approval == nil ||
		shown.Approval.Status != "approved" || shown.Approval.DecidedBy != "alice" || shown.Value != "5000000" || shown.Amount != "5.00 USDC" {
		t.Fatalf("show --json: %d %s", code, out)
	}
	if _, _, code := runCLI(t, "authorization", "show", "0x"+strings.Repeat("ab", 32), "--dir", root); code != authExitUnknown {
		t.Fatalf("an unknown nonce: exit %d", code)
	}
	chain, _ := chainFile(t, root)
	if out, code := verifyChain(t, root, chain); code != 0 {
		t.Fatalf("verify: %d %s", code, out)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", root); code != 0 {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
	if !strings.Contains(stderr.String(), e2ePayerAddr) || strings.Contains(stderr.String(), e2ePayerKey) {
		t.Fatal("the payer address is not logged at start, or the key is")
	}

	// Whoever can write the volume edits the unsigned copy: the proof says so.
	logPath := filepath.Join(root, "guard", "decisions.ndjson")
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := bytes.Replace(data, []byte(`"value":"250000"`), []byte(`"value":"25000"`), 1)
	if bytes.Equal(edited, data) {
		t.Fatal("no authorized line to edit")
	}
	os.WriteFile(logPath, edited, 0o600)
	out, _, code = runCLI(t, "authorization", "show", allow.Authorization.Nonce, "--dir", root)
	if code != authExitTampered || !strings.Contains(out, "TAMPERED") {
		t.Fatalf("an edited authorization: exit %d\n%s", code, out)
	}
	// ...or drops it: the signed receipt still names the authorization.
	var kept [][]byte
	for _, l := range bytes.SplitAfter(edited, []byte("\n")) {
		if !bytes.Contains(l, []byte(allow.Authorization.Nonce)) {
			kept = append(kept, l)
		}
	}
	os.WriteFile(logPath, bytes.Join(kept, nil), 0o600)
	for _, id := range []string{allow.Authorization.Nonce, allow.ReceiptID} {
		out, _, code = runCLI(t, "authorization", "show", id, "--dir", root)
		if code != authExitTampered || !strings.Contains(out, "MISSING") {
			t.Fatalf("a dropped authorization asked by %s: exit %d\n%s", id, code, out)
		}
	}
}

// TestStdioAuthorizePaymentSellerHost: the real binary judges the seller's
// host beside the 402's payTo. A seller that names a new payTo in every
// 402 gets one payment signed while it is open (maxOpenPartial 0), not
// seven; under a 5.00 limit with open payments tolerated it gets five of
// 1.00; a denylisted host's own 402 is blocked, whatever payTo it names.
func TestStdioAuthorizePaymentSellerHost(t *testing.T) {
	payee := func(i int) string { return fmt.Sprintf("0x%040x", 0xbeef00+i) }
	for _, tc := range []struct {
		name, policy string
		signed       int
		rule         string
	}{
		{"open payment", `{"maxOpenPartialPerCounterparty":0,"perCounterpartyLimit":{"amount":"5.00","windowHours":24}}`, 1, "open_partial"},
		{"limit", `{"maxOpenPartialPerCounterparty":20,"perCounterpartyLimit":{"amount":"5.00","windowHours":24},"velocity":null}`, 5, "per_counterparty_limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := sampleRoot(t)
			cfg := writeSecret(t, "guard.json", tc.policy)
			cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--guard-config", cfg,
				"--payer-key", writeSecret(t, "payer.key", e2ePayerKey))
			signed := 0
			for i := 0; i < 7; i++ {
				url := fmt.Sprintf("https://pay.rotating.example/item/%d", i)
				var a authorizeAnswer
				decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{"payment_required": e2ePaymentRequiredAt(url, "1000000", payee(i)), "resource": url}), &a)
				if a.Payment != nil {
					signed++
					continue
				}
				if a.Decision != "review" || !slices.ContainsFunc(a.Reasons, func(r struct {
					Rule   string `json:"rule"`
					Detail string `json:"detail"`
				}) bool {
					return r.Rule == tc.rule && strings.Contains(r.Detail, "pay.rotating.example")
				}) {
					t.Fatalf("payment %d: %s %+v", i+1, a.Decision, a.Reasons)
				}
			}
			if signed != tc.signed {
				t.Fatalf("%d × 1.00 signed to one host with a new payTo each time; want %d", signed, tc.signed)
			}
		})
	}
	t.Run("denylisted host", func(t *testing.T) {
		cfg := writeSecret(t, "guard.json", `{"denylist":["pay.denied.example"]}`)
		cs := mcpSession(t, nil, "--dir", sampleRoot(t), "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--guard-config", cfg,
			"--payer-key", writeSecret(t, "payer.key", e2ePayerKey))
		var checked struct {
			Decision string `json:"decision"`
		}
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": "pay.denied.example", "amount": "0.01"}), &checked)
		a := authorizeCall(t, cs, e2ePaymentRequiredAt("https://PAY.denied.example./data", "10000", payee(1)))
		if checked.Decision != "block" || a.Decision != "block" || a.Payment != nil {
			t.Fatalf("check_before_pay %s, the host's own 402 %s (%+v)", checked.Decision, a.Decision, a.Reasons)
		}
	})
}

func mustInt(s string) int64 {
	var n int64
	for _, c := range s {
		n = n*10 + int64(c-'0')
	}
	return n
}

// TestStdioPayerSignerProcess: the key lives in its own process; the
// server signs through it; the process holds its own limits over its real
// socket (--max-value, the policy's maxAuthorizationSeconds) and logs
// each signature; when it stops, no payment is authorized (fail closed)
// and a server cannot start against it.
func TestStdioPayerSignerProcess(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", e2ePayerKey)
	sockDir, err := os.MkdirTemp("", "pay")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "p.sock")
	if _, errOut, code := runCLI(t, "signer", "--payer-key", payerKey, "--listen", "unix:"+sock); code != exitUsage || !strings.Contains(errOut, "--max-value") {
		t.Fatalf("a payer signer without --max-value: %d %s", code, errOut)
	}
	policy := writeSecret(t, "guard.json", `{"maxAuthorizationSeconds":60}`)
	signer := exec.Command(binPath, "signer", "--payer-key", payerKey, "--listen", "unix:"+sock, "--max-value", "1.00", "--guard-config", policy)
	var sigErr lockedBuffer
	signer.Stderr = &sigErr
	if err := signer.Start(); err != nil {
		t.Fatal(err)
	}
	defer signer.Process.Kill()
	for i := 0; ; i++ {
		if out, _, code := runCLI(t, "payer", "address", "--payer-signer", "unix:"+sock); code == 0 {
			if strings.TrimSpace(out) != e2ePayerAddr {
				t.Fatalf("payer address through the signer: %q", out)
			}
			break
		}
		if i > 200 {
			t.Fatalf("the payer signer never came up: %s", sigErr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--payer-signer", "unix:"+sock, "--guard-config", policy)
	a := authorizeCall(t, cs, e2ePaymentRequired("10000", e2eSeller))
	if a.Decision != "allow" || a.Authorization.Payer != e2ePayerAddr {
		t.Fatalf("through the signer: %+v", a)
	}

	// Whoever reaches the socket, the signer holds its own line.
	rs, err := x402.DialPayer(context.Background(), sock, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pol := guard.DefaultConfig()
	pr, err := x402.ParseArgument(e2ePaymentRequired("1000000", e2eSeller))
	if err != nil {
		t.Fatal(err)
	}
	choice, _ := x402.Select(pr, pol.Assets)
	terms, err := x402.TermsFor(choice, rs.Address(), "rcpt_direct", time.Now(), 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x402.Sign(context.Background(), rs, terms); err != nil {
		t.Fatalf("1.00 for 60 s, within the limits: %v", err)
	}
	over := terms
	over.Authorization.Value = big.NewInt(1000001)
	if _, err := rs.SignAuthorization(context.Background(), over.Domain, over.Authorization); err == nil || !strings.Contains(err.Error(), "above this signer's --max-value 1 USDC") {
		t.Fatalf("1.000001 USDC under --max-value 1.00: %v", err)
	}
	forever := terms
	forever.Authorization.ValidBefore = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1))
	if _, err := rs.SignAuthorization(context.Background(), forever.Domain, forever.Authorization); err == nil || !strings.Contains(err.Error(), "valid for at most 60 seconds") {
		t.Fatalf("validBefore 2^256-1: %v", err)
	}
	// A server whose policy lets authorizations live longer than the
	// signer's is refused its signature: fail closed, nothing given.
	long := mcpSession(t, nil, "--dir", sampleRoot(t), "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--payer-signer", "unix:"+sock)
	if res := callTool(t, long, "authorize_payment", map[string]any{"payment_required": e2ePaymentRequiredAt("https://long.example/x", "10000", e2eSeller)}); !res.IsError || !strings.Contains(resultText(res), "no authorization is given") {
		t.Fatalf("a signature valid 120 s from a signer capped at 60 s: %v %s", res.IsError, resultText(res))
	}
	logged := sigErr.String()
	for _, want := range []string{"payer signer signed", "payee=" + e2eSeller, `value="1 USDC"`, "asset=eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
		"valid_before=" + terms.Authorization.ValidBefore.String(), "nonce=" + terms.Authorization.JSON().Nonce, "nonce=" + a.Authorization.Nonce, "payer signer refused a request"} {
		if !strings.Contains(logged, want) {
			t.Errorf("the signer's log lacks %q:\n%s", want, logged)
		}
	}
	signer.Process.Signal(os.Interrupt)
	signer.Wait()
	// Another seller (host and payee), so that the answer is allow
	// whatever the first payment still holds open: only the signature is
	// missing.
	res := callTool(t, cs, "authorize_payment", map[string]any{"payment_required": e2ePaymentRequiredAt("https://other.example/data", "10000", "0x00000000000000000000000000000000000000c3")})
	if !res.IsError || !strings.Contains(resultText(res), "no authorization is given") || strings.Contains(resultText(res), "0x"+e2ePayerKey[:8]) {
		t.Fatalf("with the signer stopped: %v %s", res.IsError, resultText(res))
	}
	_, errOut, code := runCLI(t, "--dir", root, "--key-file", key, "--payer-signer", "unix:"+sock)
	if code == 0 || !strings.Contains(errOut, "--payer-signer") {
		t.Fatalf("a server started against a stopped signer: %d %s", code, errOut)
	}
	if strings.Contains(sigErr.String(), e2ePayerKey) {
		t.Fatal("the signer logged its key")
	}
}

// BenchmarkAuthorizePaymentStdio times authorize_payment over stdio
// against the real binary (the official Go SDK as the client): what an
// agent host waits for, from the request to the signed payment, a fresh
// seller (host and payee) each time. Each authorization is an entry of the
// spend ledger until its validBefore, so with -benchtime 2250x the last 250
// are answered with 2,000 entries live (reportWindows). HAIA_BENCH_BIN2
// runs a second build call for call beside the first:
//
//	HAIA_E2E_NORACE=1 go test -run '^$' -bench AuthorizePaymentStdio -benchtime 2250x ./cmd/haia-trace-mcp/
func BenchmarkAuthorizePaymentStdio(b *testing.B) {
	payerKey := filepath.Join(b.TempDir(), "payer.key")
	if err := os.WriteFile(payerKey, []byte(e2ePayerKey), 0o600); err != nil {
		b.Fatal(err)
	}
	level := "warn"
	var stderr *lockedBuffer
	if benchSteps() {
		level, stderr = "debug", &lockedBuffer{}
		defer func() { reportSteps(stderr.String(), "authorize_payment steps") }()
	}
	// HAIA_BENCH_BIN2 names a second build, run beside the first in the
	// same loop, call for call (A B A B), each with its own root: both see
	// the same moments of a loaded machine.
	bins := []string{binPath}
	if other := os.Getenv("HAIA_BENCH_BIN2"); other != "" {
		bins = append(bins, other)
	}
	ctx := context.Background()
	var sessions []*mcp.ClientSession
	for k, bin := range bins {
		cmd := exec.Command(bin, "--dir", b.TempDir(), "--key-file", filepath.Join(b.TempDir(), "k.pem"), "--payer-key", payerKey, "--log-level", level)
		if stderr != nil && k == 0 {
			cmd.Stderr = stderr
		}
		client := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
		cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cs.Close()
		sessions = append(sessions, cs)
	}
	ask := func(cs *mcp.ClientSession, i int) {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "authorize_payment", Arguments: map[string]any{
			"payment_required": e2ePaymentRequiredAt(fmt.Sprintf("https://s%d.example/data", i+1), "10000", fmt.Sprintf("0x%040x", i+1))}})
		if err != nil || res.IsError {
			b.Fatalf("authorize_payment: %v %v", err, res)
		}
	}
	for _, cs := range sessions {
		ask(cs, 0)
	}
	ds := make([][]time.Duration, len(sessions))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, cs := range sessions {
			t0 := time.Now()
			ask(cs, i+1)
			ds[k] = append(ds[k], time.Since(t0))
		}
	}
	b.StopTimer()
	for k := range ds {
		name, metric := "authorize", ""
		if k > 0 {
			name, metric = "authorize-bin2", "bin2-"
		}
		reportWindows(b, name, ds[k])
		slices.Sort(ds[k])
		b.ReportMetric(float64(ds[k][len(ds[k])/2].Microseconds())/1000, metric+"p50-ms")
		b.ReportMetric(float64(ds[k][len(ds[k])*99/100].Microseconds())/1000, metric+"p99-ms")
	}
}

// The payer address is on /healthz and /readyz, and healthcheck prints it.
func TestHTTPHealthNamesThePayer(t *testing.T) {
	payerKey := writeSecret(t, "payer.key", e2ePayerKey)
	p := startHTTPBinary(t, "--dir", sampleRoot(t), "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--http-insecure-no-auth", "--payer-key", payerKey)
	out, errOut, code := runCLI(t, "healthcheck", "--url", p.base+"/healthz")
	if code != 0 || out != "ok\npayer "+e2ePayerAddr+"\n" {
		t.Fatalf("healthcheck: %d %q %s", code, out, errOut)
	}
	resp, err := http.Get(p.base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "payer "+e2ePayerAddr) || strings.Contains(string(body), e2ePayerKey) {
		t.Fatalf("/readyz: %d %s", resp.StatusCode, body)
	}
}

// TestStdioAuthorizePaymentSellerSpellings: the real binary judges
// duplicates on the resource the agent requested, whatever the seller's
// 402 declares, refuses a declared query the agent did not request, and
// refuses before asking the engine a 402 valid too briefly to settle or
// paid only by Permit2, so nothing is reserved for it.
func TestStdioAuthorizePaymentSellerSpellings(t *testing.T) {
	cfg := writeSecret(t, "guard.json", `{"maxOpenPartialPerCounterparty":20,"duplicatePayment":{"windowMinutes":60}}`)
	cs := mcpSession(t, nil, "--dir", sampleRoot(t), "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--guard-config", cfg,
		"--payer-key", writeSecret(t, "payer.key", e2ePayerKey))
	const asked = "https://dup.seller.example/report"
	call := func(declared string, mod func(e map[string]any)) *mcp.CallToolResult {
		pr := e2ePaymentRequiredAt(declared, "10000", e2eSeller)
		if mod != nil {
			mod(pr["accepts"].([]any)[0].(map[string]any))
		}
		return callTool(t, cs, "authorize_payment", map[string]any{"payment_required": pr, "resource": asked})
	}
	// Too short, and Permit2: refused by name, nothing reserved.
	for _, tc := range []struct {
		mod  func(e map[string]any)
		want string
	}{
		{func(e map[string]any) { e["maxTimeoutSeconds"] = 5 }, "maxTimeoutSeconds is 5 seconds"},
		{func(e map[string]any) {
			e["extra"] = map[string]any{"name": "USD Coin", "version": "2", "assetTransferMethod": "permit2"}
		}, "assetTransferMethod is permit2"},
	} {
		if res := call(asked, tc.mod); !res.IsError || !strings.Contains(resultText(res), tc.want) {
			t.Fatalf("want a refusal saying %q: %s", tc.want, resultText(res))
		}
	}
	var first authorizeAnswer
	decodeStructured(t, call(asked, nil), &first)
	if first.Decision != "allow" {
		t.Fatalf("the first payment, after the refusals reserved nothing: %+v", first)
	}
	for _, declared := range []string{"https://DUP.Seller.example/report", "https://dup.seller.example/./report", "https://dup.seller.example:443/report#x"} {
		var a authorizeAnswer
		decodeStructured(t, call(declared, nil), &a)
		if a.Decision != "review" || a.Payment != nil || !slices.ContainsFunc(a.Reasons, func(r struct {
			Rule   string `json:"rule"`
			Detail string `json:"detail"`
		}) bool {
			return r.Rule == "duplicate_payment"
		}) {
			t.Fatalf("declared %s: %s %+v", declared, a.Decision, a.Reasons)
		}
	}
	if res := call(asked+"?n=2", nil); !res.IsError || !strings.Contains(resultText(res), "a declared query must be the one requested") {
		t.Fatalf("a declared query the agent did not request: %s", resultText(res))
	}
}
