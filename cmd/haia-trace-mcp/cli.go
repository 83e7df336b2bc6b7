package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
)

// command is one CLI command's flag grammar, the same for every command:
// --help/-h prints the usage and every flag with its default on stdout and
// exits 0; a usage error is one line on stderr naming the problem and
// pointing at --help, and exits 2 (verify keeps 4, since 2 is its TAMPERED).
type command struct {
	name      string // "review approve"
	usage     string
	fs        *flag.FlagSet
	stdout    io.Writer
	stderr    io.Writer
	usageCode int
}

func newCommand(name, usage string, stdout, stderr io.Writer) *command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &command{name: name, usage: usage, fs: fs, stdout: stdout, stderr: stderr, usageCode: exitUsage}
}

// parse parses args, letting flags and positional arguments mix ("approve
// ID --note x"). ok is false when the command must stop with code: after
// --help (0) or a usage error.
func (c *command) parse(args []string) (pos []string, code int, ok bool) {
	for {
		err := c.fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			c.help(c.stdout)
			return nil, exitOK, false
		}
		if err != nil {
			return nil, c.failf("%v", err), false
		}
		args = c.fs.Args()
		if len(args) == 0 {
			return pos, exitOK, true
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), exitOK, true
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// help writes the usage text and the flags with their defaults.
func (c *command) help(w io.Writer) {
	fmt.Fprint(w, strings.TrimRight(c.usage, "\n")+"\n")
	var flags bytes.Buffer
	c.fs.SetOutput(&flags)
	c.fs.PrintDefaults()
	c.fs.SetOutput(io.Discard)
	if flags.Len() > 0 {
		fmt.Fprintf(w, "\nflags:\n%s", flags.String())
	}
}

// failf reports a usage error in one line and returns the usage exit code.
func (c *command) failf(format string, a ...any) int {
	name := strings.TrimSpace("haia-trace-mcp " + c.name)
	fmt.Fprintf(c.stderr, "%s: %s (see %s --help)\n", name, termsafe.String(fmt.Sprintf(format, a...)), name)
	return c.usageCode
}

// wantArgs checks the number of positional arguments.
func (c *command) wantArgs(pos []string, min, max int, what string) (int, bool) {
	if len(pos) < min || len(pos) > max {
		if len(pos) > max && max >= 0 {
			return c.failf("unexpected argument %q (want %s)", pos[max], what), false
		}
		return c.failf("want %s, got %d argument(s)", what, len(pos)), false
	}
	return exitOK, true
}

// isHelp says whether args asks for help before anything else.
func isHelp(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")
}
