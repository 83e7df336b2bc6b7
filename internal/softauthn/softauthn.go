// Package softauthn is a software WebAuthn authenticator for tests: a key
// (ECDSA P-256 by default; P-384, Ed25519 or RSA on request) that produces
// real attestation ("none") and assertion bytes, as a browser hands them
// to a relying party.
package softauthn

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/big"

	"github.com/go-webauthn/webauthn/protocol/webauthncbor"
)

// Flags of the authenticator data.
const (
	FlagUP = 0x01
	FlagUV = 0x04
	FlagAT = 0x40
)

// COSE algorithms an Authenticator can hold a key of.
const (
	ES256 = -7
	ES384 = -35
	EdDSA = -8
	RS256 = -257
)

// Authenticator holds one credential.
type Authenticator struct {
	// Key is the ES256 key (nil for another algorithm); signer signs for
	// Alg, the credential's COSE algorithm.
	Key     *ecdsa.PrivateKey
	Alg     int
	signer  crypto.Signer
	CredID  []byte
	Counter uint32
	// Flags are set on every assertion (UP|UV unless a test changes them).
	Flags byte
}

// New returns an authenticator with a fresh key and a random 32-byte
// credential id.
func New() (*Authenticator, error) { return NewAlg(ES256) }

// NewAlg is New with a key of COSE algorithm alg (ES256, ES384, EdDSA or
// RS256).
func NewAlg(alg int) (*Authenticator, error) {
	a := &Authenticator{Alg: alg, Flags: FlagUP | FlagUV}
	var err error
	switch alg {
	case ES256:
		a.Key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		a.signer = a.Key
	case ES384:
		a.signer, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case EdDSA:
		_, a.signer, err = ed25519.GenerateKey(rand.Reader)
	case RS256:
		a.signer, err = rsa.GenerateKey(rand.Reader, 2048)
	default:
		return nil, fmt.Errorf("softauthn: no key of COSE algorithm %d", alg)
	}
	if err != nil {
		return nil, err
	}
	a.CredID = make([]byte, 32)
	if _, err := rand.Read(a.CredID); err != nil {
		return nil, err
	}
	return a, nil
}

var b64 = base64.RawURLEncoding

// CredentialID is the credential id, base64url.
func (a *Authenticator) CredentialID() string { return b64.EncodeToString(a.CredID) }

// COSEKey is the credential's public key as a COSE_Key (EC2 P-256 for
// ES256, P-384 for ES384, OKP Ed25519, RSA).
func (a *Authenticator) COSEKey() []byte {
	var m map[int]any
	switch k := a.signer.Public().(type) {
	case *ecdsa.PublicKey:
		crv := 1
		if k.Curve == elliptic.P384() {
			crv = 2
		}
		point, err := k.Bytes() // 0x04 ‖ x ‖ y
		if err != nil {
			panic(err) // a generated key always encodes
		}
		size := (len(point) - 1) / 2
		m = map[int]any{1: 2, 3: a.Alg, -1: crv, -2: point[1 : 1+size], -3: point[1+size:]}
	case ed25519.PublicKey:
		m = map[int]any{1: 1, 3: a.Alg, -1: 6, -2: []byte(k)}
	case *rsa.PublicKey:
		m = map[int]any{1: 3, 3: a.Alg, -1: k.N.Bytes(), -2: big.NewInt(int64(k.E)).Bytes()}
	}
	b, err := webauthncbor.Marshal(m)
	if err != nil {
		panic(err) // a map of ints and byte strings always marshals
	}
	return b
}

// sign signs data as the credential's algorithm does.
func (a *Authenticator) sign(data []byte) ([]byte, error) {
	switch a.Alg {
	case ES384:
		d := sha512.Sum384(data)
		return ecdsa.SignASN1(rand.Reader, a.signer.(*ecdsa.PrivateKey), d[:])
	case EdDSA:
		return a.signer.Sign(rand.Reader, data, crypto.Hash(0))
	case RS256:
		d := sha256.Sum256(data)
		return a.signer.Sign(rand.Reader, d[:], crypto.SHA256)
	}
	d := sha256.Sum256(data)
	return ecdsa.SignASN1(rand.Reader, a.Key, d[:])
}

func clientData(typ string, challenge []byte, origin string) []byte {
	b, _ := json.Marshal(map[string]any{"type": typ, "challenge": b64.EncodeToString(challenge), "origin": origin, "crossOrigin": false})
	return b
}

func (a *Authenticator) authData(rpID string, flags byte, attested []byte) []byte {
	h := sha256.Sum256([]byte(rpID))
	out := append([]byte{}, h[:]...)
	out = append(out, flags)
	out = binary.BigEndian.AppendUint32(out, a.Counter)
	return append(out, attested...)
}

// Attestation is what navigator.credentials.create returns, as JSON the
// relying party reads (PublicKeyCredential with an attestation response).
func (a *Authenticator) Attestation(rpID, origin string, challenge []byte) ([]byte, error) {
	attested := make([]byte, 16) // AAGUID zero
	attested = binary.BigEndian.AppendUint16(attested, uint16(len(a.CredID)))
	attested = append(attested, a.CredID...)
	attested = append(attested, a.COSEKey()...)
	ad := a.authData(rpID, a.Flags|FlagAT, attested)
	obj, err := webauthncbor.Marshal(map[string]any{"fmt": "none", "attStmt": map[string]any{}, "authData": ad})
	if err != nil {
		return nil, fmt.Errorf("attestation object: %w", err)
	}
	return json.Marshal(map[string]any{
		"id": a.CredentialID(), "rawId": a.CredentialID(), "type": "public-key",
		"response": map[string]any{
			"clientDataJSON":    b64.EncodeToString(clientData("webauthn.create", challenge, origin)),
			"attestationObject": b64.EncodeToString(obj),
		},
	})
}

// Assertion is one assertion's parts, base64url.
type Assertion struct {
	CredentialID, AuthenticatorData, ClientDataJSON, Signature string
}

// Assert signs challenge for rpID at origin, counting the signature.
func (a *Authenticator) Assert(rpID, origin string, challenge []byte) (Assertion, error) {
	a.Counter++
	return a.AssertRaw(rpID, clientData("webauthn.get", challenge, origin))
}

// AssertRaw signs the given client data bytes (for tests that forge them).
func (a *Authenticator) AssertRaw(rpID string, cd []byte) (Assertion, error) {
	ad := a.authData(rpID, a.Flags, nil)
	cdh := sha256.Sum256(cd)
	sig, err := a.sign(append(append([]byte{}, ad...), cdh[:]...))
	if err != nil {
		return Assertion{}, err
	}
	return Assertion{CredentialID: a.CredentialID(), AuthenticatorData: b64.EncodeToString(ad),
		ClientDataJSON: b64.EncodeToString(cd), Signature: b64.EncodeToString(sig)}, nil
}

// JSON is the assertion as navigator.credentials.get returns it.
func (x Assertion) JSON() ([]byte, error) {
	return json.Marshal(map[string]any{
		"id": x.CredentialID, "rawId": x.CredentialID, "type": "public-key",
		"response": map[string]any{"clientDataJSON": x.ClientDataJSON, "authenticatorData": x.AuthenticatorData, "signature": x.Signature},
	})
}
