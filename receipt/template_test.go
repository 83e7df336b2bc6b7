package receipt

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

const goodTemplate = `
template: t
version: 1.5
stages:
  - id: a
    required: true
    match:
      - event: x.a
        role: client
      - event: x.b
    missing_explanation: "nothing"
  - id: b
    required: false
    match:
      - event: x.c
exceptions:
  - x.fail
`

func TestParseTemplate(t *testing.T) {
	tm, err := ParseTemplate("t.yaml", []byte(goodTemplate))
	if err != nil {
		t.Fatal(err)
	}
	want := &Template{Name: "t", Version: 1.5, Source: "t.yaml", Exceptions: []string{"x.fail"}, Stages: []StageSpec{
		{ID: "a", Required: true, MissingExplanation: "nothing", Match: []Witness{{Event: "x.a", Role: "client", HasRole: true}, {Event: "x.b"}}},
		{ID: "b", Match: []Witness{{Event: "x.c"}}},
	}}
	if !reflect.DeepEqual(tm, want) {
		t.Errorf("got %+v\nwant %+v", tm, want)
	}
	for _, v := range []struct {
		in   string
		want float64
	}{{"2", 2}, {"2.0", 2}, {"-3", -3}, {"1e3", 1000}, {"0x10", 16}, {"0o10", 8}} {
		tm, err := ParseTemplate("v", []byte(strings.Replace(goodTemplate, "version: 1.5", "version: "+v.in, 1)))
		if err != nil || tm.Version != v.want {
			t.Errorf("version %s: %v %v", v.in, tm, err)
		}
	}
}

func TestParseTemplateRules(t *testing.T) {
	rep := func(old, new string) string { return strings.Replace(goodTemplate, old, new, 1) }
	cases := []struct{ name, in, want string }{
		{"empty", "", "src: empty file"},
		{"not yaml", "template: [", "src: not valid YAML"},
		{"two documents", goodTemplate + "---\n" + goodTemplate, "src: holds more than one YAML document"},
		{"not a mapping", "- 1\n", "src: expected a mapping at the top level, got a list"},
		{"unknown top key", goodTemplate + "exception: [x]\n", "src: exception: unknown key (expected one of template, version, stages, exceptions)"},
		{"duplicate top key", goodTemplate + "template: u\n", "src: template: duplicate key"},
		{"template missing", rep("template: t\n", ""), "src: template: must be a non-empty string"},
		{"template empty", rep("template: t", `template: ""`), "src: template: must be a non-empty string"},
		{"template number", rep("template: t", `template: 5`), "src: template: must be a non-empty string"},
		{"version missing", rep("version: 1.5\n", ""), "src: version: must be a finite number"},
		{"version string", rep("version: 1.5", `version: "1.5"`), "src: version: must be a finite number"},
		{"version nan", rep("version: 1.5", `version: .nan`), "src: version: must be a finite number"},
		{"version inf", rep("version: 1.5", `version: -.inf`), "src: version: must be a finite number"},
		{"stages missing", "template: t\nversion: 1\n", "src: stages: must be a non-empty list"},
		{"stages empty", "template: t\nversion: 1\nstages: []\n", "src: stages: must be a non-empty list"},
		{"stages mapping", "template: t\nversion: 1\nstages: {a: 1}\n", "src: stages: must be a non-empty list"},
		{"stage not mapping", "template: t\nversion: 1\nstages: [x]\n", "src: stages[0]: expected a mapping with id, required and match, got a str"},
		{"stage unknown key", rep("required: false", "required: false\n    optional: true"), "src: stages[1].optional: unknown key"},
		{"id missing", rep("  - id: b\n    required", "  - required"), "src: stages[1].id: must be a non-empty string"},
		{"id empty", rep("id: b", `id: ""`), "src: stages[1].id: must be a non-empty string"},
		{"id number", rep("id: b", `id: 7`), "src: stages[1].id: must be a non-empty string"},
		{"id duplicate", rep("id: b", `id: a`), `src: stages[1].id: duplicate stage id "a"`},
		{"required missing", rep("    required: false\n", ""), "src: stages[1].required: must be a boolean"},
		{"required yes", rep("required: false", "required: yes"), "src: stages[1].required: must be a boolean"},
		{"required string", rep("required: false", `required: "false"`), "src: stages[1].required: must be a boolean"},
		{"match missing", rep("    match:\n      - event: x.c\n", ""), "src: stages[1].match: must be a non-empty list"},
		{"match empty", rep("    match:\n      - event: x.c\n", "    match: []\n"), "src: stages[1].match: must be a non-empty list"},
		{"witness not mapping", rep("      - event: x.c", "      - x.c"), "src: stages[1].match[0]: expected a mapping"},
		{"witness unknown key", rep("      - event: x.c", "      - event: x.c\n        who: me"), "src: stages[1].match[0].who: unknown key (expected one of event, role)"},
		{"event missing", rep("      - event: x.b", "      - role: r"), "src: stages[0].match[1].event: must be a non-empty string"},
		{"event empty", rep("      - event: x.b", `      - event: ""`), "src: stages[0].match[1].event: must be a non-empty string"},
		{"event null", rep("      - event: x.b", `      - event: ~`), "src: stages[0].match[1].event: must be a non-empty string"},
		{"role empty", rep("role: client", `role: ""`), "src: stages[0].match[0].role: must be a non-empty string when present"},
		{"role list", rep("role: client", `role: [a]`), "src: stages[0].match[0].role: must be a non-empty string when present"},
		{"explanation number", rep(`missing_explanation: "nothing"`, `missing_explanation: 3`), "src: stages[0].missing_explanation: must be a non-empty string when present"},
		{"explanation empty", rep(`missing_explanation: "nothing"`, `missing_explanation: ""`), "src: stages[0].missing_explanation: must be a non-empty string when present"},
		{"exceptions not a list", rep("exceptions:\n  - x.fail", "exceptions: x.fail"), "src: exceptions: must be a list of non-empty strings"},
		{"exception empty", rep("  - x.fail", `  - ""`), "src: exceptions[0]: must be a non-empty string"},
		{"exception number", rep("  - x.fail", `  - 4`), "src: exceptions[0]: must be a non-empty string"},
		{"too big", goodTemplate + "#" + strings.Repeat("x", MaxTemplateBytes), "src: file is"},
		{"unknown alias", "template: t\nversion: 1\nstages: [*b]\n", "src: not valid YAML"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTemplate("src", []byte(c.in))
			var te *TemplateError
			if !errors.As(err, &te) {
				t.Fatalf("err = %v, want a TemplateError", err)
			}
			if !strings.HasPrefix(err.Error(), c.want) {
				t.Errorf("err = %q, want prefix %q", err, c.want)
			}
		})
	}
}

