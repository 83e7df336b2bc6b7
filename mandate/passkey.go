package mandate

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// A grant the reviewer console makes with an approval is signed by the
// reviewer's passkey: one WebAuthn assertion whose challenge binds the
// review's decision hash (the record's Decision) and the record's digest
// (every byte a key would sign: the label and the line up to its
// signature, Prev included). The decision's receipt carries the same
// assertion, naming the digest (passkey.Assertion.Mandate), so each of
// the two verifies offline on its own, and neither can be edited without
// its signature failing.

// PasskeyKID is the key id of a record a passkey signed: which of the
// reviewer's passkeys is the assertion's credential id.
const PasskeyKID = "passkey"

// PasskeySigPrefix starts the signature of a record a passkey signed.
const PasskeySigPrefix = "webauthn:"

// SignedWithPasskey says whether the record's signature is a passkey's.
func (r *Record) SignedWithPasskey() bool { return strings.HasPrefix(r.Sig, PasskeySigPrefix) }

// Digest is what a passkey signs of r: "sha256:" and the hex SHA-256 of
// the label and the line up to its signature. r is checked first (its
// format version set).
func (r *Record) Digest() (string, error) {
	r.V = Version
	if err := r.Check(); err != nil {
		return "", err
	}
	p, err := r.prefix()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(message(p))
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// PasskeyChallenge is the WebAuthn challenge a passkey signs to grant r
// (with the decision r.Decision names, when it names one), and r's
// digest.
func (r *Record) PasskeyChallenge() ([]byte, string, error) {
	d, err := r.Digest()
	if err != nil {
		return nil, "", err
	}
	ch, err := passkey.BoundChallenge(r.Decision, d)
	if err != nil {
		return nil, "", err
	}
	return ch, d, nil
}

// SignWithPasskey writes r (By, KID PasskeyKID) with assertion a, made
// over r.PasskeyChallenge(), as its signature; it returns the line
// (without a newline). It does not verify a: the reader does, against
// the trusted reviewers' passkeys.
func (r *Record) SignWithPasskey(a passkey.Assertion) ([]byte, error) {
	if r.KID != PasskeyKID {
		return nil, fmt.Errorf("a passkey's record names key %q, not %q", PasskeyKID, clip(r.KID))
	}
	if _, err := r.Digest(); err != nil {
		return nil, err
	}
	a.Mandate = "" // the reader computes it from the record itself
	b, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	r.Sig = PasskeySigPrefix + base64.RawURLEncoding.EncodeToString(b)
	p, _ := r.prefix()
	line := append(append(p, r.Sig...), `"}`...)
	if len(line) > MaxLine {
		return nil, fmt.Errorf("mandate record of %d bytes, more than %d", len(line), MaxLine)
	}
	return line, nil
}

// PasskeyAssertion reads the assertion of a record a passkey signed.
func (r *Record) PasskeyAssertion() (passkey.Assertion, error) {
	var a passkey.Assertion
	s, ok := strings.CutPrefix(r.Sig, PasskeySigPrefix)
	if !ok {
		return a, errors.New("it is not signed with a passkey")
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return a, errors.New("its passkey signature is not base64url")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil || dec.More() || a.Mandate != "" {
		return a, errors.New("its passkey signature is not {credential_id, authenticator_data, client_data_json, signature}")
	}
	return a, nil
}

// VerifyPasskey checks that the record's assertion is by credential c
// over its PasskeyChallenge: over these terms, this place in the records,
// and the decision it names.
func (r *Record) VerifyPasskey(c passkey.Credential) error {
	a, err := r.PasskeyAssertion()
	if err != nil {
		return err
	}
	rr := *r
	ch, _, err := rr.PasskeyChallenge()
	if err != nil {
		return err
	}
	if err := passkey.Verify(c, a, ch); err != nil {
		return fmt.Errorf("the passkey's assertion does not sign these terms (%w)", err)
	}
	return nil
}
