package receipt

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sharedDir returns $HAIA_SHARED or skips the test, saying what is skipped.
func sharedDir(t testing.TB, what string) string {
	t.Helper()
	d := os.Getenv("HAIA_SHARED")
	if d == "" {
		t.Skip("HAIA_SHARED not set: skipping " + what)
	}
	return d
}

// buildFile does what `haia-trace-mcp build RUN --template PATH` does.
func buildFile(t testing.TB, run, templatePath string) []byte {
	t.Helper()
	tmpl, err := LoadTemplateFile(templatePath)
	if err != nil {
		t.Fatalf("template: %v", err)
	}
	// The build command's reading (the text outside the heap), checked
	// against the plain one.
	_, events, release, err := ReadRunFileHeld(run, DefaultLimits())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	defer release()
	res := Assemble(events, tmpl)
	got := res.AppendJSON(nil)
	_, plain, err := ReadRunFile(run, DefaultLimits())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if want := Assemble(plain, tmpl); !bytes.Equal(got, want.AppendJSON(nil)) {
		t.Fatalf("ReadRunFileHeld and ReadRunFile build different output")
	}
	return got
}

func TestParity(t *testing.T) {
	parity := filepath.Join(sharedDir(t, "the byte-for-byte parity corpus"), "parity")
	cases, err := filepath.Glob(filepath.Join(parity, "cases", "*"))
	if err != nil || len(cases) == 0 {
		t.Fatalf("no parity cases under %s (err %v)", parity, err)
	}
	for _, c := range cases {
		t.Run(filepath.Base(c), func(t *testing.T) {
			ref, err := os.ReadFile(filepath.Join(c, "template"))
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join(c, "expected.json"))
			if err != nil {
				t.Fatal(err)
			}
			got := buildFile(t, filepath.Join(c, "run.ndjson"), filepath.Join(parity, strings.TrimSpace(string(ref))))
			if !bytes.Equal(got, want) {
				t.Errorf("output differs from the reference at byte %d:\n got: %s\nwant: %s", diffAt(got, want), around(got, diffAt(got, want)), around(want, diffAt(got, want)))
			}
		})
	}
}

func diffAt(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func around(b []byte, i int) string {
	lo, hi := max(0, i-80), min(len(b), i+80)
	return string(b[lo:hi])
}
