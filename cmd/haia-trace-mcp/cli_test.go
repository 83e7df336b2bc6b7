package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
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

func clipText(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// tableCommand is one command of the table that runs, with the flags its
// own flag set declares.
type tableCommand struct {
	path  []string
	spec  *cmdSpec
	flags []string // names, without dashes
}

// tableCommands lists the root (serving) and every command that runs,
// each with its flags read by flag.VisitAll from a flag set built apart
// from the help and completion code.
func tableCommands(t *testing.T) []tableCommand {
	t.Helper()
	root := commandTable()
	paths := append([][]string{{}}, leafPaths(root, nil)...)
	var out []tableCommand
	for _, p := range paths {
		c := root.find(p)
		if c == nil || c.define == nil {
			t.Fatalf("%v: in leafPaths but not a command that runs", p)
		}
		fs := flag.NewFlagSet("probe", flag.ContinueOnError)
		c.define(fs)
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		out = append(out, tableCommand{path: p, spec: c, flags: names})
	}
	if len(out) < 30 {
		t.Fatalf("the table lists only %d commands", len(out))
	}
	return out
}

// Every command in the table has one grammar: --help and -h exit 0, print
// the usage on stdout and list every flag the command takes; an unknown
// flag is one line on stderr that names the flag and the command and
// points at --help, with the command's usage exit code (verify: 4).
func TestEveryCommandHelpListsItsFlags(t *testing.T) {
	oneLine := regexp.MustCompile(`^haia-trace-mcp[a-z -]*: .*\(see haia-trace-mcp[a-z -]* --help\)\n$`)
	for _, c := range tableCommands(t) {
		name := strings.Join(c.path, " ")
		t.Run(strings.ReplaceAll("cmd "+name, " ", "_"), func(t *testing.T) {
			for _, h := range []string{"--help", "-h"} {
				out, errOut, code := runIn(append(slices.Clone(c.path), h)...)
				if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage:\n  haia-trace-mcp "+name) {
					t.Fatalf("%s: exit %d, stdout %q, stderr %q", h, code, clipText(out), errOut)
				}
				_, flagPart, _ := strings.Cut(out, "\nflags:\n")
				for _, f := range c.flags {
					if !regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(f) + `( |$)`).MatchString(flagPart) {
						t.Errorf("%s does not list --%s", h, f)
					}
				}
				if !strings.Contains(out, c.spec.summary) {
					t.Errorf("%s does not show the summary %q", h, c.spec.summary)
				}
			}
			want := exitUsage
			if name == "verify" || name == "dossier verify" {
				want = exitVerifyUsage
			}
			_, errOut, code := runIn(append(slices.Clone(c.path), "--no-such-flag")...)
			if code != want || !oneLine.MatchString(errOut) || !strings.Contains(errOut, "-no-such-flag") ||
				!strings.HasPrefix(errOut, strings.TrimSpace("haia-trace-mcp "+name)+": ") {
				t.Errorf("--no-such-flag: exit %d (want %d), stderr %q", code, want, errOut)
			}
		})
	}
	// A flag's bad value is named with the command.
	if _, errOut, code := runIn("healthcheck", "--timeout", "soon"); code != exitUsage ||
		errOut != "haia-trace-mcp healthcheck: invalid value \"soon\" for flag -timeout: parse error (see haia-trace-mcp healthcheck --help)\n" {
		t.Errorf("healthcheck --timeout soon: exit %d, %q", code, errOut)
	}
	// A run function's usage error names the command, as a parse error does.
	if _, errOut, code := runIn("policy", "eval", "p.json"); code != exitUsage ||
		errOut != "haia-trace-mcp policy eval: --input INPUT.json is required (see haia-trace-mcp policy eval --help)\n" {
		t.Errorf("policy eval without --input: exit %d, %q", code, errOut)
	}
	// Flags show their defaults.
	if out, _, _ := runIn("review", "approve", "--help"); !strings.Contains(out, "-lock-wait duration") || !strings.Contains(out, `(default 5s)`) {
		t.Errorf("review approve --help lacks --lock-wait and its default:\n%s", out)
	}
	// help, --help, version and --version agree; help CMD is CMD --help.
	a, _, _ := runIn("help")
	b, _, _ := runIn("--help")
	if a != b || !strings.Contains(a, "-http string") || !strings.Contains(a, "review approve") {
		t.Errorf("help and --help differ, or lack the commands or the server flags:\n%s", clipText(a))
	}
	c1, _, _ := runIn("help", "review", "approve")
	c2, _, _ := runIn("review", "approve", "--help")
	if c1 != c2 {
		t.Error("help review approve and review approve --help differ")
	}
	v1, _, code1 := runIn("version")
	v2, _, code2 := runIn("--version")
	if v1 != v2 || code1 != 0 || code2 != 0 || !strings.HasPrefix(v1, "haia-trace-mcp ") {
		t.Errorf("version %q (%d) and --version %q (%d) disagree", v1, code1, v2, code2)
	}
}

