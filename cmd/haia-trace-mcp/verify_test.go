package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func runVerifyArgs(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"verify"}, args...), strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

// TestVerifyConformance runs the CLI on every row of the NOA conformance
// table, with the arguments exactly as the table gives them.
func TestVerifyConformance(t *testing.T) {
	shared := os.Getenv("HAIA_SHARED")
	if shared == "" {
		t.Skip("HAIA_SHARED not set: skipping the NOA expected-verdicts.tsv walk through the verify command")
	}
	base := filepath.Join(shared, "noa", "conformance")
	f, err := os.Open(filepath.Join(base, "expected-verdicts.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	rows := 0
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		cols := strings.Split(line, "\t")
		want, err := strconv.Atoi(strings.TrimSpace(cols[len(cols)-1]))
		if len(cols) != 2 || err != nil {
			t.Fatalf("expected-verdicts.tsv line %d is not ARGS<TAB>CODE", n)
		}
		var args []string
		for _, a := range strings.Fields(cols[0]) {
			if !strings.HasPrefix(a, "--") {
				a = filepath.Join(base, a)
			}
			args = append(args, a)
		}
		rows++
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			out, _, code := runVerifyArgs(t, args...)
			if code != want {
				t.Fatalf("verify %s: exit %d (%s), want %d", cols[0], code, strings.TrimSpace(out), want)
			}
			if strings.Count(out, "\n") != 1 {
				t.Fatalf("want one line on stdout, got %q", out)
			}
		})
	}
	if rows < 40 {
		t.Fatalf("only %d rows", rows)
	}
}

func TestVerifyOwnChain(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "noa")
	p := func(name string) string { return filepath.Join(dir, name) }
	tmp := t.TempDir()
	chain, err := os.ReadFile(p("chain.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	ls := strings.SplitAfter(string(chain), "\n")
	truncated := filepath.Join(tmp, "truncated.ndjson")
	os.WriteFile(truncated, []byte(ls[0]+ls[1]), 0o600)
	edited := filepath.Join(tmp, "edited.ndjson")
	os.WriteFile(edited, []byte(strings.Replace(string(chain), `"by":"alice"`, `"by":"mallory"`, 1)), 0o600)

	cases := []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"valid", []string{p("chain.ndjson"), "--keyring", p("keyring.json"), "--checkpoint", p("checkpoint.json")}, 0, "VALID: 3 receipts"},
		{"array form, flags first", []string{"--keyring", p("keyring.json"), p("chain.json")}, 0, "VALID: 3 receipts"},
		{"no keyring", []string{p("chain.ndjson")}, 1, "UNVERIFIED"},
		{"edited", []string{edited, "--keyring", p("keyring.json")}, 2, "TAMPERED"},
		{"tail cut", []string{truncated, "--keyring", p("keyring.json"), "--checkpoint", p("checkpoint.json")}, 2, "TAMPERED"},
		{"not a chain", []string{p("keyring.json")}, 3, "MALFORMED"},
		{"missing file", []string{filepath.Join(tmp, "nope")}, 4, ""},
		{"no arguments", nil, 4, ""},
		{"keyring twice", []string{p("chain.json"), p("keyring.json"), "--keyring", p("keyring.json")}, 4, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := runVerifyArgs(t, c.args...)
			if code != c.code || !strings.HasPrefix(out, c.out) {
				t.Fatalf("exit %d stdout %q stderr %q; want exit %d, stdout starting %q", code, out, errOut, c.code, c.out)
			}
		})
	}
}
