package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// openCLIRoot opens --dir for a command-line tool and checks that it is a
// Trace root: it holds events/ or guard/ (or both). A wrong folder must not
// look like an empty queue. On failure it prints why and returns the exit
// code (2 for a folder that is no Trace root).
func openCLIRoot(command, dir string, stderr io.Writer) (*confined.Dir, int) {
	root, err := confined.OpenRoot(dir)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp %s: --dir %s cannot be opened: %s\n", command, termsafe.String(dir), termsafe.String(err.Error()))
		return nil, exitUsage
	}
	found := false
	for _, name := range []string{"events", reviewlog.DirName} {
		d, err := root.OpenDir(name)
		if err == nil {
			d.Close()
			found = true
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			root.Close()
			fmt.Fprintf(stderr, "haia-trace-mcp %s: %s/%s: %s\n", command, termsafe.String(root.Path()), name, termsafe.String(err.Error()))
			return nil, exitFail
		}
	}
	if !found {
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %s is not a Trace root: it holds neither events/ nor guard/ "+
			"(a Trace root holds events/<run_id>.ndjson from the recorders and guard/ with the review log); pass --dir with the Trace root\n",
			command, termsafe.String(root.Path()))
		root.Close()
		return nil, exitUsage
	}
	return root, exitOK
}
