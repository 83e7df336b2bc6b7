package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The container test cannot pull base images, so it builds the image FROM
// scratch out of the Dockerfile's own final stage: the same instructions,
// with the build stage's outputs (/out/...) prepared by the test instead.
// This file holds that translation and its offline checks.

// buildStage returns the instructions of the stage named name.
func buildStage(ins []instruction, name string) []instruction {
	var out []instruction
	in := false
	for _, i := range ins {
		if i.cmd == "FROM" {
			f := strings.Fields(i.rest)
			in = len(f) >= 3 && strings.EqualFold(f[len(f)-2], "AS") && f[len(f)-1] == name
			continue
		}
		if in {
			out = append(out, i)
		}
	}
	return out
}

// layoutStep is one directory the build stage prepares under /out.
type layoutStep struct {
	path string // under /out
	mode os.FileMode
}

// buildLayout reads the build stage's `RUN mkdir -p ... && chmod MODE ...`
// step: the directories the final stage copies in, with their modes.
func buildLayout(build []instruction) ([]layoutStep, error) {
	var steps []layoutStep
	found := false
	for _, in := range build {
		if in.cmd != "RUN" || !strings.Contains(in.rest, "mkdir -p") {
			continue
		}
		found = true
		for _, part := range strings.Split(in.rest, "&&") {
			f := strings.Fields(part)
			switch {
			case len(f) >= 3 && f[0] == "mkdir" && f[1] == "-p":
				for _, p := range f[2:] {
					steps = append(steps, layoutStep{path: p, mode: 0o755})
				}
			case len(f) >= 3 && f[0] == "chmod":
				m, err := strconv.ParseUint(f[1], 8, 32)
				if err != nil {
					return nil, fmt.Errorf("line %d: chmod %q: want an octal mode", in.line, f[1])
				}
				for _, p := range f[2:] {
					i := slices.IndexFunc(steps, func(s layoutStep) bool { return s.path == p })
					if i < 0 {
						return nil, fmt.Errorf("line %d: chmod of %s, which no mkdir made", in.line, p)
					}
					steps[i].mode = os.FileMode(m)
				}
			default:
				return nil, fmt.Errorf("line %d: %q in the layout step; the container test only knows mkdir -p and chmod", in.line, strings.TrimSpace(part))
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("the build stage has no `RUN mkdir -p` layout step")
	}
	for _, s := range steps {
		if !strings.HasPrefix(s.path, "/out/") {
			return nil, fmt.Errorf("layout path %s is not under /out/", s.path)
		}
	}
	return steps, nil
}

// scratchContainerfile turns the final stage into a Containerfile whose
// base is scratch and whose COPY --from=build /out/X reads out/X from the
// build context. Every other instruction is kept as written.
func scratchContainerfile(final []instruction) (string, error) {
	var b strings.Builder
	for _, in := range final {
		switch in.cmd {
		case "FROM":
			b.WriteString("FROM scratch\n")
		case "COPY":
			f := strings.Fields(in.rest)
			var opts, args []string
			fromBuild := false
			for _, w := range f {
				switch {
				case w == "--from=build":
					fromBuild = true
				case strings.HasPrefix(w, "--"):
					opts = append(opts, w)
				default:
					args = append(args, w)
				}
			}
			if !fromBuild || len(args) != 2 || !strings.HasPrefix(args[0], "/out/") {
				return "", fmt.Errorf("line %d: COPY %s: the container test only translates COPY --from=build /out/SRC DEST", in.line, in.rest)
			}
			src := strings.TrimPrefix(args[0], "/")
			fmt.Fprintf(&b, "COPY %s\n", strings.Join(append(opts, src, args[1]), " "))
		case "RUN", "ADD", "ONBUILD":
			return "", fmt.Errorf("line %d: %s in the final stage cannot be reproduced on scratch", in.line, in.cmd)
		default:
			fmt.Fprintf(&b, "%s %s\n", in.cmd, in.rest)
		}
	}
	return b.String(), nil
}

// finalConfig is what the final stage says the image's configuration is.
type finalConfig struct {
	user        string
	entrypoint  []string
	cmd         []string
	volumes     []string
	env         map[string]string
	expose      []string
	healthcheck []string // the CMD argv
}

func parseFinalConfig(final []instruction) (finalConfig, error) {
	c := finalConfig{env: map[string]string{}}
	for _, in := range final {
		var ok bool
		switch in.cmd {
		case "USER":
			c.user = in.rest
		case "ENTRYPOINT":
			if c.entrypoint, ok = execForm(in.rest); !ok {
				return c, fmt.Errorf("line %d: ENTRYPOINT is not exec form", in.line)
			}
		case "CMD":
			if c.cmd, ok = execForm(in.rest); !ok {
				return c, fmt.Errorf("line %d: CMD is not exec form", in.line)
			}
		case "VOLUME":
			if c.volumes, ok = execForm(in.rest); !ok {
				c.volumes = strings.Fields(in.rest)
			}
		case "EXPOSE":
			c.expose = strings.Fields(in.rest)
		case "ENV":
			k, v, ok := strings.Cut(in.rest, "=")
			if !ok || strings.ContainsAny(k, " \t") || strings.ContainsAny(v, " \t\"'") {
				return c, fmt.Errorf("line %d: ENV %q: want one KEY=VALUE without quotes", in.line, in.rest)
			}
			c.env[k] = v
		case "HEALTHCHECK":
			_, after, found := strings.Cut(in.rest, "CMD ")
			if !found {
				return c, fmt.Errorf("line %d: HEALTHCHECK without CMD", in.line)
			}
			if c.healthcheck, ok = execForm(strings.TrimSpace(after)); !ok {
				return c, fmt.Errorf("line %d: HEALTHCHECK CMD is not exec form", in.line)
			}
		}
	}
	return c, nil
}

func TestScratchContainerfile(t *testing.T) {
	ins := loadDockerfile(t)
	final := finalStage(ins)
	cf, err := scratchContainerfile(final)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseDockerfile(cf)
	if err != nil {
		t.Fatalf("the generated Containerfile does not parse: %v\n%s", err, cf)
	}
	// The translation changes FROM and the COPY sources only.
	if len(got) != len(final) {
		t.Fatalf("%d instructions, the final stage has %d", len(got), len(final))
	}
	for i := range got {
		a, b := got[i], final[i]
		switch {
		case a.cmd != b.cmd:
			t.Errorf("instruction %d: %s, want %s", i, a.cmd, b.cmd)
		case a.cmd == "FROM":
			if a.rest != "scratch" {
				t.Errorf("FROM %s, want scratch", a.rest)
			}
		case a.cmd == "COPY":
			want := slices.DeleteFunc(strings.Fields(b.rest), func(w string) bool { return w == "--from=build" })
			have := strings.Fields(a.rest)
			for i, w := range have {
				if strings.HasPrefix(w, "out/") {
					have[i] = "/" + w
				}
			}
			if !slices.Equal(have, want) {
				t.Errorf("COPY %q does not mirror %q", a.rest, b.rest)
			}
		case a.rest != b.rest:
			t.Errorf("%s %q, want %q as in the Dockerfile", a.cmd, a.rest, b.rest)
		}
	}
	if _, err := buildLayout(buildStage(ins, "build")); err != nil {
		t.Errorf("build stage: %v", err)
	}

	for name, bad := range map[string]string{
		"RUN in final":    "FROM a\nRUN x\n",
		"COPY from host":  "FROM a\nCOPY x /y\n",
		"COPY other root": "FROM a\nCOPY --from=build /src/x /y\n",
	} {
		ins, err := parseDockerfile(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := scratchContainerfile(ins); err == nil {
			t.Errorf("%s: translated without error", name)
		}
	}
	if _, err := buildLayout([]instruction{{1, "RUN", "mkdir -p /out/a && rm -rf /"}}); err == nil {
		t.Error("a layout step with another command was accepted")
	}
}

// TestDockerfileConfigDir: the image sets HAIA_CONFIG_DIR (the container
// has no HOME) to a directory it creates, private to the non-root user, so
// a volume mounted there starts with the right owner.
func TestDockerfileConfigDir(t *testing.T) {
	ins := loadDockerfile(t)
	final := finalStage(ins)
	c, err := parseFinalConfig(final)
	if err != nil {
		t.Fatal(err)
	}
	dir := c.env["HAIA_CONFIG_DIR"]
	if !filepath.IsAbs(dir) {
		t.Fatalf("final stage ENV HAIA_CONFIG_DIR=%q; want an absolute directory", dir)
	}
	layout, err := buildLayout(buildStage(ins, "build"))
	if err != nil {
		t.Fatal(err)
	}
	var made *layoutStep
	for i, s := range layout {
		if s.path == "/out"+dir {
			made = &layout[i]
		}
	}
	if made == nil {
		t.Fatalf("the build stage does not create /out%s", dir)
	}
	if made.mode&0o077 != 0 {
		t.Errorf("/out%s has mode %04o; the key directory must be private (0700)", dir, made.mode)
	}
	uid, _, _ := strings.Cut(c.user, ":")
	owned := false
	for _, in := range final {
		if in.cmd == "COPY" && strings.Contains(in.rest, " "+dir) && strings.Contains(in.rest, "--chown="+uid+":") {
			owned = true
		}
	}
	if !owned {
		t.Errorf("%s is not copied into the image owned by the USER %s", dir, c.user)
	}
}
