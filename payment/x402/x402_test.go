package x402

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// testKeyHex is the key of the Web3 Secret Storage test vectors below.
const testKeyHex = "7a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d"

func testSigner(t testing.TB) *KeySigner {
	t.Helper()
	k, err := ParseKey([]byte(testKeyHex), nil)
	if err != nil {
		t.Fatal(err)
	}
	return NewKeySigner(k)
}

const baseUSDC = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"

func v2Required(amount, payTo string) string {
	return `{"x402Version":2,"resource":{"url":"https://api.example.com/data","mimeType":"application/json"},
	"accepts":[{"scheme":"exact","network":"eip155:8453","amount":"` + amount + `","asset":"` + baseUSDC + `",
	"payTo":"` + payTo + `","maxTimeoutSeconds":600,"extra":{"name":"USD Coin","version":"2"}}]}`
}

const payee = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"

func TestKeccakAndChecksum(t *testing.T) {
	if h := Keccak256(); hex.EncodeToString(h[:]) != "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470" {
		t.Fatalf("keccak256('') = %x", h)
	}
	// EIP-55's own test vectors.
	for _, s := range []string{"0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed", "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
		"0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB", "0xD1220A0cf47c7B9Be7A2E6BA89F429762e7b9aDb"} {
		a, err := ParseAddress(strings.ToLower(s))
		if err != nil {
			t.Fatal(err)
		}
		if a.Hex() != s {
			t.Errorf("checksum %s, want %s", a.Hex(), s)
		}
		if _, err := ParseAddress(s); err != nil {
			t.Errorf("a correct checksum is refused: %v", err)
		}
	}
	if _, err := ParseAddress("0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeD"); err == nil {
		t.Error("a wrong EIP-55 checksum was accepted")
	}
}

func TestAddressOfKnownKey(t *testing.T) {
	// The web3.js documentation's account.
	k, err := ParseKey([]byte("0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := NewKeySigner(k).Address().Hex(); got != "0x2c7536E3605D9C16a7a3D7b1898e529396a65c23" {
		t.Fatalf("address %s", got)
	}
}

func TestDomainSeparatorOfMainnetUSDC(t *testing.T) {
	// USDC on Ethereum (FiatTokenV2_2) publishes DOMAIN_SEPARATOR on chain.
	c, _ := ParseAddress("0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48")
	sep, err := Domain{Name: "USD Coin", Version: "2", ChainID: big.NewInt(1), VerifyingContract: c}.Separator()
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(sep[:]); got != "06c37168a7db5138defc7866392bb87a741f9b3d104deb5094588ce041cae335" {
		t.Fatalf("domain separator %s", got)
	}
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"plain", testKeyHex, true},
		{"0x and newline", "0x" + testKeyHex + "\n", true},
		{"CRLF", testKeyHex + "\r\n", true},
		{"short", testKeyHex[:62], false},
		{"not hex", strings.Repeat("z", 64), false},
		{"zero", strings.Repeat("0", 64), false},
		{"order", "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseKey([]byte(tc.in), nil)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v", err)
			}
			if err != nil && strings.Contains(err.Error(), tc.in) && tc.in != "" {
				t.Fatalf("the error repeats the key material: %v", err)
			}
		})
	}
}

// The Web3 Secret Storage Definition's test vectors (password "testpassword").
const (
	keystorePBKDF2 = `{"crypto":{"cipher":"aes-128-ctr","cipherparams":{"iv":"6087dab2f9fdbbfaddc31a909735c1e6"},"ciphertext":"5318b4d5bcd28de64ee5559e671353e16f075ecae9f99c7a79a38af5f869aa46","kdf":"pbkdf2","kdfparams":{"c":262144,"dklen":32,"prf":"hmac-sha256","salt":"ae3cd4e7013836a3df6bd7241b12db061dbe2c6785853cce422d148a624ce0bd"},"mac":"517ead924a9d0dc3124507e3393d175ce3ff7c1e96529c6c555ce9e51205e9b2"},"id":"3198bc9c-6672-5ab3-d995-4942343ae5b6","version":3}`
	keystoreScrypt = `{"crypto":{"cipher":"aes-128-ctr","cipherparams":{"iv":"83dbcc02d8ccb40e466191a123791e0e"},"ciphertext":"d172bf743a674da9cdad04534d56926ef8358534d458fffccd4e6ad2fbde479c","kdf":"scrypt","kdfparams":{"dklen":32,"n":262144,"r":1,"p":8,"salt":"ab0c7876052600dd703518d6fc3fe8984592145b591fc8fb5c6d43190334ba19"},"mac":"2103ac29920d71da29f15d75b4a16dbe95cfd7ff8faea1056c33131d846e3097"},"id":"3198bc9c-6672-5ab3-d995-4942343ae5b6","version":3}`
)

