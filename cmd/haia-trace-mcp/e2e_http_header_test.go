package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The server over HTTP reads a token's protected header exactly: a member
// named twice, or a registered one in another case, is a malformed token
// (401), though the token is signed with the right key; the same claims
// under a plain header are accepted.
func TestHTTPTokenHeaderReadExactly(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("k", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile)
	body, err := json.Marshal(map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": "hs-agent",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	sign := func(header string) string {
		input := enc([]byte(header)) + "." + enc(body)
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(input))
		return input + "." + enc(mac.Sum(nil))
	}
	for _, c := range []struct {
		name, header string
		status       int
	}{
		{"plain", `{"alg":"HS256","typ":"JWT"}`, 200},
		{"typ twice", `{"alg":"HS256","typ":"dpop+jwt","typ":"JWT"}`, 401},
		{"alg twice, one escaped", `{"alg":"none","\u0061lg":"HS256"}`, 401},
		{"ALG beside alg", `{"ALG":"none","alg":"HS256"}`, 401},
		{"Typ alone", `{"alg":"HS256","Typ":"JWT"}`, 401},
	} {
		code, challenge := rawInitialize(t, p.resource, sign(c.header))
		if code != c.status {
			t.Fatalf("%s: HTTP %d, want %d (%s)\n%s", c.name, code, c.status, challenge, p.logs())
		}
		if c.status == 401 && (!strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, "malformed token")) {
			t.Fatalf("%s: challenge %q", c.name, challenge)
		}
	}
}
