package passkey_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// Every algorithm the server offers at enrolment verifies a decision, and
// forged or moved assertions under it do not; a key in another algorithm
// is no credential, and the refusal names the ones that are.
func TestAlgorithms(t *testing.T) {
	decision := hashOf("approve review 1")
	ch, err := passkey.Challenge(decision)
	if err != nil {
		t.Fatal(err)
	}
	offered := map[int64]bool{}
	for _, alg := range passkey.Algorithms() {
		offered[alg.ID] = true
	}
	for _, alg := range []int{softauthn.ES256, softauthn.EdDSA, softauthn.RS256} {
		if !offered[int64(alg)] {
			t.Fatalf("COSE algorithm %d is not offered", alg)
		}
		a, err := softauthn.NewAlg(alg)
		if err != nil {
			t.Fatal(err)
		}
		c := credOf(a)
		if err := c.Check(); err != nil {
			t.Fatalf("alg %d: %v", alg, err)
		}
		x, err := a.Assert(rp, origin, ch)
		if err != nil {
			t.Fatal(err)
		}
		if err := passkey.VerifyDecision(c, conv(x), decision); err != nil {
			t.Errorf("alg %d: a good assertion: %v", alg, err)
		}
		if err := passkey.VerifyDecision(c, conv(x), hashOf("approve review 2")); err == nil {
			t.Errorf("alg %d: an assertion moved to another decision verified", alg)
		}
		other, _ := softauthn.NewAlg(alg)
		y, _ := other.Assert(rp, origin, ch)
		y.CredentialID = a.CredentialID()
		if err := passkey.VerifyDecision(c, conv(y), decision); err == nil {
			t.Errorf("alg %d: another key's signature verified", alg)
		}
	}
	es384, err := softauthn.NewAlg(softauthn.ES384)
	if err != nil {
		t.Fatal(err)
	}
	err = credOf(es384).Check()
	if !errors.Is(err, passkey.ErrUnsupportedAlgorithm) || !strings.Contains(err.Error(), "ES384 (COSE algorithm -35)") ||
		!strings.Contains(err.Error(), "ES256, EdDSA (Ed25519) or RS256") {
		t.Fatalf("an ES384 passkey: %v", err)
	}
	if got := passkey.AlgorithmNames(); got != "ES256, EdDSA (Ed25519) or RS256" {
		t.Fatalf("AlgorithmNames: %q", got)
	}
}

// FuzzCheckAlgorithm: whatever bytes a registration carries as its key,
// the check answers without panicking, and what it accepts is in an
// algorithm the server verifies.
func FuzzCheckAlgorithm(f *testing.F) {
	for _, alg := range []int{softauthn.ES256, softauthn.ES384, softauthn.EdDSA, softauthn.RS256} {
		a, _ := softauthn.NewAlg(alg)
		f.Add(a.COSEKey())
	}
	f.Add([]byte{0xa1, 0x03, 0x26})
	f.Fuzz(func(t *testing.T, key []byte) {
		if err := passkey.CheckAlgorithm(key); err != nil {
			return
		}
		alg, err := passkey.KeyAlgorithm(key)
		if err != nil {
			t.Fatalf("accepted a key whose algorithm cannot be read: %v", err)
		}
		for _, a := range passkey.Algorithms() {
			if a.ID == alg {
				return
			}
		}
		t.Fatalf("accepted COSE algorithm %d", alg)
	})
}