func TestParseTemplateAliasExpansionIsBounded(t *testing.T) {
	// 1000 stages sharing one 1000-witness match list by alias would be a
	// million witnesses from a file of a few dozen KiB.
	var b strings.Builder
	b.WriteString("template: t\nversion: 1\nstages:\n  - id: s0\n    required: true\n    match: &m [")
	for i := 0; i < 1000; i++ {
		b.WriteString("{event: e},")
	}
	b.WriteString("]\n")
	for i := 1; i < 1000; i++ {
		b.WriteString("  - {id: s" + itoa(i) + ", required: true, match: *m}\n")
	}
	_, err := ParseTemplate("src", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "more than 100000 YAML nodes") {
		t.Fatalf("err = %v", err)
	}
	// A few aliases are fine.
	doc := "template: t\nversion: 1\nstages:\n  - id: s\n    required: true\n    match: &m [{event: x}, {event: y}]\n"
	for i := 0; i < 5; i++ {
		doc += "  - {id: s" + itoa(i+1) + ", required: true, match: *m}\n"
	}
	if _, err := ParseTemplate("src", []byte(doc)); err != nil {
		t.Fatalf("aliases refused: %v", err)
	}
}

func TestBundledTemplatesLoad(t *testing.T) {
	for _, name := range BundledNames() {
		tm, err := Bundled(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if tm.Name != name {
			t.Errorf("bundled %s is named %q", name, tm.Name)
		}
		for _, s := range tm.Stages {
			if s.Required && s.MissingExplanation == "" {
				t.Errorf("%s: required stage %s has no missing_explanation", name, s.ID)
			}
		}
	}
	if _, err := Bundled("nope"); err == nil {
		t.Error("unknown bundled template loaded")
	}
	if _, err := Bundled("../x"); err == nil || !strings.Contains(err.Error(), "not a bare slug") {
		t.Errorf("path as bundled name: %v", err)
	}
}

// TestBundledMatchReference catches drift between the bundled templates and
// the reference files: everything but the explanation texts must agree.
func TestBundledMatchReference(t *testing.T) {
	refDir := filepath.Join(sharedDir(t, "the comparison of bundled templates with the reference templates"), "haia-trace", "templates")
	for _, name := range BundledNames() {
		ref, err := LoadTemplateFile(filepath.Join(refDir, name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		own, err := Bundled(name)
		if err != nil {
			t.Fatal(err)
		}
		strip := func(tm *Template) Template {
			c := *tm
			c.Source = ""
			c.Stages = nil
			for _, s := range tm.Stages {
				s.MissingExplanation = ""
				c.Stages = append(c.Stages, s)
			}
			return c
		}
		if a, b := strip(own), strip(ref); !reflect.DeepEqual(a, b) {
			t.Errorf("%s drifted from the reference:\n own %+v\n ref %+v", name, a, b)
		}
		for i := range ref.Stages {
			if (ref.Stages[i].MissingExplanation == "") != (own.Stages[i].MissingExplanation == "") {
				t.Errorf("%s stage %s: explanation present in one and not the other", name, ref.Stages[i].ID)
			}
		}
	}
}

func TestResolver(t *testing.T) {
	dir := fstest.MapFS{
		"x402-buyer.yaml": {Data: []byte(strings.Replace(goodTemplate, "template: t", "template: overridden", 1))},
		"mine.yml":        {Data: []byte(goodTemplate)},
		"both.yaml":       {Data: []byte(strings.Replace(goodTemplate, "template: t", "template: from-yaml", 1))},
		"both.yml":        {Data: []byte(goodTemplate)},
		"broken.yaml":     {Data: []byte("template: [")},
	}
	r := Resolver{Dir: dir, DirName: "ops/templates"}
	cases := []struct{ name, want, err string }{
		{"x402-buyer", "overridden", ""},
		{"x402-seller", "x402-seller", ""},
		{"mine", "t", ""},
		{"both", "from-yaml", ""},
		{"broken", "", "ops/templates/broken.yaml: not valid YAML"},
		{"absent", "", `template not found: "absent" is not in the templates directory or among the bundled templates`},
		{"../etc/passwd", "", "not a bare slug"},
		{"", "", "not a bare slug"},
	}
	for _, c := range cases {
		tm, err := r.Resolve(c.name)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Resolve(%q) err = %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || tm.Name != c.want {
			t.Errorf("Resolve(%q) = %v, %v; want %s", c.name, tm, err, c.want)
		}
	}
	if tm, err := (Resolver{}).Resolve("escrow-arc"); err != nil || tm.Name != "escrow-arc" {
		t.Errorf("no dir: %v %v", tm, err)
	}
	if _, err := (Resolver{}).Resolve("absent"); !errors.Is(err, ErrTemplateNotFound) {
		t.Errorf("no dir, absent: %v", err)
	}
}

func TestIsSlug(t *testing.T) {
	for s, want := range map[string]bool{"x402-buyer": true, "A_b-9": true, "": false, "a.b": false, "a/b": false, "..": false, "é": false, "a b": false} {
		if IsSlug(s) != want {
			t.Errorf("IsSlug(%q) = %v", s, !want)
		}
	}
}

func TestLoadTemplateFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "t.yaml")
	if err := os.WriteFile(p, []byte(goodTemplate), 0o600); err != nil {
		t.Fatal(err)
	}
	if tm, err := LoadTemplateFile(p); err != nil || tm.Source != p {
		t.Errorf("LoadTemplateFile = %v %v", tm, err)
	}
	if _, err := LoadTemplateFile(filepath.Join(dir, "absent.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent: %v", err)
	}
}

func FuzzParseTemplate(f *testing.F) {
	f.Add([]byte(goodTemplate))
	for _, name := range BundledNames() {
		data, _ := bundledFS.ReadFile("templates/" + name + ".yaml")
		f.Add(data)
	}
	f.Add([]byte("template: t\nversion: 1\nstages: &a [{id: s, required: true, match: [{event: e}]}]\nexceptions: *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tm, err := ParseTemplate("fuzz", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz: ") {
				t.Fatalf("error without its source: %v", err)
			}
			return
		}
		if tm.Name == "" || len(tm.Stages) == 0 {
			t.Fatalf("accepted a broken template: %+v", tm)
		}
		seen := map[string]bool{}
		for _, s := range tm.Stages {
			if s.ID == "" || seen[s.ID] || len(s.Match) == 0 {
				t.Fatalf("accepted a broken stage: %+v", s)
			}
			seen[s.ID] = true
			for _, w := range s.Match {
				if w.Event == "" || (w.HasRole && w.Role == "") {
					t.Fatalf("accepted a broken witness: %+v", w)
				}
			}
		}
	})
}