// A group (review, chain, ...) answers --help, -h and help with every
// subcommand and its summary; without a subcommand, or with an unknown
// one, it is a usage error naming the group.
func TestGroupsHelpAndUsage(t *testing.T) {
	oneLine := regexp.MustCompile(`^haia-trace-mcp[a-z -]*: .*\(see haia-trace-mcp[a-z -]* --help\)\n$`)
	root := commandTable()
	var walk func(c *cmdSpec, path []string)
	groups := 0
	walk = func(c *cmdSpec, path []string) {
		for _, s := range c.subs {
			p := append(slices.Clone(path), s.name)
			walk(s, p)
			if s.define != nil {
				continue
			}
			groups++
			name := strings.Join(p, " ")
			for _, h := range []string{"--help", "-h", "help"} {
				out, errOut, code := runIn(append(slices.Clone(p), h)...)
				if code != 0 || errOut != "" {
					t.Errorf("%s %s: exit %d %q", name, h, code, errOut)
				}
				for _, sub := range s.subs {
					if !strings.Contains(out, "haia-trace-mcp "+name+" "+sub.name) || !strings.Contains(out, sub.summary) {
						t.Errorf("%s %s does not show %s and its summary:\n%s", name, h, sub.name, out)
					}
				}
			}
			_, errOut, code := runIn(p...)
			if code != exitUsage || !oneLine.MatchString(errOut) || !strings.Contains(errOut, "name a subcommand: ") {
				t.Errorf("%s alone: exit %d %q", name, code, errOut)
			}
			_, errOut, code = runIn(append(slices.Clone(p), "bogus")...)
			if code != exitUsage || !oneLine.MatchString(errOut) || !strings.HasPrefix(errOut, "haia-trace-mcp "+name+": unknown subcommand \"bogus\"") {
				t.Errorf("%s bogus: exit %d %q", name, code, errOut)
			}
		}
	}
	walk(root, nil)
	if groups < 8 {
		t.Fatalf("only %d groups in the table", groups)
	}
}

// A flag the help prose names (a synopsis, the details) is one the command
// takes, or the server's: the prose cannot drift from the flag sets.
func TestHelpNamesOnlyRealFlags(t *testing.T) {
	cmds := tableCommands(t)
	server := map[string]bool{}
	for _, f := range cmds[0].flags {
		server[f] = true
	}
	mention := regexp.MustCompile(`--([a-z][a-z0-9-]+)`)
	// A group's details, which its subcommands show, may name the flags of
	// any of them.
	family := map[string]map[string]bool{}
	for _, c := range cmds[1:] {
		if family[c.path[0]] == nil {
			family[c.path[0]] = map[string]bool{}
		}
		for _, f := range c.flags {
			family[c.path[0]][f] = true
		}
	}
	for _, c := range cmds[1:] {
		own := map[string]bool{"help": true, "version": c.path[0] == "version"}
		for _, f := range c.flags {
			own[f] = true
		}
		out, _, _ := runIn(append(slices.Clone(c.path), "--help")...)
		prose, _, _ := strings.Cut(out, "\nflags:\n")
		for _, m := range mention.FindAllStringSubmatch(c.spec.synopsis, -1) {
			if !own[m[1]] {
				t.Errorf("%v: the synopsis names --%s, which the command does not take", c.path, m[1])
			}
		}
		for _, m := range mention.FindAllStringSubmatch(prose, -1) {
			if !own[m[1]] && !server[m[1]] && !family[c.path[0]][m[1]] {
				t.Errorf("%v: the help names --%s, which neither the command nor the server takes", c.path, m[1])
			}
		}
	}
}

