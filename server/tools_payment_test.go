package server

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

type authorizeAnswer struct {
	Decision  string `json:"decision"`
	ReceiptID string `json:"receipt_id"`
	ReviewID  string `json:"review_id"`
	Accepted  struct {
		Amount string `json:"amount"`
		PayTo  string `json:"pay_to"`
		Host   string `json:"host"`
	} `json:"accepted"`
	Payment *struct {
		Payload    json.RawMessage `json:"payload"`
		Header     string          `json:"header"`
		HeaderName string          `json:"header_name"`
	} `json:"payment"`
	Reservation *struct {
		Open  bool   `json:"open"`
		Until string `json:"until"`
		PayTo string `json:"pay_to"`
	} `json:"reservation"`
	Authorization *struct {
		Payer     string `json:"payer"`
		Nonce     string `json:"nonce"`
		ReceiptID string `json:"receipt_id"`
	} `json:"authorization"`
}

// callTool calls one tool in process and returns (isError, text, structured).
func callTool(t *testing.T, s *Server, name string, args map[string]any) (bool, string, json.RawMessage) {
	t.Helper()
	ctx := context.Background()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": name, "arguments": args}})
	raw, _ := json.Marshal(s.MCP().HandleMessage(ctx, body))
	var msg struct {
		Result struct {
			IsError    bool            `json:"isError"`
			Structured json.RawMessage `json:"structuredContent"`
			Content    []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil {
		t.Fatal(err)
	}
	text := ""
	if len(msg.Result.Content) > 0 {
		text = msg.Result.Content[0].Text
	}
	return msg.Result.IsError, text, msg.Result.Structured
}

const sellerA = "0x209693bc6afc0c5328ba36faf03c514ef312287c"

func authorize(t *testing.T, s *Server, args map[string]any) authorizeAnswer {
	t.Helper()
	isErr, text, st := callTool(t, s, "authorize_payment", args)
	if isErr {
		t.Fatalf("authorize_payment refused: %s", text)
	}
	var a authorizeAnswer
	if err := json.Unmarshal(st, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAuthorizePaymentDecisions(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"1.00","denylist":["0x1111111111111111111111111111111111111111"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := newPolicyServer(t, dir, 0, pol)
	payer, _ := x402.ParseKey([]byte(testPayerKey), nil)
	payerAddr := x402.NewKeySigner(payer).Address()

	// allow: a signature over exactly the 402's terms, bound to the decision.
	a := authorize(t, s, map[string]any{"payment_required": paymentRequired("250000", sellerA), "resource": "https://api.seller.example/data"})
	if a.Decision != "allow" || a.Payment == nil || a.Authorization == nil {
		t.Fatalf("allow without a payment: %+v", a)
	}
	if a.Accepted.Amount != "0.25" || !strings.EqualFold(a.Accepted.PayTo, sellerA) {
		t.Fatalf("asked about %+v", a.Accepted)
	}
	// It holds: spend, and a payment open to the payee, with no lapse.
	if r := a.Reservation; r == nil || !r.Open || r.Until != "" || !strings.EqualFold(r.PayTo, sellerA) {
		t.Fatalf("the allow holds %+v", a.Reservation)
	}
	if n := x402.NonceFor(a.ReceiptID); a.Authorization.Nonce != "0x"+hex.EncodeToString(n[:]) {
		t.Fatal("the nonce is not derived from the decision receipt")
	}
	hdr, _ := base64.StdEncoding.DecodeString(a.Payment.Header)
	var p struct {
		X402Version int
		Accepted    map[string]any
		Payload     x402.ExactPayload
	}
	if err := json.Unmarshal(hdr, &p); err != nil || p.X402Version != 2 || a.Payment.HeaderName != "PAYMENT-SIGNATURE" {
		t.Fatalf("header %s: %v", hdr, err)
	}
	au, err := p.Payload.Authorization.Read()
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x402.ParseAddress("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913")
	dom := x402.Domain{Name: "USD Coin", Version: "2", ChainID: bigInt(8453), VerifyingContract: c}
	digest, _ := x402.Digest(dom, au)
	var sig [65]byte
	b, _ := hex.DecodeString(p.Payload.Signature[2:])
	copy(sig[:], b)
	if who, err := x402.Recover(digest, sig); err != nil || who != payerAddr {
		t.Fatalf("the signature recovers to %s (%v), not the payer %s", who.Hex(), err, payerAddr.Hex())
	}
	if au.Value.String() != "250000" || !strings.EqualFold(au.To.Hex(), sellerA) || au.ValidBefore.Int64()-au.ValidAfter.Int64() != 120+60 {
		t.Fatalf("signed terms %+v", au)
	}

	// review: no signature, a review id.
	r := authorize(t, s, map[string]any{"payment_required": paymentRequired("5000000", sellerA)})
	if r.Decision != "review" || r.Payment != nil || r.Authorization != nil || r.ReviewID == "" {
		t.Fatalf("review: %+v", r)
	}
	// block: no signature, ever.
	k := authorize(t, s, map[string]any{"payment_required": paymentRequired("1", "0x1111111111111111111111111111111111111111")})
	if k.Decision != "block" || k.Payment != nil {
		t.Fatalf("block: %+v", k)
	}
	// The log holds exactly the one authorization, bound to its receipts.
	auths, err := reviewlog.OpenStore(filestore.New(openRoot(t, dir)), reviewlog.Options{}).Authorizations(context.Background())
	if err != nil || len(auths) != 1 || auths[0].DecisionReceipt != a.ReceiptID || auths[0].Receipt != a.Authorization.ReceiptID {
		t.Fatalf("authorizations %+v (%v)", auths, err)
	}
}

func bigInt(n int64) *big.Int { return big.NewInt(n) }

func TestAuthorizePaymentRefusals(t *testing.T) {
	dir := t.TempDir()
	s := newTestServer(t, dir)
	odd := func(mod func(e map[string]any)) map[string]any {
		pr := paymentRequired("10000", sellerA)
		mod(pr["accepts"].([]any)[0].(map[string]any))
		return pr
	}
	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"resource differs", map[string]any{"payment_required": paymentRequired("10000", sellerA), "resource": "https://other.example/data"}, "declares the resource"},
		{"unknown asset", map[string]any{"payment_required": odd(func(e map[string]any) { e["asset"] = sellerA })}, "not in the policy's assets"},
		{"no eip712 domain", map[string]any{"payment_required": odd(func(e map[string]any) { delete(e, "extra") })}, "EIP-712"},
		{"huge amount", map[string]any{"payment_required": odd(func(e map[string]any) { e["amount"] = strings.Repeat("9", 100) })}, "uint256"},
		{"amount as number", map[string]any{"payment_required": odd(func(e map[string]any) { e["amount"] = 10000 })}, "must be a string"},
		{"scheme upto", map[string]any{"payment_required": odd(func(e map[string]any) { e["scheme"] = "upto" })}, "scheme"},
		{"not base64", map[string]any{"payment_required": "@@@"}, "base64"},
		{"duplicate key in header", map[string]any{"payment_required": base64.StdEncoding.EncodeToString([]byte(`{"x402Version":2,"x402Version":1}`))}, "appears twice"},
		{"array", map[string]any{"payment_required": []any{1}}, "PaymentRequired object"},
		{"missing", map[string]any{}, "payment_required is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isErr, text, _ := callTool(t, s, "authorize_payment", tc.args)
			if !isErr || !strings.Contains(text, tc.want) {
				t.Fatalf("isError %v, text %q; want it to say %q", isErr, text, tc.want)
			}
			if strings.Contains(text, "signature") && !strings.Contains(text, "nothing was") && !strings.Contains(text, "invalid arguments") {
				t.Fatalf("a refusal that may have signed: %s", text)
			}
		})
	}
	auths, _ := reviewlog.OpenStore(filestore.New(openRoot(t, dir)), reviewlog.Options{}).Authorizations(context.Background())
	if len(auths) != 0 {
		t.Fatalf("a refused call left %d authorizations", len(auths))
	}
}

// Many agents at once: every allow has its own decision, its own nonce
// and its own recorded authorization.
func TestAuthorizePaymentConcurrent(t *testing.T) {
	dir := t.TempDir()
	s := newTestServer(t, dir)
	const n = 12
	var wg sync.WaitGroup
	nonces := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			isErr, text, st := callTool(t, s, "authorize_payment", map[string]any{"payment_required": paymentRequired("10000", sellerA)})
			if isErr {
				t.Errorf("refused: %s", text)
				return
			}
			var a authorizeAnswer
			json.Unmarshal(st, &a)
			if a.Authorization != nil {
				nonces <- a.Authorization.Nonce
			}
		}()
	}
	wg.Wait()
	close(nonces)
	seen := map[string]bool{}
	for nc := range nonces {
		if seen[nc] {
			t.Fatalf("nonce %s signed twice", nc)
		}
		seen[nc] = true
	}
	auths, err := reviewlog.OpenStore(filestore.New(openRoot(t, dir)), reviewlog.Options{}).Authorizations(context.Background())
	if err != nil || len(auths) != len(seen) {
		t.Fatalf("%d signed, %d recorded (%v)", len(seen), len(auths), err)
	}
}

