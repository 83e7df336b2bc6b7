// Package passkey verifies, offline, the WebAuthn assertions a reviewer's
// passkey makes over a decision: the assertion's challenge is the 32 bytes
// of the decision hash (reviewlog.DecisionHash), so a valid assertion by a
// trusted credential proves that the passkey's holder, verified by the
// authenticator, approved or rejected exactly those terms with that note.
//
// The ceremonies' parsing and signature checks are go-webauthn's; this
// package fixes the policy: user verification required, the relying party
// id and the origin the reviewers file records, no cross-origin frames.
package passkey

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/protocol/webauthncose"
)

// ErrInvalid marks an assertion or credential that does not hold.
var ErrInvalid = errors.New("passkey assertion invalid")

// Bounds on what is read from untrusted records.
const (
	maxCredentialID = 1023 // WebAuthn caps credential ids at 1023 bytes
	maxPublicKey    = 2048
	maxAuthData     = 4096
	maxClientData   = 8192
	maxSignature    = 1024
)

// Credential is a reviewer's trusted passkey as the reviewers file lists
// it. Only the operator's command writes it there.
type Credential struct {
	// ID is the credential id (base64url, no padding).
	ID string `json:"credential_id"`
	// PublicKey is the credential's COSE_Key (base64url, no padding).
	PublicKey string `json:"public_key"`
	// RPID is the relying party id the credential is scoped to, and Origin
	// the one origin its assertions must name.
	RPID   string `json:"rp_id"`
	Origin string `json:"origin"`
}

// Assertion is one WebAuthn assertion as a decision record carries it,
// every member base64url without padding.
type Assertion struct {
	CredentialID      string `json:"credential_id"`
	AuthenticatorData string `json:"authenticator_data"`
	ClientDataJSON    string `json:"client_data_json"`
	Signature         string `json:"signature"`
	// Mandate, when set, is the digest ("sha256:<hex>") of a standing
	// approval (package mandate) the same gesture granted with the
	// decision: the challenge is then BoundChallenge of the decision hash
	// and it, so one assertion signs both, and neither without the other.
	Mandate string `json:"mandate,omitempty"`
}

// Check says whether c is a credential that can verify anything: its id
// and key decode, the key is a COSE key go-webauthn reads in one of
// Algorithms, and the relying party and origin are named.
func (c Credential) Check() error {
	id, err := decode("credential_id", c.ID, maxCredentialID)
	if err != nil {
		return err
	}
	if len(id) == 0 {
		return fmt.Errorf("%w: credential_id is empty", ErrInvalid)
	}
	pk, err := decode("public_key", c.PublicKey, maxPublicKey)
	if err != nil {
		return err
	}
	if _, err := webauthncose.ParsePublicKey(pk); err != nil {
		return fmt.Errorf("%w: public_key is no COSE key this server reads", ErrInvalid)
	}
	if err := CheckAlgorithm(pk); err != nil {
		return err
	}
	if c.RPID == "" || strings.ContainsAny(c.RPID, "/: \t") {
		return fmt.Errorf("%w: rp_id %q is no host name", ErrInvalid, clip(c.RPID))
	}
	if _, err := protocol.FullyQualifiedOrigin(c.Origin); err != nil || !strings.HasPrefix(c.Origin, "http") {
		return fmt.Errorf("%w: origin %q is no http(s) origin", ErrInvalid, clip(c.Origin))
	}
	return nil
}

// Fingerprint names a credential's public key for a human to compare:
// "sha256:" and the hex SHA-256 of its COSE_Key bytes, grouped by four.
func Fingerprint(publicKey string) (string, error) {
	pk, err := decode("public_key", publicKey, maxPublicKey)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(pk)
	h := hex.EncodeToString(sum[:])
	var b strings.Builder
	b.WriteString("sha256:")
	for i := 0; i < len(h); i += 4 {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(h[i : i+4])
	}
	return b.String(), nil
}

