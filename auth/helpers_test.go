package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const (
	testIssuer   = "https://auth.example"
	testResource = "http://127.0.0.1:3000/mcp"
	testMetaURL  = "http://127.0.0.1:3000/.well-known/oauth-protected-resource/mcp"
)

// fixture holds keys generated for one test and the files written from them.
// Tokens are signed with the standard library, not jwx, so the library under
// test is checked against an independent signer.
type fixture struct {
	t          testing.TB
	dir        string
	rsa        *rsa.PrivateKey
	ec         *ecdsa.PrivateKey
	otherRSA   *rsa.PrivateKey
	secret     []byte
	jwksPath   string
	secretPath string
	now        time.Time
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir(), now: time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)}
	var err error
	if f.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if f.otherRSA, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if f.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	f.secret = make([]byte, 32)
	if _, err := rand.Read(f.secret); err != nil {
		t.Fatal(err)
	}
	// Stored base64url-encoded (printable), with the trailing newline an editor adds.
	f.secret = []byte(base64.RawURLEncoding.EncodeToString(f.secret))
	f.jwksPath = filepath.Join(f.dir, "jwks.json")
	f.secretPath = filepath.Join(f.dir, "hmac.secret")
	f.writeJWKS(f.jwksPath, map[string]any{"rsa-1": &f.rsa.PublicKey, "ec-1": &f.ec.PublicKey})
	if err := os.WriteFile(f.secretPath, append(append([]byte{}, f.secret...), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func padded(n *big.Int, size int) []byte {
	out := make([]byte, size)
	n.FillBytes(out)
	return out
}

// jwkJSON renders a public key as a JWK member map.
func jwkJSON(kid string, pub any) map[string]any {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return map[string]any{"kty": "RSA", "kid": kid, "use": "sig", "n": b64(k.N.Bytes()), "e": b64(big.NewInt(int64(k.E)).Bytes())}
	case *ecdsa.PublicKey:
		return map[string]any{"kty": "EC", "kid": kid, "crv": "P-256", "x": b64(ecCoord(k, 0)), "y": b64(ecCoord(k, 1))}
	}
	panic("unsupported key type in test")
}

func (f *fixture) writeJWKS(path string, keys map[string]any) {
	f.t.Helper()
	var list []map[string]any
	for kid, k := range keys {
		list = append(list, jwkJSON(kid, k))
	}
	data, err := json.Marshal(map[string]any{"keys": list})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// claims returns a valid claim set for the fixture's clock.
func (f *fixture) claims() map[string]any {
	return map[string]any{
		"iss":   testIssuer,
		"sub":   "agent-7",
		"aud":   testResource,
		"exp":   f.now.Add(10 * time.Minute).Unix(),
		"iat":   f.now.Unix(),
		"scope": "trace:read",
	}
}

// sign builds a compact JWS. key decides the signature: *rsa.PrivateKey →
// RS256 bytes, *ecdsa.PrivateKey → ES256 bytes, []byte → HMAC-SHA256, nil →
// empty signature. The header is taken as given, so it may lie about alg.
func (f *fixture) sign(header, claims map[string]any, key any) string {
	f.t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		f.t.Fatal(err)
	}
	c, err := json.Marshal(claims)
	if err != nil {
		f.t.Fatal(err)
	}
	input := b64(h) + "." + b64(c)
	digest := sha256.Sum256([]byte(input))
	var sig []byte
	switch k := key.(type) {
	case *rsa.PrivateKey:
		sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, digest[:])
	case *ecdsa.PrivateKey:
		var r, s *big.Int
		r, s, err = ecdsa.Sign(rand.Reader, k, digest[:])
		if err == nil {
			sig = append(padded(r, 32), padded(s, 32)...)
		}
	case []byte:
		m := hmac.New(sha256.New, k)
		m.Write([]byte(input))
		sig = m.Sum(nil)
	case nil:
	default:
		f.t.Fatalf("unsupported signing key %T", key)
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return input + "." + b64(sig)
}

func (f *fixture) rs256(claims map[string]any) string {
	return f.sign(map[string]any{"alg": "RS256", "kid": "rsa-1", "typ": "at+jwt"}, claims, f.rsa)
}

func (f *fixture) es256(claims map[string]any) string {
	return f.sign(map[string]any{"alg": "ES256", "kid": "ec-1", "typ": "at+jwt"}, claims, f.ec)
}

func (f *fixture) hs256(claims map[string]any) string {
	return f.sign(map[string]any{"alg": "HS256", "typ": "JWT"}, claims, f.secret)
}

// rsaPublicPEM is what an attacker would use as an HMAC key in an
// algorithm-confusion attack.
func (f *fixture) rsaPublicPEM() []byte {
	der, err := x509.MarshalPKIXPublicKey(&f.rsa.PublicKey)
	if err != nil {
		f.t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func (f *fixture) config(keys string) Config {
	cfg := Config{
		Issuer:     testIssuer,
		Resource:   testResource,
		Scopes:     []string{"trace:read"},
		ToolScopes: map[string]string{"check_before_pay": "trace:write"},
		Now:        func() time.Time { return f.now },
	}
	if keys == "hmac" {
		cfg.HMACSecretFile = f.secretPath
	} else {
		cfg.JWKSFile = f.jwksPath
	}
	return cfg
}

func (f *fixture) verifier(keys string) *Verifier {
	f.t.Helper()
	v, err := New(f.config(keys))
	if err != nil {
		f.t.Fatalf("New: %v", err)
	}
	return v
}

// with returns a copy of the valid claims changed by edit.
func (f *fixture) with(edit func(map[string]any)) map[string]any {
	c := f.claims()
	edit(c)
	return c
}

// ecCoord returns a P-256 key's X (i=0) or Y (i=1) from its uncompressed encoding.
func ecCoord(k *ecdsa.PublicKey, i int) []byte {
	b, err := k.Bytes()
	if err != nil {
		panic(err)
	}
	return b[1+32*i : 33+32*i]
}
