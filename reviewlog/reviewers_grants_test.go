package reviewlog

import (
	"crypto/ed25519"
	"crypto/rand"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

func TestParseTrustGrants(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	key := noa.EncodeSPKI(pub)
	for _, tc := range []struct {
		name, text, want string // want "" parses
		grants           Grants
	}{
		{"key alone grants nothing", `{"alice":"` + key + `"}`, "", Grants{}},
		{"two tenants", `{"alice":{"key":"` + key + `","tenants":["acme","globex"]}}`, "", Grants{"alice": {"acme", "globex"}}},
		{"every tenant", `{"alice":{"key":"` + key + `","tenants":["*"]}}`, "", Grants{"alice": {"*"}}},
		{"a pattern is no tenant", `{"alice":{"key":"` + key + `","tenants":["a*"]}}`, "tenants of \"alice\"", nil},
		{"tenants without key or passkey", `{"alice":{"tenants":["acme"]}}`, "neither a key nor a passkey", nil},
		{"path in a tenant", `{"alice":{"key":"` + key + `","tenants":["../globex"]}}`, "tenants of \"alice\"", nil},
		{"empty tenant", `{"alice":{"key":"` + key + `","tenants":[""]}}`, "1 to 64", nil},
		{"tenant twice", `{"alice":{"key":"` + key + `","tenants":["acme","acme"]}}`, "twice", nil},
		{"tenants not a list", `{"alice":{"key":"` + key + `","tenants":"acme"}}`, "base64 SPKI string or", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tf, err := parseTrustFile([]byte(tc.text), "r.json")
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want one naming %q", err, tc.want)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(tf.grants, tc.grants) {
				t.Fatalf("grants %v, %v; want %v", tf.grants, err, tc.grants)
			}
			all := slices.Contains(tc.grants["alice"], AllTenants)
			if tf.grants.Allows("alice", "initech") != all || tf.grants.Allows("bob", "acme") {
				t.Fatalf("Allows: alice for initech %v (want %v), bob for acme %v (want false)", tf.grants.Allows("alice", "initech"), all, tf.grants.Allows("bob", "acme"))
			}
		})
	}
}

// Every writer of the file keeps the tenant grants: reviewer init, passkey
// add and remove; a grant is added only by the operator's --tenant.
func TestWritersKeepGrants(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reviewers.json")
	alice, _, _ := ed25519.GenerateKey(rand.Reader)
	bob, _, _ := ed25519.GenerateKey(rand.Reader)
	c := testCredential(t)
	grants := func() Grants {
		t.Helper()
		g, err := LoadGrants(path)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if changed, err := AddPasskey(path, "alice", c, "acme"); err != nil || !changed {
		t.Fatalf("add passkey for acme: %v %v", changed, err)
	}
	if changed, err := AddPasskey(path, "alice", c, "acme"); err != nil || changed {
		t.Fatalf("the same passkey and tenant again: %v %v", changed, err)
	}
	if _, err := AddReviewer(path, "bob", bob); err != nil {
		t.Fatal(err)
	}
	if _, err := AddReviewer(path, "alice", alice); err != nil {
		t.Fatal(err)
	}
	if g := grants(); !reflect.DeepEqual(g, Grants{"alice": {"acme"}}) {
		t.Fatalf("after reviewer init: %v", g)
	}
	if changed, err := AddReviewer(path, "alice", alice, "globex"); err != nil || !changed {
		t.Fatalf("grant globex: %v %v", changed, err)
	}
	if _, err := AddReviewer(path, "bob", bob, "bad/tenant"); err == nil {
		t.Fatal("a tenant that is no slug was granted")
	}
	if n, err := RemovePasskeys(path, "alice", c.ID); err != nil || n != 1 {
		t.Fatalf("remove: %d %v", n, err)
	}
	g := grants()
	if !reflect.DeepEqual(g, Grants{"alice": {"acme", "globex"}}) || !g.Allows("alice", "globex") || g.Allows("bob", "acme") || g.Allows("alice", "initech") {
		t.Fatalf("after passkey remove: %v", g)
	}
	// An entry left with neither key nor passkey is gone, its grants too.
	if _, err := AddPasskey(path, "pat", c, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := RemovePasskeys(path, "pat", ""); err != nil {
		t.Fatal(err)
	}
	if g := grants(); g.Allows("pat", "acme") {
		t.Fatalf("pat keeps a grant without any key: %v", g)
	}
	if _, _, err := LoadTrust(path); err != nil {
		t.Fatalf("the file no longer parses: %v", err)
	}
}

// A tenant's console trusts the passkeys of the reviewers granted it alone.
func TestLoadTenantPasskeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reviewers.json")
	alice, bob := testCredential(t), testCredential(t)
	if _, err := AddPasskey(path, "alice", alice, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := AddPasskey(path, "bob", bob); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tenant string
		want   []string
	}{{"acme", []string{"alice"}}, {"globex", nil}, {"", nil}} {
		pks, err := LoadTenantPasskeys(path, tc.tenant)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for id := range pks {
			got = append(got, id)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("tenant %q trusts %v, want %v", tc.tenant, got, tc.want)
		}
	}
}
