package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// pinnedKey is a verification key with the one algorithm it may be used with.
// The algorithm comes from the key (its `alg`, or its type), never from a token.
type pinnedKey struct {
	alg jwa.SignatureAlgorithm
	key any // *rsa.PublicKey, *ecdsa.PublicKey or []byte (HS256)
}

// keySet is an immutable snapshot of the keys; Reload swaps whole snapshots.
type keySet struct {
	byKID map[string]pinnedKey // JWKS mode
	hmac  *pinnedKey           // HS256 mode: kid is not consulted
	cache *tokenCache          // tokens verified with these keys; nil when off
}

// readBounded reads a regular file of at most limit bytes.
func readBounded(path string, limit int64, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s %s: %w", what, path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s %s: %w", what, path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is not a regular file", what, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", what, path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s %s is larger than the %d-byte limit", what, path, limit)
	}
	return data, nil
}

// loadHMAC reads an HS256 secret. Trailing whitespace is dropped because
// secrets are usually written with `echo` or an editor that adds a newline.
func loadHMAC(path string, log *slog.Logger) (*keySet, error) {
	data, err := readBounded(path, maxSecretFileBytes, "HMAC secret file")
	if err != nil {
		return nil, err
	}
	secret := bytes.TrimRight(data, " \t\r\n")
	if len(secret) < minSecretBytes {
		return nil, fmt.Errorf("HMAC secret file %s holds %d bytes; HS256 needs at least %d (RFC 7518 §3.2)", path, len(secret), minSecretBytes)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		// Not refused: mounted secrets (Kubernetes) are often 0644 inside a private volume.
		log.Warn("HMAC secret file is readable by group or others", "path", path, "mode", st.Mode().Perm().String())
	}
	return &keySet{hmac: &pinnedKey{alg: jwa.HS256, key: secret}}, nil
}

// loadJWKS reads a JWKS file and keeps the keys usable for RS256 or ES256.
// Keys meant for something else (encryption, other curves or algorithms) are
// skipped with a warning, as an authorization server's JWKS may hold them; a
// file left with no usable key, or with two usable keys under one kid, is refused.
func loadJWKS(path string, log *slog.Logger) (*keySet, error) {
	data, err := readBounded(path, maxKeyFileBytes, "JWKS file")
	if err != nil {
		return nil, err
	}
	set, err := jwk.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("JWKS file %s is not a valid JWK set: %w", path, err)
	}
	ks := &keySet{byKID: make(map[string]pinnedKey)}
	for i := 0; i < set.Len(); i++ {
		k, _ := set.Key(i)
		pk, err := pinKey(k)
		if err != nil {
			log.Warn("JWKS key skipped", "path", path, "index", i, "kid", k.KeyID(), "reason", err.Error())
			continue
		}
		if _, dup := ks.byKID[k.KeyID()]; dup {
			return nil, fmt.Errorf("JWKS file %s has two usable keys with kid %q: a token's kid must name one key", path, k.KeyID())
		}
		ks.byKID[k.KeyID()] = pk
	}
	if len(ks.byKID) == 0 {
		return nil, fmt.Errorf("JWKS file %s has no usable key: need RSA (RS256, at least %d bits) or EC P-256 (ES256) public keys with a kid", path, minRSABits)
	}
	return ks, nil
}

// pinKey decides the single algorithm a JWK may verify.
func pinKey(k jwk.Key) (pinnedKey, error) {
	if k.KeyID() == "" {
		return pinnedKey{}, errors.New("no kid: tokens must name their key")
	}
	if u := k.KeyUsage(); u != "" && u != string(jwk.ForSignature) {
		return pinnedKey{}, fmt.Errorf("use is %q, not \"sig\"", u)
	}
	if ops := k.KeyOps(); len(ops) > 0 && !slices.Contains(ops, jwk.KeyOpVerify) {
		return pinnedKey{}, errors.New("key_ops does not allow \"verify\"")
	}
	declared := ""
	if a := k.Algorithm(); a != nil {
		declared = a.String()
	}
	var raw any
	pub, err := k.PublicKey() // a private JWK is reduced to its public half
	if err != nil {
		return pinnedKey{}, fmt.Errorf("no public key: %w", err)
	}
	if err := pub.Raw(&raw); err != nil {
		return pinnedKey{}, fmt.Errorf("unreadable key material: %w", err)
	}
	switch key := raw.(type) {
	case *rsa.PublicKey:
		if declared != "" && declared != string(jwa.RS256) {
			return pinnedKey{}, fmt.Errorf("RSA key declares alg %q; only RS256 is supported", declared)
		}
		if key.N.BitLen() < minRSABits {
			return pinnedKey{}, fmt.Errorf("RSA key has %d bits; at least %d are required", key.N.BitLen(), minRSABits)
		}
		return pinnedKey{alg: jwa.RS256, key: key}, nil
	case *ecdsa.PublicKey:
		if key.Curve != elliptic.P256() {
			return pinnedKey{}, fmt.Errorf("EC key on curve %s; only P-256 (ES256) is supported", key.Curve.Params().Name)
		}
		if declared != "" && declared != string(jwa.ES256) {
			return pinnedKey{}, fmt.Errorf("EC P-256 key declares alg %q; only ES256 is supported", declared)
		}
		return pinnedKey{alg: jwa.ES256, key: key}, nil
	default:
		return pinnedKey{}, fmt.Errorf("key type %s is not supported (symmetric keys belong in --auth-hmac-secret)", k.KeyType())
	}
}