// A mistyped command or subcommand names the nearest one; a word far from
// every command gets no guess.
func TestUnknownCommandSuggests(t *testing.T) {
	for _, tc := range []struct {
		args []string
		name string // the command the error names
		want string // the suggestion, "" for none
	}{
		{[]string{"reveiw"}, "haia-trace-mcp", "review"},
		{[]string{"verfy"}, "haia-trace-mcp", "verify"},
		{[]string{"chian"}, "haia-trace-mcp", "chain"},
		{[]string{"complet"}, "haia-trace-mcp", "completion"},
		{[]string{"xyzzy"}, "haia-trace-mcp", ""},
		{[]string{"review", "aprove"}, "haia-trace-mcp review", "approve"},
		{[]string{"chain", "exprot", "x"}, "haia-trace-mcp chain", "export"},
		{[]string{"reviewer", "passkey", "rm"}, "haia-trace-mcp reviewer passkey", ""},
		{[]string{"store", "mig"}, "haia-trace-mcp store", "migrate"},
	} {
		typed := tc.args[len(tc.args)-1]
		if tc.args[0] == "chain" {
			typed = tc.args[1]
		}
		_, errOut, code := runIn(tc.args...)
		what := "subcommand"
		if len(tc.args) == 1 {
			what = "command"
		}
		if code != exitUsage || !strings.HasPrefix(errOut, fmt.Sprintf("%s: unknown %s %q", tc.name, what, typed)) {
			t.Errorf("%v: exit %d %q", tc.args, code, errOut)
		}
		if got := strings.Contains(errOut, "did you mean"); got != (tc.want != "") || (tc.want != "" && !strings.Contains(errOut, `"`+tc.want+`"?`)) {
			t.Errorf("%v: %q, want a suggestion of %q", tc.args, errOut, tc.want)
		}
	}
}

// The completion scripts offer every command and every flag each command
// takes. bash runs its script: at each command path, with flags and their
// values typed before, the words it offers are compared with the flags
// flag.VisitAll finds on the command's flag set. zsh loads the same script
// through bashcompinit; fish's lines are checked one by one.
func TestCompletionOffersEveryCommandAndFlag(t *testing.T) {
	cmds := tableCommands(t)
	root := commandTable()
	bashScript, errOut, code := runIn("completion", "bash")
	if code != 0 || errOut != "" {
		t.Fatalf("completion bash: %d %q", code, errOut)
	}
	zsh, _, code := runIn("completion", "zsh")
	if code != 0 || !strings.HasSuffix(zsh, bashScript) || !strings.HasPrefix(zsh, "#compdef haia-trace-mcp ./haia-trace-mcp\n") {
		t.Errorf("completion zsh: %d, not the bash script behind bashcompinit", code)
	}
	fish, _, code := runIn("completion", "fish")
	if code != 0 {
		t.Fatalf("completion fish: %d", code)
	}
	if _, _, code := runIn("completion", "tcsh"); code != exitUsage {
		t.Errorf("completion tcsh: exit %d", code)
	}

	// What each path must offer: its subcommands, its argument's values,
	// its flags.
	want := map[string][]string{}
	var walk func(c *cmdSpec, path []string)
	walk = func(c *cmdSpec, path []string) {
		key := strings.Join(path, " ")
		want[key] = append(c.subNames(), c.argWords...)
		for _, s := range c.subs {
			walk(s, append(slices.Clone(path), s.name))
		}
	}
	walk(root, nil)
	for _, c := range cmds {
		key := strings.Join(c.path, " ")
		for _, f := range c.flags {
			want[key] = append(want[key], "--"+f)
		}
	}

	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash to run the completion script")
	}
	// One bash process asks the completion function at every path, with a
	// flag and its value typed first (they must be skipped), and prints
	// "path<TAB>offered words".
	var probe strings.Builder
	probe.WriteString(bashScript)
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		words := append([]string{"haia-trace-mcp"}, strings.Fields(k)...)
		if k != "" {
			words = append(words[:2], append([]string{"--dir", "x"}, words[2:]...)...)
		}
		words = append(words, "")
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = fmt.Sprintf("%q", w)
		}
		fmt.Fprintf(&probe, "COMP_WORDS=(%s); COMP_CWORD=%d; _haia_trace_mcp; printf '%%s\\t%%s\\n' %q \"${COMPREPLY[*]}\"\n",
			strings.Join(quoted, " "), len(words)-1, k)
	}
	cmd := exec.Command(bash, "--norc", "--noprofile")
	cmd.Stdin = strings.NewReader(probe.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash on the completion script: %v\n%s", err, out)
	}
	offered := map[string][]string{}
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		k, words, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("bash printed %q", line)
		}
		offered[k] = strings.Fields(words)
	}
	for _, k := range keys {
		got, ok := offered[k]
		if !ok {
			t.Errorf("bash: nothing for %q", k)
			continue
		}
		for _, w := range append(want[k], "--help") {
			if !slices.Contains(got, w) {
				t.Errorf("bash completion after %q does not offer %s (offers %v)", k, w, got)
			}
		}
		for _, w := range got {
			if !slices.Contains(want[k], w) && w != "--help" && w != "--version" {
				t.Errorf("bash completion after %q offers %s, which it does not take", k, w)
			}
		}
		// fish offers the same words at the same path.
		for _, w := range want[k] {
			line := fmt.Sprintf("-n \"test (__haia_trace_mcp_path) = '%s'\" -a %s\n", k, w)
			if name, isFlag := strings.CutPrefix(w, "--"); isFlag {
				line = fmt.Sprintf("-n \"test (__haia_trace_mcp_path) = '%s'\" -l %s\n", k, name)
			}
			if !strings.Contains(fish, line) {
				t.Errorf("fish completion does not offer %s after %q", w, k)
			}
		}
	}
	// A flag value that happens to be a command's name does not move the
	// path: after "review --dir chain", review's subcommands are offered.
	cmd = exec.Command(bash, "--norc", "--noprofile")
	cmd.Stdin = strings.NewReader(bashScript + `COMP_WORDS=(haia-trace-mcp review list --dir review ""); COMP_CWORD=5; _haia_trace_mcp; echo "${COMPREPLY[*]}"` + "\n")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "--all") {
		t.Errorf("after review list --dir review: %v %q", err, out)
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

// docs/cli.md lists every command of the table, and no command the table
// does not have.
func TestCLIPageListsEveryCommand(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `haia-trace-mcp ([a-z -]+)` \\|").FindAllStringSubmatch(string(data), -1) {
		listed[m[1]] = true
	}
	root := commandTable()
	for _, p := range leafPaths(root, nil) {
		name := strings.Join(p, " ")
		if !listed[name] {
			t.Errorf("docs/cli.md does not list %s", name)
		}
		delete(listed, name)
	}
	for name := range listed {
		t.Errorf("docs/cli.md lists %s, which is no command", name)
	}
}

