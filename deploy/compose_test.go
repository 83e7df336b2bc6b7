package deploy

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The compose file, as far as this project uses the Compose specification.
// Decoding with KnownFields refuses anything else, so a typo (say
// "readonly: true") fails instead of silently dropping a protection.
type composeFile struct {
	Name       string                    `yaml:"name"`
	XHardening yaml.Node                 `yaml:"x-hardening"` // a YAML anchor merged into the services
	Services   map[string]composeService `yaml:"services"`
	Volumes    map[string]struct{}       `yaml:"volumes"`
	Secrets    map[string]composeFileRef `yaml:"secrets"`
	Configs    map[string]composeFileRef `yaml:"configs"`
}

type composeFileRef struct {
	File string `yaml:"file"`
}

type composeService struct {
	Image       string                       `yaml:"image"`
	Build       composeBuild                 `yaml:"build"`
	User        string                       `yaml:"user"`
	ReadOnly    bool                         `yaml:"read_only"`
	CapDrop     []string                     `yaml:"cap_drop"`
	SecurityOpt []string                     `yaml:"security_opt"`
	Restart     string                       `yaml:"restart"`
	NetworkMode string                       `yaml:"network_mode"`
	Entrypoint  []string                     `yaml:"entrypoint"`
	Command     []string                     `yaml:"command"`
	Ports       []string                     `yaml:"ports"`
	Secrets     []string                     `yaml:"secrets"`
	Configs     []composeConfigMount         `yaml:"configs"`
	Volumes     []composeMount               `yaml:"volumes"`
	Healthcheck *composeHealthcheck          `yaml:"healthcheck"`
	DependsOn   map[string]composeDependency `yaml:"depends_on"`
	Deploy      composeDeploy                `yaml:"deploy"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

type composeConfigMount struct {
	Source string `yaml:"source"`
	Target string `yaml:"target"`
}

type composeMount struct {
	Type     string `yaml:"type"`
	Source   string `yaml:"source"`
	Target   string `yaml:"target"`
	ReadOnly bool   `yaml:"read_only"`
	Volume   struct {
		Subpath string `yaml:"subpath"`
	} `yaml:"volume"`
}

type composeHealthcheck struct {
	Test        []string `yaml:"test"`
	Interval    string   `yaml:"interval"`
	Timeout     string   `yaml:"timeout"`
	StartPeriod string   `yaml:"start_period"`
	Retries     int      `yaml:"retries"`
}

type composeDependency struct {
	Condition string `yaml:"condition"`
}

type composeDeploy struct {
	Resources struct {
		Limits struct {
			CPUs   string `yaml:"cpus"`
			Memory string `yaml:"memory"`
			Pids   int    `yaml:"pids"`
		} `yaml:"limits"`
	} `yaml:"resources"`
}

func decodeCompose(data []byte) (*composeFile, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c composeFile
	if err := dec.Decode(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

func loadCompose(t *testing.T) *composeFile {
	t.Helper()
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := decodeCompose(data)
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return c
}

func TestComposeStrictDecoderRefuses(t *testing.T) {
	cases := map[string]string{
		"unknown service field": "services:\n  a:\n    readonly: true\n",
		"unknown top level":     "servics: {}\n",
		"wrong type":            "services:\n  a:\n    read_only: maybe\n",
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeCompose([]byte(doc)); err == nil {
				t.Errorf("decoded without error:\n%s", doc)
			}
		})
	}
}

// serverService is the service that faces the network: the one that
// publishes ports.
func serverService(t *testing.T, c *composeFile) (string, composeService) {
	t.Helper()
	var name string
	for n, s := range c.Services {
		if len(s.Ports) > 0 {
			if name != "" {
				t.Fatalf("services %s and %s both publish ports", name, n)
			}
			name = n
		}
	}
	if name == "" {
		t.Fatal("no service publishes a port")
	}
	return name, c.Services[name]
}

func TestComposeHardening(t *testing.T) {
	c := loadCompose(t)
	if len(c.Services) == 0 {
		t.Fatal("no services")
	}
	for name, s := range c.Services {
		if !s.ReadOnly {
			t.Errorf("service %s: read_only is not true", name)
		}
		if !slices.Contains(s.CapDrop, "ALL") {
			t.Errorf("service %s: cap_drop lacks ALL", name)
		}
		if !slices.Contains(s.SecurityOpt, "no-new-privileges:true") && !slices.Contains(s.SecurityOpt, "no-new-privileges") {
			t.Errorf("service %s: security_opt lacks no-new-privileges", name)
		}
		uid, _, _ := strings.Cut(s.User, ":")
		if n, err := strconv.Atoi(uid); err != nil || n == 0 {
			t.Errorf("service %s: user %q is not a numeric non-root uid", name, s.User)
		}
		if s.Deploy.Resources.Limits.Memory == "" || s.Deploy.Resources.Limits.CPUs == "" {
			if s.Restart != "no" { // one-shot jobs may go without
				t.Errorf("service %s: no cpu and memory limits", name)
			}
		}
		if s.Image == "" {
			t.Errorf("service %s: no image", name)
		}
	}
}

func TestComposeServer(t *testing.T) {
	c := loadCompose(t)
	name, s := serverService(t, c)
	for _, p := range s.Ports {
		if !strings.HasPrefix(p, "127.0.0.1:") && !strings.HasPrefix(p, "[::1]:") {
			t.Errorf("service %s: port %q is published beyond the host's loopback", name, p)
		}
	}
	hc := s.Healthcheck
	if hc == nil || len(hc.Test) < 2 || hc.Test[0] != "CMD" {
		t.Fatalf("service %s: healthcheck must be exec form [\"CMD\", ...] (the image has no shell), got %+v", name, hc)
	}
	if !slices.Contains(hc.Test, "healthcheck") || !strings.HasSuffix(flagValue(hc.Test, "--url"), "/healthz") {
		t.Errorf("service %s: healthcheck %v does not run `healthcheck --url .../healthz`", name, hc.Test)
	}
	if flagValue(s.Command, "--key-file") != "" {
		t.Errorf("service %s is given --key-file; it must sign through --signer", name)
	}
	if !strings.HasPrefix(flagValue(s.Command, "--signer"), "unix:") {
		t.Errorf("service %s has no --signer unix:PATH", name)
	}
	// Without it the server would try to create one under $HOME, on a
	// read-only filesystem.
	if flagValue(s.Command, "--params-key-file") == "" {
		t.Errorf("service %s has --signer but no --params-key-file", name)
	}
}

// TestComposeTraceMounts: the server sees events/ read-only and writes only
// guard/.
func TestComposeTraceMounts(t *testing.T) {
	c := loadCompose(t)
	name, s := serverService(t, c)
	dir := flagValue(s.Command, "--dir")
	if dir == "" {
		t.Fatalf("service %s has no --dir", name)
	}
	var rootRO, guardRW bool
	for _, m := range s.Volumes {
		if m.Source != "trace" {
			continue
		}
		sub := m.Volume.Subpath
		switch {
		case sub == "" && m.Target == dir:
			rootRO = m.ReadOnly
		case sub == "guard" && m.Target == dir+"/guard":
			guardRW = !m.ReadOnly
		case sub == "events" && m.Target == dir+"/events":
			if !m.ReadOnly {
				t.Errorf("service %s mounts events/ writable", name)
			}
		default:
			if !m.ReadOnly {
				t.Errorf("service %s: writable mount of the Trace volume (subpath %q) at %s", name, sub, m.Target)
			}
		}
	}
	if !rootRO {
		t.Errorf("service %s: the Trace volume is not mounted read-only at %s", name, dir)
	}
	if !guardRW {
		t.Errorf("service %s: guard/ is not mounted writable at %s/guard", name, dir)
	}
	if _, ok := c.Volumes["trace"]; !ok {
		t.Error("no top-level volume named trace")
	}
}

// TestComposeKeyIsolation: only the signer holds the key, and it has no
// network; it shares nothing with the server but the socket volume.
func TestComposeKeyIsolation(t *testing.T) {
	c := loadCompose(t)
	srvName, srv := serverService(t, c)
	var signerName string
	for n, s := range c.Services {
		if len(s.Entrypoint) > 1 && s.Entrypoint[1] == "signer" {
			signerName = n
		}
	}
	if signerName == "" {
		t.Fatal("no service runs `haia-trace-mcp signer`")
	}
	signer := c.Services[signerName]
	keyPath := flagValue(signer.Command, "--key-file")
	if !strings.HasPrefix(keyPath, "/run/secrets/") {
		t.Fatalf("signer --key-file %q is not a compose secret", keyPath)
	}
	keySecret := strings.TrimPrefix(keyPath, "/run/secrets/")
	if _, ok := c.Secrets[keySecret]; !ok {
		t.Errorf("secret %s is not declared", keySecret)
	}
	for n, s := range c.Services {
		if n != signerName && slices.Contains(s.Secrets, keySecret) {
			t.Errorf("service %s mounts the signing key secret %s", n, keySecret)
		}
	}
	if signer.NetworkMode != "none" {
		t.Errorf("signer network_mode %q; want none", signer.NetworkMode)
	}
	if a, b := flagValue(srv.Command, "--signer"), flagValue(signer.Command, "--listen"); a != b {
		t.Errorf("%s --signer %q and signer --listen %q differ", srvName, a, b)
	}
	// The socket's directory is a volume both mount.
	sock := strings.TrimPrefix(flagValue(signer.Command, "--listen"), "unix:")
	shared := false
	for _, a := range srv.Volumes {
		for _, b := range signer.Volumes {
			if a.Source == b.Source && a.Target == b.Target && strings.HasPrefix(sock, a.Target+"/") {
				shared = true
			}
		}
	}
	if !shared {
		t.Errorf("the socket %s is not on a volume both %s and signer mount", sock, srvName)
	}
}

func TestComposeReferencedFiles(t *testing.T) {
	c := loadCompose(t)
	for n, s := range c.Services {
		for _, sec := range s.Secrets {
			if _, ok := c.Secrets[sec]; !ok {
				t.Errorf("service %s: secret %s not declared", n, sec)
			}
		}
		for _, cf := range s.Configs {
			ref, ok := c.Configs[cf.Source]
			if !ok {
				t.Errorf("service %s: config %s not declared", n, cf.Source)
				continue
			}
			// Configs are committed examples; secrets are the operator's.
			if _, err := os.Stat(ref.File); err != nil {
				t.Errorf("config %s: %v", cf.Source, err)
			}
		}
		for _, m := range s.Volumes {
			if m.Type == "volume" {
				if _, ok := c.Volumes[m.Source]; !ok {
					t.Errorf("service %s: volume %s not declared", n, m.Source)
				}
			}
		}
		for dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("service %s depends on unknown service %s", n, dep)
			}
		}
	}
}
