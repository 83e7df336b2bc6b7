package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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

// The command table and run's dispatch agree; the top-level help names
// every command; each table entry and subcommand answers --help; the
// completion scripts offer every flag of every command (read from the
// commands' own flag sets), and bash can read its script.
func TestCommandsTable(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	dispatched := map[string]bool{}
	for _, m := range regexp.MustCompile(`case "([a-z]+)":`).FindAllStringSubmatch(string(src), -1) {
		dispatched[m[1]] = true
	}
	names := commandNames()
	for name := range dispatched {
		if !slices.Contains(names, name) {
			t.Errorf("command %s is dispatched but missing from the command table", name)
		}
	}
	top, _, _ := runIn("--help")
	words := completionWords()
	for _, c := range commands {
		if !dispatched[c.name] {
			t.Errorf("command %s is in the table but run does not dispatch it", c.name)
		}
		if !strings.Contains(top, "haia-trace-mcp "+c.name) {
			t.Errorf("--help does not list %s", c.name)
		}
		paths := [][]string{{c.name}}
		if len(c.subs) > 0 && c.name != "completion" {
			paths = nil
			for _, s := range c.subs {
				paths = append(paths, []string{c.name, s})
			}
		}
		for _, p := range paths {
			out, errOut, code := runIn(append(slices.Clone(p), "--help")...)
			if code != 0 || errOut != "" {
				t.Errorf("%v --help: exit %d %q", p, code, errOut)
			}
			if c.name == "help" || c.name == "version" {
				continue
			}
			// Every flag the help shows is offered for the command.
			_, flagPart, _ := strings.Cut(out, "\nflags:\n")
			for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(flagPart, -1) {
				if !slices.Contains(words[c.name], "--"+m[1]) {
					t.Errorf("completion for %s does not offer --%s (%v takes it)", c.name, m[1], p)
				}
			}
		}
	}
	// What the hand-kept lists used to miss.
	for cmd, flag := range map[string]string{"review": "--tenants-dir", "verify": "--store", "audit": "--store", "": "--http", "chain": "--store"} {
		if !slices.Contains(words[cmd], flag) {
			t.Errorf("completion for %q does not offer %s", cmd, flag)
		}
	}
	for _, w := range []string{"completion", "archive"} {
		if !strings.Contains(top, w) {
			t.Errorf("--help does not mention %s", w)
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		out, errOut, code := runIn("completion", shell)
		if code != 0 || !strings.Contains(out, "review") || !(strings.Contains(out, "--tenants-dir") || strings.Contains(out, "-l tenants-dir")) {
			t.Errorf("completion %s: %d %q %q", shell, code, clipText(out), errOut)
		}
		if shell == "bash" {
			if bash, err := exec.LookPath("bash"); err == nil {
				cmd := exec.Command(bash, "-n")
				cmd.Stdin = strings.NewReader(out)
				if msg, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("bash -n on the completion script: %v %s", err, msg)
				}
			}
		}
	}
	if _, _, code := runIn("completion", "tcsh"); code != exitUsage {
		t.Errorf("completion tcsh: exit %d", code)
	}
}

// A mistyped command names the nearest one; a word far from every
// command gets no guess.
func TestUnknownCommandSuggests(t *testing.T) {
	for typed, want := range map[string]string{"reveiw": "review", "verfy": "verify", "chian": "chain", "complet": "completion", "xyzzy": ""} {
		_, errOut, code := runIn(typed)
		if code != exitUsage || !strings.Contains(errOut, `unknown command "`+typed+`"`) {
			t.Errorf("%s: exit %d %q", typed, code, errOut)
		}
		if got := strings.Contains(errOut, "did you mean"); got != (want != "") || (want != "" && !strings.Contains(errOut, `"`+want+`"`)) {
			t.Errorf("%s: %q, want a suggestion of %q", typed, errOut, want)
		}
	}
}

// chain list on a Trace root without decisions lists nothing and exits 0;
// on a directory that is not a Trace root it exits 2. A missing Trace root
// is told as such, with the two ways on, never as a system call's error.
func TestChainListAndMissingRoot(t *testing.T) {
	base := t.TempDir()
	noDecisions := filepath.Join(base, "fresh")
	if err := os.MkdirAll(filepath.Join(noDecisions, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	initRoot := filepath.Join(base, "init")
	cfg := t.TempDir()
	if out, errOut, code := runCLIEnv(t, []string{"HAIA_CONFIG_DIR=" + cfg}, "init", initRoot); code != 0 {
		t.Fatalf("init: %d %s %s", code, out, errOut)
	}
	for _, root := range []string{noDecisions, initRoot} {
		if out, errOut, code := runCLI(t, "chain", "list", "--dir", root); code != 0 || out != "" {
			t.Errorf("chain list on %s: exit %d %q %q, want nothing and 0", root, code, out, errOut)
		}
	}
	if _, errOut, code := runCLI(t, "chain", "list", "--dir", base); code != exitUsage || !strings.Contains(errOut, "not a Trace root") {
		t.Errorf("chain list on a folder that is no Trace root: exit %d %q, want 2", code, errOut)
	}
	missing := filepath.Join(base, "nowhere")
	for _, args := range [][]string{{"--dir", missing}, {"review", "list", "--dir", missing}, {"chain", "list", "--dir", missing}, {"audit", "--dir", missing}} {
		_, errOut, code := runCLI(t, args...)
		if code == 0 || strings.Contains(errOut, "lstat") || !strings.Contains(errOut, "haia-trace-mcp init") || !strings.Contains(errOut, "--dir") {
			t.Errorf("%v without a Trace root: exit %d %q", args, code, errOut)
		}
	}
}
