package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// exampleLines are the event lines a template show printed.
func exampleLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "{") {
			lines = append(lines, l)
		}
	}
	return lines
}

// buildCompleteness writes lines as a run file and builds it with the real
// binary: one completeness per operation.
func buildCompleteness(t *testing.T, lines []string, args ...string) []string {
	t.Helper()
	run := filepath.Join(t.TempDir(), "run-1.ndjson")
	if err := os.WriteFile(run, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, append([]string{"build", run}, args...)...)
	if code != 0 {
		t.Fatalf("build %v: exit %d %s", args, code, errOut)
	}
	var res struct {
		Receipts []struct {
			Completeness string `json:"completeness"`
		} `json:"receipts"`
		Unassigned []json.RawMessage `json:"unassigned"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("build output: %v\n%s", err, out)
	}
	if len(res.Unassigned) != 0 {
		t.Errorf("build: %d unassigned events", len(res.Unassigned))
	}
	var got []string
	for _, r := range res.Receipts {
		got = append(got, r.Completeness)
	}
	return got
}

// template show prints, for every bundled template, its stages in order,
// the events and fields each needs, and an example run that the real build
// assembles to one full receipt; --json carries the same run.
func TestTemplateShowExampleBuildsFull(t *testing.T) {
	root := t.TempDir()
	for _, name := range []string{"x402-buyer", "x402-seller", "x402-facilitator", "escrow-arc"} {
		t.Run(name, func(t *testing.T) {
			out, errOut, code := runCLI(t, "template", "show", name, "--dir", root)
			if code != 0 || errOut != "" {
				t.Fatalf("template show %s: exit %d %s", name, code, errOut)
			}
			for _, want := range []string{"template " + name + ", version ", "stages, in order:\n  1. ", "closed by  ", "every line needs:\n  event_id", "context_id", "how the guard reads it: "} {
				if !strings.Contains(out, want) {
					t.Errorf("template show %s lacks %q:\n%s", name, want, out)
				}
			}
			if strings.HasPrefix(name, "x402") && (!strings.Contains(out, "needs      payload.requirements.pay_to: ") || !strings.Contains(out, "needs      payload.settle.success: ")) {
				t.Errorf("template show %s does not name the payload fields the guard reads:\n%s", name, out)
			}
			lines := exampleLines(out)
			if len(lines) < 2 {
				t.Fatalf("template show %s printed %d example lines:\n%s", name, len(lines), out)
			}
			if got := buildCompleteness(t, lines, "--template", name); len(got) != 1 || got[0] != "full" {
				t.Errorf("the example of %s builds %v, want one full receipt", name, got)
			}
			out, _, code = runCLI(t, "template", "show", name, "--json")
			var g struct {
				Template     string            `json:"template"`
				Stages       []json.RawMessage `json:"stages"`
				Example      []json.RawMessage `json:"example"`
				Completeness string            `json:"example_completeness"`
			}
			if err := json.Unmarshal([]byte(out), &g); err != nil || code != 0 || g.Template != name || g.Completeness != "full" || len(g.Example) != len(lines) {
				t.Fatalf("template show %s --json: %d %v\n%s", name, code, err, out)
			}
			for i, l := range g.Example {
				var a, b any
				json.Unmarshal(l, &a)
				json.Unmarshal([]byte(lines[i]), &b)
				if ja, _ := json.Marshal(a); string(ja) != func() string { jb, _ := json.Marshal(b); return string(jb) }() {
					t.Errorf("--json example line %d differs from the text's", i)
				}
			}
		})
	}
}

// An operator's template in the Trace root's templates/ is shown as the
// server would load it, its example builds full against it; a broken
// operator file is an error naming it (never the bundled template of the
// same name); an unknown name lists the bundled ones; a --dir given and
// absent is an error.
func TestTemplateShowOperatorTemplates(t *testing.T) {
	root := filepath.Join(t.TempDir(), ".trace")
	tdir := filepath.Join(root, "templates")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "events"), 0o755)
	flow := "template: my-flow\nversion: 1\nstages:\n  - id: paid\n    required: true\n    match:\n      - event: x402.payment.submitted\n        role: client\n  - id: delivered\n    required: true\n    match:\n      - event: x402.payment.responded\n        role: client\nexceptions:\n  - x402.payment.failed\n"
	os.WriteFile(filepath.Join(tdir, "my-flow.yaml"), []byte(flow), 0o644)
	os.WriteFile(filepath.Join(tdir, "x402-seller.yaml"), []byte("template: x402-seller\nversion: 1\nstages: []\n"), 0o644)

	out, errOut, code := runCLI(t, "template", "show", "my-flow", "--dir", root)
	if code != 0 || !strings.Contains(out, "template my-flow, version 1 (templates/my-flow.yaml)") || !strings.Contains(out, "knows no stage roles") {
		t.Fatalf("template show my-flow: %d %s\n%s", code, errOut, out)
	}
	if got := buildCompleteness(t, exampleLines(out), "--template", "my-flow", "--templates-dir", tdir); len(got) != 1 || got[0] != "full" {
		t.Errorf("my-flow's example builds %v", got)
	}
	_, rest, _ := strings.Cut(out, "\n")
	if out2, _, code := runCLI(t, "template", "show", "my-flow", "--templates-dir", tdir); code != 0 || !strings.HasSuffix(out2, rest) ||
		!strings.HasPrefix(out2, "template my-flow, version 1 ("+filepath.Join(tdir, "my-flow.yaml")+")\n") {
		t.Errorf("--templates-dir shows otherwise than --dir: %d\n%s", code, out2)
	}
	if out2, _, code := runCLI(t, "template", "show", filepath.Join(tdir, "my-flow.yaml")); code != 0 || len(exampleLines(out2)) != 2 {
		t.Errorf("template show PATH: %d\n%s", code, out2)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"x402-seller", "--dir", root}, "x402-seller.yaml: stages: must be a non-empty list"},
		{[]string{"nope", "--dir", root}, `"nope" is not in the templates directory`},
		{[]string{"x402-buyer", "--dir", filepath.Join(root, "absent")}, "--dir: "},
		{[]string{"x402-buyer", "--templates-dir", filepath.Join(root, "absent")}, "is not a readable directory"},
	} {
		_, errOut, code := runCLI(t, append([]string{"template", "show"}, tc.args...)...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("template show %v: exit %d %q, want 1 and %q", tc.args, code, errOut, tc.want)
		}
	}
	if _, errOut, code := runCLI(t, "template", "show"); code != exitUsage {
		t.Errorf("template show with no name: exit %d %q", code, errOut)
	}
}
