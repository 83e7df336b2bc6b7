package reviewlog

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// CheckAddPasskey refuses what AddPasskey would refuse short of the
// credential — a bad id or grant, a file that does not read, a path that
// cannot be written — and leaves nothing behind.
func TestCheckAddPasskey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "reviewers.json")
	broken := filepath.Join(dir, "broken.json")
	if err := os.WriteFile(broken, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	many := make([]string, maxGrants+1)
	for i := range many {
		many[i] = fmt.Sprintf("t%d", i)
	}
	for _, tc := range []struct {
		name, path, id string
		tenants        []string
		want           string // "" for no error
	}{
		{"absent file in a writable directory", good, "alice", nil, ""},
		{"absent directories under a writable one", filepath.Join(dir, "a", "b", "reviewers.json"), "alice", []string{"acme"}, ""},
		{"a file that does not read", broken, "alice", nil, "broken.json"},
		{"a path under a file", filepath.Join(notDir, "reviewers.json"), "alice", nil, "not a directory"},
		{"a bad id", good, "", nil, "id"},
		{"a bad tenant", good, "alice", []string{"no/slash"}, "tenant"},
		{"too many grants", good, "alice", many, "more than"},
	} {
		err := CheckAddPasskey(tc.path, tc.id, tc.tenants...)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".reviewers") {
			t.Errorf("the check left %s behind", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); err == nil {
		t.Error("the check created a directory")
	}
}
