package docs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// repoPages are the Markdown files whose links are checked: the README,
// SECURITY.md, CHANGELOG.md and every page here.
func repoPages(t *testing.T) (all, pages []string) {
	t.Helper()
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 10 {
		t.Fatalf("only %d pages under docs/; the test lost its footing", len(pages))
	}
	for _, f := range []string{"README.md", "SECURITY.md", "CHANGELOG.md"} {
		all = append(all, filepath.Join("..", f))
	}
	return append(all, pages...), pages
}

// Every relative link and #anchor of the project's documentation resolves.
func TestDocumentationLinksResolve(t *testing.T) {
	all, _ := repoPages(t)
	problems, checked, err := checkLinks(all)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if checked < 100 {
		t.Errorf("only %d relative links checked; the test lost its footing", checked)
	}
}

// Every page under docs/ and the README open with a table of contents that
// lists every section.
func TestDocumentationPagesHaveContents(t *testing.T) {
	_, pages := repoPages(t)
	for _, f := range append(pages, filepath.Join("..", "README.md")) {
		problems, err := checkContents(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Error(p)
		}
	}
}

// No page speaks of the project's own history: that is the changelog's.
func TestDocumentationSpeaksOfTheProductNotItsHistory(t *testing.T) {
	all, _ := repoPages(t)
	phrases := []string{"before issue", "after issue", "issue is silent", "this round", "version 1 ", "before the fix", "issue-1", "issue 1", "issue 2"}
	for _, f := range all {
		if strings.HasSuffix(f, "CHANGELOG.md") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(strings.ToLower(string(data)), "\n") {
			for _, ph := range phrases {
				if strings.Contains(line, ph) {
					t.Errorf("%s:%d speaks of the project's history (%q): %s", f, i+1, ph, strings.TrimSpace(line))
				}
			}
		}
	}
}

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The checker finds what is broken and nothing else.
func TestCheckLinks(t *testing.T) {
	target := "# T\n\n- [A](#a)\n\n## A\n\n## The `verify` command: exit codes\n\n## Dup\n\n## Dup\n\n```sh\n## not a heading\n```\n"
	for _, tc := range []struct {
		name   string
		page   string
		want   []string // substrings of the problems, in order
		checks int
	}{
		{name: "a file and its heading", page: "[t](t.md#a)", checks: 1},
		{name: "a heading with code and punctuation", page: "[t](t.md#the-verify-command-exit-codes)", checks: 1},
		{name: "a repeated heading is -1", page: "[t](t.md#dup) [t](t.md#dup-1)", checks: 2},
		{name: "a directory", page: "[d](sub)", checks: 1},
		{name: "an anchor in the same page", page: "# P\n\n## Here\n\n[h](#here)", checks: 1},
		{name: "other schemes are not followed", page: "[x](https://example.com/none.md#x) [m](mailto:a@b)", checks: 0},
		{name: "links in code are not links", page: "`[x](gone.md)`\n\n```\n[x](gone.md)\n```\n", checks: 0},
		{name: "a missing file", page: "see [gone](gone.md)", want: []string{"p.md:1: link gone.md: ", "does not exist"}, checks: 1},
		{name: "a missing anchor", page: "x\n[t](t.md#nope)", want: []string{"p.md:2: link t.md#nope: ", "has no heading with anchor #nope"}, checks: 1},
		{name: "a third repeat that does not exist", page: "[t](t.md#dup-2)", want: []string{"#dup-2"}, checks: 1},
		{name: "a heading inside a code block is no anchor", page: "[t](t.md#not-a-heading)", want: []string{"#not-a-heading"}, checks: 1},
		{name: "a missing anchor in the same page", page: "# P\n\n[h](#there)", want: []string{"#there"}, checks: 1},
		{name: "an anchor into a file that is not Markdown", page: "[g](sub/x.go#L1)", want: []string{"not a Markdown page"}, checks: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTree(t, map[string]string{"t.md": target, "p.md": tc.page, "sub/x.go": "package x\n"})
			problems, checked, err := checkLinks([]string{filepath.Join(dir, "p.md")})
			if err != nil {
				t.Fatal(err)
			}
			if checked != tc.checks {
				t.Errorf("checked %d links, want %d", checked, tc.checks)
			}
			if len(tc.want) == 0 {
				if len(problems) != 0 {
					t.Errorf("problems in a sound page: %v", problems)
				}
				return
			}
			if len(problems) != 1 {
				t.Fatalf("want one problem, got %v", problems)
			}
			got := problems[0].String()
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("problem %q does not say %q", got, w)
				}
			}
		})
	}
}

// A page needs a table of contents naming every section.
func TestCheckContents(t *testing.T) {
	for _, tc := range []struct {
		name string
		page string
		want []string
	}{
		{name: "complete", page: "# P\n\n- [A](#a)\n- [`B` b](#b-b)\n  - [C](#c)\n\n## A\n\n## `B` b\n\n### C\n"},
		{name: "none", page: "# P\n\nText.\n\n## A\n", want: []string{"no table of contents"}},
		{name: "a section left out", page: "# P\n\n- [A](#a)\n\n## A\n\n## B\n", want: []string{"#b is not in the table of contents"}},
		{name: "no sections", page: "# P\n\nText.\n", want: []string{"no section headings"}},
		{name: "a list after the first section is no table of contents", page: "# P\n\n## A\n\n- [A](#a)\n", want: []string{"no table of contents"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTree(t, map[string]string{"p.md": tc.page})
			problems, err := checkContents(filepath.Join(dir, "p.md"))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range problems {
				got = append(got, p.What)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("problems %v, want %v", got, tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %q does not say %q", got[i], w)
				}
			}
		})
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"The guard's store: files or PostgreSQL": "the-guards-store-files-or-postgresql",
		"`verify`'s exit codes":                  "verifys-exit-codes",
		"check_before_pay by store":              "check_before_pay-by-store",
		"0.1.0 - 2026-12-01":                     "010---2026-12-01",
		"See [the rules](rules.md) here":         "see-the-rules-here",
		"Ünïcode héading":                        "ünïcode-héading",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}

// The README opens with the two commands a newcomer runs — the demo and the
// tests — and the test command is the one CI runs (with the race detector).
func TestReadmeOpensWithTheTwoCommands(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var block []string
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			for _, b := range lines[i+1:] {
				if strings.HasPrefix(b, "```") {
					break
				}
				block = append(block, strings.Fields(strings.SplitN(b, "#", 2)[0])...)
				block = append(block, "\n")
			}
			break
		}
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "# ") {
			t.Fatalf("README line %d comes before the two commands: %q", i+1, l)
		}
	}
	if got := strings.Join(block, " "); got != "go run ./cmd/haia-trace-mcp demo \n go test ./... \n" {
		t.Fatalf("the README's first block is %q, not the demo and the test command", got)
	}
	ci, err := os.ReadFile(filepath.Join("..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range strings.Split(string(ci), "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[0] == "go" && f[1] == "test" && slices.Contains(f, "-race") && f[len(f)-1] == "./..." {
			found = true
		}
	}
	if !found {
		t.Error(".ci/run does not run the README's test command (go test … ./...) with -race")
	}
}
