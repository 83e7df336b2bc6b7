package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
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
	XServer    yaml.Node                 `yaml:"x-server"`    // one server replica, merged into each
	Services   map[string]composeService `yaml:"services"`
	Networks   map[string]composeNetwork `yaml:"networks"`
	Volumes    map[string]struct{}       `yaml:"volumes"`
	Secrets    map[string]composeFileRef `yaml:"secrets"`
	Configs    map[string]composeFileRef `yaml:"configs"`
}

type composeNetwork struct {
	Internal bool `yaml:"internal"`
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
	Networks    []string                     `yaml:"networks"`
	Environment map[string]string            `yaml:"environment"`
	EnvFile     []string                     `yaml:"env_file"`
	Tmpfs       []string                     `yaml:"tmpfs"`
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

// composeVariant is one compose file and what it must be.
type composeVariant struct {
	file string
	// postgres: the guard's state lives in PostgreSQL, so nothing under
	// guard/ is mounted and the DSN comes from HAIA_STORE.
	postgres bool
	// ingest: recorders post their events (--ingest) and every replica
	// keeps its own Trace root; no Trace volume is shared.
	ingest  bool
	servers int // replicas of the server
}

func composeVariants() []composeVariant {
	return []composeVariant{
		{file: "compose.yaml", servers: 1},
		{file: "compose.postgres.yaml", postgres: true, servers: 3},
		{file: "compose.ingest.yaml", postgres: true, ingest: true, servers: 3},
	}
}

func loadComposeFile(t *testing.T, file string) *composeFile {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	c, err := decodeCompose(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return c
}

// loadCompose is the file-store topology, compose.yaml.
func loadCompose(t *testing.T) *composeFile {
	t.Helper()
	return loadComposeFile(t, "compose.yaml")
}

// eachCompose runs check as a subtest for every compose file.
func eachCompose(t *testing.T, check func(t *testing.T, v composeVariant, c *composeFile)) {
	for _, v := range composeVariants() {
		t.Run(v.file, func(t *testing.T) { check(t, v, loadComposeFile(t, v.file)) })
	}
}

// eachPostgresCompose runs check for every compose file of the PostgreSQL store.
func eachPostgresCompose(t *testing.T, check func(t *testing.T, v composeVariant, c *composeFile)) {
	for _, v := range composeVariants() {
		if v.postgres {
			t.Run(v.file, func(t *testing.T) { check(t, v, loadComposeFile(t, v.file)) })
		}
	}
}

func TestComposeStrictDecoderRefuses(t *testing.T) {
	cases := map[string]string{
		"unknown service field": "services:\n  a:\n    readonly: true\n",
		"unknown top level":     "servics: {}\n",
		"wrong type":            "services:\n  a:\n    read_only: maybe\n",
		"unknown network field": "networks:\n  a:\n    internl: true\n",
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeCompose([]byte(doc)); err == nil {
				t.Errorf("decoded without error:\n%s", doc)
			}
		})
	}
}

