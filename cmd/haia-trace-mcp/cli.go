package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
)

// A cmdSpec is one command of the CLI as data: the table in commands.go
// lists them all, and dispatch, --help, usage errors and the completion
// scripts are generated from it. A command either has subcommands (a
// group: review, chain, ...) or defines its flags and run function.
//
// Every command has one grammar: --help/-h prints the usage and every flag
// with its default on stdout and exits 0; a usage error is one line on
// stderr naming the command and the problem and pointing at --help, and
// exits usageCode (2, except verify's 4, since 2 is its TAMPERED).
type cmdSpec struct {
	name    string // the word on the command line: "approve"
	summary string // one line, for the parent's help and the top-level list
	// synopsis follows "haia-trace-mcp <path>" in the usage: positional
	// arguments and the flags worth showing; the flags are all listed
	// below it anyway.
	synopsis string
	// details is printed after the summary: what it does, exit codes. A
	// subcommand without its own prints its group's.
	details string
	args    argSpec
	// usageCode is the exit code of a usage error (0: exitUsage).
	usageCode int
	// dashTail: the words after "--" are not this command's (proxy's
	// upstream command); they reach run as cmdEnv.tail.
	dashTail bool
	// argWords are the values the completion scripts offer for the
	// positional argument (completion's shells).
	argWords []string
	// define declares the command's flags on fs and returns the run
	// function that reads them. nil for a group.
	define func(fs *flag.FlagSet) runFunc
	subs   []*cmdSpec
}

// runFunc runs a command with its flags parsed. Its error carries the exit
// code (see exitError, usageErrorf); nil is success, exit 0.
type runFunc func(ctx context.Context, env *cmdEnv, args []string) error

// cmdEnv is what a command runs with besides its flags.
type cmdEnv struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// fs is the command's parsed flag set (to tell which flags were set).
	fs *flag.FlagSet
	// tail is what followed "--" for a dashTail command.
	tail []string
}

// argSpec is how many positional arguments a command takes; the zero
// argSpec is none.
type argSpec struct {
	min, max int    // max < 0: any number
	what     string // "one review id", for the usage error
}

func oneArg(what string) argSpec { return argSpec{min: 1, max: 1, what: what} }

// exitError is a command's failure with its exit code. err is printed as
// "haia-trace-mcp <command>: <err>" on stderr; a nil err means the command
// has already said why.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitCode is the outcome of a command that has reported on stderr
// itself: nil for exitOK.
func exitCode(code int) error {
	if code == exitOK {
		return nil
	}
	return &exitError{code: code}
}

// usageError is a usage error: printed in one line naming the command and
// pointing at its --help, with the command's usage exit code.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// usageCodeOf is the exit code of a usage error of c.
func (c *cmdSpec) usageCodeOf() int {
	if c.usageCode != 0 {
		return c.usageCode
	}
	return exitUsage
}

// sub is c's subcommand named name, or nil.
func (c *cmdSpec) sub(name string) *cmdSpec {
	for _, s := range c.subs {
		if s.name == name {
			return s
		}
	}
	return nil
}

// subNames lists c's subcommands.
func (c *cmdSpec) subNames() []string {
	out := make([]string, len(c.subs))
	for i, s := range c.subs {
		out[i] = s.name
	}
	return out
}

// flagSet is c's flag set, with its run function bound to it (nil for a
// group).
func (c *cmdSpec) flagSet(path string) (*flag.FlagSet, runFunc) {
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if c.define == nil {
		return fs, nil
	}
	return fs, c.define(fs)
}

