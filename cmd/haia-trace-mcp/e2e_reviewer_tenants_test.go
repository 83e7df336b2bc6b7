package main

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// reviewer init --tenant grants tenants in the trusted reviewers file; a
// later init without --tenant keeps them; a --tenant that is no tenant
// name is a usage error and writes nothing.
func TestReviewerInitTenantGrant(t *testing.T) {
	dir := t.TempDir()
	reviewers := filepath.Join(dir, "reviewers.json")
	key := filepath.Join(dir, "carol.pem")
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		out, err string
		want     reviewlog.Grants
	}{
		{"bad tenant", []string{"--tenant", "../globex"}, exitUsage, "", "--tenant", nil},
		{"grant acme", []string{"--tenant", "acme"}, 0, "tenants granted: acme", "", reviewlog.Grants{"carol": {"acme"}}},
		{"grant globex too", []string{"--tenant", "globex", "--tenant", "acme"}, 0, "tenants granted: globex, acme", "", reviewlog.Grants{"carol": {"acme", "globex"}}},
		{"again without --tenant keeps them", nil, 0, "(already listed)", "", reviewlog.Grants{"carol": {"acme", "globex"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"reviewer", "init", "--id", "carol", "--key-file", key, "--reviewers", reviewers}, tc.args...)
			out, errOut, code := runCLI(t, args...)
			if code != tc.code || !strings.Contains(out, tc.out) || !strings.Contains(errOut, tc.err) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, %q, %q", code, out, errOut, tc.code, tc.out, tc.err)
			}
			g, err := reviewlog.LoadGrants(reviewers)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("the file was written: %v", g)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(g, tc.want) {
				t.Fatalf("grants %v (%v), want %v", g, err, tc.want)
			}
		})
	}
}
