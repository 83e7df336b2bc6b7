package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// The README's host set-ups, first-hour commands, example event line and
// example template, and every server command line of the pages under docs/,
// stay true to the binary.
func TestREADMEExamplesHold(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	pages, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages under docs/: %v", err)
	}
	docs := map[string]string{"README.md": readme}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs["docs/"+filepath.Base(p)] = string(b)
	}
	flagsOf := func(args ...string) map[string]bool {
		known := map[string]bool{}
		out, _, _ := runIn(append(args, "--help")...)
		for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(out, -1) {
			known["--"+m[1]] = true
		}
		return known
	}
	serveFlags, proxyFlags := flagsOf(), flagsOf("proxy")
	// Every flag the Claude Desktop block and the server lines pass exists.
	checked, checkedReadme := 0, 0
	for name, text := range docs {
		for _, b := range regexp.MustCompile("(?s)```(json|sh)\n(.*?)```").FindAllStringSubmatch(text, -1) {
			// A block that starts the guard proxy passes the proxy's flags.
			known := serveFlags
			if strings.Contains(b[2], `["proxy"`) {
				known = proxyFlags
			}
			for _, line := range strings.Split(b[2], "\n") {
				server := (strings.Contains(line, "haia-trace-mcp --dir") && !strings.Contains(line, "go run ./tools/")) || strings.Contains(line, `"args"`) || strings.Contains(line, `"--guard-config"`)
				if !server {
					continue
				}
				for _, f := range regexp.MustCompile(`(--[a-z0-9-]+)`).FindAllString(line, -1) {
					checked++
					if name == "README.md" {
						checkedReadme++
					}
					if !known[f] {
						t.Errorf("%s passes %s to the server, which has no such flag: %s", name, f, strings.TrimSpace(line))
					}
				}
			}
		}
	}
	if checkedReadme < 12 || checked < 25 {
		t.Fatalf("only %d server flags found in the README's set-ups (%d with docs/); the test lost its footing", checkedReadme, checked)
	}
	// The example run's lines are valid Event Contract lines, and the real
	// build assembles them to one full receipt (without the settlement
	// answer, partial), as the README says.
	lines := regexp.MustCompile(`(?m)^\{"event_id":"op-1-\d+".*\}$`).FindAllString(readme, -1)
	if len(lines) != 3 {
		t.Fatalf("the README's example run has %d lines, want the three of one x402 payment", len(lines))
	}
	for _, line := range lines {
		if _, err := receipt.DecodeLine([]byte(line)); err != nil || !json.Valid([]byte(line)) {
			t.Errorf("the README's example event line does not decode: %v", err)
		}
	}
	if got := buildCompleteness(t, lines); len(got) != 1 || got[0] != "full" {
		t.Errorf("the README's example run builds %v, want one full receipt", got)
	}
	if got := buildCompleteness(t, lines[:2]); len(got) != 1 || got[0] != "partial" {
		t.Errorf("the README's example run without its settlement answer builds %v, want partial", got)
	}
	// template show x402-buyer prints this very run.
	if out, _, code := runCLI(t, "template", "show", "x402-buyer"); code != 0 || strings.Join(exampleLines(out), "\n") != strings.Join(lines, "\n") {
		t.Errorf("template show x402-buyer (exit %d) prints another example than the README's", code)
	}
	// The example template parses.
	tmpl := regexp.MustCompile("(?s)```yaml\n(template: my-flow.*?)```").FindStringSubmatch(readme)
	if tmpl == nil {
		t.Fatal("the README's example template is gone")
	}
	if _, err := receipt.ParseTemplate("README", []byte(tmpl[1])); err != nil {
		t.Errorf("the README's example template does not parse: %v", err)
	}
}
