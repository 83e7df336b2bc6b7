// Package authtest is a tiny, offline token issuer for tests and the demo:
// it writes an ES256 public key into a JWKS file and signs access tokens with
// the private half, so that an auth.Verifier can be exercised end to end
// without an authorization server. It is not an authorization server.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Issuer signs tokens for one issuer and resource.
type Issuer struct {
	Issuer   string // the `iss` it puts in tokens
	Resource string // the `aud` it puts in tokens
	JWKSPath string // the JWKS file to give the verifier (--auth-jwks)
	KeyID    string
	key      *ecdsa.PrivateKey
}

// NewIssuer creates a fresh P-256 key and writes its JWKS to dir/jwks.json.
func NewIssuer(dir, issuer, resource string) (*Issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("authtest: generate key: %w", err)
	}
	iss := &Issuer{Issuer: issuer, Resource: resource, JWKSPath: filepath.Join(dir, "jwks.json"), KeyID: "authtest-1", key: key}
	jwks := map[string]any{"keys": []map[string]any{{
		"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": iss.KeyID,
		"x": enc(ecX(&key.PublicKey)), "y": enc(ecY(&key.PublicKey)),
	}}}
	data, err := json.MarshalIndent(jwks, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("authtest: encode JWKS: %w", err)
	}
	if err := os.WriteFile(iss.JWKSPath, data, 0o644); err != nil {
		return nil, fmt.Errorf("authtest: write JWKS: %w", err)
	}
	return iss, nil
}

// Token returns an access token for sub with the given scopes, issued at
// now and valid for ttl.
func (i *Issuer) Token(sub string, scopes []string, now time.Time, ttl time.Duration) (string, error) {
	return i.Sign(map[string]any{
		"iss":   i.Issuer,
		"aud":   i.Resource,
		"sub":   sub,
		"iat":   now.Unix(),
		"exp":   now.Add(ttl).Unix(),
		"scope": strings.Join(scopes, " "),
	})
}

// Sign signs an arbitrary claim set with the issuer's key (ES256).
func (i *Issuer) Sign(claims map[string]any) (string, error) {
	hdr, err := json.Marshal(map[string]string{"alg": "ES256", "kid": i.KeyID, "typ": "at+jwt"})
	if err != nil {
		return "", fmt.Errorf("authtest: encode header: %w", err)
	}
	body, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("authtest: encode claims: %w", err)
	}
	input := enc(hdr) + "." + enc(body)
	digest := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, i.key, digest[:])
	if err != nil {
		return "", fmt.Errorf("authtest: sign: %w", err)
	}
	return input + "." + enc(append(fixed32(r.Bytes()), fixed32(s.Bytes())...)), nil
}

func enc(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// fixed32 left-pads a big-endian P-256 integer to 32 bytes (RFC 7518 §3.4, §6.2.1.2).
func fixed32(b []byte) []byte {
	out := make([]byte, 32)
	copy(out[32-len(b):], b)
	return out
}

// ecX and ecY read a P-256 public key's coordinates from its uncompressed
// encoding (0x04 || X || Y), each 32 bytes.
func ecX(k *ecdsa.PublicKey) []byte { b, _ := k.Bytes(); return b[1:33] }
func ecY(k *ecdsa.PublicKey) []byte { b, _ := k.Bytes(); return b[33:65] }
