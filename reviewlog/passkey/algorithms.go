package passkey

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-webauthn/webauthn/protocol/webauthncbor"
	"github.com/go-webauthn/webauthn/protocol/webauthncose"
)

// Algorithm is a COSE signature algorithm of the passkeys this server
// verifies.
type Algorithm struct {
	ID   int64
	Name string
}

// ErrUnsupportedAlgorithm marks a passkey whose key signs with an
// algorithm this server does not verify.
var ErrUnsupportedAlgorithm = errors.New("a passkey algorithm this server does not verify")

// Algorithms are the passkey algorithms this server verifies, in the
// order the console offers them at enrolment (an authenticator takes the
// first it supports): ES256 (ECDSA P-256, SHA-256; every platform
// passkey), EdDSA (Ed25519; some security keys) and RS256 (RSA PKCS#1 v1.5,
// SHA-256; older Windows Hello).
func Algorithms() []Algorithm {
	return []Algorithm{
		{int64(webauthncose.AlgES256), "ES256"},
		{int64(webauthncose.AlgEdDSA), "EdDSA (Ed25519)"},
		{int64(webauthncose.AlgRS256), "RS256"},
	}
}

// AlgorithmNames lists the algorithms in words: "ES256, EdDSA (Ed25519)
// or RS256".
func AlgorithmNames() string {
	var names []string
	for _, a := range Algorithms() {
		names = append(names, a.Name)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// KeyAlgorithm is the COSE algorithm (member 3) of a COSE_Key.
func KeyAlgorithm(coseKey []byte) (int64, error) {
	var k webauthncose.PublicKeyData
	if err := webauthncbor.Unmarshal(coseKey, &k); err != nil {
		return 0, fmt.Errorf("%w: the public key is no COSE key", ErrInvalid)
	}
	return k.Algorithm, nil
}

// CheckAlgorithm refuses a COSE_Key whose algorithm is not one of
// Algorithms (an EdDSA key on another curve than Ed25519 too), naming the
// ones this server verifies.
func CheckAlgorithm(coseKey []byte) error {
	alg, err := KeyAlgorithm(coseKey)
	if err != nil {
		return err
	}
	for _, a := range Algorithms() {
		if a.ID != alg {
			continue
		}
		if alg != int64(webauthncose.AlgEdDSA) {
			return nil
		}
		pk, err := webauthncose.ParsePublicKey(coseKey)
		if okp, ok := pk.(webauthncose.OKPPublicKeyData); err == nil && ok && okp.Curve == int64(webauthncose.Ed25519) {
			return nil
		}
		return fmt.Errorf("%w: this passkey's EdDSA key is not on Ed25519; this server verifies passkeys that sign with %s", ErrUnsupportedAlgorithm, AlgorithmNames())
	}
	return fmt.Errorf("%w: this passkey signs with %s, which this server cannot verify; it verifies passkeys that sign with %s", ErrUnsupportedAlgorithm, algorithmName(alg), AlgorithmNames())
}

// algorithmName names a COSE algorithm for a person.
func algorithmName(alg int64) string {
	names := map[int64]string{-7: "ES256", -35: "ES384", -36: "ES512", -8: "EdDSA", -257: "RS256", -258: "RS384", -259: "RS512",
		-37: "PS256", -38: "PS384", -39: "PS512", -47: "ES256K", -65535: "RS1"}
	if n, ok := names[alg]; ok {
		return fmt.Sprintf("%s (COSE algorithm %d)", n, alg)
	}
	return fmt.Sprintf("COSE algorithm %d", alg)
}
