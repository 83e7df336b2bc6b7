package noa

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"slices"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
)

// Signer signs NOA preimages. Implementations: KeySigner (in process) and
// the client DialSigner returns (a signer process).
type Signer interface {
	KeyID() string
	PublicKey() ed25519.PublicKey
	Sign(ctx context.Context, msg []byte) ([]byte, error)
}

// KeySigner signs with a private key held in this process.
type KeySigner struct {
	key ed25519.PrivateKey
	kid string
}

// NewKeySigner returns a Signer for key whose kid is KeyID(public key).
// The public half is derived again from the seed, so that what it signs
// verifies under PublicKey by construction (Seal relies on it).
func NewKeySigner(key ed25519.PrivateKey) *KeySigner {
	if len(key) == ed25519.PrivateKeySize {
		key = ed25519.NewKeyFromSeed(key.Seed())
	}
	return &KeySigner{key: key, kid: KeyID(key.Public().(ed25519.PublicKey))}
}

func (s *KeySigner) KeyID() string                { return s.kid }
func (s *KeySigner) PublicKey() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }
func (s *KeySigner) Sign(ctx context.Context, msg []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return ed25519.Sign(s.key, msg), nil
}

// spkiPrefix is the fixed DER header of an Ed25519 SubjectPublicKeyInfo
// (RFC 8410): SEQUENCE { SEQUENCE { OID 1.3.101.112 } BIT STRING (33) }.
var spkiPrefix = []byte{0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00}

// EncodeSPKI returns the base64 DER SPKI of pub, the keyring's value form.
func EncodeSPKI(pub ed25519.PublicKey) string {
	return base64.StdEncoding.EncodeToString(append(slices.Clone(spkiPrefix), pub...))
}

// KeyID derives a stable key id from a public key: "haia-" and the first
// 16 hex digits of SHA-256 over its SPKI. A new key gets a new kid, so a
// key rotation can never be mistaken for the old key.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(append(slices.Clone(spkiPrefix), pub...))
	return "haia-" + hex.EncodeToString(sum[:8])
}

// fieldQ is 2^255-19, the Ed25519 field prime.
var fieldQ = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))

// smallOrder lists the canonical encodings of the eight points of small
// order; a real key is never one of them, and verifiers disagree about
// them (cofactored or not), so NOA refuses them.
var smallOrder = []string{
	"0100000000000000000000000000000000000000000000000000000000000000",
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
	"0000000000000000000000000000000000000000000000000000000000000000",
	"0000000000000000000000000000000000000000000000000000000000000080",
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
}

// DecodeSPKI parses a keyring value strictly: canonical base64 of exactly
// the 44-byte Ed25519 SPKI, a canonical point encoding (y < 2^255-19), not
// a small-order point. Lenient decoding would let one key have many
// spellings and split verifiers that agree on the bytes.
func DecodeSPKI(b64 string) (ed25519.PublicKey, error) {
	der, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil || base64.StdEncoding.EncodeToString(der) != b64 {
		return nil, errors.New("public key is not canonical base64")
	}
	if len(der) != len(spkiPrefix)+ed25519.PublicKeySize || !bytes.HasPrefix(der, spkiPrefix) {
		return nil, errors.New("public key is not a DER Ed25519 SubjectPublicKeyInfo")
	}
	raw := der[len(spkiPrefix):]
	if slices.Contains(smallOrder, hex.EncodeToString(raw)) {
		return nil, errors.New("public key is a small-order point")
	}
	le := slices.Clone(raw)
	le[31] &= 0x7f
	slices.Reverse(le)
	if new(big.Int).SetBytes(le).Cmp(fieldQ) >= 0 {
		return nil, errors.New("public key has a non-canonical y coordinate")
	}
	return ed25519.PublicKey(slices.Clone(raw)), nil
}

// verifySig checks a base64 signature over msg; the signature must be the
// canonical base64 of exactly 64 bytes.
func verifySig(pub ed25519.PublicKey, msg []byte, sigB64 string) bool {
	sig, err := base64.StdEncoding.Strict().DecodeString(sigB64)
	if err != nil || len(sig) != ed25519.SignatureSize || base64.StdEncoding.EncodeToString(sig) != sigB64 {
		return false
	}
	return ed25519.Verify(pub, msg, sig)
}

// preimage is the domain-separated message that is signed:
// domain tag ++ SHA-256(hash input).
func preimage(domain string, input []byte) []byte {
	sum := sha256.Sum256(input)
	return append([]byte(domain), sum[:]...)
}

// Keyring maps a kid to the base64 SPKI of its public key: the trust root
// of verification. Entries are decoded when used, so one bad entry only
// fails the receipts that name it.
type Keyring map[string]string

// Add puts pub in the keyring under kid.
func (k Keyring) Add(kid string, pub ed25519.PublicKey) { k[kid] = EncodeSPKI(pub) }

// JSON returns the keyring in its canonical file form.
func (k Keyring) JSON() ([]byte, error) {
	m := make(map[string]any, len(k))
	for kid, v := range k {
		m[kid] = v
	}
	return jcs.Marshal(m)
}

// ParseKeyring decodes a keyring file ({kid: base64 SPKI}).
func ParseKeyring(data []byte) (Keyring, error) {
	v, err := jcs.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, &MalformedError{Path: "keyring", Msg: "must be an object (kid -> base64 SPKI)"}
	}
	k := make(Keyring, len(m))
	for kid, val := range m {
		s, ok := val.(string)
		if !ok {
			return nil, &MalformedError{Path: fmt.Sprintf("keyring[%q]", kid), Msg: "must be a base64 SPKI string"}
		}
		k[kid] = s
	}
	return k, nil
}

// Identity maps an agent.id to the kids authorized to sign for it. With an
// identity manifest, VALID means "this agent.id signed", not only "a
// trusted key signed".
type Identity map[string][]string

// ParseIdentity decodes an identity manifest ({agent.id: [kid, ...]}).
func ParseIdentity(data []byte) (Identity, error) {
	v, err := jcs.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("identity manifest: %w", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, &MalformedError{Path: "identity", Msg: "must be an object (agent.id -> [kid])"}
	}
	id := make(Identity, len(m))
	for agent, val := range m {
		arr, ok := val.([]any)
		if !ok {
			return nil, &MalformedError{Path: fmt.Sprintf("identity[%q]", agent), Msg: "must be an array of kid strings"}
		}
		kids := make([]string, 0, len(arr))
		for _, e := range arr {
			s, ok := e.(string)
			if !ok {
				return nil, &MalformedError{Path: fmt.Sprintf("identity[%q]", agent), Msg: "must be an array of kid strings"}
			}
			kids = append(kids, s)
		}
		id[agent] = kids
	}
	return id, nil
}

func (id Identity) allows(agent, kid string) bool {
	return slices.Contains(id[agent], kid)
}

// checkKeyFileOwner refuses a key file owned by anyone but the process's
// effective user or root: whoever owns the file can replace the key with
// their own, or grant themselves read access, whatever its mode says now.
func checkKeyFileOwner(path string, owner uint32, euid int) error {
	if owner == 0 || int64(owner) == int64(euid) {
		return nil
	}
	return fmt.Errorf("key file %s: %w: owned by uid %d, not by this process's user (uid %d) or root; run chown %d %s",
		path, ErrUnsafeKeyFile, owner, euid, euid, path)
}
