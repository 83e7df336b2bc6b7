package noa

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckKeyFileOwner(t *testing.T) {
	tests := []struct {
		name  string
		owner uint32
		euid  int
		ok    bool
	}{
		{"owned by the process's user", 1000, 1000, true},
		{"owned by root, process not root", 0, 1000, true},
		{"owned by root, process root", 0, 0, true},
		{"owned by another user", 1001, 1000, false},
		{"process root, file another user's", 1001, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkKeyFileOwner("/keys/signing.pem", tc.owner, tc.euid)
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrUnsafeKeyFile) || !strings.Contains(err.Error(), "/keys/signing.pem") ||
				!strings.Contains(err.Error(), "owned by uid 1001") {
				t.Fatalf("err = %v; want ErrUnsafeKeyFile naming the file and the owner uid", err)
			}
		})
	}
}

// TestLoadKeyFileRefusesForeignOwner chowns a real 0600 key file to
// another uid; that needs root, so the test is skipped otherwise.
func TestLoadKeyFileRefusesForeignOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's owner needs root; the rule itself is tested by TestCheckKeyFileOwner")
	}
	path := filepath.Join(t.TempDir(), "signing.pem")
	if _, _, err := LoadOrCreateKeyFile(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	_, err := LoadKeyFile(path)
	if !errors.Is(err, ErrUnsafeKeyFile) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "uid 4242") {
		t.Fatalf("err = %v; want a refusal naming %s and uid 4242", err, path)
	}
	if _, created, err := LoadOrCreateKeyFile(path); err == nil || created {
		t.Fatalf("LoadOrCreateKeyFile accepted a foreign-owned key (created=%v, err=%v)", created, err)
	}
}
