// Package sellerkey reads the public keys a seller signs x402 offers and
// receipts with under JWS (a JWK, or a did:jwk key identifier) and checks
// a JWS signature made with one. It has no dependency on the rest of the
// product, so that the policy reader can check a key named in the policy
// when it loads, and the payment reader can verify with it.
package sellerkey

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/decred/dcrd/dcrec/secp256k1/v4"
	decdsa "github.com/decred/dcrd/dcrec/secp256k1/v4/ecdsa"
)

// Key is a seller's public key for JWS: its algorithm is fixed by its
// curve, so a header cannot choose a weaker one.
type Key struct {
	// Alg is the JWS algorithm the key verifies: ES256, ES256K or EdDSA.
	Alg  string
	p256 *ecdsa.PublicKey
	k1   *secp256k1.PublicKey
	ed   ed25519.PublicKey
	// Thumbprint is the key's RFC 7638 JWK thumbprint (base64url SHA-256),
	// the name a record keeps for it.
	Thumbprint string
	// jwk is the public JWK with its required members only, in RFC 7638's
	// canonical form (what the thumbprint hashes).
	jwk string
}

// PublicJWK is the key as a public JWK with its required members only, in
// RFC 7638's canonical form: what ParseJWK reads back to the same key and
// thumbprint ("" for a Key not read by ParseJWK).
func (k Key) PublicJWK() string { return k.jwk }

// ParseJWK reads a public JWK: kty EC with crv P-256 or secp256k1 (x, y),
// or kty OKP with crv Ed25519 (x). A private member (d) is refused, so
// that an operator who pasted a private key learns it at once.
func ParseJWK(raw []byte) (Key, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return Key{}, errors.New("a JWK must be a JSON object")
	}
	str := func(k string) (string, error) {
		v, ok := m[k]
		if !ok {
			return "", fmt.Errorf("the JWK has no %q", k)
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", fmt.Errorf("the JWK's %q must be a string", k)
		}
		return s, nil
	}
	if _, ok := m["d"]; ok {
		return Key{}, errors.New("the JWK holds a private key (member \"d\"); name the public key only")
	}
	kty, err := str("kty")
	if err != nil {
		return Key{}, err
	}
	crv, err := str("crv")
	if err != nil {
		return Key{}, err
	}
	coord := func(k string, n int) ([]byte, string, error) {
		s, err := str(k)
		if err != nil {
			return nil, "", err
		}
		b, err := base64.RawURLEncoding.Strict().DecodeString(s)
		if err != nil || len(b) != n {
			return nil, "", fmt.Errorf("the JWK's %q must be %d bytes in unpadded base64url", k, n)
		}
		return b, s, nil
	}
	switch {
	case kty == "EC" && (crv == "P-256" || crv == "secp256k1"):
		x, xs, err := coord("x", 32)
		if err != nil {
			return Key{}, err
		}
		y, ys, err := coord("y", 32)
		if err != nil {
			return Key{}, err
		}
		canon := fmt.Sprintf(`{"crv":%q,"kty":"EC","x":%q,"y":%q}`, crv, xs, ys)
		tp := thumbprint(canon)
		if crv == "P-256" {
			pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
			if err != nil {
				return Key{}, errors.New("the JWK's point is not on P-256")
			}
			return Key{Alg: "ES256", p256: pub, Thumbprint: tp, jwk: canon}, nil
		}
		pub, err := secp256k1.ParsePubKey(append(append([]byte{4}, x...), y...))
		if err != nil {
			return Key{}, errors.New("the JWK's point is not on secp256k1")
		}
		return Key{Alg: "ES256K", k1: pub, Thumbprint: tp, jwk: canon}, nil
	case kty == "OKP" && crv == "Ed25519":
		x, xs, err := coord("x", ed25519.PublicKeySize)
		if err != nil {
			return Key{}, err
		}
		canon := fmt.Sprintf(`{"crv":"Ed25519","kty":"OKP","x":%q}`, xs)
		return Key{Alg: "EdDSA", ed: ed25519.PublicKey(x), Thumbprint: thumbprint(canon), jwk: canon}, nil
	}
	return Key{}, fmt.Errorf("a JWK of kty %q and crv %q is not read (EC P-256, EC secp256k1 and OKP Ed25519 are)", clip(kty), clip(crv))
}

