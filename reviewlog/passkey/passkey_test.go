package passkey_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

const (
	rp     = "localhost"
	origin = "http://localhost:8080"
)

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func credOf(a *softauthn.Authenticator) passkey.Credential {
	return passkey.Credential{ID: a.CredentialID(), PublicKey: base64.RawURLEncoding.EncodeToString(a.COSEKey()), RPID: rp, Origin: origin}
}

func conv(x softauthn.Assertion) passkey.Assertion {
	return passkey.Assertion{CredentialID: x.CredentialID, AuthenticatorData: x.AuthenticatorData, ClientDataJSON: x.ClientDataJSON, Signature: x.Signature}
}

func TestVerifyDecision(t *testing.T) {
	alice, err := softauthn.New()
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := softauthn.New()
	if err != nil {
		t.Fatal(err)
	}
	decision := hashOf("approve review 1")
	other := hashOf("approve review 2")
	ch, err := passkey.Challenge(decision)
	if err != nil {
		t.Fatal(err)
	}
	good, err := alice.Assert(rp, origin, ch)
	if err != nil {
		t.Fatal(err)
	}
	mustAssert := func(a *softauthn.Authenticator, rpID, org string, challenge []byte) passkey.Assertion {
		t.Helper()
		x, err := a.Assert(rpID, org, challenge)
		if err != nil {
			t.Fatal(err)
		}
		return conv(x)
	}
	noUV := func() passkey.Assertion {
		alice.Flags = softauthn.FlagUP
		defer func() { alice.Flags = softauthn.FlagUP | softauthn.FlagUV }()
		return mustAssert(alice, rp, origin, ch)
	}()
	flipSig := conv(good)
	sig, _ := base64.RawURLEncoding.DecodeString(flipSig.Signature)
	sig[len(sig)-1] ^= 1
	flipSig.Signature = base64.RawURLEncoding.EncodeToString(sig)
	editedClient := conv(good)
	cd, _ := base64.RawURLEncoding.DecodeString(editedClient.ClientDataJSON)
	editedClient.ClientDataJSON = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(cd), "webauthn.get", "webauthn.create", 1)))
	createType := func() passkey.Assertion {
		b, _ := json.Marshal(map[string]any{"type": "webauthn.create", "challenge": base64.RawURLEncoding.EncodeToString(ch), "origin": origin})
		x, err := alice.AssertRaw(rp, b)
		if err != nil {
			t.Fatal(err)
		}
		return conv(x)
	}()
	otherCred := conv(good)
	otherCred.CredentialID = mallory.CredentialID()

	for _, tc := range []struct {
		name string
		cred passkey.Credential
		a    passkey.Assertion
		hash string
		want string // "" valid, else a fragment of the error
	}{
		{"valid", credOf(alice), conv(good), decision, ""},
		{"re-targeted to other terms", credOf(alice), conv(good), other, "challenge"},
		{"wrong origin", credOf(alice), mustAssert(alice, rp, "http://evil.localhost:8080", ch), decision, "origin"},
		{"wrong relying party", credOf(alice), mustAssert(alice, "evil.example", origin, ch), decision, "RP"},
		{"forged by another key", credOf(alice), func() passkey.Assertion {
			x := mustAssert(mallory, rp, origin, ch)
			x.CredentialID = alice.CredentialID()
			return x
		}(), decision, "signature"},
		{"unknown credential", credOf(alice), otherCred, decision, "made by credential"},
		{"signature flipped", credOf(alice), flipSig, decision, "signature"},
		{"client data edited", credOf(alice), editedClient, decision, "ceremony"},
		{"registration client data", credOf(alice), createType, decision, "ceremony"},
		{"no user verification", credOf(alice), noUV, decision, "verif"},
		{"bad base64", credOf(alice), passkey.Assertion{CredentialID: "!!", AuthenticatorData: "x", ClientDataJSON: "x", Signature: "x"}, decision, "base64url"},
		{"bad decision hash", credOf(alice), conv(good), "sha256:zz", "decision hash"},
		{"credential without key", passkey.Credential{ID: alice.CredentialID(), PublicKey: "AAAA", RPID: rp, Origin: origin}, conv(good), decision, "COSE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := passkey.VerifyDecision(tc.cred, tc.a, tc.hash)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid assertion refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want an error naming %q", tc.want)
			}
			if !errors.Is(err, passkey.ErrInvalid) || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
				t.Fatalf("error %q; want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

func TestFingerprint(t *testing.T) {
	a, _ := softauthn.New()
	fp, err := passkey.Fingerprint(base64.RawURLEncoding.EncodeToString(a.COSEKey()))
	if err != nil || !strings.HasPrefix(fp, "sha256:") || len(fp) != len("sha256:")+64+15 {
		t.Fatalf("fingerprint %q, %v", fp, err)
	}
	if _, err := passkey.Fingerprint("%%"); err == nil {
		t.Fatal("bad base64 accepted")
	}
}

func FuzzVerify(f *testing.F) {
	a, _ := softauthn.New()
	x, _ := a.Assert(rp, origin, make([]byte, 32))
	f.Add(x.AuthenticatorData, x.ClientDataJSON, x.Signature)
	cred := credOf(a)
	f.Fuzz(func(t *testing.T, ad, cd, sig string) {
		err := passkey.Verify(cred, passkey.Assertion{CredentialID: a.CredentialID(), AuthenticatorData: ad, ClientDataJSON: cd, Signature: sig}, make([]byte, 32))
		if err == nil && (ad != x.AuthenticatorData || cd != x.ClientDataJSON) {
			t.Fatalf("an edited assertion verified")
		}
	})
}

func FuzzDecodeModel(f *testing.F) {
	f.Add(passkey.EncodeModel(passkey.Assertion{CredentialID: "a", AuthenticatorData: "b", ClientDataJSON: "c", Signature: "d"}))
	f.Add("claude")
	f.Fuzz(func(t *testing.T, model string) {
		a, ok, err := passkey.DecodeModel(&model)
		if !strings.HasPrefix(model, passkey.ModelPrefix) && (ok || err != nil) {
			t.Fatalf("a model without the prefix read as an assertion")
		}
		if ok && err == nil && passkey.EncodeModel(a) == "" {
			t.Fatal("unreachable")
		}
	})
}

func TestCheckSignCount(t *testing.T) {
	for _, c := range []struct {
		last, got uint32
		ok        bool
	}{
		{0, 0, true},  // an authenticator that does not count
		{0, 1, true},  // the first counted signature
		{5, 6, true},  // grew
		{5, 90, true}, // grew by more than one (signatures elsewhere)
		{5, 5, false}, // the same counter twice: a clone
		{5, 4, false}, // went back: a clone
		{5, 0, false}, // a counter that stopped counting
		{0xffffffff, 0xffffffff, false},
	} {
		err := passkey.CheckSignCount(c.last, c.got)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, passkey.ErrCloned)) {
			t.Errorf("CheckSignCount(%d, %d) = %v", c.last, c.got, err)
		}
	}
}