// What a command's error carries from its arguments (a path, a word) is
// printed with terminal controls escaped, whether it is a usage error or a
// failure, so a hostile file name cannot clear or rewrite the terminal.
func TestCLIErrorsEscapeTerminalControls(t *testing.T) {
	hostile := "a\x1b[2Jb\u202e"
	dir := t.TempDir()
	for _, args := range [][]string{
		{"build", filepath.Join(dir, hostile)},                   // a failure naming the file
		{"review", hostile},                                      // an unknown subcommand
		{"healthcheck", "--url", "http://" + hostile + ":1/x"},   // a usage error from the run function
		{"policy", "check", filepath.Join(dir, hostile+".json")}, // a failure naming the file
	} {
		_, errOut, code := runIn(args...)
		// %q already escapes ("\x1b"); what is not quoted is escaped by
		// termsafe ("\u001b").
		if code == 0 || strings.ContainsAny(errOut, "\x1b\u202e") || !(strings.Contains(errOut, `\u001b[2Jb`) || strings.Contains(errOut, `x1b[2Jb`)) {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// A flag name means one thing: every command that takes it shows the same
// help text, declared once in flags.go. The few names that mean another
// thing on some command are listed here with those commands; a new
// difference fails until it is shared or listed.
func TestSharedFlagsHaveOneHelpText(t *testing.T) {
	// name → the commands whose flag of that name is their own.
	own := map[string][]string{
		"dir":                     {"store import", "store export"},
		"store":                   {"verify"},
		"keyring":                 {"verify", "dossier verify"},
		"reviewers":               {"verify", "dossier verify"},
		"out":                     {"dossier export"},
		"templates-dir":           {"build"},
		"key-file":                {"reviewer init", "signer", "reviewer passkey add", "audit", "policy simulate", "dossier export"},
		"params-key-file":         {"reviewer passkey add", "audit", "policy simulate"},
		"note":                    {"mandate grant"},
		"payer-key":               {"signer"},
		"payer-key-password-file": {"signer"},
		"guard-config":            {"signer", "policy simulate"},
		"tenant":                  {"", "proxy", "chain checkpoint", "review list", "review show", "review approve", "review reject", "review archive", "verify", "reviewer init", "reviewer passkey add", "ingest-key create", "mandate grant", "mandate list", "mandate show", "mandate revoke", "mandate sign", "mandate import", "policy simulate"},
		"console-url":             {"review list", "review show", "reviewer passkey add"},
		"id":                      {"reviewer init", "reviewer passkey add", "reviewer passkey remove"},
		"all":                     {"chain export"},
	}
	help := map[string]map[string]string{} // name → usage → first command
	for _, c := range tableCommands(t) {
		name := strings.Join(c.path, " ")
		fs := flag.NewFlagSet("probe", flag.ContinueOnError)
		c.spec.define(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if slices.Contains(own[f.Name], name) {
				return
			}
			if help[f.Name] == nil {
				help[f.Name] = map[string]string{}
			}
			if _, ok := help[f.Name][f.Usage]; !ok {
				help[f.Name][f.Usage] = name
			}
		})
	}
	for name, texts := range help {
		if len(texts) > 1 {
			var where []string
			for usage, cmd := range texts {
				where = append(where, fmt.Sprintf("%q (%s)", usage, cmd))
			}
			slices.Sort(where)
			t.Errorf("--%s has %d help texts: %s", name, len(texts), strings.Join(where, "; "))
		}
	}
	for _, name := range []string{"dir", "store", "reviewers", "guard-config", "json"} {
		if len(help[name]) != 1 {
			t.Errorf("--%s: %d help texts", name, len(help[name]))
		}
	}
}

// The bash script completes the binary as the README runs it: in a
// directory holding the real binary, `source <(./haia-trace-mcp completion
// bash)` registers a compspec for ./haia-trace-mcp as for haia-trace-mcp
// (complete -p names both), and the function that compspec names, asked
// with COMP_WORDS as bash fills them for ./haia-trace-mcp, offers review's
// subcommands.
func TestCompletionRegistersForDotSlash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash to run the completion script")
	}
	dir := t.TempDir()
	data, err := os.ReadFile(binPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "haia-trace-mcp"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"./haia-trace-mcp", "haia-trace-mcp"} {
		t.Run(name, func(t *testing.T) {
			script := `source <(./haia-trace-mcp completion bash) || exit 9
spec=$(complete -p ` + name + `) || exit 8
echo "$spec"
fn=$(sed -n 's/.* -F \([^ ]*\) .*/\1/p' <<<"$spec")
COMP_WORDS=(` + name + ` review a); COMP_CWORD=2; COMP_LINE="` + name + ` review a"; COMP_POINT=${#COMP_LINE}
"$fn" ` + name + ` a review
echo "offered: ${COMPREPLY[*]}"
`
			cmd := exec.Command(bash, "--norc", "--noprofile", "-c", script)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("bash: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "complete -o default -F _haia_trace_mcp") {
				t.Errorf("complete -p %s: %q", name, out)
			}
			if !strings.Contains(string(out), "offered: approve archive\n") {
				t.Errorf("completing %q review a: %q, want approve and archive", name, out)
			}
		})
	}
}