// FromKID reads a key that its identifier carries: did:jwk:<base64url of
// the JWK>. ok is false for any other identifier (did:web, did:key …),
// whose key must be named beside it.
func FromKID(kid string) (Key, bool, error) {
	did, _, _ := strings.Cut(kid, "#")
	rest, found := strings.CutPrefix(did, "did:jwk:")
	if !found {
		return Key{}, false, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return Key{}, true, errors.New("a did:jwk identifier must carry the JWK in unpadded base64url")
	}
	k, err := ParseJWK(b)
	return k, true, err
}

func thumbprint(canonical string) string {
	h := sha256.Sum256([]byte(canonical))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

// Header is a JWS protected header as read here.
type Header struct {
	Alg string `json:"alg"`
	KID string `json:"kid"`
}

// Compact is a JWS compact serialization split into its parts.
type Compact struct {
	Header    Header
	Payload   []byte
	signing   []byte
	signature []byte
}

// ParseCompact splits header.payload.signature and reads the header: alg
// and kid required, no crit, no b64 (the payload is always encoded), no
// key carried in the header (jwk, jku, x5u, x5c), which would let the
// signer name its own key.
func ParseCompact(s string) (Compact, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return Compact{}, errors.New("a JWS compact serialization has three parts separated by dots")
	}
	dec := func(p, what string) ([]byte, error) {
		b, err := base64.RawURLEncoding.Strict().DecodeString(p)
		if err != nil {
			return nil, fmt.Errorf("the JWS %s is not unpadded base64url", what)
		}
		return b, nil
	}
	hb, err := dec(parts[0], "header")
	if err != nil {
		return Compact{}, err
	}
	var hm map[string]json.RawMessage
	if err := json.Unmarshal(hb, &hm); err != nil || hm == nil {
		return Compact{}, errors.New("the JWS header is not a JSON object")
	}
	for _, k := range []string{"crit", "b64", "jwk", "jku", "x5u", "x5c"} {
		if _, ok := hm[k]; ok {
			return Compact{}, fmt.Errorf("the JWS header carries %q, which is not accepted", k)
		}
	}
	var c Compact
	if err := json.Unmarshal(hb, &c.Header); err != nil {
		return Compact{}, errors.New("the JWS header's alg and kid must be strings")
	}
	if c.Header.Alg == "" || c.Header.KID == "" {
		return Compact{}, errors.New("the JWS header must name alg and kid")
	}
	if c.Payload, err = dec(parts[1], "payload"); err != nil {
		return Compact{}, err
	}
	if c.signature, err = dec(parts[2], "signature"); err != nil {
		return Compact{}, err
	}
	c.signing = []byte(parts[0] + "." + parts[1])
	return c, nil
}

// Verify checks the signature with k: the header's alg must be the key's.
func (c Compact) Verify(k Key) error {
	if c.Header.Alg != k.Alg {
		return fmt.Errorf("the JWS is signed with alg %q, and the key %s verifies %s only", clip(c.Header.Alg), k.Thumbprint, k.Alg)
	}
	switch k.Alg {
	case "ES256", "ES256K":
		if len(c.signature) != 64 {
			return errors.New("an ECDSA JWS signature is 64 bytes (r ‖ s)")
		}
		h := sha256.Sum256(c.signing)
		if k.Alg == "ES256" {
			r, s := new(big.Int).SetBytes(c.signature[:32]), new(big.Int).SetBytes(c.signature[32:])
			if !ecdsa.Verify(k.p256, h[:], r, s) {
				return errors.New("the JWS signature does not verify")
			}
			return nil
		}
		var r, s secp256k1.ModNScalar
		if r.SetByteSlice(c.signature[:32]) || s.SetByteSlice(c.signature[32:]) || r.IsZero() || s.IsZero() {
			return errors.New("the JWS signature does not verify")
		}
		if !decdsa.NewSignature(&r, &s).Verify(h[:], k.k1) {
			return errors.New("the JWS signature does not verify")
		}
		return nil
	case "EdDSA":
		if !ed25519.Verify(k.ed, c.signing, c.signature) {
			return errors.New("the JWS signature does not verify")
		}
		return nil
	}
	return fmt.Errorf("the key's algorithm %q is not verified here", k.Alg)
}

// Equal says whether two keys are the same key.
func (k Key) Equal(o Key) bool {
	return k.Thumbprint != "" && k.Thumbprint == o.Thumbprint && k.Alg == o.Alg
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
