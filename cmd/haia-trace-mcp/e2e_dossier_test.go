package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	decdsa "github.com/decred/dcrd/dcrec/secp256k1/v4/ecdsa"

	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

const e2eSellerKey = "7a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d"

func e2eSign(t *testing.T, digest [32]byte) string {
	t.Helper()
	k, err := x402.ParseKey([]byte(e2eSellerKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := decdsa.SignCompact(k, digest[:], false)
	return "0x" + hex.EncodeToString(append(append([]byte{}, c[1:]...), c[0]))
}

// TestDossierExportVerify: the real binary pays a seller whose 402 carries
// a signed offer, after a human approved it, takes the settlement with the
// seller's signed receipt, and exports the payment's dossier; dossier
// verify checks it offline (VALID with the keyring and the reviewers file,
// UNVERIFIED on the file's own keys), and refuses every tampered field.
func TestDossierExportVerify(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"1.00","requireSignedOffers":true}`)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey)
	k, _ := x402.ParseKey([]byte(e2eSellerKey), nil)
	seller := x402.NewKeySigner(k).Address().Hex()
	res := "https://api.seller.example/data"
	terms := x402.OfferTerms{Version: 1, ResourceURL: res, Scheme: "exact", Network: "eip155:8453", Asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
		PayTo: seller, Amount: "2500000", ValidUntil: 4102444800}
	pr := e2ePaymentRequired("2500000", seller)
	pr["extensions"] = map[string]any{"offer-receipt": map[string]any{"info": map[string]any{"offers": []any{map[string]any{
		"format": "eip712", "acceptIndex": 0, "signature": e2eSign(t, x402.OfferDigest(terms)), "payload": terms}}}}}

	first := authorizeCall(t, cs, pr)
	if first.Decision != "review" {
		t.Fatalf("2.50 is above reviewAbove: %+v", first)
	}
	if _, errOut, code := runCLI(t, "review", "approve", first.ReviewID, "--dir", root, "--note", "a big one"); code != 0 {
		t.Fatalf("approve: %d %s", code, errOut)
	}
	allow := authorizeCall(t, cs, pr)
	if allow.Decision != "allow" {
		t.Fatalf("after approval: %+v", allow)
	}
	tx := "0x" + strings.Repeat("7c", 32)
	rt := x402.ReceiptTerms{Version: 1, Network: "eip155:8453", ResourceURL: res, Payer: e2ePayerAddr, IssuedAt: 1800000000, Transaction: tx}
	settlement := map[string]any{"success": true, "transaction": tx, "network": "eip155:8453", "payer": e2ePayerAddr,
		"extensions": map[string]any{"offer-receipt": map[string]any{"info": map[string]any{"receipt": map[string]any{
			"format": "eip712", "signature": e2eSign(t, x402.ReceiptDigest(rt)), "payload": rt}}}}}
	var rec struct {
		Findings []string `json:"findings"`
	}
	decodeStructured(t, callTool(t, cs, "record_receipt", map[string]any{"nonce": allow.Authorization.Nonce, "payment_response": settlement}), &rec)
	if len(rec.Findings) != 0 {
		t.Fatalf("findings: %v", rec.Findings)
	}

	// The operator keeps a checkpoint of the decision chain now; more
	// decisions follow, so the chain's head moves past the payment's
	// receipts.
	kept := t.TempDir()
	chainsOut, _, code := runCLI(t, "chain", "list", "--dir", root)
	if code != 0 {
		t.Fatalf("chain list: %d", code)
	}
	for _, line := range strings.Split(strings.TrimSpace(chainsOut), "\n") {
		id := strings.Split(line, "\t")[0]
		// The server's chains (a reviewer's own chain is signed by the
		// reviewer's key, which the operator does not hold).
		cp, errOut, code := runCLI(t, "chain", "checkpoint", id, "--dir", root, "--key-file", key)
		if code == exitUsage && strings.Contains(errOut, "not by this key") {
			continue
		}
		if code != 0 {
			t.Fatalf("chain checkpoint %s: %d %s", id, code, errOut)
		}
		os.WriteFile(filepath.Join(kept, id+".json"), []byte(cp), 0o600)
	}
	os.WriteFile(filepath.Join(kept, "notes.txt"), []byte("not a checkpoint"), 0o600)
	if later := authorizeCall(t, cs, e2ePaymentRequiredAt("https://api.seller.example/later", "250000", e2eSeller)); later.Decision == "" {
		t.Fatalf("a later decision: %+v", later)
	}

	file := filepath.Join(t.TempDir(), "dossier.json")
	if _, errOut, code := runCLI(t, "dossier", "export", allow.Authorization.Nonce, "--dir", root, "--out", file); code != exitUsage || !strings.Contains(errOut, "--key-file") {
		t.Fatalf("export without the server's key: %d %s", code, errOut)
	}
	out, errOut, code := runCLI(t, "dossier", "export", allow.Authorization.Nonce, "--dir", root, "--key-file", key, "--checkpoints", kept, "--out", file)
	if code != 0 || !strings.Contains(out, "checkpoints)") || !strings.Contains(errOut, "notes.txt left out") {
		t.Fatalf("export: %d %s %s", code, out, errOut)
	}
	keyring := filepath.Join(root, "guard", "keyring.json")
	reviewers := filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "haia-trace-mcp", "reviewers.json")
	out, errOut, code = runCLI(t, "dossier", "verify", file, "--keyring", keyring, "--reviewers", reviewers)
	if code != 0 {
		t.Fatalf("verify: %d\n%s%s", code, out, errOut)
	}
	t.Logf("dossier verify:\n%s", out)
	for _, link := range []string{"decision", "human decision", "authorization", "authorization receipt", "seller offer", "settlement", "seller receipt"} {
		if !strings.Contains(out, "VALID      "+link+" ") {
			t.Errorf("no VALID %s link:\n%s", link, out)
		}
	}
	if !strings.Contains(out, "a checkpoint the operator kept") || !strings.Contains(out, "the chain's head when the dossier was exported") {
		t.Errorf("no VALID kept and export checkpoints:\n%s", out)
	}
	if out, _, code := runCLI(t, "dossier", "verify", file); code != 1 || !strings.Contains(out, "UNVERIFIED") {
		t.Fatalf("on the file's own keys: %d\n%s", code, out)
	}
	if _, _, code := runCLI(t, "dossier", "export", "0x"+strings.Repeat("00", 32), "--dir", root, "--key-file", key); code != authExitUnknown {
		t.Fatalf("an unknown nonce: exit %d", code)
	}
	// authorization show prints the offer its receipt sealed, and a
	// dossier export command the operator can run as printed: with the
	// server's key where the default key file is, else a KEY_FILE it
	// explains.
	show, _, code := runCLI(t, "authorization", "show", allow.Authorization.Nonce, "--dir", root)
	if code != 0 || !strings.Contains(show, "offer sealed   sha256:") || !strings.Contains(show, "(eip712), signer "+seller+" (EIP-712), key "+strings.ToLower(seller)) ||
		!strings.Contains(show, "--key-file KEY_FILE --out dossier.json (KEY_FILE: the server's signing key") {
		t.Fatalf("authorization show: %d\n%s", code, show)
	}
	show, _, code = runCLIEnv(t, []string{"HAIA_CONFIG_DIR=" + filepath.Dir(key)}, "authorization", "show", allow.Authorization.Nonce, "--dir", root, "--reviewers", reviewers)
	cmdLine := ""
	for _, l := range strings.Split(show, "\n") {
		if _, after, ok := strings.Cut(l, "  dossier        haia-trace-mcp "); ok {
			cmdLine = after
		}
	}
	args := strings.Fields(cmdLine)
	if code != 0 || len(args) == 0 || args[len(args)-1] != "dossier.json" || !strings.Contains(cmdLine, "--reviewers "+reviewers+" --key-file "+key) {
		t.Fatalf("authorization show with the default key file: %d\n%s", code, show)
	}
	printed := filepath.Join(t.TempDir(), "printed.json")
	args[len(args)-1] = printed
	if out, errOut, code := runCLI(t, args...); code != 0 {
		t.Fatalf("the export command authorization show printed (%s): %d %s%s", cmdLine, code, out, errOut)
	}
	if out, _, code := runCLI(t, "dossier", "verify", printed, "--keyring", keyring, "--reviewers", reviewers); code != 0 || !strings.Contains(out, "VALID      offer seal") {
		t.Fatalf("the dossier the printed command wrote: %d\n%s", code, out)
	}

	// Each field edited is refused.
	orig, _ := os.ReadFile(file)
	var d map[string]any
	json.Unmarshal(orig, &d)
	auth := d["authorization"].(map[string]any)
	set := func(path []string, v any) []byte {
		var m map[string]any
		json.Unmarshal(orig, &m)
		cur := m
		for _, p := range path[:len(path)-1] {
			cur = cur[p].(map[string]any)
		}
		cur[path[len(path)-1]] = v
		b, _ := json.Marshal(m)
		return b
	}
	offer := string(mustJSON(auth["offer"]))
	st := d["settlement"].(map[string]any)
	sellerReceipt := string(mustJSON(st["seller_receipt"]))
	for name, edited := range map[string][]byte{
		"value":             set([]string{"authorization", "value"}, "25000000"),
		"payee":             set([]string{"authorization", "to"}, e2eSeller),
		"payer signature":   set([]string{"authorization", "signature"}, "0x"+strings.Repeat("11", 65)),
		"decision receipt":  set([]string{"authorization", "decision_receipt"}, "rcpt_other"),
		"offer amount":      set([]string{"authorization", "offer"}, json.RawMessage(strings.Replace(offer, `"amount":"2500000"`, `"amount":"2500001"`, 1))),
		"offer signer":      set([]string{"authorization", "offer_signer"}, e2eSeller+" (EIP-712)"),
		"transaction":       set([]string{"settlement", "transaction"}, "0x"+strings.Repeat("8d", 32)),
		"settlement payer":  set([]string{"settlement", "payer"}, seller),
		"seller receipt":    set([]string{"settlement", "seller_receipt"}, json.RawMessage(strings.Replace(sellerReceipt, `"issuedAt":1800000000`, `"issuedAt":1800000001`, 1))),
		"settlement digest": set([]string{"settlement", "digest"}, "0x"+strings.Repeat("00", 32)),
		"a receipt":         bytes.Replace(orig, []byte(`ALLOWED`), []byte(`BLOCKED`), 1),
		"no segments":       set([]string{"segments"}, []any{}),
		"review":            set([]string{"review"}, nil),
		"no checkpoints":    segEdit(orig, func(s map[string]any) { s["checkpoints"] = []any{} }),
		"no link":           segEdit(orig, func(s map[string]any) { s["link"] = []any{} }),
		"checkpoint head": segEdit(orig, func(s map[string]any) {
			cps := s["checkpoints"].([]any)
			cp := cps[len(cps)-1].(map[string]any)["checkpoint"].(map[string]any)
			cp["highestSeq"] = cp["highestSeq"].(float64) + 1
		}),
		"kept checkpoint": segEdit(orig, func(s map[string]any) {
			cp := s["checkpoints"].([]any)[0].(map[string]any)["checkpoint"].(map[string]any)
			cp["headHash"] = "sha256:" + strings.Repeat("0", 64)
		}),
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "d.json")
			os.WriteFile(p, edited, 0o600)
			out, _, code := runCLI(t, "dossier", "verify", p, "--keyring", keyring, "--reviewers", reviewers)
			if code != 2 && code != 3 {
				t.Fatalf("exit %d, want TAMPERED or MALFORMED:\n%s", code, out)
			}
		})
	}
}

// segEdit edits the dossier's segment that carries a link (the decision
// chain's).
func segEdit(orig []byte, f func(s map[string]any)) []byte {
	var m map[string]any
	json.Unmarshal(orig, &m)
	for _, s := range m["segments"].([]any) {
		if seg := s.(map[string]any); len(seg["link"].([]any)) > 0 {
			f(seg)
			b, _ := json.Marshal(m)
			return b
		}
	}
	panic("no segment with a link")
}