// Challenge is the WebAuthn challenge of a decision: the 32 bytes of the
// decision hash ("sha256:<hex>").
func Challenge(decisionHash string) ([]byte, error) {
	h, ok := strings.CutPrefix(decisionHash, "sha256:")
	if !ok || len(h) != 64 {
		return nil, fmt.Errorf("%w: decision hash %q is not sha256:<64 hex>", ErrInvalid, clip(decisionHash))
	}
	b, err := hex.DecodeString(h)
	if err != nil || hex.EncodeToString(b) != h {
		return nil, fmt.Errorf("%w: decision hash %q is not lower-case hex", ErrInvalid, clip(decisionHash))
	}
	return b, nil
}

// Verify checks that a is an assertion by credential c over challenge: the
// credential ids agree, the client data is of a "webauthn.get" ceremony
// with this challenge and c's origin (not cross-origin), the authenticator
// data names c's relying party with user presence and user verification,
// and the signature verifies under c's key.
func Verify(c Credential, a Assertion, challenge []byte) error {
	if err := c.Check(); err != nil {
		return err
	}
	parsed, err := parse(a)
	if err != nil {
		return err
	}
	want, _ := decode("credential_id", c.ID, maxCredentialID)
	if !bytes.Equal(parsed.RawID, want) {
		return fmt.Errorf("%w: made by credential %s, not %s", ErrInvalid, clip(a.CredentialID), clip(c.ID))
	}
	ad := parsed.Response.AuthenticatorData
	if rp := sha256.Sum256([]byte(c.RPID)); !bytes.Equal(ad.RPIDHash, rp[:]) {
		return fmt.Errorf("%w: made for another relying party than %s (RP id hash differs)", ErrInvalid, c.RPID)
	}
	if !ad.Flags.UserPresent() || !ad.Flags.UserVerified() {
		return fmt.Errorf("%w: the authenticator did not verify the user (user verification is required)", ErrInvalid)
	}
	pk, _ := decode("public_key", c.PublicKey, maxPublicKey)
	err = parsed.Verify(base64.RawURLEncoding.EncodeToString(challenge), c.RPID, "", []string{c.Origin}, nil, nil,
		protocol.TopOriginDefaultVerificationMode, false, true, true, pk, protocol.SignaturePolicy{})
	if err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, describe(err))
	}
	return nil
}

// VerifyDecision is Verify with the challenge of decisionHash: its 32
// bytes, or, when a names a mandate it granted too, BoundChallenge of the
// two.
func VerifyDecision(c Credential, a Assertion, decisionHash string) error {
	var ch []byte
	var err error
	if a.Mandate != "" {
		ch, err = BoundChallenge(decisionHash, a.Mandate)
	} else {
		ch, err = Challenge(decisionHash)
	}
	if err != nil {
		return err
	}
	return Verify(c, a, ch)
}

// boundLabel domain-separates a challenge that binds a decision and a
// mandate from every other challenge (a decision hash's own 32 bytes, a
// sign-in's random ones).
const boundLabel = "haia-trace-mcp/passkey/decision+mandate/v1\x00"

// BoundChallenge is the WebAuthn challenge of one gesture that decides a
// review and grants a standing approval: the SHA-256 of a label, the
// decision hash, a NUL and the mandate's digest (both "sha256:<hex>").
// decisionHash is "" for a mandate signed without a decision.
func BoundChallenge(decisionHash, mandateDigest string) ([]byte, error) {
	if decisionHash != "" {
		if _, err := Challenge(decisionHash); err != nil {
			return nil, err
		}
	}
	if _, err := Challenge(mandateDigest); err != nil {
		return nil, fmt.Errorf("%w (the mandate's digest)", err)
	}
	h := sha256.New()
	h.Write([]byte(boundLabel))
	h.Write([]byte(decisionHash))
	h.Write([]byte{0})
	h.Write([]byte(mandateDigest))
	return h.Sum(nil), nil
}

// ErrCloned marks an assertion whose signature counter did not grow past
// the last one seen from the same credential.
var ErrCloned = errors.New("passkey signature counter did not grow")

