package main

import (
	"flag"
	"fmt"
	"io"
	"runtime/debug"
)

// runVersion prints the module version and the VCS revision recorded in the
// build info, so an operator can tell exactly which build is running.
func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "version: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	fmt.Fprintln(stdout, versionString())
	return exitOK
}

func versionString() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "haia-trace-mcp (no build info)"
	}
	version := info.Main.Version
	if version == "" {
		version = "(devel)"
	}
	revision, modified, goVersion := "unknown", "", info.GoVersion
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	return fmt.Sprintf("haia-trace-mcp %s revision %s%s %s", version, revision, modified, goVersion)
}
