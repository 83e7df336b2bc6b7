// Package softauthn is a software WebAuthn authenticator for tests: an
// ECDSA P-256 key that produces real attestation ("none") and assertion
// bytes, as a browser hands them to a relying party.
package softauthn

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/go-webauthn/webauthn/protocol/webauthncbor"
)

// Flags of the authenticator data.
const (
	FlagUP = 0x01
	FlagUV = 0x04
	FlagAT = 0x40
)

// Authenticator holds one credential.
type Authenticator struct {
	Key     *ecdsa.PrivateKey
	CredID  []byte
	Counter uint32
	// Flags are set on every assertion (UP|UV unless a test changes them).
	Flags byte
}

// New returns an authenticator with a fresh key and a random 32-byte
// credential id.
func New() (*Authenticator, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	id := make([]byte, 32)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	return &Authenticator{Key: k, CredID: id, Flags: FlagUP | FlagUV}, nil
}

var b64 = base64.RawURLEncoding

// CredentialID is the credential id, base64url.
func (a *Authenticator) CredentialID() string { return b64.EncodeToString(a.CredID) }

// COSEKey is the credential's public key as a COSE_Key (EC2, ES256, P-256).
func (a *Authenticator) COSEKey() []byte {
	x := make([]byte, 32)
	y := make([]byte, 32)
	a.Key.X.FillBytes(x)
	a.Key.Y.FillBytes(y)
	b, err := webauthncbor.Marshal(map[int]any{1: 2, 3: -7, -1: 1, -2: x, -3: y})
	if err != nil {
		panic(err) // a map of ints and byte strings always marshals
	}
	return b
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
	digest := sha256.Sum256(append(append([]byte{}, ad...), cdh[:]...))
	sig, err := ecdsa.SignASN1(rand.Reader, a.Key, digest[:])
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