// CheckSignCount applies WebAuthn's clone detection: an authenticator that
// counts its signatures gives each a counter above the last; got at or
// below last means another authenticator holds the same key. Two zeros are
// an authenticator that does not count (many synced passkeys), and pass.
func CheckSignCount(last, got uint32) error {
	if (got != 0 || last != 0) && got <= last {
		return fmt.Errorf("%w: this assertion's signature counter is %d, not above the %d seen before from the same passkey — the authenticator may have been cloned", ErrCloned, got, last)
	}
	return nil
}

// SignCount is the authenticator's signature counter in a.
func SignCount(a Assertion) (uint32, error) {
	p, err := parse(a)
	if err != nil {
		return 0, err
	}
	return p.Response.AuthenticatorData.Counter, nil
}

func parse(a Assertion) (*protocol.ParsedCredentialAssertionData, error) {
	id, err := decode("credential_id", a.CredentialID, maxCredentialID)
	if err != nil {
		return nil, err
	}
	ad, err := decode("authenticator_data", a.AuthenticatorData, maxAuthData)
	if err != nil {
		return nil, err
	}
	cd, err := decode("client_data_json", a.ClientDataJSON, maxClientData)
	if err != nil {
		return nil, err
	}
	sig, err := decode("signature", a.Signature, maxSignature)
	if err != nil {
		return nil, err
	}
	car := protocol.CredentialAssertionResponse{
		PublicKeyCredential: protocol.PublicKeyCredential{
			Credential: protocol.Credential{ID: a.CredentialID, Type: string(protocol.PublicKeyCredentialType)},
			RawID:      id,
		},
		AssertionResponse: protocol.AuthenticatorAssertionResponse{
			AuthenticatorResponse: protocol.AuthenticatorResponse{ClientDataJSON: cd},
			AuthenticatorData:     ad,
			Signature:             sig,
		},
	}
	p, err := car.Parse()
	if err != nil {
		return nil, fmt.Errorf("%w: cannot be read: %s", ErrInvalid, describe(err))
	}
	return p, nil
}

func decode(name, s string, limit int) ([]byte, error) {
	if len(s) > base64.RawURLEncoding.EncodedLen(limit) {
		return nil, fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalid, name, limit)
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not base64url without padding", ErrInvalid, name)
	}
	return b, nil
}

// describe names what go-webauthn refused without its debugging detail.
func describe(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		if pe.Details != "" {
			return pe.Details
		}
		return pe.Type
	}
	return "malformed"
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// ModelPrefix starts the agent.model of a HUMAN receipt whose decision a
// passkey made: the NOA receipt format admits no member of its own for the
// assertion, so it rides, signed and hashed into the chain, in agent.model
// as ModelPrefix + base64url(JSON of the Assertion).
const ModelPrefix = "webauthn-assertion:"

// maxModel bounds the agent.model read.
const maxModel = 16 << 10

// EncodeModel is the agent.model that carries a.
func EncodeModel(a Assertion) string {
	b, _ := json.Marshal(a) // four strings always marshal
	return ModelPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// DecodeModel reads the assertion of an agent.model. ok is false when the
// model carries none (a decision signed with a reviewer's own key).
func DecodeModel(model *string) (a Assertion, ok bool, err error) {
	if model == nil || !strings.HasPrefix(*model, ModelPrefix) {
		return Assertion{}, false, nil
	}
	s := strings.TrimPrefix(*model, ModelPrefix)
	if len(s) > maxModel {
		return Assertion{}, true, fmt.Errorf("%w: the assertion in agent.model is longer than %d bytes", ErrInvalid, maxModel)
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Assertion{}, true, fmt.Errorf("%w: the assertion in agent.model is not base64url", ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil || dec.More() {
		return Assertion{}, true, fmt.Errorf("%w: the assertion in agent.model is not {credential_id, authenticator_data, client_data_json, signature[, mandate]}", ErrInvalid)
	}
	return a, true, nil
}
