package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

const buildUsage = `usage:
  haia-trace-mcp build RUN_FILE [--template NAME|PATH] [--templates-dir DIR]

Assembles one run file against a template and prints {"receipts": [...],
"unassigned": [...]} exactly as the reference assembler's build --json does.
exit codes: 0 printed, 1 the run or template cannot be read, 2 usage
`

// runBuild assembles one run file against a template and prints the
// reference's `build --json` output.
func runBuild(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("build", buildUsage, stdout, stderr)
	tmpl := c.fs.String("template", "x402-buyer", "template `NAME` (bundled or in --templates-dir) or PATH to a template file")
	dir := c.fs.String("templates-dir", "", "operator's templates `DIR`, searched before the bundled templates")
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 1, 1, "one RUN_FILE"); !ok {
		return code
	}
	file := pos[0]
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