// Every flag of every command may be typed before the command's name: the
// answer is the one it gets typed after it (the command's help, or the
// same refusal of a bad value), never "unknown command". A flag name is a
// boolean everywhere or nowhere, so where the command starts is never in
// doubt.
func TestSharedFlagsEitherSideOfTheCommand(t *testing.T) {
	kinds := map[string]map[bool][]string{}
	for _, c := range tableCommands(t) {
		if len(c.path) == 0 {
			continue
		}
		fs := flag.NewFlagSet("probe", flag.ContinueOnError)
		c.spec.define(fs)
		fs.VisitAll(func(f *flag.Flag) {
			b, ok := f.Value.(interface{ IsBoolFlag() bool })
			isBool := ok && b.IsBoolFlag()
			if kinds[f.Name] == nil {
				kinds[f.Name] = map[bool][]string{}
			}
			kinds[f.Name][isBool] = append(kinds[f.Name][isBool], strings.Join(c.path, " "))
			typed := []string{"--" + f.Name}
			if !isBool {
				typed = append(typed, f.DefValue)
			}
			after := append(append(slices.Clone(c.path), typed...), "--help")
			before := append(append(slices.Clone(typed), c.path...), "--help")
			outA, errA, codeA := runIn(after...)
			outB, errB, codeB := runIn(before...)
			if codeA != codeB || outA != outB || errA != errB || strings.Contains(errB, "unknown command") {
				t.Errorf("%q: exit %d %q %q; typed after the command: exit %d %q %q", before, codeB, clipText(outB), errB, codeA, clipText(outA), errA)
			}
		})
	}
	for name, k := range kinds {
		if len(k) > 1 {
			t.Errorf("--%s is a boolean on %v and takes a value on %v", name, k[true], k[false])
		}
	}
	// A flag no command has ends the leading flags; the command names it.
	if _, errOut, code := runIn("--no-such-flag", "status"); code != exitUsage || !strings.Contains(errOut, "no-such-flag") {
		t.Errorf("an unknown flag before a command: exit %d %q", code, errOut)
	}
	// A word after the flags that names no command is suggested one.
	if _, errOut, code := runIn("--dir", t.TempDir(), "statsu"); code != exitUsage || !strings.Contains(errOut, `did you mean "status"?`) {
		t.Errorf("a mistyped command after a flag: exit %d %q", code, errOut)
	}
}
