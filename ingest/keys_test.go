package ingest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cfg", KeysFileName)
	now := time.Date(2026, 12, 5, 17, 0, 0, 0, time.UTC)
	if _, err := OpenKeys(path); err == nil || !strings.Contains(err.Error(), "ingest-key create") {
		t.Fatalf("no file: %v", err)
	}
	key, rec, err := NewKey(path, "acme", now)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := NewKey(path, "", now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := NewKey(path, "no/such", now); err == nil {
		t.Fatal("a bad tenant name was accepted")
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), key) || strings.Contains(string(raw), strings.SplitN(key, "_", 3)[2]) {
		t.Fatal("the keys file holds the key")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	keys, err := OpenKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := keys.Lookup(key)
	if err != nil || got.Tenant != "acme" || got.ID != rec.ID {
		t.Fatalf("lookup: %+v %v", got, err)
	}
	if got, err := keys.Lookup(other); err != nil || got.Tenant != "" {
		t.Fatalf("other: %+v %v", got, err)
	}
	// The key with its last character changed: to "A", or to "B" when it
	// already ends in "A" (one key in 64 does).
	last := "A"
	if strings.HasSuffix(key, last) {
		last = "B"
	}
	for _, bad := range []string{"", "hik_", key[:len(key)-1] + last, strings.Replace(key, rec.ID, "000000000000", 1), "Bearer " + key} {
		if _, err := keys.Lookup(bad); !errors.Is(err, ErrUnknownKey) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := RevokeKey(path, rec.ID, now); err != nil {
		t.Fatal(err)
	}
	if _, err := RevokeKey(path, rec.ID, now); err == nil {
		t.Fatal("revoked twice")
	}
	if _, err := RevokeKey(path, "nope", now); err == nil {
		t.Fatal("revoked an unknown id")
	}
	// The running server's view follows the file.
	if _, err := keys.Lookup(key); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("a revoked key: %v", err)
	}
	list, _ := ListKeys(path)
	if len(list) != 2 || list[0].RevokedAt == "" || list[1].RevokedAt != "" {
		t.Fatalf("list %+v", list)
	}

	// A keys file that cannot be read accepts no key, not the keys read
	// before: the edit that broke it may be the one that revoked a key.
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`{"keys": [ {"id": "`+rec.ID+`", "revoked`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Lookup(other); err == nil || errors.Is(err, ErrUnknownKey) {
		t.Fatalf("a broken keys file: %v, want an error that is not ErrUnknownKey", err)
	}
	// Mended, it is read again.
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := keys.Lookup(other); err != nil || got.Tenant != "" {
		t.Fatalf("the keys file mended: %+v %v", got, err)
	}
}
