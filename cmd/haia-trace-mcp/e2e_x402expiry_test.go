package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// expiryAnswer is what the test reads of authorize_payment.
type expiryAnswer struct {
	authorizeAnswer
	Reservation *struct {
		ReceiptID   string `json:"receipt_id"`
		ValidBefore string `json:"valid_before"`
	} `json:"reservation"`
	Auth *struct {
		ValidBefore int64  `json:"valid_before"`
		Nonce       string `json:"nonce"`
	} `json:"authorization"`
}

// TestX402OnChainExpiredAuthorization: an authorization signed by
// authorize_payment holds its payment until the Trace shows it. Once its
// validBefore has passed (and the skew after it), a server given the
// chain's RPC endpoint (--chain-rpc) reads authorizationState on the real
// token: the one never used is released, and the next payment to that
// seller is allowed again; the one used on chain (transferWithAuthorization
// submitted, not written to the Trace) is kept. Without --chain-rpc the
// hold is kept, and status says its outcome is unknown.
func TestX402OnChainExpiredAuthorization(t *testing.T) {
	h := startChainHarness(t, e2ePayerAddr)
	tokenKey := h.Network + "/" + strings.ToLower(h.Token)
	// The shortest validity the server signs (x402.MinAuthorizationSeconds),
	// so that the test waits as little as it can.
	cfg := writeSecret(t, "guard.json", fmt.Sprintf(`{"assets":{%q:{"symbol":"hUSD","decimals":6}},"defaultAsset":%q,
		"reviewAbove":"100.00","maxAuthorizationSeconds":%d}`, tokenKey, tokenKey, x402.MinAuthorizationSeconds))
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	rpcFlag := h.Network + "=" + h.URL + "/rpc"
	client := &http.Client{Timeout: time.Minute}
	required := func(path string) string {
		t.Helper()
		resp, err := client.Get(h.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get("PAYMENT-REQUIRED") == "" {
			t.Fatalf("GET %s: %s, no 402", path, resp.Status)
		}
		return resp.Header.Get("PAYMENT-REQUIRED")
	}
	type server struct {
		root, key string
	}
	newServer := func() server {
		return server{root: sampleRoot(t), key: filepath.Join(t.TempDir(), "signing-key.pem")}
	}
	session := func(s server, extra ...string) func(path string) expiryAnswer {
		cs := mcpSession(t, nil, append([]string{"--dir", s.root, "--key-file", s.key, "--guard-config", cfg, "--payer-key", payerKey}, extra...)...)
		return func(path string) expiryAnswer {
			t.Helper()
			var a expiryAnswer
			decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{"payment_required": required(path), "resource": h.URL + path}), &a)
			return a
		}
	}
	status := func(s server) (string, statusJSONReservations) {
		t.Helper()
		out, errOut, code := runCLI(t, "status", "--dir", s.root)
		if code != 0 {
			t.Fatalf("status: %d %s", code, errOut)
		}
		js, errOut, code := runCLI(t, "status", "--dir", s.root, "--json")
		if code != 0 {
			t.Fatalf("status --json: %d %s", code, errOut)
		}
		var rep statusJSONReservations
		if err := json.Unmarshal([]byte(js), &rep); err != nil {
			t.Fatalf("status --json: %v\n%s", err, js)
		}
		return out, rep
	}

	// unused: signed by a server without --chain-rpc, never sent.
	u := newServer()
	payU := session(u)
	a := payU("/data")
	if a.Decision != "allow" || a.Auth == nil || a.Reservation == nil {
		t.Fatalf("the unused one: %+v", a)
	}
	vbA := time.Unix(a.Auth.ValidBefore, 0)
	if a.Reservation.ValidBefore != vbA.UTC().Format("2006-01-02T15:04:05.000Z") {
		t.Fatalf("the hold records validBefore %q, the authorization %d", a.Reservation.ValidBefore, a.Auth.ValidBefore)
	}
	// used: signed by a server with --chain-rpc, then moved on chain by
	// whoever holds it, and never written to the Trace.
	s := newServer()
	payS := session(s, "--chain-rpc", rpcFlag)
	b := payS("/data")
	if b.Decision != "allow" || b.Payment == nil {
		t.Fatalf("the used one: %+v", b)
	}
	var sent struct {
		Payload x402.ExactPayload `json:"payload"`
	}
	json.Unmarshal(b.Payment.Payload, &sent)
	var submit struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	h.post(t, "/control/submit", map[string]any{"payload": map[string]any{"payload": sent.Payload}}, &submit)
	if !submit.OK {
		t.Fatalf("the used one on chain: %+v", submit)
	}
	var used struct{ Used bool }
	h.post(t, "/control/used", map[string]any{"from": e2ePayerAddr, "nonce": b.Auth.Nonce}, &used)
	if !used.Used {
		t.Fatal("the chain does not say the submitted authorization was used")
	}

	// Before validBefore the hold says until when it can be used.
	if out, rep := status(u); !strings.Contains(out, "authorization valid until") || len(rep.Reservations.Items) != 1 || rep.Reservations.Items[0].Expired {
		t.Fatalf("status before validBefore:\n%s\n%+v", out, rep)
	}

	// Wait past both validBefores and the skew, then mine a block: the
	// chain's newest block must be past validBefore too.
	last := vbA
	if vbB := time.Unix(b.Auth.ValidBefore, 0); vbB.After(last) {
		last = vbB
	}
	time.Sleep(time.Until(last.Add(engine.ExpirySkew + 2*time.Second)))
	var ok struct{ OK bool }
	h.post(t, "/control/advance", map[string]any{"seconds": 0}, &ok)

	// Without --chain-rpc: kept, and status says its outcome is unknown.
	if out, rep := status(u); !strings.Contains(out, "expired, outcome unknown") || len(rep.Reservations.Items) != 1 || !rep.Reservations.Items[0].Expired ||
		!strings.Contains(rep.Reservations.Items[0].Until, "expired, outcome unknown") {
		t.Fatalf("status after validBefore, without --chain-rpc:\n%s\n%+v", out, rep)
	}
	held := payU("/big")
	if held.Decision != "review" || held.ReviewID == "" {
		t.Fatalf("without --chain-rpc the expired hold stopped counting: %+v", held)
	}
	// review show lists the hold beside the review it caused, the same way.
	if out, errOut, code := runCLI(t, "review", "show", held.ReviewID, "--dir", u.root); code != 0 || !strings.Contains(out, a.ReceiptID) ||
		!strings.Contains(out, "expired, outcome unknown") {
		t.Fatalf("review show: %d\n%s%s", code, out, errOut)
	}
	// The same store, served with --chain-rpc: the next decision reads
	// the token, releases the unused hold, and is judged without it.
	payU2 := session(u, "--chain-rpc", rpcFlag)
	again := payU2("/data")
	if again.Decision != "allow" {
		t.Fatalf("with --chain-rpc the unused, expired authorization still holds: %+v", again)
	}
	if _, rep := status(u); len(rep.Reservations.Items) != 1 || rep.Reservations.Items[0].ReceiptID != again.ReceiptID {
		t.Fatalf("status after the release lists %+v, want only the new hold %s", rep.Reservations.Items, again.ReceiptID)
	}
	// The release is a sealed entry the whole ledger's audit accepts.
	if out, errOut, code := runCLI(t, "audit", "--dir", u.root, "--key-file", u.key); code != 0 || !strings.Contains(out, "CONSISTENT") {
		t.Fatalf("audit after the release: %d\n%s%s", code, out, errOut)
	}

	// The used one is kept: the chain says it moved money the Trace does
	// not show.
	if kept := payS("/data"); kept.Decision == "allow" {
		t.Fatalf("an authorization used on chain was released: %+v", kept)
	}
	if _, rep := status(s); len(rep.Reservations.Items) != 1 || rep.Reservations.Items[0].ReceiptID != b.ReceiptID {
		t.Fatalf("status of the used one: %+v", rep.Reservations.Items)
	}
}