// BenchmarkAuthorizePayment times authorize_payment in process: the 402
// read, the engine's decision recorded and signed, the EIP-712 signature
// (checked by recovery) and the authorization recorded — a fresh payee
// each time, on a root of 200 recorded payments.
func BenchmarkAuthorizePayment(b *testing.B) {
	dir := b.TempDir()
	rec, err := simrec.New(dir, "run-1", time.Now().Add(-time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	var ps []simrec.Payment
	for i := 0; i < 200; i++ {
		ps = append(ps, simrec.Payment{OperationID: fmt.Sprintf("op-%d", i), URL: "https://a.example.com/x", PayTo: fmt.Sprintf("0x%040x", i+100000), Amount: "1000", Outcome: "settled"})
	}
	if err := rec.PayAll(ps); err != nil {
		b.Fatal(err)
	}
	s := newTestServer(b, dir)
	ctx := context.Background()
	ask := func(i int) {
		res, err := s.authorizePayment(ctx, map[string]any{"payment_required": paymentRequired("10000", fmt.Sprintf("0x%040x", i+1))})
		if err != nil || res.IsError {
			b.Fatalf("authorize_payment: %v %v", err, res)
		}
	}
	ask(0)
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		ask(i + 1)
		ds = append(ds, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, ds)
}

// The agent asks check_before_pay about one payment, then hands
// authorize_payment a 402 for another: the 402's own terms are judged and
// signed, never what the agent asked about.
func TestAuthorizePaymentJudgesThe402NotTheQuestion(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"1.00","denylist":["0x1111111111111111111111111111111111111111"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	s := newPolicyServer(t, t.TempDir(), 0, pol)
	isErr, text, st := callTool(t, s, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": "0.25"})
	var asked struct{ Decision string }
	json.Unmarshal(st, &asked)
	if isErr || asked.Decision != "allow" {
		t.Fatalf("the question: %s", text)
	}
	if a := authorize(t, s, map[string]any{"payment_required": paymentRequired("4990000", sellerA)}); a.Decision != "review" || a.Payment != nil {
		t.Fatalf("a 402 for more than asked: %+v", a)
	}
	if a := authorize(t, s, map[string]any{"payment_required": paymentRequired("250000", "0x1111111111111111111111111111111111111111")}); a.Decision != "block" || a.Payment != nil {
		t.Fatalf("a 402 to another payee: %+v", a)
	}
	// A 402 whose first entry is another payee's and whose second is the
	// one asked about: the first payable entry is judged, as x402 clients pay it.
	pr := paymentRequired("250000", "0x1111111111111111111111111111111111111111")
	second := paymentRequired("250000", sellerA)["accepts"].([]any)[0]
	pr["accepts"] = append(pr["accepts"].([]any), second)
	if a := authorize(t, s, map[string]any{"payment_required": pr}); a.Decision != "block" || !strings.EqualFold(a.Accepted.PayTo, "0x1111111111111111111111111111111111111111") {
		t.Fatalf("two entries: %+v", a)
	}
}
