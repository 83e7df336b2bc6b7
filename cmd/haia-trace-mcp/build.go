package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// runBuild assembles one run file against a template and prints the
// reference's `build --json` output.
func runBuild(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("build", flag.ContinueOnError)
	fl.SetOutput(stderr)
	tmpl := fl.String("template", "x402-buyer", "template `NAME` (bundled or in --templates-dir) or PATH to a template file")
	dir := fl.String("templates-dir", "", "operator's templates `DIR`, searched before the bundled templates")
	fl.Usage = func() {
		fmt.Fprintf(stderr, "usage: haia-trace-mcp build RUN_FILE [--template NAME|PATH] [--templates-dir DIR]\n")
		fl.PrintDefaults()
	}
	// Accept the run file before or after the flags.
	var file string
	rest := args
	for {
		if err := fl.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		if fl.NArg() == 0 {
			break
		}
		if file != "" {
			fmt.Fprintf(stderr, "haia-trace-mcp build: one run file expected, got %q and %q\n", file, fl.Arg(0))
			return exitUsage
		}
		file, rest = fl.Arg(0), fl.Args()[1:]
	}
	if file == "" {
		fl.Usage()
		return exitUsage
	}
	if err := ctx.Err(); err != nil {
		return exitFail
	}

	var (
		t   *receipt.Template
		err error
	)
	if receipt.IsSlug(*tmpl) {
		r := receipt.Resolver{}
		if *dir != "" {
			st, serr := os.Stat(*dir)
			if serr != nil || !st.IsDir() {
				fmt.Fprintf(stderr, "haia-trace-mcp build: --templates-dir %s is not a readable directory\n", *dir)
				return exitFail
			}
			r = receipt.Resolver{Dir: os.DirFS(*dir), DirName: *dir}
		}
		t, err = r.Resolve(*tmpl)
	} else {
		t, err = receipt.LoadTemplateFile(*tmpl)
	}
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp build: %v\n", err)
		return exitFail
	}
	_, events, err := receipt.ReadRunFile(file, receipt.DefaultLimits())
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp build: %s: %v\n", file, err)
		return exitFail
	}
	// The events are not needed apart from their receipts: assemble them in
	// place, folding each operation as it is printed.
	out := bufio.NewWriterSize(stdout, 1<<20)
	err = receipt.WriteBuild(out, events, t)
	if err == nil {
		err = out.Flush()
	}
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp build: writing output: %v\n", err)
		return exitFail
	}
	return exitOK
}