// dispatch runs args against the table: it walks down the subcommands,
// then parses the command's flags and runs it. It returns the exit code.
func dispatch(ctx context.Context, root *cmdSpec, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd, path := root, []string{}
	usageErr := func(c *cmdSpec, format string, a ...any) int {
		name := strings.TrimSpace("haia-trace-mcp " + strings.Join(path, " "))
		fmt.Fprintf(stderr, "%s: %s (see %s --help)\n", name, termsafe.String(fmt.Sprintf(format, a...)), name)
		return c.usageCodeOf()
	}
	// Flags typed before the command ("--dir .trace status") are the
	// command's, as if typed after it.
	hoisted, args := hoistFlags(root, args)
	for len(cmd.subs) > 0 && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		next := cmd.sub(args[0])
		if next == nil && cmd.define == nil && isHelp(args) {
			break // "review help": the group's help
		}
		if next == nil {
			what := "subcommand"
			if len(path) == 0 {
				what = "command"
			}
			if near := nearest(args[0], cmd.subNames()); near != "" {
				return usageErr(cmd, "unknown %s %q; did you mean %q?", what, args[0], near)
			}
			return usageErr(cmd, "unknown %s %q", what, args[0])
		}
		cmd, path, args = next, append(path, args[0]), args[1:]
	}
	args = append(hoisted, args...)
	name := strings.Join(path, " ")
	if cmd.define == nil {
		if len(args) > 0 && isHelp(args) {
			writeHelp(stdout, root, path)
			return exitOK
		}
		if len(args) == 0 {
			return usageErr(cmd, "name a subcommand: %s", orList(cmd.subNames()))
		}
		return usageErr(cmd, "unknown subcommand %q", args[0])
	}
	fs, runCmd := cmd.flagSet(name)
	var tail []string
	if cmd.dashTail {
		for i, a := range args {
			if a == "--" {
				args, tail = args[:i], args[i+1:]
				break
			}
		}
	}
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		writeHelp(stdout, root, path)
		return exitOK
	}
	if err != nil {
		return usageErr(cmd, "%v", err)
	}
	a := cmd.args
	if a.what == "" {
		a.what = "no arguments"
	}
	if len(pos) < a.min || (a.max >= 0 && len(pos) > a.max) {
		if a.max >= 0 && len(pos) > a.max {
			if cmd.dashTail {
				return usageErr(cmd, "unexpected argument %q (%s goes after --)", pos[a.max], a.what)
			}
			return usageErr(cmd, "unexpected argument %q (want %s)", pos[a.max], a.what)
		}
		return usageErr(cmd, "want %s, got %d argument(s)", a.what, len(pos))
	}
	env := &cmdEnv{stdin: stdin, stdout: stdout, stderr: stderr, fs: fs, tail: tail}
	return exitCodeOf(runCmd(ctx, env, pos), func(msg string) int { return usageErr(cmd, "%s", msg) }, name, stderr)
}

// hoistFlags splits off the flags typed before a command's name, so that
// "--dir .trace status" runs status with --dir: it returns them and the
// words from the command's name on. Without a command after them (serving
// MCP, or a word that names none) it returns args as they are. Whether a
// flag takes a value is read from the flag sets of the table: a flag no
// command declares ends the leading flags, and the command reports it.
func hoistFlags(root *cmdSpec, args []string) (hoisted, rest []string) {
	bools := flagKinds(root)
	i := 0
	for i < len(args) {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		name, _, withValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		isBool, known := bools[name]
		if name == "h" || name == "help" {
			isBool, known = true, true
		}
		if !known {
			return nil, args
		}
		if withValue || isBool {
			i++
		} else {
			i += 2
		}
	}
	if i == 0 || i >= len(args) || root.sub(args[i]) == nil {
		return nil, args
	}
	return args[:i:i], args[i:]
}

// flagKinds maps every flag some command of the table declares to whether
// it is a boolean (a flag that takes no value).
func flagKinds(root *cmdSpec) map[string]bool {
	out := map[string]bool{}
	var walk func(c *cmdSpec)
	walk = func(c *cmdSpec) {
		if c.define != nil {
			fs, _ := c.flagSet(c.name)
			fs.VisitAll(func(f *flag.Flag) {
				b, ok := f.Value.(interface{ IsBoolFlag() bool })
				out[f.Name] = out[f.Name] || (ok && b.IsBoolFlag())
			})
		}
		for _, s := range c.subs {
			walk(s)
		}
	}
	walk(root)
	return out
}

// exitCodeOf turns a run function's error into its exit code, reporting it
// on stderr unless the command already did.
func exitCodeOf(err error, usage func(string) int, name string, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return usage(ue.msg)
	}
	code := exitFail
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		if ee.err == nil {
			return code
		}
	}
	fmt.Fprintf(stderr, "%s: %s\n", strings.TrimSpace("haia-trace-mcp "+name), termsafe.String(err.Error()))
	return code
}

