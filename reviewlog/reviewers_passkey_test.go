package reviewlog

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

func testCredential(t testing.TB) passkey.Credential {
	t.Helper()
	a, err := softauthn.New()
	if err != nil {
		t.Fatal(err)
	}
	return passkey.Credential{ID: a.CredentialID(), PublicKey: base64.RawURLEncoding.EncodeToString(a.COSEKey()), RPID: "localhost", Origin: "http://localhost:8787"}
}

func TestParseTrustPasskeys(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	key := noa.EncodeSPKI(pub)
	c := testCredential(t)
	cj := `{"credential_id":"` + c.ID + `","public_key":"` + c.PublicKey + `","rp_id":"localhost","origin":"http://localhost:8787"}`
	for _, tc := range []struct {
		name, text, want string // want "" parses
		keys, passkeys   int
	}{
		{"key alone", `{"alice":"` + key + `"}`, "", 1, 0},
		{"key and passkey", `{"alice":{"key":"` + key + `","passkeys":[` + cj + `]}}`, "", 1, 1},
		{"passkey alone", `{"pat":{"passkeys":[` + cj + `]}}`, "", 0, 1},
		{"neither", `{"pat":{}}`, "neither a key nor a passkey", 0, 0},
		{"unknown member", `{"pat":{"passkeys":[` + cj + `],"admin":true}}`, "unknown field", 0, 0},
		{"credential twice", `{"pat":{"passkeys":[` + cj + `]},"sam":{"passkeys":[` + cj + `]}}`, "twice", 0, 0},
		{"bad COSE key", `{"pat":{"passkeys":[{"credential_id":"AAAA","public_key":"AAAA","rp_id":"localhost","origin":"http://localhost:8787"}]}}`, "COSE", 0, 0},
		{"no origin", `{"pat":{"passkeys":[{"credential_id":"` + c.ID + `","public_key":"` + c.PublicKey + `","rp_id":"localhost","origin":""}]}}`, "origin", 0, 0},
		{"a number", `{"pat":7}`, "base64 SPKI string or", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, pks, err := ParseTrust([]byte(tc.text), "r.json")
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want one naming %q", err, tc.want)
				}
				return
			}
			if err != nil || len(rs) != tc.keys || len(pks) != tc.passkeys {
				t.Fatalf("got %d keys, %d reviewers with passkeys, %v", len(rs), len(pks), err)
			}
		})
	}
}

// The operator's commands keep what the other wrote: a passkey survives
// reviewer init, a key survives passkey add and remove.
func TestAddRemovePasskeyKeepsKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reviewers.json")
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	c := testCredential(t)
	if added, err := AddPasskey(path, "alice", c); err != nil || !added {
		t.Fatalf("add passkey: %v %v", added, err)
	}
	if added, err := AddPasskey(path, "alice", c); err != nil || added {
		t.Fatalf("the same passkey again: %v %v", added, err)
	}
	if _, err := AddPasskey(path, "bob", c); err == nil {
		t.Fatal("one passkey listed for two reviewers")
	}
	if _, err := AddReviewer(path, "alice", pub); err != nil {
		t.Fatal(err)
	}
	rs, pks, err := LoadTrust(path)
	if err != nil || !rs["alice"].Equal(pub) || len(pks["alice"]) != 1 {
		t.Fatalf("after reviewer init: %v %v %v", rs, pks, err)
	}
	if n, err := RemovePasskeys(path, "alice", "other"); err != nil || n != 0 {
		t.Fatalf("remove another id: %d %v", n, err)
	}
	if n, err := RemovePasskeys(path, "alice", c.ID); err != nil || n != 1 {
		t.Fatalf("remove: %d %v", n, err)
	}
	rs, pks, err = LoadTrust(path)
	if err != nil || !rs["alice"].Equal(pub) || len(pks) != 0 {
		t.Fatalf("after remove: %v %v %v", rs, pks, err)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("file mode: %v %v", info.Mode(), err)
	}
}

func FuzzParseTrust(f *testing.F) {
	c := testCredential(f)
	f.Add([]byte(`{"pat":{"passkeys":[{"credential_id":"` + c.ID + `","public_key":"` + c.PublicKey + `","rp_id":"localhost","origin":"http://localhost:8787"}]}}`))
	f.Add([]byte(`{"alice":"MCowBQYDK2VwAyEA"}`))
	f.Add([]byte(`{"alice":{"key":"MCowBQYDK2VwAyEA","tenants":["acme","globex"]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, pks, err := ParseTrust(data, "fuzz")
		if err != nil {
			return
		}
		for id, cs := range pks {
			if CheckReviewerID(id) != nil {
				t.Fatalf("accepted reviewer id %q", id)
			}
			for _, c := range cs {
				if c.Check() != nil {
					t.Fatalf("accepted a credential that does not check: %+v", c)
				}
			}
		}
		for id := range rs {
			if CheckReviewerID(id) != nil {
				t.Fatalf("accepted reviewer id %q", id)
			}
		}
		tf, err := parseTrustFile(data, "fuzz")
		if err != nil {
			t.Fatalf("ParseTrust accepts what parseTrustFile refuses: %v", err)
		}
		for id, ts := range tf.grants {
			if _, ok := rs[id]; !ok && len(pks[id]) == 0 {
				t.Fatalf("granted %q tenants without a key or passkey", id)
			}
			for _, tn := range ts {
				if CheckTenantGrant(tn) != nil {
					t.Fatalf("accepted tenant %q", tn)
				}
			}
		}
	})
}
