package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// chainHarness is the Node harness of tools/x402e2e as the test sees it.
type chainHarness struct {
	URL          string `json:"url"`
	Network      string `json:"network"`
	ChainID      int64  `json:"chain_id"`
	Token        string `json:"token"`
	TokenName    string `json:"token_name"`
	TokenVersion string `json:"token_version"`
	Seller       string `json:"seller"`
	Denied       string `json:"denied"`
	Payer        string `json:"payer"`
	Price        string `json:"price"`
	// JWSKid is the did:jwk key identifier of the seller that signs its
	// offers and receipts as JWS (/offerjws).
	JWSKid string `json:"jws_kid"`
}

func (h chainHarness) post(t *testing.T, path string, body any, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(h.URL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %s %s", path, resp.Status, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("%s: %s: %v", path, data, err)
	}
}

func (h chainHarness) balance(t *testing.T, addr string) int64 {
	t.Helper()
	var out struct{ Balance string }
	h.post(t, "/control/balance", map[string]string{"address": addr}, &out)
	var n int64
	fmt.Sscan(out.Balance, &n)
	return n
}

// startChainHarness starts tools/x402e2e/harness.mjs, or skips saying why.
func startChainHarness(t *testing.T, payer string) chainHarness {
	t.Helper()
	node := os.Getenv("HAIA_NODE")
	if node == "" {
		t.Skip("HAIA_NODE not set: the x402 on-chain end-to-end test needs Node 22 and tools/x402e2e's packages (tools/ci-node.sh sets both up)")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "tools", "x402e2e"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"ganache", "solc", "viem", "@x402/core", "@x402/evm", "@x402/extensions"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p)); err != nil {
			t.Skipf("tools/x402e2e/node_modules lacks %s (run npm ci in %s): %v", p, dir, err)
		}
	}
	cmd := exec.Command(node, "harness.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HAIA_X402_PAYER="+payer, "HAIA_X402_MINT=10000000")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		lines <- l
	}()
	var h chainHarness
	select {
	case l := <-lines:
		if err := json.Unmarshal([]byte(l), &h); err != nil || h.URL == "" {
			t.Fatalf("the harness did not start: %q %v\n%s", l, err, errb.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the harness did not start in 3 minutes:\n%s", errb.String())
	}
	if !strings.HasPrefix(h.URL, "http://127.0.0.1:") {
		t.Fatalf("the harness listens beyond loopback: %s", h.URL)
	}
	return h
}

// TestX402OnChain is the whole path on a real (local) chain: a seller
// that answers 402 with the official x402 packages, the agent asking
// authorize_payment for each 402, the official facilitator verifying and
// settling transferWithAuthorization on the token, and the chain's
// balances as the judge. viem checks every signature the product makes,
// for every network and asset the policy names.
func TestX402OnChain(t *testing.T) {
	h := startChainHarness(t, e2ePayerAddr)
	tokenKey := h.Network + "/" + strings.ToLower(h.Token)
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", fmt.Sprintf(`{"assets":{%q:{"symbol":"hUSD","decimals":6}},"defaultAsset":%q,
		"reviewAbove":"1.00","denylist":[%q],"maxAuthorizationSeconds":60}`, tokenKey, tokenKey, strings.ToLower(h.Denied)))
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey)
	client := &http.Client{Timeout: time.Minute}

	// The agent's x402 client: GET, and on 402 ask the product.
	type attempt struct {
		decision string
		status   int
		header   string
		answer   authorizeAnswer
	}
	get := func(path, header string) (int, http.Header, []byte) {
		req, _ := http.NewRequest(http.MethodGet, h.URL+path, nil)
		if header != "" {
			req.Header.Set("PAYMENT-SIGNATURE", header)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, body
	}
	signed, settled, refused := 0, 0, 0
	var firstTx string
	pay := func(path string) attempt {
		t.Helper()
		status, hdr, body := get(path, "")
		required := hdr.Get("PAYMENT-REQUIRED")
		if status != http.StatusPaymentRequired || required == "" {
			t.Fatalf("GET %s without payment: %d %s", path, status, body)
		}
		var a authorizeAnswer
		decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{"payment_required": required, "resource": h.URL + path}), &a)
		at := attempt{decision: a.Decision, answer: a}
		if a.Decision != "allow" {
			refused++
			if a.Payment != nil {
				t.Fatalf("%s with a signature", a.Decision)
			}
			return at
		}
		signed++
		at.header = a.Payment.Header
		at.status, _, body = get(path, at.header)
		if at.status != http.StatusOK {
			t.Logf("GET %s with payment: %d %s", path, at.status, body)
			return at
		}
		settled++
		// The agent's recorder writes the paid operation into its Trace,
		// with the settlement the seller answered (the real transaction).
		var served struct {
			Transaction string `json:"transaction"`
		}
		json.Unmarshal(body, &served)
		if settled == 1 {
			firstTx = served.Transaction
		}
		rec, err := simrec.New(root, fmt.Sprintf("run-chain-%d", settled), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: "op-1", URL: h.URL + path, PayTo: a.Accepted.PayTo, Amount: a.Accepted.Atomic,
			Network: h.Network, Asset: h.Token, Outcome: "settled", Nonce: a.Authorization.Nonce,
			Settle: map[string]any{"success": true, "transaction": served.Transaction, "network": h.Network, "payer": h.Payer}}); err != nil {
			t.Fatal(err)
		}
		return at
	}
	payer0, seller0 := h.balance(t, h.Payer), h.balance(t, h.Seller)
	price := int64(250000)

	// 1. allow: the balance moves exactly once.
	first := pay("/data")
	if first.decision != "allow" || first.status != http.StatusOK {
		t.Fatalf("the first payment: %+v", first)
	}
	if p, s := h.balance(t, h.Payer), h.balance(t, h.Seller); p != payer0-price || s != seller0+price {
		t.Fatalf("after one payment: payer %d (was %d), seller %d (was %d)", p, payer0, s, seller0)
	}
	// viem recovers the payer from the very signature the product gave.
	var sent struct {
		Payload x402.ExactPayload `json:"payload"`
	}
	json.Unmarshal(first.answer.Payment.Payload, &sent)
	var rec struct{ Address string }
	h.post(t, "/control/recover", map[string]any{"domain": map[string]any{"name": h.TokenName, "version": h.TokenVersion, "chainId": h.ChainID, "verifyingContract": h.Token},
		"authorization": sent.Payload.Authorization, "signature": sent.Payload.Signature}, &rec)
	if rec.Address != e2ePayerAddr {
		t.Fatalf("viem recovers %s, not the payer", rec.Address)
	}

	// The proof names the Trace operation the recorder wrote for it.
	if out, errOut, code := runCLI(t, "authorization", "show", sent.Payload.Authorization.Nonce, "--dir", root); code != 0 ||
		!strings.Contains(out, "run run-chain-1, operation op-1") || !strings.Contains(out, "CONSISTENT") {
		t.Fatalf("authorization show: %d\n%s%s", code, out, errOut)
	}

	// 2. the same header again: the seller's facilitator refuses it, and
	// so does the chain itself (the nonce is used); nothing moves.
	if status, _, body := get("/data", first.header); status == http.StatusOK {
		t.Fatalf("a replayed header was served: %s", body)
	}
	var submit struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	h.post(t, "/control/submit", map[string]any{"payload": map[string]any{"payload": sent.Payload}}, &submit)
	if submit.OK || !strings.Contains(submit.Error, "authorization is used") {
		t.Fatalf("a replay on chain: %+v", submit)
	}
	if p := h.balance(t, h.Payer); p != payer0-price {
		t.Fatalf("a replay moved money: payer %d", p)
	}

	// 3. review: no signature exists; a human approves; the next call gets
	// one signature, which settles once; the approval is not used again.
	big1 := pay("/big")
	if big1.decision != "review" || big1.answer.ReviewID == "" {
		t.Fatalf("/big: %+v", big1)
	}
	if _, errOut, code := runCLI(t, "review", "approve", big1.answer.ReviewID, "--dir", root, "--note", "one big payment"); code != 0 {
		t.Fatalf("approve: %d %s", code, errOut)
	}
	// The settlement the recorder wrote for the first payment (the real
	// transaction on the chain, the nonce in the payment sent) was read by
	// the server at the next authorize_payment and recorded as the
	// authorization's settlement.
	if out, errOut, code := runCLI(t, "authorization", "show", sent.Payload.Authorization.Nonce, "--dir", root); code != 0 ||
		!strings.Contains(out, "settlement     transaction "+strings.ToLower(firstTx)) || !strings.Contains(out, "settled by     the Trace: run run-chain-1, operation op-1") {
		t.Fatalf("authorization show after the Trace settled it: %d\n%s%s", code, out, errOut)
	}
	big2 := pay("/big")
	if big2.decision != "allow" || big2.status != http.StatusOK || big2.answer.ReviewID != big1.answer.ReviewID {
		t.Fatalf("/big after approval: %+v", big2)
	}
	if big3 := pay("/big"); big3.decision == "allow" {
		t.Fatalf("the approval paid twice: %+v", big3)
	}
	if p := h.balance(t, h.Payer); p != payer0-price-10*price {
		t.Fatalf("after the approved payment: payer %d", p)
	}

	// 4. block: never a signature.
	if denied := pay("/denied"); denied.decision != "block" {
		t.Fatalf("/denied: %+v", denied)
	}
	if d := h.balance(t, h.Denied); d != 0 {
		t.Fatalf("the denied seller holds %d", d)
	}

	// 5. expired: an allowed authorization not used in time fails on chain.
	_, hdr, _ := get("/data", "")
	var late authorizeAnswer
	decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{"payment_required": hdr.Get("PAYMENT-REQUIRED")}), &late)
	if late.Decision != "allow" {
		t.Fatalf("the late one: %+v", late)
	}
	signed++
	var lateSent struct {
		Payload x402.ExactPayload `json:"payload"`
	}
	json.Unmarshal(late.Payment.Payload, &lateSent)
	var ok struct{ OK bool }
	h.post(t, "/control/advance", map[string]any{"seconds": 120}, &ok)
	h.post(t, "/control/submit", map[string]any{"payload": map[string]any{"payload": lateSent.Payload}}, &submit)
	if submit.OK || !strings.Contains(submit.Error, "expired") {
		t.Fatalf("an expired authorization on chain: %+v", submit)
	}
	if p := h.balance(t, h.Payer); p != payer0-11*price {
		t.Fatalf("the expired authorization moved money: payer %d", p)
	}

	// viem agrees with the product's EIP-712 for every asset the policy
	// names (the built-in USDC deployments and the token above).
	pol, err := guard.LoadConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := x402.ParseKey([]byte(e2ePayerKey), nil)
	signer := x402.NewKeySigner(k)
	for _, asset := range pol.Assets.All() {
		pr, err := x402.Parse([]byte(fmt.Sprintf(`{"x402Version":2,"resource":{"url":"https://a.example/x"},"accepts":[{"scheme":"exact","network":%q,"amount":"1234567","asset":%q,"payTo":%q,"maxTimeoutSeconds":60,"extra":{"name":"USD Coin","version":"2"}}]}`,
			asset.Network, asset.Address, h.Seller)))
		if err != nil {
			t.Fatal(err)
		}
		c, skipped := x402.Select(pr, pol.Assets)
		if skipped != nil {
			t.Fatalf("%s: %v", asset.Key, skipped)
		}
		terms, err := x402.TermsFor(c, signer.Address(), "rcpt-"+asset.Key, time.Now(), 60)
		if err != nil {
			t.Fatal(err)
		}
		sig, err := x402.Sign(t.Context(), signer, terms)
		if err != nil {
			t.Fatal(err)
		}
		h.post(t, "/control/recover", map[string]any{"domain": map[string]any{"name": "USD Coin", "version": "2", "chainId": terms.Domain.ChainID.Int64(), "verifyingContract": c.Token.Hex()},
			"authorization": terms.Authorization.JSON(), "signature": "0x" + hex.EncodeToString(sig[:])}, &rec)
		if rec.Address != signer.Address().Hex() {
			t.Fatalf("%s: viem recovers %s, not the payer %s", asset.Key, rec.Address, signer.Address().Hex())
		}
	}

	var stats struct{ Required, Settled, Refused int }
	h.post(t, "/control/stats", nil, &stats)
	if stats.Settled != 2 || settled != 2 {
		t.Fatalf("settled: seller %d, agent %d; want 2", stats.Settled, settled)
	}
	t.Logf("x402 on chain: %d authorizations signed, %d settled, %d answers without a signature (review/block), %d payments refused by the seller (replay); payer paid %s atomic units in all",
		signed, settled, refused, stats.Refused, new(big.Int).SetInt64(payer0-h.balance(t, h.Payer)))
}
