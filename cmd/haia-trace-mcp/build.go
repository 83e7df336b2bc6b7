package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

const buildDetails = `Assembles one run file against a template and prints {"receipts": [...],
"unassigned": [...]} exactly as the reference assembler's JSON build output.
exit codes: 0 printed, 1 the run or template cannot be read, 2 usage
`

// defineBuild assembles one run file against a template and prints the
// reference's `build --json` output.
func defineBuild(fs *flag.FlagSet) runFunc {
	tmpl := fs.String("template", guard.DefaultTemplate, "template `NAME` (bundled or in --templates-dir) or PATH to a template file")
	dir := fs.String("templates-dir", "", "the operator's templates `DIR`, searched before the bundled templates (default: none)")
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		return runBuild(ctx, env.stdout, pos[0], *tmpl, *dir)
	}
}

func runBuild(ctx context.Context, stdout io.Writer, file, tmpl, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var (
		t   *receipt.Template
		err error
	)
	if receipt.IsSlug(tmpl) {
		var r receipt.Resolver
		if r, err = templatesDirResolver(dir); err != nil {
			return err
		}
		t, err = r.Resolve(tmpl)
	} else {
		t, err = receipt.LoadTemplateFile(tmpl)
	}
	if err != nil {
		return err
	}
	defer quietCollector()()
	// The events share the run file mapped into memory: Guard turns a read
	// past the end of a file cut short under the build into an error.
	err = receipt.Guard(func() error {
		_, events, release, err := receipt.ReadRunFileHeld(file, receipt.DefaultLimits())
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		defer release()
		// The events are not needed apart from their receipts: assemble them
		// in place, folding each operation as it is printed. WriteBuild hands
		// over its output a batch (a few hundred KiB) at a time: a small
		// buffer gathers the few short pieces around them, and a batch goes
		// to stdout from where it was printed instead of being copied
		// through a buffer of its size.
		out := bufio.NewWriterSize(stdout, 64<<10)
		err = receipt.WriteBuild(out, events, t)
		if err == nil {
			err = out.Flush()
		}
		switch {
		case errors.Is(err, receipt.ErrRunChanged):
			return fmt.Errorf("%s: %w", file, err)
		case err != nil:
			return fmt.Errorf("writing output: %w", err)
		}
		return nil
	})
	if errors.Is(err, receipt.ErrRunCut) {
		return fmt.Errorf("%s: %w", file, err)
	}
	return err
}

// buildMemoryLimit is the heap the build command grows to before the
// collector runs: a run is at most 256 MiB (receipt.DefaultLimits) and
// its build holds about half its size on the heap beside its text.
const buildMemoryLimit = 1 << 30

// quietCollector turns the garbage collector off below buildMemoryLimit,
// unless the operator set GOGC or GOMEMLIMIT, and returns what puts the
// settings back (the command also runs inside tests). The build allocates
// about half its run's size once and ends; collecting on the way frees
// nothing it could reuse, and marking reads memory not yet written, so
// each such page is faulted twice (a read, then a copy-on-write that
// flushes every core's TLB).
func quietCollector() (restore func()) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	limit := debug.SetMemoryLimit(buildMemoryLimit)
	percent := debug.SetGCPercent(-1)
	return func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
}

// templatesDirResolver resolves template names in the operator's templates
// directory dir, then among the bundled ones; "" is the bundled ones only.
func templatesDirResolver(dir string) (receipt.Resolver, error) {
	if dir == "" {
		return receipt.Resolver{}, nil
	}
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return receipt.Resolver{}, fmt.Errorf("--templates-dir %s is not a readable directory", dir)
	}
	return receipt.Resolver{Dir: os.DirFS(dir), DirName: dir}, nil
}