func TestKeystoreV3(t *testing.T) {
	want := testSigner(t).Address()
	for name, ks := range map[string]string{"pbkdf2": keystorePBKDF2, "scrypt": keystoreScrypt} {
		t.Run(name, func(t *testing.T) {
			k, err := ParseKey([]byte(ks), []byte("testpassword"))
			if err != nil {
				t.Fatal(err)
			}
			if NewKeySigner(k).Address() != want {
				t.Fatal("the keystore decrypts to another key")
			}
			if _, err := ParseKey([]byte(ks), []byte("wrong")); err == nil || !strings.Contains(err.Error(), "wrong password") {
				t.Fatalf("wrong password: %v", err)
			}
			if _, err := ParseKey([]byte(ks), nil); err == nil || !strings.Contains(err.Error(), "--payer-key-password-file") {
				t.Fatalf("no password: %v", err)
			}
		})
	}
	greedy := strings.Replace(keystoreScrypt, `"n":262144`, `"n":1073741824`, 1)
	if _, err := ParseKey([]byte(greedy), []byte("testpassword")); err == nil || !strings.Contains(err.Error(), "scrypt parameters") {
		t.Fatalf("a keystore asking for 1 TiB of scrypt memory: %v", err)
	}
	dup := strings.Replace(keystoreScrypt, `"version":3`, `"version":3,"version":3`, 1)
	if _, err := ParseKey([]byte(dup), []byte("testpassword")); err == nil {
		t.Fatal("a keystore with a duplicate key was read")
	}
}