// serverServices are the services that face the network (the ones that
// publish ports), sorted by name.
func serverServices(c *composeFile) []string {
	var names []string
	for n, s := range c.Services {
		if len(s.Ports) > 0 {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// serverService is the one service that faces the network.
func serverService(t *testing.T, c *composeFile) (string, composeService) {
	t.Helper()
	names := serverServices(c)
	if len(names) != 1 {
		t.Fatalf("want exactly one service publishing ports, have %v", names)
	}
	return names[0], c.Services[names[0]]
}

// builtHere tells a service running the project's own image, built from
// this repository, from a third-party one.
func builtHere(s composeService) bool {
	return s.Build.Context != ""
}

func signerService(t *testing.T, c *composeFile) (string, composeService) {
	t.Helper()
	var names []string
	for n, s := range c.Services {
		if len(s.Entrypoint) > 1 && s.Entrypoint[1] == "signer" {
			names = append(names, n)
		}
	}
	if len(names) != 1 {
		t.Fatalf("want exactly one service running `haia-trace-mcp signer`, have %v", names)
	}
	return names[0], c.Services[names[0]]
}

func TestComposeHardening(t *testing.T) {
	eachCompose(t, func(t *testing.T, _ composeVariant, c *composeFile) {
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
			if !builtHere(s) && !digestPinned(s.Image) {
				t.Errorf("service %s: third-party image %q is not pinned by tag and digest", name, s.Image)
			}
		}
	})
}

func TestComposeServer(t *testing.T) {
	eachCompose(t, func(t *testing.T, v composeVariant, c *composeFile) {
		names := serverServices(c)
		if len(names) != v.servers {
			t.Fatalf("services publishing ports: %v; want %d server replicas", names, v.servers)
		}
		hostPorts := map[string]string{}
		for _, name := range names {
			s := c.Services[name]
			for _, p := range s.Ports {
				if !strings.HasPrefix(p, "127.0.0.1:") && !strings.HasPrefix(p, "[::1]:") {
					t.Errorf("service %s: port %q is published beyond the host's loopback", name, p)
				}
				host := p[:strings.LastIndex(p, ":")]
				if other, dup := hostPorts[host]; dup {
					t.Errorf("services %s and %s both publish %s", other, name, host)
				}
				hostPorts[host] = name
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
	})
}

// TestComposeTraceMounts: every server sees the Trace root read-only; with
// the file store it writes guard/ only, with PostgreSQL nothing at all.
func TestComposeTraceMounts(t *testing.T) {
	eachCompose(t, func(t *testing.T, v composeVariant, c *composeFile) {
		if v.ingest {
			checkComposeIngestMounts(t, c)
			return
		}
		if _, ok := c.Volumes["trace"]; !ok {
			t.Error("no top-level volume named trace")
		}
		for _, name := range serverServices(c) {
			s := c.Services[name]
			dir := flagValue(s.Command, "--dir")
			if dir == "" {
				t.Errorf("service %s has no --dir", name)
				continue
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
				case !v.postgres && sub == "guard" && m.Target == dir+"/guard":
					guardRW = !m.ReadOnly
				case sub == "guard" || strings.HasPrefix(sub, "guard/") || m.Target == dir+"/guard":
					t.Errorf("service %s mounts guard/ (subpath %q at %s); with the PostgreSQL store nothing under guard/ is mounted", name, sub, m.Target)
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
			if !v.postgres && !guardRW {
				t.Errorf("service %s: guard/ is not mounted writable at %s/guard", name, dir)
			}
		}
	})
}

// TestComposeKeyIsolation: only the signer holds the key, and it has no
// network; it shares nothing with the servers but the socket volume.
func TestComposeKeyIsolation(t *testing.T) {
	eachCompose(t, func(t *testing.T, _ composeVariant, c *composeFile) {
		signerName, signer := signerService(t, c)
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
		if signer.NetworkMode != "none" || len(signer.Networks) != 0 {
			t.Errorf("signer network_mode %q, networks %v; want network_mode none", signer.NetworkMode, signer.Networks)
		}
		// The socket's directory is a volume each server and the signer mount.
		sock := strings.TrimPrefix(flagValue(signer.Command, "--listen"), "unix:")
		for _, srvName := range serverServices(c) {
			srv := c.Services[srvName]
			if a, b := flagValue(srv.Command, "--signer"), flagValue(signer.Command, "--listen"); a != b {
				t.Errorf("%s --signer %q and signer --listen %q differ", srvName, a, b)
			}
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
	})
}

func TestComposeReferencedFiles(t *testing.T) {
	eachCompose(t, func(t *testing.T, _ composeVariant, c *composeFile) {
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
			for _, net := range s.Networks {
				if _, ok := c.Networks[net]; !ok && net != "default" {
					t.Errorf("service %s: network %s not declared", n, net)
				}
			}
			if s.NetworkMode != "" && len(s.Networks) > 0 {
				t.Errorf("service %s sets both network_mode and networks", n)
			}
			for dep := range s.DependsOn {
				if _, ok := c.Services[dep]; !ok {
					t.Errorf("service %s depends on unknown service %s", n, dep)
				}
			}
		}
	})
}

// storeMigrateArgv is the one-shot that brings the schema up to date; the
// servers refuse to start on any other.
func storeMigrateArgv() []string { return []string{binaryName, "store", "migrate"} }

// grantedRole is the role a `store migrate` one-shot's arguments give the
// server's privileges to (--grant ROLE), or "" with any other arguments.
func grantedRole(args []string) string {
	if len(args) == 2 && args[0] == "--grant" {
		return args[1]
	}
	return ""
}

// TestComposePostgresStore: the PostgreSQL topology starts the database,
// migrates, then the replicas; each DSN reaches only the containers that
// need it, and only through HAIA_STORE from an env_file outside the
// repository: the owner's the migration alone, the runtime role's the
// replicas. The runtime role is created at the database's first
// initialisation, its password from a secret file, and owns nothing.
func TestComposePostgresStore(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	eachPostgresCompose(t, func(t *testing.T, v composeVariant, c *composeFile) {
		var pgName, migrateName string
		for n, s := range c.Services {
			if strings.HasPrefix(s.Image, "docker.io/library/postgres:15") {
				pgName = n
			}
			if slices.Equal(s.Entrypoint, storeMigrateArgv()) {
				if migrateName != "" {
					t.Errorf("services %s and %s both run store migrate", migrateName, n)
				}
				migrateName = n
			}
		}
		if pgName == "" || migrateName == "" {
			t.Fatalf("want a postgres:15 service and a `store migrate` one-shot, have postgres %q, migrate %q", pgName, migrateName)
		}
		pg, migrate := c.Services[pgName], c.Services[migrateName]

		// PostgreSQL: reachable only on internal networks, healthy when it
		// answers, its password from a secret file, its data on its own volume.
		if len(pg.Ports) != 0 {
			t.Errorf("service %s publishes %v", pgName, pg.Ports)
		}
		if len(pg.Networks) == 0 {
			t.Errorf("service %s is on no network of its own", pgName)
		}
		for _, net := range pg.Networks {
			if !c.Networks[net].Internal {
				t.Errorf("service %s is on network %s, which is not internal", pgName, net)
			}
		}
		if hc := pg.Healthcheck; hc == nil || len(hc.Test) < 2 || hc.Test[0] != "CMD" || hc.Test[1] != "pg_isready" {
			t.Errorf("service %s: healthcheck %+v is not [\"CMD\", \"pg_isready\", ...]", pgName, hc)
		}
		pwFile, ok := pg.Environment["POSTGRES_PASSWORD_FILE"]
		if sec, isSecret := strings.CutPrefix(pwFile, "/run/secrets/"); !ok || !isSecret || !slices.Contains(pg.Secrets, sec) {
			t.Errorf("service %s: POSTGRES_PASSWORD_FILE %q is not one of its secrets %v", pgName, pwFile, pg.Secrets)
		}
		for k := range pg.Environment {
			if strings.Contains(k, "PASSWORD") && !strings.HasSuffix(k, "_FILE") {
				t.Errorf("service %s: %s puts a password in the environment", pgName, k)
			}
		}
		dataVolume := false
		for _, m := range pg.Volumes {
			if m.Target == "/var/lib/postgresql/data" && m.Type == "volume" && m.Source != "trace" && !m.ReadOnly {
				dataVolume = true
			}
		}
		if !dataVolume {
			t.Errorf("service %s: /var/lib/postgresql/data is not a volume of its own", pgName)
		}

		// The order: postgres healthy → migrate completed → every replica.
		if migrate.Restart != "no" {
			t.Errorf("service %s: restart %q; a one-shot wants \"no\"", migrateName, migrate.Restart)
		}
		if got := migrate.DependsOn[pgName].Condition; got != "service_healthy" {
			t.Errorf("service %s waits for %s with condition %q; want service_healthy", migrateName, pgName, got)
		}
		storeNets := func(s composeService) bool {
			for _, net := range s.Networks {
				if slices.Contains(pg.Networks, net) {
					return true
				}
			}
			return false
		}
		// Two roles: the migration runs as the owner and grants the runtime
		// role, which the replicas run as.
		role := grantedRole(migrate.Command)
		if role == "" {
			t.Fatalf("service %s runs store migrate with %q; want --grant ROLE, the role the replicas run as", migrateName, migrate.Command)
		}
		servers := serverServices(c)
		runtimeEnv := c.Services[servers[0]].EnvFile
		needsDSN := append(slices.Clone(servers), migrateName)
		for _, name := range needsDSN {
			s := c.Services[name]
			if name != migrateName {
				if got := s.DependsOn[migrateName].Condition; got != "service_completed_successfully" {
					t.Errorf("service %s waits for %s with condition %q; want service_completed_successfully", name, migrateName, got)
				}
				if !slices.Equal(s.EnvFile, runtimeEnv) {
					t.Errorf("service %s: env_file %v differs from %s's %v", name, s.EnvFile, servers[0], runtimeEnv)
				}
			}
			for _, f := range s.EnvFile {
				if name != migrateName && slices.Contains(migrate.EnvFile, f) {
					t.Errorf("service %s reads %s, the owner's env_file: the owner's DSN goes to %s alone", name, f, migrateName)
				}
			}
			if !storeNets(s) {
				t.Errorf("service %s shares no network with %s", name, pgName)
			}
			if len(s.EnvFile) == 0 {
				t.Errorf("service %s has no env_file: HAIA_STORE would be unset and the server would use the file store", name)
			}
			for _, f := range s.EnvFile {
				if rel, err := filepath.Rel(repo, f); !filepath.IsAbs(f) || err == nil && !strings.HasPrefix(rel, "..") {
					t.Errorf("service %s: env_file %s is not an absolute path outside the repository", name, f)
				}
			}
		}
		for name, s := range c.Services {
			if len(s.EnvFile) > 0 && !slices.Contains(needsDSN, name) {
				t.Errorf("service %s takes env_file %v; only the servers and %s need the DSN", name, s.EnvFile, migrateName)
			}
			if _, ok := s.Environment["HAIA_STORE"]; ok {
				t.Errorf("service %s sets HAIA_STORE in the compose file; it comes from the env_file only", name)
			}
			words := slices.Concat(s.Entrypoint, s.Command)
			if s.Healthcheck != nil {
				words = append(words, s.Healthcheck.Test...)
			}
			for k, val := range s.Environment {
				words = append(words, k+"="+val)
			}
			for _, w := range words {
				if strings.HasPrefix(w, "--store") || strings.Contains(w, "postgres://") || strings.Contains(w, "postgresql://") {
					t.Errorf("service %s: %q puts the store on a command line or in the compose file", name, w)
				}
			}
		}
		for name, ref := range c.Configs {
			data, err := os.ReadFile(ref.File)
			if err != nil {
				t.Errorf("config %s: %v", name, err)
				continue
			}
			if bytes.Contains(data, []byte("postgres://")) || bytes.Contains(data, []byte("HAIA_STORE")) {
				t.Errorf("config %s (%s) holds the DSN; configs are not secret", name, ref.File)
			}
		}
		checkRuntimeRoleCreated(t, c, pgName, role)
		checkDocumentedDSNs(t, v.file, c.Services[pgName].Environment["POSTGRES_USER"], role, migrate.EnvFile, runtimeEnv)
	})
}

// initdbDir is where the postgres image looks for the scripts it runs once,
// on an empty data directory.
const initdbDir = "/docker-entrypoint-initdb.d/"

// checkRuntimeRoleCreated: the postgres service creates role at its first
// initialisation with one SQL script of its own, a LOGIN role and nothing
// more, its password read by psql from a secret only that service mounts
// (neither the owner's password nor in the environment or a command line).
func checkRuntimeRoleCreated(t *testing.T, c *composeFile, pgName, role string) {
	t.Helper()
	pg := c.Services[pgName]
	var scripts []string
	for _, cf := range pg.Configs {
		if strings.HasPrefix(cf.Target, initdbDir) {
			if !strings.HasSuffix(cf.Target, ".sql") {
				t.Errorf("service %s: init script %s is not .sql (the image would run a shell script with its environment)", pgName, cf.Target)
			}
			scripts = append(scripts, c.Configs[cf.Source].File)
		}
	}
	if len(scripts) != 1 {
		t.Fatalf("service %s: init scripts %v; want one that creates %s", pgName, scripts, role)
	}
	data, err := os.ReadFile(scripts[0])
	if err != nil {
		t.Fatal(err)
	}
	sql := string(data)
	create := fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD :'", role)
	var creates []string
	for _, line := range strings.Split(sql, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "CREATE ROLE") {
			creates = append(creates, strings.TrimSpace(line))
		}
	}
	if len(creates) != 1 || !strings.HasPrefix(creates[0], create) || strings.Count(creates[0], ":'") != 1 {
		t.Errorf("%s: CREATE ROLE statements %q; want one, %q<variable>', a login role with nothing else", scripts[0], creates, create)
	}
	for _, w := range []string{"SUPERUSER", "CREATEDB", "CREATEROLE", "REPLICATION", "BYPASSRLS", "GRANT", "ALTER", "OWNER"} {
		if strings.Contains(strings.ToUpper(strings.Join(creates, " ")), w) || strings.Contains(sql, w+" ") {
			t.Errorf("%s gives %s %s; the runtime role gets its privileges from store migrate --grant alone", scripts[0], role, w)
		}
	}
	for _, set := range []string{"SET log_statement = 'none';", "SET log_min_error_statement = 'panic';"} {
		if !strings.Contains(sql, set) {
			t.Errorf("%s lacks %q: the statement carrying the password could reach the server's log", scripts[0], set)
		}
	}
	_, rest, ok := strings.Cut(sql, "`cat /run/secrets/")
	secret, _, _ := strings.Cut(rest, "`")
	if !ok || !slices.Contains(pg.Secrets, secret) {
		t.Fatalf("%s reads the password from /run/secrets/%q, which is not a secret of service %s (%v)", scripts[0], secret, pgName, pg.Secrets)
	}
	if strings.TrimPrefix(pg.Environment["POSTGRES_PASSWORD_FILE"], "/run/secrets/") == secret {
		t.Errorf("%s: %s's password is the owner's", scripts[0], role)
	}
	for name, s := range c.Services {
		if name != pgName && slices.Contains(s.Secrets, secret) {
			t.Errorf("service %s mounts secret %s, %s's password; the replicas have it in their DSN only", name, secret, role)
		}
	}
}

// checkDocumentedDSNs: the compose file's header tells the operator to
// put the owner's DSN in the migration's env_file and the runtime role's
// in the replicas'.
func checkDocumentedDSNs(t *testing.T, composeFile, owner, role string, ownerEnv, runtimeEnv []string) {
	t.Helper()
	for _, d := range []struct {
		files []string
		want  string
	}{{ownerEnv, owner}, {runtimeEnv, role}} {
		if len(d.files) != 1 {
			t.Errorf("env_file %v; want one file", d.files)
			continue
		}
		u := documentedDSN(t, composeFile, d.files[0])
		if got := u.User.Username(); got != d.want || got == "" {
			t.Errorf("the header documents %s with a DSN of role %q; want %q", d.files[0], got, d.want)
		}
	}
}
