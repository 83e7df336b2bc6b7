package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int    // where it starts
	cmd  string // upper-cased keyword
	rest string // everything after the keyword
}

// parseDockerfile splits a Dockerfile into instructions: comments and blank
// lines dropped, backslash continuations joined. Heredocs are not used here.
func parseDockerfile(data string) ([]instruction, error) {
	var out []instruction
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(data, "\n") {
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.Contains(line, "<<") && regexp.MustCompile(`<<-?["']?[A-Za-z]`).MatchString(line) {
			return nil, fmt.Errorf("line %d: heredocs are not supported by this check", i+1)
		}
		if body, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(body)
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(line)
		kw, rest, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{line: start, cmd: strings.ToUpper(kw), rest: strings.TrimSpace(rest)})
		cur.Reset()
	}
	if cur.Len() != 0 {
		return nil, fmt.Errorf("line %d: continuation runs past the end", start)
	}
	return out, nil
}

// execForm decodes a JSON-array (exec form) argument list.
func execForm(s string) ([]string, bool) {
	var argv []string
	if json.Unmarshal([]byte(s), &argv) != nil || len(argv) == 0 {
		return nil, false
	}
	return argv, true
}

func loadDockerfile(t *testing.T) []instruction {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	ins, err := parseDockerfile(string(data))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	return ins
}

// finalStage returns the instructions of the last stage.
func finalStage(ins []instruction) []instruction {
	last := 0
	for i, in := range ins {
		if in.cmd == "FROM" {
			last = i
		}
	}
	return ins[last:]
}

