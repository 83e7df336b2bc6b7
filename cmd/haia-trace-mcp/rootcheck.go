package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
)

// openCLIRoot opens --dir for a command-line tool and checks that it is a
// Trace root: it holds events/ or guard/ (or both). A wrong folder must not
// look like an empty queue. On failure it prints why and returns the exit
// code (2 for a folder that is no Trace root).
func openCLIRoot(command, dir string, stderr io.Writer) (*confined.Dir, int) {
	root, err := confined.OpenRoot(dir)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %s\n", command, rootOpenProblem(dir, err))
		return nil, exitUsage
	}
	r, err := app.RootOf(root)
	if err == nil {
		err = r.Check()
		r.Close()
	}
	var ce *app.CheckError
	switch {
	case err == nil:
	case errors.Is(err, app.ErrNotTraceRoot):
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %s is not a Trace root: it holds neither events/ nor guard/ "+
			"(a Trace root holds events/<run_id>.ndjson from the recorders and guard/ with the review log); pass --dir with the Trace root\n",
			command, termsafe.String(root.Path()))
		root.Close()
		return nil, exitUsage
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %s/%s: %s\n", command, termsafe.String(root.Path()), ce.Name, termsafe.String(ce.Err.Error()))
		root.Close()
		return nil, exitFail
	default:
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %s\n", command, termsafe.String(err.Error()))
		root.Close()
		return nil, exitFail
	}
	return root, exitOK
}

// rootOpenProblem says why the Trace root dir could not be opened, for a
// person: a missing one names the two ways on (init, --dir) rather than a
// system call; any other failure names the directory and the cause alone.
// What it carries from dir and err is escaped for a terminal.
func rootOpenProblem(dir string, err error) string {
	return termsafe.String(rootOpenProblemRaw(dir, err))
}

// rootOpenProblemRaw is rootOpenProblem unescaped, for a message escaped
// whole where it is printed.
func rootOpenProblemRaw(dir string, err error) string {
	where := dir
	if abs, aerr := filepath.Abs(dir); aerr == nil && abs != dir {
		where += " (" + abs + ")"
	}
	if errors.Is(err, fs.ErrNotExist) {
		return "no Trace root at " + where + ": run `haia-trace-mcp init " + shellWordRaw(dir) + "` to create one, " +
			"or pass --dir with the Trace root the recorders write into"
	}
	cause := err
	var pe *fs.PathError
	if errors.As(err, &pe) {
		cause = pe.Err
	}
	return "the Trace root " + where + " cannot be opened: " + cause.Error()
}

// shellWordRaw quotes s for a POSIX shell when it needs quoting (the
// message it goes into is escaped where it is printed).
func shellWordRaw(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/+:@%=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