func TestLoadKeyFileHardening(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "payer.key")
	if err := os.WriteFile(good, []byte("0x"+testKeyHex+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeyFile(good, ""); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.key")
	os.WriteFile(open, []byte(testKeyHex), 0o644)
	if _, err := LoadKeyFile(open, ""); !errors.Is(err, noa.ErrUnsafeKeyFile) {
		t.Fatalf("mode 0644: %v", err)
	}
	link := filepath.Join(dir, "link.key")
	os.Symlink(good, link)
	if _, err := LoadKeyFile(link, ""); !errors.Is(err, noa.ErrUnsafeKeyFile) {
		t.Fatalf("symlink: %v", err)
	}
	ks := filepath.Join(dir, "ks.json")
	pw := filepath.Join(dir, "pw")
	os.WriteFile(ks, []byte(keystorePBKDF2), 0o600)
	os.WriteFile(pw, []byte("testpassword\n"), 0o600)
	if _, err := LoadKeyFile(ks, pw); err != nil {
		t.Fatal(err)
	}
	os.Chmod(pw, 0o640)
	if _, err := LoadKeyFile(ks, pw); !errors.Is(err, noa.ErrUnsafeKeyFile) {
		t.Fatalf("password file mode 0640: %v", err)
	}
}

func TestParsePaymentRequired(t *testing.T) {
	good := v2Required("10000", payee)
	for _, tc := range []struct {
		name, in, err string
	}{
		{"v2 object", good, ""},
		{"v2 base64", base64.StdEncoding.EncodeToString([]byte(good)), ""},
		{"v2 base64url unpadded", base64.RawURLEncoding.EncodeToString([]byte(good)), ""},
		{"v1", `{"x402Version":1,"accepts":[{"scheme":"exact","network":"base","maxAmountRequired":"10000","resource":"https://a.example/x","description":"","mimeType":"","payTo":"` + payee + `","maxTimeoutSeconds":60,"asset":"` + baseUSDC + `","extra":{"name":"USD Coin","version":"2"}}]}`, ""},
		{"version 3", strings.Replace(good, `"x402Version":2`, `"x402Version":3`, 1), "not supported"},
		{"version string", strings.Replace(good, `"x402Version":2`, `"x402Version":"2"`, 1), "x402Version must be"},
		{"duplicate top key", strings.Replace(good, `"x402Version":2`, `"x402Version":2,"x402Version":2`, 1), "appears twice"},
		{"duplicate nested key", strings.Replace(good, `"amount":"10000"`, `"amount":"1","amount":"10000"`, 1), "appears twice"},
		{"two values", good + good, "more than one"},
		{"resource URL beside url", strings.Replace(good, `"url":"https://api.example.com/data"`, `"url":"https://api.example.com/data","URL":"https://evil.example/x"`, 1), `"URL" is not spelled "url"`},
		{"resource URL alone", strings.Replace(good, `"url":`, `"Url":`, 1), `"Url" is not spelled "url"`},
		{"resource mimetype", strings.Replace(good, `"mimeType":`, `"mimetype":`, 1), `"mimetype" is not spelled "mimeType"`},
		{"top-level Accepts", strings.Replace(good, `"x402Version":2,`, `"x402Version":2,"Accepts":[],`, 1), `"Accepts" is not spelled "accepts"`},
		{"no resource", `{"x402Version":2,"accepts":[]}`, "resource is missing"},
		{"empty accepts", `{"x402Version":2,"resource":{"url":"https://a.example"},"accepts":[]}`, "accepts is empty"},
		{"accepts not array", `{"x402Version":2,"resource":{"url":"https://a.example"},"accepts":{}}`, "accepts must be an array"},
		{"entry not object", `{"x402Version":2,"resource":{"url":"https://a.example"},"accepts":[5]}`, "must be an object"},
		{"deep", `{"x402Version":2,"x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, "deeper"},
		{"not json", "%%%", "base64"},
		{"base64 of non-object", base64.StdEncoding.EncodeToString([]byte("[1]")), "does not decode to a JSON object"},
		{"huge", `{"x402Version":2,"pad":"` + strings.Repeat("a", MaxPaymentRequiredBytes) + `"}`, "at most"},
		{"bad utf8", "{\"x402Version\":2,\"a\":\"\xff\"}", "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr, err := ParseHeaderOrJSON(tc.in)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(pr.Accepts) != 1 || pr.Accepts[0].Problem != "" {
					t.Fatalf("%+v", pr)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrPaymentRequired) {
				t.Fatalf("err = %v, want it to say %q", err, tc.err)
			}
		})
	}
}

func TestSelect(t *testing.T) {
	cfg, err := guard.ParseConfig([]byte(`{}`), "")
	if err != nil {
		t.Fatal(err)
	}
	entry := func(mod func(m map[string]any)) map[string]any {
		m := map[string]any{"scheme": "exact", "network": "eip155:8453", "amount": "250000", "asset": baseUSDC,
			"payTo": payee, "maxTimeoutSeconds": 60, "extra": map[string]any{"name": "USD Coin", "version": "2"}}
		if mod != nil {
			mod(m)
		}
		return m
	}
	for _, tc := range []struct {
		name  string
		mod   func(m map[string]any)
		skip  string
		check func(t *testing.T, c Choice)
	}{
		{"payable", nil, "", func(t *testing.T, c Choice) {
			if c.Amount() != "0.25" || c.Network != "eip155:8453" || c.PayTo.Hex() != payee {
				t.Fatalf("%+v", c)
			}
		}},
		{"scheme upto", func(m map[string]any) { m["scheme"] = "upto" }, "scheme", nil},
		{"solana", func(m map[string]any) { m["network"] = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp" }, "not an EVM network", nil},
		{"unknown token", func(m map[string]any) { m["asset"] = payee }, "not in the policy's assets", nil},
		{"same token other chain", func(m map[string]any) { m["network"] = "eip155:1" }, "not in the policy's assets", nil},
		{"negative", func(m map[string]any) { m["amount"] = "-1" }, "digits only", nil},
		{"decimal", func(m map[string]any) { m["amount"] = "0.25" }, "digits only", nil},
		{"exponent", func(m map[string]any) { m["amount"] = "1e6" }, "digits only", nil},
		{"leading zero", func(m map[string]any) { m["amount"] = "0100" }, "leading zero", nil},
		{"too big", func(m map[string]any) { m["amount"] = strings.Repeat("9", 78) }, "uint256", nil},
		{"79 digits", func(m map[string]any) { m["amount"] = strings.Repeat("1", 79) }, "at most 78", nil},
		{"zero", func(m map[string]any) { m["amount"] = "0" }, "zero", nil},
		{"amount number", func(m map[string]any) { m["amount"] = 250000 }, "must be a string", nil},
		{"no extra", func(m map[string]any) { delete(m, "extra") }, "EIP-712 name and version", nil},
		{"extra name number", func(m map[string]any) { m["extra"] = map[string]any{"name": 1, "version": "2"} }, "extra.name", nil},
		{"payTo zero", func(m map[string]any) { m["payTo"] = "0x0000000000000000000000000000000000000000" }, "zero address", nil},
		{"payTo bad", func(m map[string]any) { m["payTo"] = "0x12" }, "payTo", nil},
		{"timeout 0", func(m map[string]any) { m["maxTimeoutSeconds"] = 0 }, "maxTimeoutSeconds", nil},
		{"timeout fraction", func(m map[string]any) { m["maxTimeoutSeconds"] = 1.5 }, "maxTimeoutSeconds", nil},
		// What the official facilitator would refuse is never chosen.
		{"timeout 5", func(m map[string]any) { m["maxTimeoutSeconds"] = 5 }, "maxTimeoutSeconds is 5 seconds; an authorization valid that briefly cannot settle", nil},
		{"timeout 15", func(m map[string]any) { m["maxTimeoutSeconds"] = 15 }, "at least 16 are needed", nil},
		{"timeout 16", func(m map[string]any) { m["maxTimeoutSeconds"] = 16 }, "", func(t *testing.T, c Choice) {}},
		{"permit2", func(m map[string]any) {
			m["extra"] = map[string]any{"name": "USD Coin", "version": "2", "assetTransferMethod": "permit2"}
		}, "assetTransferMethod is permit2", nil},
		{"eip3009 named", func(m map[string]any) {
			m["extra"] = map[string]any{"name": "USD Coin", "version": "2", "assetTransferMethod": "eip3009"}
		}, "", func(t *testing.T, c Choice) {}},
		{"unknown method", func(m map[string]any) {
			m["extra"] = map[string]any{"name": "USD Coin", "version": "2", "assetTransferMethod": "erc7710"}
		}, "not one x402 names", nil},
		{"method number", func(m map[string]any) {
			m["extra"] = map[string]any{"name": "USD Coin", "version": "2", "assetTransferMethod": 1}
		}, "extra.assetTransferMethod must be a string", nil},
		{"method case twin", func(m map[string]any) {
			m["extra"] = map[string]any{"name": "USD Coin", "version": "2", "AssetTransferMethod": "permit2"}
		}, "not spelled", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := map[string]any{"x402Version": 2, "resource": map[string]any{"url": "https://a.example/x"}, "accepts": []any{entry(tc.mod)}}
			pr, err := ParseArgument(doc)
			if err != nil {
				t.Fatal(err)
			}
			c, skipped := Select(pr, cfg.Assets)
			if tc.skip == "" {
				if len(skipped) != 0 {
					t.Fatalf("skipped: %+v", skipped)
				}
				tc.check(t, c)
				return
			}
			if len(skipped) != 1 || !strings.Contains(skipped[0].Reason, tc.skip) {
				t.Fatalf("skipped %+v, want %q", skipped, tc.skip)
			}
		})
	}
	// The first payable entry wins; the unpayable ones before it are passed over.
	doc := map[string]any{"x402Version": 2, "resource": map[string]any{"url": "https://a.example/x"},
		"accepts": []any{entry(func(m map[string]any) { m["scheme"] = "upto" }), entry(nil), entry(func(m map[string]any) { m["amount"] = "1" })}}
	pr, _ := ParseArgument(doc)
	if c, _ := Select(pr, cfg.Assets); c.Index != 1 {
		t.Fatalf("chose entry %d", c.Index)
	}
}

func TestSignRecoverAndPayload(t *testing.T) {
	s := testSigner(t)
	cfg, _ := guard.ParseConfig([]byte(`{}`), "")
	pr, err := ParseHeaderOrJSON(v2Required("10000", payee))
	if err != nil {
		t.Fatal(err)
	}
	c, skipped := Select(pr, cfg.Assets)
	if skipped != nil {
		t.Fatal(skipped)
	}
	now := time.Unix(1_800_000_000, 0)
	terms, err := TermsFor(c, s.Address(), "rcpt-1", now, 300)
	if err != nil {
		t.Fatal(err)
	}
	a := terms.Authorization
	if a.ValidBefore.Int64() != now.Unix()+300 || a.ValidAfter.Int64() != now.Unix()-60 || a.Value.Int64() != 10000 {
		t.Fatalf("validity %v..%v value %v", a.ValidAfter, a.ValidBefore, a.Value)
	}
	if a.Nonce != NonceFor("rcpt-1") || a.Nonce == NonceFor("rcpt-2") {
		t.Fatal("the nonce is not the decision receipt's")
	}
	if short, _ := TermsFor(c, s.Address(), "r", now, 3600); short.Authorization.ValidBefore.Int64() != now.Unix()+600 {
		t.Fatal("maxTimeoutSeconds did not bound the validity")
	}
	// The validBefore chosen before the decision (and sealed into its
	// hold) is the one signed, however late the signing.
	if vb := ValidBeforeFor(c, now, 300); vb != now.Unix()+300 {
		t.Fatalf("ValidBeforeFor = %d", vb)
	}
	if late, _ := TermsUntil(c, s.Address(), "r", now.Add(7*time.Second), now.Unix()+300); late.Authorization.ValidBefore.Int64() != now.Unix()+300 ||
		late.Authorization.ValidAfter.Int64() != now.Unix()+7-60 {
		t.Fatalf("TermsUntil signs %v..%v", late.Authorization.ValidAfter, late.Authorization.ValidBefore)
	}
	sig, err := Sign(context.Background(), s, terms)
	if err != nil {
		t.Fatal(err)
	}
	if sig[64] != 27 && sig[64] != 28 {
		t.Fatalf("v = %d", sig[64])
	}
	pay, err := BuildPayment(pr, c, terms, sig)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		X402Version int
		Accepted    json.RawMessage
		Payload     ExactPayload
	}
	hb, _ := base64.StdEncoding.DecodeString(pay.Header)
	if string(hb) != string(pay.Payload) || json.Unmarshal(pay.Payload, &p) != nil {
		t.Fatal("header and payload disagree")
	}
	if p.X402Version != 2 || string(p.Accepted) != string(c.Req.Raw) || p.Payload.Authorization.To != payee {
		t.Fatalf("%s", pay.Payload)
	}
	// A signer that answers with another key's signature is caught before
	// anyone sees it; so is a digest recorded that is not the one signed,
	// whichever signer signed.
	stranger := testSignerSeed(t, 7)
	if _, err := Sign(context.Background(), lyingPayer{s, stranger}, terms); err == nil || !strings.Contains(err.Error(), "recovers to") {
		t.Fatalf("a signer answering another key's signature: %v", err)
	}
	swapped := terms
	swapped.Digest[0] ^= 1
	for _, signer := range []Signer{s, lyingPayer{s, s}} {
		if _, err := Sign(context.Background(), signer, swapped); err == nil {
			t.Fatalf("%T: signed terms whose recorded digest is not the one signed", signer)
		}
	}
	// Someone else's authorization is refused by the signer itself.
	other := terms
	other.Authorization.From = c.PayTo
	if _, err := s.SignAuthorization(context.Background(), other.Domain, other.Authorization); err == nil {
		t.Fatal("signed an authorization from another address")
	}
}

func TestRemotePayerSigner(t *testing.T) {
	s := testSigner(t)
	dir, err := os.MkdirTemp("", "payer") // a short path: unix sockets allow ~100 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s")
	ln, err := noa.ListenSigner(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg, _ := guard.ParseConfig([]byte(`{}`), "")
	lim, err := NewPayerLimits(300, "5.00", cfg.Assets, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- ServePayer(ctx, ln, s, lim, slog.New(slog.DiscardHandler)) }()
	rs, err := DialPayer(context.Background(), path, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Address() != s.Address() {
		t.Fatal("the remote signer announces another address")
	}
	pr, _ := ParseHeaderOrJSON(v2Required("10000", payee))
	c, _ := Select(pr, cfg.Assets)
	terms, _ := TermsFor(c, rs.Address(), "rcpt", time.Now(), 300)
	remote, err := Sign(context.Background(), rs, terms)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := Sign(context.Background(), s, terms)
	if remote != local {
		t.Fatal("the remote and local signatures differ (RFC 6979 makes them equal)")
	}
	bad := terms
	bad.Authorization.From = c.PayTo
	if _, err := rs.SignAuthorization(context.Background(), bad.Domain, bad.Authorization); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a foreign from: %v", err)
	}
	// A raw request outside the protocol is refused.
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte(`{"op":"sign","msg":"AAAA"}` + "\n"))
	buf := make([]byte, 256)
	n, _ := conn.Read(buf)
	conn.Close()
	if !strings.Contains(string(buf[:n]), `"error":"request is not exact: unknown field \"msg\""`) {
		t.Fatalf("raw sign: %s", buf[:n])
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Stopped: fail closed, quickly.
	start := time.Now()
	if _, err := Sign(context.Background(), rs, terms); err == nil {
		t.Fatal("a stopped signer signed")
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("a stopped signer hung the caller")
	}
	if err := rs.Ping(context.Background()); err == nil {
		t.Fatal("ping of a stopped signer succeeded")
	}
}

func TestSameResource(t *testing.T) {
	for _, tc := range []struct {
		a, d string
		same bool
	}{
		{"https://api.example.com/data", "https://api.example.com/data", true},
		{"https://API.example.com/data?x=1", "https://api.example.com/data", true},
		{"https://api.example.com/data", "https://evil.example/data", false},
		{"https://api.example.com/data", "https://api.example.com/other", false},
		{"not a url", "https://api.example.com/data", false},
		{"https://api.example.com/data", "https://API.Example.com:443/./data#frag", true},
		{"https://api.example.com/data?x=1", "https://api.example.com/data?x=1", true},
		{"https://api.example.com/data?x=1", "https://api.example.com/a/../data?x=%31", true},
		// A query the agent did not ask for, or another one: another URL.
		{"https://api.example.com/data", "https://api.example.com/data?n=2", false},
		{"https://api.example.com/data?x=1", "https://api.example.com/data?x=2", false},
		// Order matters: the declaration is another URL.
		{"https://api.example.com/data?a=1&b=2", "https://api.example.com/data?b=2&a=1", false},
	} {
		if got := SameResource(tc.a, tc.d); got != tc.same {
			t.Errorf("SameResource(%q, %q) = %v", tc.a, tc.d, got)
		}
	}
}

// An entry of accepts that spells an x402 field in another case is kept
// with its problem and never chosen to be paid.
func TestRequirementsNamesAreExact(t *testing.T) {
	for _, c := range []struct{ from, to, want string }{
		{`"payTo":`, `"payTo":"0x0000000000000000000000000000000000000001","PayTo":`, `"PayTo" is not spelled "payTo"`},
		{`"amount":"10000"`, `"amount":"10000","Amount":"1"`, `"Amount" is not spelled "amount"`},
		{`"name":"USD Coin"`, `"name":"USD Coin","NAME":"Other"`, `extra: the field "NAME" is not spelled "name"`},
	} {
		pr, err := ParseHeaderOrJSON(strings.Replace(v2Required("10000", payee), c.from, c.to, 1))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(pr.Accepts[0].Problem, c.want) {
			t.Fatalf("%s: problem %q, want %q", c.to, pr.Accepts[0].Problem, c.want)
		}
		cfg, _ := guard.ParseConfig([]byte(`{}`), "")
		if _, skipped := Select(pr, cfg.Assets); len(skipped) != 1 {
			t.Fatalf("%s: an entry with a problem was chosen", c.to)
		}
	}
}

func FuzzParsePaymentRequired(f *testing.F) {
	f.Add(v2Required("10000", payee))
	f.Add(base64.StdEncoding.EncodeToString([]byte(v2Required("1", payee))))
	f.Add(`{"x402Version":1,"accepts":[{"scheme":"exact","network":"base","maxAmountRequired":"1","payTo":"` + payee + `","maxTimeoutSeconds":60,"asset":"` + baseUSDC + `"}]}`)
	f.Add(`{"x402Version":2,"x402Version":2}`)
	f.Add(strings.Replace(v2Required("1", payee), `"url":`, `"URL":`, 1))
	cfg, _ := guard.ParseConfig([]byte(`{}`), "")
	s := testSigner(f)
	f.Fuzz(func(t *testing.T, in string) {
		pr, err := ParseHeaderOrJSON(in)
		if err != nil {
			if !errors.Is(err, ErrPaymentRequired) {
				t.Fatalf("an error outside the contract: %v", err)
			}
			return
		}
		c, skipped := Select(pr, cfg.Assets)
		if len(skipped) == len(pr.Accepts) {
			return
		}
		// Whatever was chosen is read exactly: signing it and rebuilding
		// the payload never fails, and the amount is the entry's own.
		if c.Atomic.String() != c.Req.Amount {
			t.Fatalf("amount %s read as %s", c.Req.Amount, c.Atomic)
		}
		terms, err := TermsFor(c, s.Address(), "r", time.Unix(1_800_000_000, 0), 300)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := BuildPayment(pr, c, terms, [65]byte{}); err != nil {
			t.Fatal(err)
		}
	})
}

// The payer signer reads each request line from its socket: whatever the
// bytes, it answers without panicking, and it signs only an authorization
// from its own address (checked by recovering the signer).
func FuzzPayerRequest(f *testing.F) {
	s := testSigner(f)
	cfg, _ := guard.ParseConfig([]byte(`{}`), "")
	pr, _ := ParseHeaderOrJSON(v2Required("10000", payee))
	c, _ := Select(pr, cfg.Assets)
	terms, _ := TermsFor(c, s.Address(), "r", time.Unix(1_800_000_000, 0), 300)
	good, _ := json.Marshal(payerRequest{Op: "sign_authorization", Domain: &domainJSON{Name: "USD Coin", Version: "2", ChainID: "8453", VerifyingContract: baseUSDC},
		Authorization: func() *AuthorizationJSON { a := terms.Authorization.JSON(); return &a }()})
	f.Add(good)
	f.Add([]byte(`{"op":"payer"}`))
	f.Add([]byte(`{"op":"sign","msg":"AAAA"}`))
	f.Add([]byte(`{"op":"sign_authorization","domain":{},"authorization":{}}`))
	log := slog.New(slog.DiscardHandler)
	lim, err := NewPayerLimits(300, "5.00", cfg.Assets, func() time.Time { return time.Unix(1_800_000_000, 0) })
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		resp := answerPayer(context.Background(), line, s, lim, log)
		if resp.Signature == "" {
			return
		}
		var req payerRequest
		if err := json.Unmarshal(line, &req); err != nil || req.Domain == nil || req.Authorization == nil {
			t.Fatalf("signed %q", line)
		}
		d, err1 := req.Domain.read()
		a, err2 := req.Authorization.Read()
		if err1 != nil || err2 != nil || a.From != s.Address() {
			t.Fatalf("signed an unreadable or foreign request %q", line)
		}
		digest, _ := Digest(d, a)
		var sig [65]byte
		b, _ := hex.DecodeString(resp.Signature[2:])
		copy(sig[:], b)
		if who, err := Recover(digest, sig); err != nil || who != s.Address() {
			t.Fatalf("the signature does not recover to the payer: %v", err)
		}
		if a.Value.Cmp(big.NewInt(5_000_000)) > 0 || a.ValidBefore.Cmp(big.NewInt(1_800_000_300)) > 0 {
			t.Fatalf("signed past the limits: value %s, validBefore %s", a.Value, a.ValidBefore)
		}
	})
}

// The payer signer holds its own line: a value above --max-value, a
// validity past maxAuthorizationSeconds (up to 2^256-1) or a token whose
// decimals it does not know is refused by name, and each signature is
// logged with its payee, value, asset, validBefore and nonce.
func TestPayerSignerLimits(t *testing.T) {
	s := testSigner(t)
	cfg, _ := guard.ParseConfig([]byte(`{}`), "")
	now := time.Unix(1_800_000_000, 0)
	lim, err := NewPayerLimits(120, "1.50", cfg.Assets, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	pr, _ := ParseHeaderOrJSON(v2Required("1500000", payee))
	c, _ := Select(pr, cfg.Assets)
	terms, _ := TermsFor(c, s.Address(), "r", now, 120)
	req := func(mod func(d *domainJSON, a *AuthorizationJSON)) []byte {
		d := domainJSON{Name: "USD Coin", Version: "2", ChainID: "8453", VerifyingContract: baseUSDC}
		a := terms.Authorization.JSON()
		if mod != nil {
			mod(&d, &a)
		}
		b, _ := json.Marshal(payerRequest{Op: "sign_authorization", Domain: &d, Authorization: &a})
		return b
	}
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	for _, tc := range []struct {
		name string
		mod  func(d *domainJSON, a *AuthorizationJSON)
		want string
	}{
		{"at the ceiling", nil, ""},
		{"above the ceiling", func(_ *domainJSON, a *AuthorizationJSON) { a.Value = "1500001" }, "the value 1.500001 USDC is above this signer's --max-value 1.5 USDC"},
		{"valid for ever", func(_ *domainJSON, a *AuthorizationJSON) {
			a.ValidBefore = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1)).String()
		}, "this signer signs authorizations valid for at most 120 seconds"},
		{"one second too long", func(_ *domainJSON, a *AuthorizationJSON) { a.ValidBefore = "1800000121" }, "is 121 seconds ahead"},
		{"unknown token", func(d *domainJSON, _ *AuthorizationJSON) { d.VerifyingContract = payee }, "is not among this signer's assets"},
		{"other chain", func(d *domainJSON, _ *AuthorizationJSON) { d.ChainID = "1" }, "on chain 1 is not among this signer's assets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := answerPayer(context.Background(), req(tc.mod), s, lim, log)
			if tc.want == "" {
				if resp.Signature == "" {
					t.Fatalf("refused: %s", resp.Error)
				}
				return
			}
			if resp.Signature != "" || !strings.Contains(resp.Error, tc.want) {
				t.Fatalf("answer %+v; want a refusal saying %q", resp, tc.want)
			}
		})
	}
	// A request that says two things is refused: a member named twice, or
	// spelled in another case beside the exact one.
	good := string(req(nil))
	for _, line := range []string{
		strings.Replace(good, `"op":"sign_authorization"`, `"op":"sign_authorization","op":"payer"`, 1),
		strings.Replace(good, `"value":"1500000"`, `"value":"1500000","Value":"9000000"`, 1),
		strings.Replace(good, `"domain":`, `"Domain":`, 1),
	} {
		if resp := answerPayer(context.Background(), []byte(line), s, lim, log); resp.Signature != "" || !strings.Contains(resp.Error, "request is not exact") {
			t.Errorf("%s: %+v", line, resp)
		}
	}
	out := logged.String()
	for _, want := range []string{"payer signer signed", "payee=" + payee, `value="1.5 USDC"`, "asset=" + guard.USDCBase, "valid_before=1800000120", "nonce=0x", "payer signer refused a request"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []struct {
		secs  int64
		value string
	}{{15, "1"}, {86401, "1"}, {300, "0"}, {300, "-1"}, {300, "1e3"}, {300, ""}} {
		if _, err := NewPayerLimits(bad.secs, bad.value, cfg.Assets, nil); err == nil {
			t.Errorf("limits %d s, %q accepted", bad.secs, bad.value)
		}
	}
}

// lyingPayer is a payer signer (not the in-process KeySigner) that
// answers with what by signs, while claiming Signer's address.
type lyingPayer struct {
	*KeySigner
	by *KeySigner
}

func (l lyingPayer) SignAuthorization(ctx context.Context, d Domain, a Authorization) ([65]byte, error) {
	a.From = l.by.Address()
	return l.by.SignAuthorization(ctx, d, a)
}

// testSignerSeed is a payer signer of its own, made from a small number.
func testSignerSeed(t testing.TB, n byte) *KeySigner {
	t.Helper()
	k, err := ParseKey([]byte(fmt.Sprintf("%064x", n)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return NewKeySigner(k)
}