func TestDockerfile(t *testing.T) {
	ins := loadDockerfile(t)
	stages := map[string]bool{}
	froms := 0
	// The base images are named by ARGs declared before the first FROM
	// (a closed network passes local names); their defaults are checked.
	globals := globalArgs(ins)
	for _, in := range ins {
		switch in.cmd {
		case "FROM":
			froms++
			f := strings.Fields(in.rest)
			var image string
			for _, w := range f {
				if !strings.HasPrefix(w, "--") {
					image = w
					break
				}
			}
			if name, ok := argRef(image); ok {
				def, declared := globals[name]
				if !declared || def == "" {
					t.Errorf("line %d: FROM %s names no ARG with a default before the first FROM", in.line, image)
				}
				image = def
			}
			if !stages[image] && !digestPinned(image) {
				t.Errorf("line %d: base image %q is not pinned by tag and digest", in.line, image)
			}
			// A short name (golang:…) is refused by a stock podman,
			// whose short-name mode asks which registry is meant.
			if !stages[image] && !fullyQualified(image) {
				t.Errorf("line %d: base image %q is a short name; name its registry (docker.io/library/…)", in.line, image)
			}
			if len(f) >= 3 && strings.EqualFold(f[len(f)-2], "AS") {
				stages[f[len(f)-1]] = true
			}
		case "ADD":
			if regexp.MustCompile(`(?i)(https?|git|ftp)://|git@`).MatchString(in.rest) {
				t.Errorf("line %d: ADD of a remote source; fetch it with a checksum in a build stage instead", in.line)
			}
		case "COPY":
			if strings.Contains(in.rest, "://") {
				t.Errorf("line %d: COPY of a remote source", in.line)
			}
		}
	}
	if froms < 2 {
		t.Errorf("%d FROM; want a multi-stage build", froms)
	}

	final := finalStage(ins)
	var user, healthcheck, entrypoint, cmd, volume, expose string
	for _, in := range final {
		switch in.cmd {
		case "USER":
			user = in.rest
		case "HEALTHCHECK":
			healthcheck = in.rest
		case "ENTRYPOINT":
			entrypoint = in.rest
		case "CMD":
			cmd = in.rest
		case "VOLUME":
			volume = in.rest
		case "EXPOSE":
			expose = in.rest
		case "RUN":
			t.Errorf("line %d: RUN in the final stage; the final image has no shell", in.line)
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if user == "" || uid == "0" || uid == "root" {
		t.Errorf("final stage USER %q; want a non-root user", user)
	}
	if _, after, ok := strings.Cut(healthcheck, "CMD "); !ok {
		t.Errorf("HEALTHCHECK %q has no CMD", healthcheck)
	} else if argv, ok := execForm(strings.TrimSpace(after)); !ok {
		t.Errorf("HEALTHCHECK CMD %q is not exec form", after)
	} else if len(argv) < 2 || argv[1] != "healthcheck" {
		t.Errorf("HEALTHCHECK runs %v, want the healthcheck subcommand", argv)
	}
	for name, v := range map[string]string{"ENTRYPOINT": entrypoint, "CMD": cmd} {
		if _, ok := execForm(v); !ok {
			t.Errorf("%s %q is not exec form", name, v)
		}
	}
	ep, _ := execForm(entrypoint)
	c, _ := execForm(cmd)
	dir := flagValue(append(ep, c...), "--dir")
	vols, ok := execForm(volume)
	if !ok {
		vols = strings.Fields(volume)
	}
	if dir == "" || !containsString(vols, dir) {
		t.Errorf("VOLUME %v does not hold the Trace root --dir %q", vols, dir)
	}
	if !containsString(strings.Fields(expose), "3000") || flagValue(ep, "--http") != "0.0.0.0:3000" {
		t.Errorf("want EXPOSE 3000 and ENTRYPOINT --http 0.0.0.0:3000 (EXPOSE %q, ENTRYPOINT %v)", expose, ep)
	}

	var build string
	for _, in := range ins {
		if in.cmd == "RUN" && strings.Contains(in.rest, "go build") {
			build = in.rest
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w"`, "./cmd/haia-trace-mcp"} {
		if !strings.Contains(build, want) {
			t.Errorf("the go build step lacks %s: %q", want, build)
		}
	}
}

// globalArgs are the ARGs before the first FROM, with their defaults.
func globalArgs(ins []instruction) map[string]string {
	out := map[string]string{}
	for _, in := range ins {
		if in.cmd == "FROM" {
			break
		}
		if in.cmd == "ARG" {
			k, v, _ := strings.Cut(in.rest, "=")
			out[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return out
}

// argRef reads "${NAME}" or "$NAME".
func argRef(s string) (string, bool) {
	if n, ok := strings.CutPrefix(s, "${"); ok && strings.HasSuffix(n, "}") {
		return strings.TrimSuffix(n, "}"), true
	}
	if n, ok := strings.CutPrefix(s, "$"); ok && n != "" {
		return n, true
	}
	return "", false
}

// The Dockerfile builds on a closed network from a vendored module tree:
// with GOFLAGS=-mod=vendor the module download is skipped (the RUN that
// downloads is conditional on it), and the base images are ARGs a local
// name can replace. TestContainer's offline build runs it for real.
func TestDockerfileBuildsOffline(t *testing.T) {
	ins := loadDockerfile(t)
	globals := globalArgs(ins)
	for _, name := range []string{"GO_IMAGE", "RUNTIME_IMAGE"} {
		if !digestPinned(globals[name]) {
			t.Errorf("ARG %s default %q is not pinned by tag and digest", name, globals[name])
		}
	}
	build := buildStage(ins, "build")
	var goflags, download bool
	for _, in := range build {
		switch {
		case in.cmd == "ARG" && strings.HasPrefix(in.rest, "GOFLAGS"):
			goflags = true
		case in.cmd == "RUN" && strings.Contains(in.rest, "go mod download"):
			download = true
			if !strings.Contains(in.rest, "-mod=vendor") {
				t.Errorf("line %d: the module download does not skip a vendored build: %s", in.line, in.rest)
			}
		}
	}
	if !goflags || !download {
		t.Errorf("the build stage declares ARG GOFLAGS %v and downloads modules %v; want both", goflags, download)
	}
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// fullyQualified reports whether an image reference names its registry:
// the first path component is a host (has a dot or a port) or localhost.
func fullyQualified(ref string) bool {
	first, _, ok := strings.Cut(ref, "/")
	return ok && (strings.ContainsAny(first, ".:") || first == "localhost")
}

// digestPinned accepts only name:tag@sha256:<64 hex>.
func digestPinned(ref string) bool {
	name, _, ok := strings.Cut(ref, "@")
	return ok && imagePinned(ref) && strings.LastIndex(name, ":") > strings.LastIndex(name, "/")
}

func TestParseDockerfile(t *testing.T) {
	ins, err := parseDockerfile("# c\nFROM a:1@sha256:x AS b\n\nRUN x \\\n  y\nUSER 1\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []instruction{{2, "FROM", "a:1@sha256:x AS b"}, {4, "RUN", "x  y"}, {6, "USER", "1"}}
	if fmt.Sprint(ins) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", ins, want)
	}
	if _, err := parseDockerfile("RUN a \\\n"); err == nil {
		t.Error("a dangling continuation parsed")
	}
	if digestPinned("golang:1.26") || digestPinned("golang@sha256:"+strings.Repeat("0", 64)) {
		t.Error("digestPinned accepts a reference without tag or digest")
	}
}
