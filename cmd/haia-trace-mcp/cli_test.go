package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
)

func runIn(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

// Every command has the same grammar: --help and -h exit 0 and show the
// flags with their defaults on stdout; an unknown flag is one line on
// stderr that names it and points at --help, exit 2 (verify: 4).
func TestEveryCommandHasOneGrammar(t *testing.T) {
	commands := [][]string{
		{}, {"build"}, {"policy", "check"}, {"policy", "eval"}, {"verify"}, {"signer"}, {"review", "list"}, {"review", "show"},
		{"review", "approve"}, {"review", "reject"}, {"review", "watch"}, {"review", "archive"}, {"reviewer", "init"}, {"audit"}, {"init"},
		{"chain", "list"}, {"chain", "export"}, {"chain", "checkpoint"}, {"healthcheck"}, {"proxy"}, {"demo"}, {"version"}, {"completion"},
		{"payer", "address"}, {"authorization", "show"},
	}
	oneLine := regexp.MustCompile(`^haia-trace-mcp[a-z ]*: .*\(see haia-trace-mcp[a-z ]* --help\)\n$`)
	for _, cmd := range commands {
		name := strings.Join(cmd, " ")
		for _, h := range []string{"--help", "-h"} {
			out, errOut, code := runIn(append(append([]string{}, cmd...), h)...)
			if code != 0 || !strings.Contains(out, "usage") || errOut != "" {
				t.Errorf("%q %s: exit %d, stdout %q, stderr %q", name, h, code, clipText(out), errOut)
			}
		}
		want := exitUsage
		if len(cmd) > 0 && cmd[0] == "verify" {
			want = exitVerifyUsage
		}
		_, errOut, code := runIn(append(append([]string{}, cmd...), "--no-such-flag")...)
		if code != want || !oneLine.MatchString(errOut) || !strings.Contains(errOut, "no-such-flag") {
			t.Errorf("%q --no-such-flag: exit %d (want %d), stderr %q", name, code, want, errOut)
		}
	}
	// Flags show their defaults.
	if out, _, _ := runIn("review", "approve", "--help"); !strings.Contains(out, "-lock-wait duration") || !strings.Contains(out, `(default 5s)`) {
		t.Errorf("review approve --help lacks --lock-wait and its default:\n%s", out)
	}
	if out, _, _ := runIn("--help"); !strings.Contains(out, "-http string") || !strings.Contains(out, "haia-trace-mcp review") {
		t.Errorf("--help lacks the commands or the server flags:\n%s", clipText(out))
	}
	// help, --help, version and --version agree.
	a, _, _ := runIn("help")
	b, _, _ := runIn("--help")
	if a != b {
		t.Error("help and --help differ")
	}
	v1, _, c1 := runIn("version")
	v2, _, c2 := runIn("--version")
	if v1 != v2 || c1 != 0 || c2 != 0 || !strings.HasPrefix(v1, "haia-trace-mcp ") {
		t.Errorf("version %q (%d) and --version %q (%d) disagree", v1, c1, v2, c2)
	}
	// Commands without their subcommand, or with an unknown one, are usage errors.
	for _, cmd := range [][]string{{"review"}, {"chain"}, {"policy"}, {"reviewer"}, {"review", "bogus"}, {"chain", "bogus"}, {"nosuchcommand"}} {
		if _, errOut, code := runIn(cmd...); code != exitUsage || !oneLine.MatchString(errOut) {
			t.Errorf("%v: exit %d, stderr %q", cmd, code, errOut)
		}
	}
}

func clipText(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// The completion scripts know every command, and bash can read its script.
func TestCompletionKnowsEveryCommand(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`case "([a-z]+)":`).FindAllStringSubmatch(string(src), -1) {
		found := false
		for _, w := range completionWords[""] {
			found = found || w == m[1]
		}
		if !found {
			t.Errorf("command %s is missing from the completion words", m[1])
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		out, errOut, code := runIn("completion", shell)
		if code != 0 || !strings.Contains(out, "review") || !strings.Contains(out, "haia-trace-mcp") {
			t.Errorf("completion %s: %d %q %q", shell, code, clipText(out), errOut)
		}
	}
	if _, _, code := runIn("completion", "tcsh"); code != exitUsage {
		t.Errorf("completion tcsh: exit %d", code)
	}
}
