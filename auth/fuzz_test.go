package auth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"slices"
	"strings"
	"testing"
)

// FuzzVerify feeds arbitrary strings to both verifiers. Verify must never
// panic, must fail only with *TokenError or *ScopeError, and must accept only
// tokens whose signature an independent standard-library check confirms.
func FuzzVerify(f *testing.F) {
	fx := newFixture(f)
	jwksV := fx.verifier("jwks")
	hmacV := fx.verifier("hmac")
	for _, s := range []string{
		fx.rs256(fx.claims()),
		fx.es256(fx.claims()),
		fx.hs256(fx.claims()),
		fx.sign(map[string]any{"alg": "none", "kid": "rsa-1"}, fx.claims(), nil),
		fx.sign(map[string]any{"alg": "HS256", "kid": "rsa-1"}, fx.claims(), fx.rsaPublicPEM()),
		breakSig(fx.rs256(fx.claims())),
		"", "a.b.c", "..", "eyJ.eyJ.", "not-a-jwt", "a.b.c.d.e",
	} {
		f.Add(s)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, token string) {
		for _, v := range []*Verifier{jwksV, hmacV} {
			_, err := v.Verify(ctx, token)
			var te *TokenError
			var se *ScopeError
			if err != nil && !errors.As(err, &te) && !errors.As(err, &se) {
				t.Fatalf("Verify returned an untyped error %T: %v", err, err)
			}
			if te != nil {
				if te.Description == "" || quoteSafe(te.Description) != te.Description {
					t.Fatalf("client-facing description %q is empty or not header-safe", te.Description)
				}
				continue
			}
			if !fx.signatureHolds(token, v == hmacV) {
				t.Fatalf("token accepted without a signature the oracle confirms: %q", token)
			}
		}
	})
}

// signatureHolds checks a compact JWS with the standard library alone.
func (f *fixture) signatureHolds(token string, hmacMode bool) bool {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return false
	}
	hdrBytes, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return false
	}
	var hdr struct{ Alg, Kid string }
	if json.Unmarshal(hdrBytes, &hdr) != nil {
		return false
	}
	input := []byte(parts[0] + "." + parts[1])
	digest := sha256.Sum256(input)
	switch {
	case hmacMode && hdr.Alg == "HS256":
		m := hmac.New(sha256.New, f.secret)
		m.Write(input)
		return hmac.Equal(m.Sum(nil), sig)
	case !hmacMode && hdr.Alg == "RS256" && hdr.Kid == "rsa-1":
		return rsa.VerifyPKCS1v15(&f.rsa.PublicKey, crypto.SHA256, digest[:], sig) == nil
	case !hmacMode && hdr.Alg == "ES256" && hdr.Kid == "ec-1" && len(sig) == 64:
		r := new(big.Int).SetBytes(sig[:32])
		s := new(big.Int).SetBytes(sig[32:])
		return ecdsa.Verify(&f.ec.PublicKey, digest[:], r, s)
	}
	return false
}

// FuzzCalledTools feeds arbitrary bodies to the per-tool scope peek. It must
// never panic, and whenever encoding/json (mcp-go's decoder) reads a single
// tools/call of a named tool, the peek must report that tool.
func FuzzCalledTools(f *testing.F) {
	for _, s := range []string{payBody, readBody1, batchBody, listBody, `[]`, `[1,2]`, `{"method":"tools/call"}`,
		`{"METHOD":"tools/call","Params":{"NAME":"x"}}`, `{"method":"tools/call","params":{"name":"a","name":"b"}}`,
		` [{"method":"tools/call","params":null}]`, `nul`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		tools, err := CalledTools(body)
		var m struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &m) == nil && m.Method == "tools/call" && m.Params.Name != "" {
			if err != nil || !slices.Contains(tools, m.Params.Name) {
				t.Fatalf("peek missed tool %q: tools %v, err %v", m.Params.Name, tools, err)
			}
		}
		if err != nil && len(tools) > 0 {
			t.Fatalf("both tools %v and error %v", tools, err)
		}
	})
}