// One assertion over the bound challenge of a decision and a mandate
// verifies as that decision only while it names that mandate: not as the
// decision alone, not with another mandate, and the decoded model keeps
// the mandate it names.
func TestVerifyDecisionBoundToMandate(t *testing.T) {
	alice, err := softauthn.New()
	if err != nil {
		t.Fatal(err)
	}
	decision, mandate := hashOf("approve review 1"), hashOf("mandate m_1")
	ch, err := passkey.BoundChallenge(decision, mandate)
	if err != nil {
		t.Fatal(err)
	}
	x, err := alice.Assert(rp, origin, ch)
	if err != nil {
		t.Fatal(err)
	}
	a := conv(x)
	a.Mandate = mandate
	if err := passkey.VerifyDecision(credOf(alice), a, decision); err != nil {
		t.Fatalf("the bound assertion: %v", err)
	}
	alone := a
	alone.Mandate = ""
	other := a
	other.Mandate = hashOf("mandate m_2")
	for name, b := range map[string]passkey.Assertion{"without its mandate": alone, "with another mandate": other} {
		if err := passkey.VerifyDecision(credOf(alice), b, decision); !errors.Is(err, passkey.ErrInvalid) {
			t.Errorf("%s: %v, want it refused", name, err)
		}
	}
	if err := passkey.VerifyDecision(credOf(alice), a, hashOf("approve review 2")); !errors.Is(err, passkey.ErrInvalid) {
		t.Errorf("another decision: %v, want it refused", err)
	}
	model := passkey.EncodeModel(a)
	back, ok, err := passkey.DecodeModel(&model)
	if err != nil || !ok || back != a {
		t.Fatalf("the model round trip: %+v %v %v", back, ok, err)
	}
	if _, err := passkey.BoundChallenge(decision, "sha256:zz"); err == nil {
		t.Fatal("a malformed mandate digest made a challenge")
	}
}
