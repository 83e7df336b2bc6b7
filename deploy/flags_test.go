package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
)

// invocation is one command line the deploy files give the binary.
type invocation struct {
	where string
	argv  []string // after the program name
}

// binaryName is how the deploy files name the program.
const binaryName = "/haia-trace-mcp"

// collectInvocations gathers every command line that runs haia-trace-mcp:
// the image's ENTRYPOINT+CMD and HEALTHCHECK, each compose service and
// healthcheck, each Kubernetes container using the project's image, and the
// package of the MCP registry manifest (server.json).
func collectInvocations(t *testing.T) []invocation {
	t.Helper()
	var out []invocation
	add := func(where string, full []string) {
		if len(full) == 0 || full[0] != binaryName {
			return
		}
		out = append(out, invocation{where: where, argv: full[1:]})
	}
	var ep, cmd []string
	for _, in := range finalStage(loadDockerfile(t)) {
		switch in.cmd {
		case "ENTRYPOINT":
			ep, _ = execForm(in.rest)
		case "CMD":
			cmd, _ = execForm(in.rest)
		case "HEALTHCHECK":
			if _, after, ok := strings.Cut(in.rest, "CMD "); ok {
				argv, _ := execForm(strings.TrimSpace(after))
				add("Dockerfile HEALTHCHECK", argv)
			}
		}
	}
	add("Dockerfile ENTRYPOINT+CMD", append(append([]string{}, ep...), cmd...))

	// An entrypoint that is set replaces the image's and drops its CMD;
	// a command that is set replaces the CMD.
	resolve := func(entry, command []string, entrySet, commandSet bool) []string {
		e, c := ep, cmd
		if entrySet {
			e, c = entry, nil
		}
		if commandSet {
			c = command
		}
		return append(append([]string{}, e...), c...)
	}
	// The MCP registry manifest runs the binary with its package arguments.
	m := loadManifest(t)
	for _, pkg := range m.Packages {
		rt := argv(t, pkg.RuntimeArguments, nil)
		if ep := flagValue(rt, "--entrypoint"); ep != "" {
			add("server.json package "+pkg.Identifier, append([]string{ep}, argv(t, pkg.PackageArguments, nil)...))
		}
	}
	for _, v := range composeVariants() {
		for name, s := range loadComposeFile(t, v.file).Services {
			add(v.file+" service "+name, resolve(s.Entrypoint, s.Command, s.Entrypoint != nil, s.Command != nil))
			if hc := s.Healthcheck; hc != nil && len(hc.Test) > 1 && hc.Test[0] == "CMD" {
				add(v.file+" healthcheck of "+name, hc.Test[1:])
			}
		}
	}
	for _, o := range loadAllK8s(t) {
		dep, ok := o.obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		for _, c := range allContainers(&dep.Spec.Template.Spec) {
			if !strings.Contains(c.Image, "haia-trace-mcp") {
				continue
			}
			add(o.where+" container "+c.Name, resolve(c.Command, c.Args, c.Command != nil, c.Args != nil))
		}
	}
	return out
}

// buildBinary builds ./cmd/haia-trace-mcp, or says why it cannot.
func buildBinary(t *testing.T) (string, error) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(t.TempDir(), "haia-trace-mcp")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goTool, "build", "-o", bin, "./cmd/haia-trace-mcp")
	build.Dir = ".."
	// The environment's own settings (no CGO_ENABLED=0 here) so that the
	// build reuses the cache of `go test ./...`; flags do not depend on cgo.
	if out, err := build.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("go build did not finish within 5 minutes: %w", ctx.Err())
		}
		return "", errors.New(strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// TestFlagsExist runs the built binary with each flag the deploy files pass,
// followed by -h: the flag package stops at -h, so nothing is served, and
// an unknown flag is reported as "flag provided but not defined" first.
func TestFlagsExist(t *testing.T) {
	invs := collectInvocations(t)
	if len(invs) < 5 {
		t.Fatalf("found only %d command lines of the binary in the deploy files: %v", len(invs), invs)
	}
	bin, err := buildBinary(t)
	if err != nil {
		t.Skipf("flag check skipped: cannot build ./cmd/haia-trace-mcp: %v", err)
	}
	for _, inv := range invs {
		// The subcommand: the words before the first flag (`version`,
		// `store migrate`).
		args := inv.argv
		n := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "-") })
		if n < 0 {
			n = len(args)
		}
		sub, args := args[:n], args[n:]
		if len(args) == 0 && len(sub) == 1 {
			// A command without flags (trace-init's `version`): it must run.
			if out, code := runBinary(t, bin, sub); code != 0 {
				t.Errorf("%s: `%s` exits %d: %s", inv.where, strings.Join(sub, " "), code, out)
			}
			continue
		}
		if len(args) == 0 {
			// A nested one (`store migrate`) would act on its store: ask for
			// its help instead, which names an unknown (sub)command.
			if out, _ := runBinary(t, bin, append(slices.Clone(sub), "-h")); strings.Contains(out, "unknown command") || strings.Contains(out, "unknown subcommand") {
				t.Errorf("%s: the binary has no command `%s`: %s", inv.where, strings.Join(sub, " "), firstLine(out))
			}
			continue
		}
		for i := 0; i < len(args); i++ {
			a := args[i]
			if !strings.HasPrefix(a, "-") {
				t.Errorf("%s: argument %q is not a flag", inv.where, a)
				continue
			}
			probe := append(append([]string{}, sub...), a)
			if !strings.Contains(a, "=") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				probe = append(probe, args[i])
			}
			probe = append(probe, "-h")
			out, _ := runBinary(t, bin, probe)
			name := strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")
			switch {
			case strings.Contains(out, "flag provided but not defined: -"+name):
				t.Errorf("%s: the binary has no flag %s (ran %v)", inv.where, a, probe)
			case strings.Contains(out, "unknown command"):
				t.Errorf("%s: the binary has no subcommand %q", inv.where, sub[0])
			case strings.Contains(out, "invalid value") || strings.Contains(out, "invalid boolean"):
				t.Errorf("%s: %s: %s", inv.where, a, firstLine(out))
			}
		}
	}
}

func runBinary(t *testing.T, bin string, args []string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, bin, args...)
	c.Dir = t.TempDir()
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	c.Stdin = strings.NewReader("")
	err := c.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v did not stop within 30s; -h should end flag parsing", args)
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %v: %v", args, err)
	}
	return out.String(), code
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
