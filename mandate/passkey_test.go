package mandate

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

const (
	pkRP     = "localhost"
	pkOrigin = "http://localhost:8787"
	// aDecision is the hash of the approval a grant is signed with.
	aDecision = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
)

func pkCred(a *softauthn.Authenticator) passkey.Credential {
	return passkey.Credential{ID: a.CredentialID(), PublicKey: base64.RawURLEncoding.EncodeToString(a.COSEKey()), RPID: pkRP, Origin: pkOrigin}
}

// passkeyGrant is a grant by pat, after c's records, signed by
// authenticator a over its challenge; edit changes the record after the
// signature (a writer of the store).
func (c *chain) passkeyGrant(t *testing.T, a *softauthn.Authenticator, edit func(*Record)) Record {
	t.Helper()
	id, _ := NewID()
	r := Record{Kind: KindGrant, ID: id, Tenant: "acme", PayTo: payee, Asset: "eip155:8453/0xusdc", MaxAtomic: "2000000", BudgetAtomic: "3000000",
		Count: 2, Expires: FormatTime(t0.Add(24 * 3600e9)), Decision: aDecision, At: FormatTime(t0), By: "pat", KID: PasskeyKID}
	if len(c.lines) > 0 {
		r.Prev = Hash(c.lines[len(c.lines)-1])
	}
	ch, digest, err := r.PasskeyChallenge()
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := passkey.BoundChallenge(aDecision, digest); string(want) != string(ch) {
		t.Fatal("the challenge is not the bound challenge of the decision and the digest")
	}
	x, err := a.Assert(pkRP, pkOrigin, ch)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&r)
	}
	line, err := r.SignWithPasskey(passkey.Assertion{CredentialID: x.CredentialID, AuthenticatorData: x.AuthenticatorData, ClientDataJSON: x.ClientDataJSON, Signature: x.Signature})
	if err != nil {
		t.Fatal(err)
	}
	c.lines = append(c.lines, line)
	return r
}

// A grant a passkey signed reads as one a key signed: parsed back
// exactly, trusted when the passkey is its reviewer's, usable; and not
// when its terms, its place or its decision were edited after the
// signature, the passkey is not the reviewer's, or the tenant is not
// granted.
func TestPasskeySignedGrant(t *testing.T) {
	pat, err := softauthn.New()
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := softauthn.New()
	if err != nil {
		t.Fatal(err)
	}
	trustPat := func(c *chain) Trust {
		tr := c.trust()
		tr.Passkeys = map[string][]passkey.Credential{"pat": {pkCred(pat)}}
		return tr
	}

	c := newChain("alice")
	g := c.passkeyGrant(t, pat, nil)
	r, err := Parse(c.lines[0])
	if err != nil || !r.SignedWithPasskey() || r.Decision != aDecision {
		t.Fatalf("parse the passkey's record: %v %+v", err, r)
	}
	set := Read(c.lines, "acme", trustPat(c), &Cache{})
	m := set.Mandates[g.ID]
	if len(set.Findings) > 0 || m == nil || !m.Complete() || m.Signers[0] != "pat" {
		t.Fatalf("a grant pat's passkey signed: %v %+v", set.Findings, m)
	}
	if why := m.Refuses(Use{Tenant: "acme", PayTo: payee, Asset: "eip155:8453/0xusdc", Atomic: m.Grant.Max(), At: t0.Add(3600e9)}, Spent{}); why != "" {
		t.Fatalf("it does not cover a payment inside it: %s", why)
	}
	// Alice's key signs after it, as after any record.
	c.add(t, "alice", Record{Kind: KindRevoke, ID: g.ID, Terms: m.TermsHash}, t0.Add(7200e9))
	if set := Read(c.lines, "acme", trustPat(c), nil); len(set.Findings) > 0 || set.Mandates[g.ID].Revoked == nil {
		t.Fatalf("a revocation after the passkey's grant: %v", set.Findings)
	}

	for _, tc := range []struct {
		name  string
		a     *softauthn.Authenticator
		edit  func(*Record)
		trust func(Trust) Trust
		want  string
	}{
		{"budget raised", pat, func(r *Record) { r.BudgetAtomic = "300000000" }, nil, `not signed by reviewer "pat"'s passkey`},
		{"payee changed", pat, func(r *Record) { r.PayTo = "0x" + strings.Repeat("ab", 20) }, nil, `not signed by reviewer "pat"'s passkey`},
		{"expiry moved", pat, func(r *Record) { r.Expires = FormatTime(t0.Add(9999 * 3600e9)) }, nil, `not signed by reviewer "pat"'s passkey`},
		{"another decision", pat, func(r *Record) { r.Decision = strings.Replace(aDecision, "00", "ff", 1) }, nil, `not signed by reviewer "pat"'s passkey`},
		{"signer renamed", pat, func(r *Record) { r.By = "alice" }, nil, `passkey ` + pat.CredentialID()[:20]},
		{"not a passkey's kid", pat, func(r *Record) { r.KID = "k1" }, nil, "a passkey's record names key"},
		{"mallory's passkey", mallory, nil, nil, `is not listed for reviewer "pat"`},
		{"not granted the tenant", pat, nil, func(tr Trust) Trust { tr.Granted = func(string) bool { return false }; return tr }, `trusted, but not granted this tenant`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got string
			if tc.edit != nil && tc.want == "a passkey's record names key" {
				// SignWithPasskey refuses to write it at all.
				id, _ := NewID()
				r := Record{Kind: KindGrant, ID: id, Tenant: "acme", PayTo: payee, Asset: "x", MaxAtomic: "1", BudgetAtomic: "1",
					Expires: FormatTime(t0.Add(3600e9)), At: FormatTime(t0), By: "pat", KID: "k1"}
				_, err := r.SignWithPasskey(passkey.Assertion{})
				if err == nil {
					t.Fatal("a passkey's record with a key's kid was written")
				}
				got = err.Error()
			} else {
				c := newChain("alice")
				c.passkeyGrant(t, tc.a, tc.edit)
				tr := trustPat(c)
				if tc.trust != nil {
					tr = tc.trust(tr)
				}
				set := Read(c.lines, "acme", tr, nil)
				if len(set.Mandates) != 0 || len(set.Findings) != 1 {
					t.Fatalf("read: %d mandates, findings %v", len(set.Mandates), set.Findings)
				}
				got = set.Findings[0]
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("%q, want it to say %q", got, tc.want)
			}
		})
	}
}

// FuzzReadPasskeyRecord: a line read as a passkey's record is trusted only
// when its assertion verifies over it, and never panics the reader.
func FuzzReadPasskeyRecord(f *testing.F) {
	pat, err := softauthn.New()
	if err != nil {
		f.Fatal(err)
	}
	c := newChain()
	c.passkeyGrant(&testing.T{}, pat, nil)
	f.Add(c.lines[0])
	trust := Trust{Passkeys: map[string][]passkey.Credential{"pat": {pkCred(pat)}}}
	f.Fuzz(func(t *testing.T, line []byte) {
		set := Read([][]byte{line}, "acme", trust, nil)
		for _, m := range set.Mandates {
			if err := m.Grant.VerifyPasskey(pkCred(pat)); err != nil || string(line) != string(c.lines[0]) {
				t.Fatalf("trusted a line that is not the one pat's passkey signed: %v", err)
			}
		}
	})
}
