package main

import (
	"context"
	"flag"
	"fmt"
	"runtime/debug"
	"strings"
)

// defineVersion prints one line naming the version, the VCS revision and
// the Go toolchain, so an operator can tell exactly which build is running.
func defineVersion(*flag.FlagSet) runFunc {
	return func(_ context.Context, env *cmdEnv, _ []string) error {
		fmt.Fprintln(env.stdout, versionSentence(readBuild()))
		return nil
	}
}

// buildFacts is what the build info says about this binary.
type buildFacts struct {
	module    string // module version as the go command recorded it, e.g. v1.2.3 or (devel)
	revision  string // VCS revision, "" when not stamped (-buildvcs=false)
	modified  bool   // the working tree had uncommitted changes
	goVersion string
}

func readBuild() buildFacts {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return buildFacts{}
	}
	b := buildFacts{module: info.Main.Version, goVersion: info.GoVersion}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.modified":
			b.modified = s.Value == "true"
		}
	}
	return b
}

// versionString is the version reported as serverInfo.version: a short,
// machine-readable token, never a sentence. It is the module version
// without its leading "v" (1.2.3, or a pseudo-version) when the binary was
// built as a versioned module (go install ...@v1.2.3); otherwise
// dev+<12-hex revision>, with ".dirty" appended for a modified tree, or
// plain "dev" when no revision was stamped. The go command's own "+dirty"
// on a module version stays as it is.
func versionString() string { return shortVersion(readBuild()) }

func shortVersion(b buildFacts) string {
	if v := b.module; v != "" && v != "(devel)" {
		return strings.TrimPrefix(v, "v")
	}
	if b.revision == "" {
		return "dev"
	}
	rev := b.revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	v := "dev+" + rev
	if b.modified {
		v += ".dirty"
	}
	return v
}

// versionSentence is what `version` and `--version` print.
func versionSentence(b buildFacts) string {
	rev := b.revision
	if rev == "" {
		rev = "not recorded"
	} else if b.modified {
		rev += " (modified)"
	}
	goVersion := b.goVersion
	if goVersion == "" {
		goVersion = "unknown"
	}
	return fmt.Sprintf("haia-trace-mcp version %s (revision %s, built with %s)", shortVersion(b), rev, goVersion)
}
