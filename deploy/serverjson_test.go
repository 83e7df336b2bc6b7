package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// The MCP registry manifest (../server.json), as far as the registry's
// server.json schema of 2025-12-11 goes for what this project publishes.
// Decoding refuses unknown fields, so a misspelt key fails here.
const serverSchemaURL = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"

type serverManifest struct {
	Schema      string `json:"$schema"`
	Name        string `json:"name"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Repository  struct {
		URL    string `json:"url"`
		Source string `json:"source"`
	} `json:"repository"`
	Version  string            `json:"version"`
	Packages []manifestPackage `json:"packages"`
}

type manifestPackage struct {
	RegistryType string `json:"registryType"`
	Identifier   string `json:"identifier"`
	RuntimeHint  string `json:"runtimeHint"`
	Transport    struct {
		Type string `json:"type"`
	} `json:"transport"`
	RuntimeArguments []manifestArgument `json:"runtimeArguments"`
	PackageArguments []manifestArgument `json:"packageArguments"`
}

type manifestArgument struct {
	Type        string                   `json:"type"`
	Name        string                   `json:"name"`
	Value       string                   `json:"value"`
	Description string                   `json:"description"`
	IsRequired  bool                     `json:"isRequired"`
	Variables   map[string]manifestInput `json:"variables"`
}

type manifestInput struct {
	Description string `json:"description"`
	Format      string `json:"format"`
	IsRequired  bool   `json:"isRequired"`
	Default     string `json:"default"`
}

func loadManifest(t *testing.T) *serverManifest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "server.json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m serverManifest
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("server.json: %v", err)
	}
	return &m
}

// modulePath reads the module path from ../go.mod.
func modulePath(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.TrimSpace(p)
		}
	}
	t.Fatal("go.mod has no module line")
	return ""
}

// expand replaces {var} with values, failing on a variable the argument
// does not declare (the registry leaves those verbatim).
func expand(t *testing.T, a manifestArgument, values map[string]string) string {
	t.Helper()
	return regexp.MustCompile(`\{([a-z_]+)\}`).ReplaceAllStringFunc(a.Value, func(m string) string {
		name := m[1 : len(m)-1]
		if _, ok := a.Variables[name]; !ok {
			t.Errorf("argument %s %q uses {%s}, which it does not declare", a.Name, a.Value, name)
		}
		v, ok := values[name]
		if !ok {
			v = a.Variables[name].Default
		}
		return v
	})
}

// argv turns manifest arguments into command-line words.
func argv(t *testing.T, args []manifestArgument, values map[string]string) []string {
	t.Helper()
	var out []string
	for _, a := range args {
		switch a.Type {
		case "named":
			out = append(out, a.Name)
			if a.Value != "" {
				out = append(out, expand(t, a, values))
			}
		case "positional":
			out = append(out, expand(t, a, values))
		default:
			t.Errorf("argument type %q", a.Type)
		}
	}
	return out
}

// semverRelease is a release version: no range, no "latest", no leading v.
var semverRelease = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

func TestServerJSON(t *testing.T) {
	m := loadManifest(t)
	mod := modulePath(t)
	owner, repo, ok := strings.Cut(strings.TrimPrefix(mod, "github.com/"), "/")
	if !ok || !strings.HasPrefix(mod, "github.com/") {
		t.Fatalf("module %s is not github.com/OWNER/REPO", mod)
	}
	if m.Schema != serverSchemaURL {
		t.Errorf("$schema %q, want %q", m.Schema, serverSchemaURL)
	}
	// The registry verifies io.github.OWNER names against the GitHub
	// repository, so name, repository and module must agree.
	if want := "io.github." + owner + "/" + repo; m.Name != want {
		t.Errorf("name %q, want %q (from the module path)", m.Name, want)
	}
	if !regexp.MustCompile(`^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$`).MatchString(m.Name) || len(m.Name) > 200 {
		t.Errorf("name %q is not namespace/name", m.Name)
	}
	if m.Repository.URL != "https://"+mod || m.Repository.Source != "github" {
		t.Errorf("repository %+v, want https://%s on github", m.Repository, mod)
	}
	if n := utf8.RuneCountInString(m.Description); n == 0 || n > 100 {
		t.Errorf("description has %d characters; the schema allows 1 to 100", n)
	}
	// serverInfo.version of a build tagged v<version> is <version>
	// (cmd/haia-trace-mcp/version.go drops the v): the two agree.
	if !semverRelease.MatchString(m.Version) {
		t.Errorf("version %q is not a release semver such as 1.2.3", m.Version)
	}
	if len(m.Packages) != 1 {
		t.Fatalf("%d packages, want the one OCI image", len(m.Packages))
	}
	p := m.Packages[0]
	image, tag, _ := strings.Cut(p.Identifier, ":")
	if p.RegistryType != "oci" || p.RuntimeHint != "docker" || tag != m.Version || !strings.HasSuffix(image, "/"+repo) {
		t.Errorf("package %s (%s, %s): want oci, docker, an image named %s tagged %s", p.Identifier, p.RegistryType, p.RuntimeHint, repo, m.Version)
	}
	if p.Transport.Type != "stdio" {
		t.Errorf("transport %q; the manifest runs the binary over stdio", p.Transport.Type)
	}

	// The runtime arguments agree with the image: the entrypoint is the
	// binary, the mounts are the Dockerfile's VOLUME and HAIA_CONFIG_DIR,
	// stdin stays open.
	cfg, err := parseFinalConfig(finalStage(loadDockerfile(t)))
	if err != nil {
		t.Fatal(err)
	}
	rt := argv(t, p.RuntimeArguments, map[string]string{"trace_root": "/host/trace", "config_dir": "/host/cfg", "agent_id": "x"})
	if flagValue(rt, "--entrypoint") != binaryName {
		t.Errorf("runtime --entrypoint %q, want %s", flagValue(rt, "--entrypoint"), binaryName)
	}
	if !containsString(rt, "-i") {
		t.Error("runtime arguments lack -i: stdio needs stdin")
	}
	var targets []string
	for i, a := range rt {
		if a == "-v" && i+1 < len(rt) {
			_, target, _ := strings.Cut(rt[i+1], ":")
			targets = append(targets, strings.Split(target, ":")[0])
		}
	}
	for _, want := range append(append([]string{}, cfg.volumes...), cfg.env["HAIA_CONFIG_DIR"]) {
		if !containsString(targets, want) {
			t.Errorf("runtime arguments mount %v; the image needs %s", targets, want)
		}
	}
	pa := argv(t, p.PackageArguments, nil)
	if dir := flagValue(pa, "--dir"); !containsString(cfg.volumes, dir) {
		t.Errorf("package --dir %q is not the image's volume %v", dir, cfg.volumes)
	}
	for _, a := range append(append([]manifestArgument{}, p.RuntimeArguments...), p.PackageArguments...) {
		for name, v := range a.Variables {
			if v.Description == "" {
				t.Errorf("variable %s of %s has no description", name, a.Name)
			}
		}
	}
	// That every package argument is a real flag is checked by
	// TestFlagsExist, which collects this command line too.
}