// parseInterleaved parses args, letting flags and positional arguments mix
// ("approve ID --note x"); "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// find is the command at path, or nil.
func (c *cmdSpec) find(path []string) *cmdSpec {
	for _, p := range path {
		if c = c.sub(p); c == nil {
			return nil
		}
	}
	return c
}

// writeHelp writes the help of the command at path: its usage lines, its
// summary and details, and its flags with their defaults (the root's is the
// top-level help: every command, then the server's flags).
func writeHelp(w io.Writer, root *cmdSpec, path []string) {
	cmd := root.find(path)
	name := strings.TrimSpace("haia-trace-mcp " + strings.Join(path, " "))
	var b strings.Builder
	b.WriteString("usage:\n")
	switch {
	case len(path) == 0:
		fmt.Fprintf(&b, "  %s %s    %s\n  %s COMMAND [SUBCOMMAND] [ARGS] [flags]\n\ncommands:\n", name, cmd.synopsis, cmd.summary, name)
		leaves := leafPaths(cmd, nil)
		width := 0
		for _, l := range leaves {
			width = max(width, len(strings.Join(l, " ")))
		}
		for _, l := range leaves {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, strings.Join(l, " "), cmd.find(l).summary)
		}
		b.WriteString("\nEvery command takes --help for its arguments, flags and exit codes. A command's flags go\nbefore or after its name: haia-trace-mcp --dir .trace status is haia-trace-mcp status --dir .trace.\n")
		if cmd.details != "" {
			b.WriteString("\n" + strings.TrimRight(cmd.details, "\n") + "\n")
		}
	case cmd.define == nil:
		for _, l := range leafPaths(cmd, path) {
			fmt.Fprintf(&b, "  haia-trace-mcp %s\n", strings.TrimSpace(strings.Join(l, " ")+" "+root.find(l).synopsis))
		}
		b.WriteString("\nsubcommands:\n")
		width := 0
		for _, sub := range cmd.subs {
			width = max(width, len(sub.name))
		}
		for _, sub := range cmd.subs {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, sub.name, sub.summary)
		}
		if cmd.details != "" {
			b.WriteString("\n" + strings.TrimRight(cmd.details, "\n") + "\n")
		}
		fmt.Fprintf(&b, "\nEach subcommand takes --help for its flags (%s SUBCOMMAND --help).\n", name)
	default:
		fmt.Fprintf(&b, "  %s\n\n%s\n", strings.TrimSpace(name+" "+cmd.synopsis), cmd.summary)
		if details := detailsOf(root, path); details != "" {
			b.WriteString("\n" + strings.TrimRight(details, "\n") + "\n")
		}
	}
	if cmd.define != nil {
		fs, _ := cmd.flagSet(strings.Join(path, " "))
		var flags bytes.Buffer
		fs.SetOutput(&flags)
		fs.PrintDefaults()
		if flags.Len() > 0 {
			fmt.Fprintf(&b, "\nflags:\n%s", flags.String())
		}
	}
	fmt.Fprint(w, b.String())
}

// detailsOf is the details of the command at path, else its nearest
// group's.
func detailsOf(root *cmdSpec, path []string) string {
	for n := len(path); n > 0; n-- {
		if d := root.find(path[:n]).details; d != "" {
			return d
		}
	}
	return ""
}

// leafPaths lists the paths of the commands under c (at path) that run,
// in table order.
func leafPaths(c *cmdSpec, path []string) [][]string {
	var out [][]string
	for _, s := range c.subs {
		p := append(append([]string{}, path...), s.name)
		if s.define != nil {
			out = append(out, p)
		}
		out = append(out, leafPaths(s, p)...)
	}
	return out
}

// orList joins words as "a, b or c".
func orList(words []string) string {
	if len(words) <= 1 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// nearest is the word of known nearest to a mistyped one (a prefix of at
// least two letters, or at most two edits away), or "".
func nearest(typed string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if len(typed) >= 2 && strings.HasPrefix(k, typed) {
			return k
		}
		if d := editDistance(typed, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// isHelp says whether args asks for help before anything else.
func isHelp(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")
}
