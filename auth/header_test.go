package auth

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// signRawHeaderRS256 signs the fixture's claims under a protected header
// given as raw JSON text, so that a test can put in what a map cannot hold
// (a member named twice).
func (f *fixture) signRawHeaderRS256(header string) string {
	f.t.Helper()
	c, err := json.Marshal(f.claims())
	if err != nil {
		f.t.Fatal(err)
	}
	input := b64([]byte(header)) + "." + b64(c)
	digest := sha256.Sum256([]byte(input))
	sig, err := rsa.SignPKCS1v15(rand.Reader, f.rsa, crypto.SHA256, digest[:])
	if err != nil {
		f.t.Fatal(err)
	}
	return input + "." + b64(sig)
}

// The protected header is read exactly, as the review log is: a member
// named twice, at any depth, or a registered header parameter spelled in
// another case is refused — encoding/json and the JWS library would each
// read another member. Every token here is signed with the pinned key;
// before, each of the refused ones was accepted. Members the server does
// not look at (x5t, nonce) are still accepted.
func TestTokenHeaderReadExactly(t *testing.T) {
	f := newFixture(t)
	v := f.verifier("jwks")
	for _, c := range []struct {
		name, header, want string
	}{
		{"plain", `{"alg":"RS256","kid":"rsa-1","typ":"at+jwt"}`, ""},
		{"members the server does not read", `{"alg":"RS256","kid":"rsa-1","typ":"at+jwt","x5t":"abc","nonce":"n","ext":{"a":1,"b":[{"a":2}]}}`, ""},
		{"typ twice", `{"alg":"RS256","kid":"rsa-1","typ":"dpop+jwt","typ":"at+jwt"}`, `"typ" appears twice`},
		{"kid twice", `{"alg":"RS256","kid":"ec-1","kid":"rsa-1"}`, `"kid" appears twice`},
		{"alg twice", `{"alg":"none","alg":"RS256","kid":"rsa-1"}`, `"alg" appears twice`},
		{"kid twice, one escaped", `{"alg":"RS256","kid":"ec-1","k\u0069d":"rsa-1"}`, `"kid" appears twice`},
		{"a member twice inside another", `{"alg":"RS256","kid":"rsa-1","jwk":{"kty":"RSA","kty":"EC"}}`, `"kty" appears twice`},
		{"ALG beside alg", `{"ALG":"none","alg":"RS256","kid":"rsa-1"}`, `"ALG" is "alg" in another case`},
		{"KID beside kid", `{"KID":"ec-1","alg":"RS256","kid":"rsa-1"}`, `"KID" is "kid" in another case`},
		{"Typ alone", `{"alg":"RS256","kid":"rsa-1","Typ":"at+jwt"}`, `"Typ" is "typ" in another case`},
		{"Crit alone", `{"alg":"RS256","kid":"rsa-1","Crit":["exp"]}`, `"Crit" is "crit" in another case`},
		{"X5T alone", `{"alg":"RS256","kid":"rsa-1","X5T":"abc"}`, `"X5T" is "x5t" in another case`},
		{"not an object", `["alg"]`, "not a JSON object"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := v.Verify(context.Background(), f.signRawHeaderRS256(c.header))
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var te *TokenError
			if !errors.As(err, &te) || te.Description != descMalformed || !strings.Contains(te.Err.Error(), c.want) {
				t.Fatalf("want a malformed token naming %q, got %v", c.want, err)
			}
		})
	}
}

// FuzzReadHeader: the protected header is the token's first bytes, the
// caller's own; reading it never panics, and a header it accepts names no
// member twice and no registered parameter in another case, and reads as
// encoding/json reads it.
func FuzzReadHeader(f *testing.F) {
	for _, s := range []string{
		`{"alg":"RS256","kid":"rsa-1","typ":"at+jwt"}`, `{"alg":"RS256","alg":"none"}`, `{"ALG":"x"}`,
		`{"jwk":{"kty":"RSA","kty":"EC"}}`, `{"k\u0069d":"a","kid":"b"}`, `[]`, ` {}`, `{"crit":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		hdr, err := readHeader(data)
		if err != nil {
			return
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(data, &members); err != nil {
			t.Fatalf("accepted a header encoding/json cannot read: %v", err)
		}
		for name := range members {
			for _, known := range joseNames {
				if name != known && strings.EqualFold(name, known) {
					t.Fatalf("accepted %q beside the registered %q", name, known)
				}
			}
		}
		// The top-level names by encoding/json's own tokens (escapes
		// decoded): none twice.
		dec := json.NewDecoder(strings.NewReader(string(data)))
		if _, err := dec.Token(); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			name := tok.(string)
			if seen[name] {
				t.Fatalf("accepted %q twice", name)
			}
			seen[name] = true
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				t.Fatal(err)
			}
		}
		var want joseHeader
		_ = json.Unmarshal(data, &want)
		if hdr.Alg != want.Alg || hdr.Kid != want.Kid || hdr.Typ != want.Typ || hdr.Cty != want.Cty {
			t.Fatalf("read %+v, encoding/json %+v", hdr, want)
		}
	})
}