// statusJSONReservations is what the test reads of status --json.
type statusJSONReservations struct {
	Reservations struct {
		Items []struct {
			ReceiptID   string `json:"receipt_id"`
			Until       string `json:"until"`
			ValidBefore string `json:"valid_before"`
			Expired     bool   `json:"expired"`
		} `json:"items"`
	} `json:"reservations"`
}

// A --chain-rpc the server cannot use stops the start, naming the flag and
// never the URL's path (where an API key sits).
func TestChainRPCFlagRefused(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	for _, tc := range []struct{ value, want string }{
		{"eip155:8453=http://rpc.example/v2/SECRETKEY", "must be https"},
		{"base=https://rpc.example/v2/SECRETKEY", "not an EVM network"},
		{"https://rpc.example/v2/SECRETKEY", "want NETWORK=URL"},
	} {
		_, errOut, code := runCLIStdin(t, "", "--dir", root, "--key-file", key, "--chain-rpc", tc.value)
		if code == 0 || !strings.Contains(errOut, "--chain-rpc") || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "SECRETKEY") {
			t.Fatalf("--chain-rpc %s: exit %d\n%s", tc.value, code, errOut)
		}
	}
	if _, errOut, code := runCLIStdin(t, "", "--dir", root, "--read-only", "--chain-rpc", "eip155:8453=https://rpc.example"); code != exitUsage || !strings.Contains(errOut, "--chain-rpc would do nothing") {
		t.Fatalf("--read-only --chain-rpc: exit %d\n%s", code, errOut)
	}
}
