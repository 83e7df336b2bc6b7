package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const cliPolicy = `{"spec":"noa.policy/0.2","id":"cli","requiredPaths":["amountAtomic"],
 "rules":[{"id":"big","when":{"op":"gt","path":"amountAtomic","value":2000000},"then":"DENY"},
          {"id":"ok","when":{"op":"exists","path":"amountAtomic"},"then":"ALLOW"}]}`

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestPolicyCLI(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"p.json": cliPolicy,
		"reordered.json": `{"rules":[{"then":"DENY","when":{"value":2000000,"path":"amountAtomic","op":"gt"},"id":"big"},
		  {"when":{"path":"amountAtomic","op":"exists"},"id":"ok","then":"ALLOW"}],"requiredPaths":["amountAtomic"],"id":"cli","spec":"noa.policy/0.2"}`,
		"bad.json":     `{"spec":"noa.policy/0.2","id":"bad","requiredPaths":[],"rules":[{"id":"a","when":{"op":"and","clauses":[]},"then":"ALLOW"}]}`,
		"notjson.json": `{"spec":`,
		"big.json":     `{"amountAtomic":3000000}`,
		"small.json":   `{"amountAtomic":5}`,
		"none.json":    `{"other":"x"}`,
		"float.json":   `{"amountAtomic":1.5}`,
		"array.json":   `[1]`,
		"norules.json": `{"spec":"noa.policy/0.2","id":"none","requiredPaths":[],"rules":[]}`,
	})
	p := func(name string) string { return filepath.Join(dir, name) }
	tests := []struct {
		name        string
		args        []string
		code        int
		stdout      string // exact, when not empty
		stderrHas   string
		emptyStdout bool
	}{
		{name: "check valid", args: []string{"check", p("p.json")}, code: 0,
			stdout: p("p.json") + ": a noa.policy/0.2 rule file, valid\n"},
		{name: "check valid json", args: []string{"check", "--json", p("p.json")}, code: 0,
			stdout: `{"file":"` + p("p.json") + `","kind":"noa.policy/0.2 rule file","valid":true,"problems":[],"policyHash":"sha256:` /* prefix; full value checked below */},
		{name: "check invalid", args: []string{"check", p("bad.json")}, code: 1, stderrHas: "bad.json:1:94: $.rules[0].when.clauses", emptyStdout: true},
		{name: "check not json", args: []string{"check", p("notjson.json")}, code: 1, stderrHas: "not a strict JSON document", emptyStdout: true},
		{name: "check missing file", args: []string{"check", p("nope.json")}, code: 1, stderrHas: "nope.json", emptyStdout: true},
		{name: "check no file", args: []string{"check"}, code: 2, emptyStdout: true},
		{name: "check two files", args: []string{"check", p("p.json"), p("bad.json")}, code: 2, emptyStdout: true},
		{name: "eval deny rule", args: []string{"eval", p("p.json"), "--input", p("big.json")}, code: 0,
			stdout: `{"verdict":"DENY","ruleFired":"big"}` + "\n"},
		{name: "eval flags first", args: []string{"eval", "--input", p("small.json"), p("p.json")}, code: 0,
			stdout: `{"verdict":"ALLOW","ruleFired":"ok"}` + "\n"},
		{name: "eval required absent", args: []string{"eval", p("p.json"), "--input", p("none.json")}, code: 0,
			stdout: `{"verdict":"DENY","ruleFired":"required-input-absent:amountAtomic"}` + "\n", stderrHas: "step 5"},
		{name: "eval float input", args: []string{"eval", p("p.json"), "--input", p("float.json")}, code: 0,
			stdout: `{"verdict":"DENY","ruleFired":"eval-error"}` + "\n", stderrHas: "non-integer"},
		{name: "eval array input", args: []string{"eval", p("p.json"), "--input", p("array.json")}, code: 0,
			stdout: `{"verdict":"DENY","ruleFired":"input-invalid"}` + "\n"},
		{name: "eval invalid policy", args: []string{"eval", p("bad.json"), "--input", p("big.json")}, code: 0,
			stdout: `{"verdict":"DENY","ruleFired":"policy-invalid"}` + "\n", stderrHas: "§2.9"},
		{name: "eval no rule matched", args: []string{"eval", p("norules.json"), "--input", p("big.json")}, code: 0,
			stdout: `{"verdict":"DENY","ruleFired":null}` + "\n"},
		{name: "eval no input flag", args: []string{"eval", p("p.json")}, code: 2, stderrHas: "--input", emptyStdout: true},
		{name: "eval missing input file", args: []string{"eval", p("p.json"), "--input", p("nope.json")}, code: 1, emptyStdout: true},
		{name: "eval unknown flag", args: []string{"eval", p("p.json"), "--inptu", p("big.json")}, code: 2, emptyStdout: true},
		{name: "no subcommand", args: nil, code: 2, emptyStdout: true},
		{name: "unknown subcommand", args: []string{"lint"}, code: 2, stderrHas: "unknown subcommand", emptyStdout: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), append([]string{"policy"}, tc.args...), strings.NewReader(""), &out, &errb)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, tc.code, errb.String())
			}
			if tc.stdout != "" && !strings.HasPrefix(out.String(), tc.stdout) {
				t.Errorf("stdout %q, want %q", out.String(), tc.stdout)
			}
			if tc.emptyStdout && out.Len() != 0 {
				t.Errorf("stdout %q, want nothing", out.String())
			}
			if tc.stderrHas != "" && !strings.Contains(errb.String(), tc.stderrHas) {
				t.Errorf("stderr %q does not mention %q", errb.String(), tc.stderrHas)
			}
		})
	}

	// check --json gives the two hashes, and key order does not change them.
	hashes := func(file string) map[string]string {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"policy", "check", "--json", p(file)}, strings.NewReader(""), &out, &errb); code != 0 {
			t.Fatalf("check %s: exit %d: %s", file, code, errb.String())
		}
		var full map[string]any
		if err := json.Unmarshal(out.Bytes(), &full); err != nil {
			t.Fatalf("check output %q: %v", out.String(), err)
		}
		m := map[string]string{}
		for _, k := range []string{"policyHash", "readSetHash"} {
			m[k], _ = full[k].(string)
		}
		if !strings.HasPrefix(m["policyHash"], "sha256:") || len(m["policyHash"]) != 71 ||
			!strings.HasPrefix(m["readSetHash"], "sha256:") || len(m["readSetHash"]) != 71 {
			t.Fatalf("check output %q: want policyHash and readSetHash", out.String())
		}
		return m
	}
	a, b := hashes("p.json"), hashes("reordered.json")
	if a["policyHash"] != b["policyHash"] || a["readSetHash"] != b["readSetHash"] {
		t.Errorf("member order changed the hashes: %v vs %v", a, b)
	}
}
