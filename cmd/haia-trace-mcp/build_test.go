package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBuildCommand(t *testing.T) {
	dir := t.TempDir()
	runFile := filepath.Join(dir, "r1.ndjson")
	line := `{"event_id":"e1","event_type":"x.a","occurred_at":"2026-07-24T09:00:00.120Z","seq":1,"adapter":"a","context_id":"op","payload":{}}`
	if err := os.WriteFile(runFile, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmpls := filepath.Join(dir, "templates")
	if err := os.Mkdir(tmpls, 0o700); err != nil {
		t.Fatal(err)
	}
	custom := "template: mine\nversion: 2.0\nstages: [{id: a, required: true, match: [{event: x.a}]}]\n"
	if err := os.WriteFile(filepath.Join(tmpls, "mine.yaml"), []byte(custom), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"default template", []string{runFile}, exitOK, `"template": "x402-buyer"`, ""},
		{"templates dir by slug", []string{"--templates-dir", tmpls, "--template", "mine", runFile}, exitOK, "\"completeness\": \"full\"", ""},
		{"template by path", []string{runFile, "--template", filepath.Join(tmpls, "mine.yaml")}, exitOK, `"version": 2,`, ""},
		{"no run file", nil, exitUsage, "", "want one RUN_FILE"},
		{"two run files", []string{runFile, runFile}, exitUsage, "", "unexpected argument"},
		{"unknown template", []string{runFile, "--template", "nope"}, exitFail, "", `template not found: "nope"`},
		{"missing templates dir", []string{runFile, "--templates-dir", filepath.Join(dir, "absent")}, exitFail, "", "is not a readable directory"},
		{"missing run", []string{filepath.Join(dir, "absent.ndjson")}, exitFail, "", "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), append([]string{"build"}, c.args...), strings.NewReader(""), &out, &errb)
			if code != c.code || !strings.Contains(out.String(), c.stdout) || !strings.Contains(errb.String(), c.stderr) {
				t.Errorf("exit %d (want %d)\nstdout: %s\nstderr: %s", code, c.code, out.String(), errb.String())
			}
			if c.code == exitOK && !strings.HasSuffix(out.String(), "}\n") {
				t.Errorf("output does not end with a newline")
			}
		})
	}
}
