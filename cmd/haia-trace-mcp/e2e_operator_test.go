package main

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The shared flags typed before the command, as a new operator types them
// (haia-trace-mcp --dir .trace status), run the command with them: the
// same answer as typed after it, for status, review list and chain list.
func TestSharedFlagsBeforeTheCommandEndToEnd(t *testing.T) {
	root, _ := demoRoot(t)
	reviewers := filepath.Join(filepath.Dir(root), "keys", "reviewers.json")
	for _, tc := range []struct {
		name          string
		before, after []string
	}{
		{"status", []string{"--dir", root, "--reviewers", reviewers, "status", "--json"}, []string{"status", "--json", "--dir", root, "--reviewers", reviewers}},
		{"review list", []string{"--dir=" + root, "--json", "review", "list", "--all"}, []string{"review", "list", "--all", "--json", "--dir", root}},
		{"chain list", []string{"--dir", root, "chain", "list"}, []string{"chain", "list", "--dir", root}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outB, errB, codeB := runCLI(t, tc.before...)
			outA, errA, codeA := runCLI(t, tc.after...)
			if codeB != 0 || codeA != 0 {
				t.Fatalf("%q: exit %d %s; %q: exit %d %s", tc.before, codeB, errB, tc.after, codeA, errA)
			}
			if strings.HasPrefix(strings.TrimSpace(outB), "{") {
				var a, b map[string]any
				if json.Unmarshal([]byte(outA), &a) != nil || json.Unmarshal([]byte(outB), &b) != nil {
					t.Fatalf("not JSON: %s / %s", outB, outA)
				}
				delete(a, "generated_at")
				delete(b, "generated_at")
				if !reflect.DeepEqual(a, b) {
					t.Errorf("%q:\n%s\nwant, as %q:\n%s", tc.before, outB, tc.after, outA)
				}
			} else if outA != outB {
				t.Errorf("%q:\n%s\nwant, as %q:\n%s", tc.before, outB, tc.after, outA)
			}
		})
	}
}
