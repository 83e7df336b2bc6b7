package deploy

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// The container test builds the image and runs the compose topology with
// podman: trace-init, the signer (no network), the server (read-only root,
// non-root, guard/ the only writable path, HS256 auth from a read-only
// secret), a recorder container writing events into the shared volume, a
// check over HTTP with a token, and the human's `review reject` through
// `podman exec`. It needs podman and runc, so it runs only when
// HAIA_PODMAN=1 (.ci/run sets it after installing them).

const (
	podmanEnv     = "HAIA_PODMAN"
	sellerSettles = "0xA11CE00000000000000000000000000000000001"
	sellerSilent  = "0xB0B0000000000000000000000000000000000002"
	testIssuer    = "http://127.0.0.1/local-as"
	imageName     = "localhost/haia-trace-mcp:test"
	recorderImage = "localhost/haia-trace-recorder:test"
)

// podman runs the podman CLI against a private store under a temporary
// directory, so the test neither sees nor leaves anything in the machine's
// own containers storage.
type podman struct {
	t        *testing.T
	global   []string
	rootless bool
	uid      int // the image's user, as a number
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	if os.Getenv(podmanEnv) != "1" {
		t.Skipf("%s=1 not set: the container test needs podman and runc (.ci/run installs them and sets it)", podmanEnv)
	}
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatalf("%s=1 but podman is not on PATH: %v", podmanEnv, err)
	}
	dir := t.TempDir()
	p := &podman{t: t, rootless: os.Geteuid() != 0, global: []string{
		"--root", filepath.Join(dir, "storage"),
		"--runroot", filepath.Join(dir, "run"),
		"--tmpdir", filepath.Join(dir, "tmp"),
		"--storage-driver", "vfs",
		"--runtime", "runc",
		"--cgroup-manager", "cgroupfs",
		"--events-backend", "file",
	}}
	// Runs before t.TempDir's removal: the store holds files owned by
	// other uids, which only podman can remove when rootless.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "podman", append(p.global, "system", "reset", "--force")...).CombinedOutput()
		if err != nil {
			t.Logf("podman system reset: %v\n%s", err, out)
		}
	})
	return p
}

// run runs podman and returns its stdout; it fails the test on a non-zero
// exit.
func (p *podman) run(args ...string) string {
	p.t.Helper()
	out, errOut, code := p.try(args...)
	if code != 0 {
		p.t.Fatalf("podman %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// try runs podman and returns stdout, stderr and the exit code.
func (p *podman) try(args ...string) (string, string, int) {
	p.t.Helper()
	return p.tryWithin(5*time.Minute, args...)
}

// tryWithin is try with another limit (a build that compiles everything).
func (p *podman) tryWithin(limit time.Duration, args ...string) (string, string, int) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", append(append([]string{}, p.global...), args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		p.t.Fatalf("podman %s did not finish within %v", strings.Join(args, " "), limit)
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	case err != nil:
		p.t.Fatalf("podman %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), 0
}

// chown gives path to uid inside the containers' user namespace.
func (p *podman) chown(path string, uid int) {
	p.t.Helper()
	if !p.rootless {
		if err := os.Lchown(path, uid, uid); err != nil {
			p.t.Fatal(err)
		}
		return
	}
	p.run("unshare", "chown", fmt.Sprintf("%d:%d", uid, uid), path)
}

// owner is the uid owning path, as the containers see it.
func (p *podman) owner(path string) int {
	p.t.Helper()
	if !p.rootless {
		st, err := os.Lstat(path)
		if err != nil {
			p.t.Fatal(err)
		}
		return int(st.Sys().(*syscall.Stat_t).Uid)
	}
	n, err := strconv.Atoi(strings.TrimSpace(p.run("unshare", "stat", "-c", "%u", path)))
	if err != nil {
		p.t.Fatal(err)
	}
	return n
}

// goBuild builds a static binary of pkg (relative to the module root).
func goBuild(t *testing.T, pkg, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// buildImages builds the server image from the Dockerfile's final stage on
// scratch, and the recorder image, and returns the final stage's config.
func buildImages(t *testing.T, p *podman) (finalConfig, string) {
	t.Helper()
	ins := loadDockerfile(t)
	final := finalStage(ins)
	cfg, err := parseFinalConfig(final)
	if err != nil {
		t.Fatal(err)
	}
	if p.uid, err = strconv.Atoi(strings.Split(cfg.user, ":")[0]); err != nil {
		t.Fatalf("USER %q is not numeric: %v", cfg.user, err)
	}
	cf, err := scratchContainerfile(final)
	if err != nil {
		t.Fatal(err)
	}
	layout, err := buildLayout(buildStage(ins, "build"))
	if err != nil {
		t.Fatal(err)
	}
	ctxDir := t.TempDir()
	for _, s := range layout {
		d := filepath.Join(ctxDir, s.path)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, s.mode); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(ctxDir, "out", "haia-trace-mcp")
	goBuild(t, "./cmd/haia-trace-mcp", bin)
	if err := os.WriteFile(filepath.Join(ctxDir, "Containerfile"), []byte(cf), 0o644); err != nil {
		t.Fatal(err)
	}
	// Docker format: the OCI image format has no HEALTHCHECK.
	p.run("build", "--format", "docker", "--pull=never", "-f", filepath.Join(ctxDir, "Containerfile"), "-t", imageName, ctxDir)

	recDir := t.TempDir()
	goBuild(t, "./deploy/testdata/recorder", filepath.Join(recDir, "recorder"))
	rcf := fmt.Sprintf("FROM scratch\nCOPY recorder /recorder\nUSER %s\nENTRYPOINT [\"/recorder\"]\n", cfg.user)
	if err := os.WriteFile(filepath.Join(recDir, "Containerfile"), []byte(rcf), 0o644); err != nil {
		t.Fatal(err)
	}
	p.run("build", "--format", "docker", "--pull=never", "-f", filepath.Join(recDir, "Containerfile"), "-t", recorderImage, recDir)
	return cfg, bin
}

// checkImageConfig: what podman built says what the Dockerfile says.
func checkImageConfig(t *testing.T, p *podman, want finalConfig) {
	t.Helper()
	var got []struct {
		Config struct {
			User         string
			Entrypoint   []string
			Cmd          []string
			Env          []string
			Volumes      map[string]struct{}
			ExposedPorts map[string]struct{}
		}
		HealthCheck *struct{ Test []string }
	}
	if err := json.Unmarshal([]byte(p.run("image", "inspect", imageName)), &got); err != nil || len(got) != 1 {
		t.Fatalf("image inspect: %v (%d images)", err, len(got))
	}
	c := got[0].Config
	if c.User != want.user {
		t.Errorf("image user %q, Dockerfile USER %q", c.User, want.user)
	}
	if !slices.Equal(c.Entrypoint, want.entrypoint) || !slices.Equal(c.Cmd, want.cmd) {
		t.Errorf("image entrypoint %v cmd %v, Dockerfile %v %v", c.Entrypoint, c.Cmd, want.entrypoint, want.cmd)
	}
	for _, v := range want.volumes {
		if _, ok := c.Volumes[v]; !ok {
			t.Errorf("image volumes %v lack %s", c.Volumes, v)
		}
	}
	for k, v := range want.env {
		if !slices.Contains(c.Env, k+"="+v) {
			t.Errorf("image env %v lacks %s=%s", c.Env, k, v)
		}
	}
	for _, e := range want.expose {
		if _, ok := c.ExposedPorts[e+"/tcp"]; !ok && !strings.Contains(e, "/") {
			t.Errorf("image exposes %v, not %s", c.ExposedPorts, e)
		}
	}
	if hc := got[0].HealthCheck; hc == nil || !slices.Equal(hc.Test, append([]string{"CMD"}, want.healthcheck...)) {
		t.Errorf("image health check %+v, Dockerfile CMD %v", hc, want.healthcheck)
	}
}

// writeKey writes an Ed25519 PKCS#8 PEM key, mode 0600, owned by uid.
func writeKey(t *testing.T, p *podman, path string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	p.chown(path, p.uid)
}

// mintHS256 signs claims as a compact HS256 JWT, as a local authorization
// server holding the same secret would.
func mintHS256(secret []byte, claims map[string]any) (string, error) {
	enc := base64.RawURLEncoding.EncodeToString
	body, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("encode claims: %w", err)
	}
	input := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc(body)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(input))
	return input + "." + enc(mac.Sum(nil)), nil
}

// freePort picks a loopback port for the server's published port; the
// resource URL (and so the tokens' audience) must name it before start.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	return port
}

// composeRun translates one compose service into `podman run` arguments:
// user, read-only root, capabilities, no-new-privileges, network, limits,
// secrets and configs as read-only files, named volumes, subpath volumes as
// bind mounts of the volume's subdirectory (podman 4.3 has no subpath),
// published ports. secrets maps a secret name to its file on this machine.
func composeRun(t *testing.T, p *podman, name string, s composeService, secrets map[string]string, port string) []string {
	t.Helper()
	args := []string{"--name", name, "--user", s.User,
		// Podman's defaults would add writable tmpfs on /tmp, /run and
		// /var/tmp and a passwd entry: off, so that guard/ is the only
		// writable path, as under Docker.
		"--read-only-tmpfs=false", "--passwd=false",
		"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"}
	if s.ReadOnly {
		args = append(args, "--read-only")
	}
	for _, c := range s.CapDrop {
		args = append(args, "--cap-drop", c)
	}
	for _, o := range s.SecurityOpt {
		args = append(args, "--security-opt", strings.Replace(o, ":true", "", 1))
	}
	if s.NetworkMode != "" {
		args = append(args, "--network", s.NetworkMode)
	}
	if l := s.Deploy.Resources.Limits; !p.rootless { // rootless cgroupfs cannot limit
		if l.CPUs != "" {
			args = append(args, "--cpus", l.CPUs)
		}
		if l.Memory != "" {
			args = append(args, "--memory", strings.ToLower(l.Memory))
		}
		if l.Pids != 0 {
			args = append(args, "--pids-limit", strconv.Itoa(l.Pids))
		}
	}
	for _, sec := range s.Secrets {
		file, ok := secrets[sec]
		if !ok {
			t.Fatalf("service %s: no file for secret %s", name, sec)
		}
		args = append(args, "-v", file+":/run/secrets/"+sec+":ro")
	}
	c := loadCompose(t)
	for _, cf := range s.Configs {
		ref := c.Configs[cf.Source]
		abs, err := filepath.Abs(ref.File)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-v", abs+":"+cf.Target+":ro")
	}
	for _, m := range s.Volumes {
		if m.Type == "bind" {
			// The operator's directory: the test's stand-in for it.
			dir, ok := secrets["bind:"+m.Source]
			if !ok || !m.ReadOnly {
				t.Fatalf("service %s: bind mount %s (read-only %v) has no stand-in, or is writable", name, m.Source, m.ReadOnly)
			}
			args = append(args, "-v", dir+":"+m.Target+":ro")
			continue
		}
		if m.Type != "volume" {
			t.Fatalf("service %s: mount type %q is not translated", name, m.Type)
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		src := m.Source
		if m.Volume.Subpath != "" {
			src = filepath.Join(volumePath(t, p, m.Source), m.Volume.Subpath)
		}
		args = append(args, "-v", src+":"+m.Target+":"+mode)
	}
	for _, pt := range s.Ports {
		parts := strings.Split(pt, ":")
		if len(parts) != 3 {
			t.Fatalf("service %s: port %q is not HOST_IP:HOST_PORT:CONTAINER_PORT", name, pt)
		}
		args = append(args, "-p", parts[0]+":"+port+":"+parts[2])
	}
	if s.Entrypoint != nil {
		args = append(args, "--entrypoint", mustJSON(t, s.Entrypoint))
	}
	return args
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func volumePath(t *testing.T, p *podman, name string) string {
	t.Helper()
	return strings.TrimSpace(p.run("volume", "inspect", "--format", "{{.Mountpoint}}", name))
}

// serverCommand is the compose server's command with its JWKS swapped for
// an HS256 secret file and the public URL set to the published port.
func serverCommand(t *testing.T, cmd []string, hmacPath, publicURL string) []string {
	t.Helper()
	var out []string
	for i := 0; i < len(cmd); i++ {
		switch cmd[i] {
		case "--auth-jwks", "--public-url", "--auth-issuer":
			i++ // dropped with its value; set below
		default:
			out = append(out, cmd[i])
		}
	}
	return append(out, "--auth-hmac-secret", hmacPath, "--auth-issuer", testIssuer, "--public-url", publicURL)
}

// processUIDs lists the uids of a
// container's processes: the user of each (podman top) and, when podman
// runs as root (no user namespace), the main process's /proc uids.
func processUIDs(t *testing.T, p *podman, ctr string) []string {
	t.Helper()
	out := p.run("top", ctr, "user", "huser", "pid", "args")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 {
		t.Fatalf("podman top %s: %q", ctr, out)
	}
	var users []string
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		users = append(users, f[0])
	}
	if !p.rootless {
		pid := strings.TrimSpace(p.run("inspect", "--format", "{{.State.Pid}}", ctr))
		status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
				users = append(users, strings.Fields(rest)...)
			}
		}
	}
	return users
}

// snapshot lists every file under dir (relative path → size and mode).
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = fmt.Sprintf("%v %d %d", info.Mode(), info.Size(), info.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestContainer builds the images once, then checks the image against the
// Dockerfile, runs the compose topology, and the defaults without HOME.
func TestContainer(t *testing.T) {
	p := newPodman(t)
	start := time.Now()
	t.Logf("podman %s, rootless=%v", strings.TrimSpace(p.run("version", "--format", "{{.Client.Version}}")), p.rootless)
	cfg, bin := buildImages(t, p)
	t.Logf("binaries and images built in %v", time.Since(start).Round(time.Millisecond))
	t.Run("image matches the Dockerfile", func(t *testing.T) { checkImageConfig(t, p.with(t), cfg) })
	t.Run("compose topology", func(t *testing.T) { containerTopology(t, p.with(t), bin) })
	t.Run("defaults without HOME", func(t *testing.T) { containerDefaultsWithoutHome(t, p.with(t), cfg) })
	t.Run("server.json package over stdio", func(t *testing.T) { containerManifestStdio(t, p.with(t)) })
	t.Run("PostgreSQL store from the image", func(t *testing.T) { containerPostgresStore(t, p.with(t)) })
	t.Run("compose.ingest.yaml's replicas from the image", func(t *testing.T) { containerIngest(t, p.with(t), bin) })
	t.Run("docs/operations.md's podman run", func(t *testing.T) { containerDocsRun(t, p.with(t), bin) })
	t.Run("port mapping with --http-allowed-host", func(t *testing.T) { containerPortMapping(t, p.with(t)) })
	t.Run("offline build from a vendored context", func(t *testing.T) { containerOfflineBuild(t, p.with(t)) })
}

// containerPostgresStore runs the image's binary against a real PostgreSQL
// (the test server, over the host's network) the way the PostgreSQL
// manifests do: read-only root, the DSN only in HAIA_STORE, `store migrate
// --grant ROLE` first as the tables' owner, then the CLI on the migrated
// store as ROLE, which owns nothing.
func containerPostgresStore(t *testing.T, p *podman) {
	owner := pgtest.Database(t, pgtest.DSN(t))
	runtime, role := pgtest.AsRuntime(t, owner)
	run := func(dsn string) []string {
		return []string{"run", "--rm", "--no-healthcheck", "--read-only", "--read-only-tmpfs=false", "--network", "host", "--cap-drop", "ALL",
			"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--env", "HAIA_STORE=" + dsn, "--entrypoint", "/haia-trace-mcp", imageName}
	}
	steps := []struct {
		dsn  string
		args []string
		want string
	}{
		{owner, []string{"store", "migrate", "--grant", role}, fmt.Sprintf("schema version 0 → %d", latestSchema(t))},
		{owner, []string{"store", "migrate", "--grant", role}, "granted " + role},
		{runtime, []string{"review", "list", "--dir", "/trace"}, "no pending reviews"},
		{runtime, []string{"chain", "list"}, ""},
	}
	secrets := []string{"haia_ci:haia_ci@", ":haia@"}
	if u, err := url.Parse(runtime); err == nil {
		if pw, ok := u.User.Password(); ok {
			secrets = append(secrets, ":"+pw+"@")
		}
	}
	for _, st := range steps {
		out, errOut, code := p.try(append(run(st.dsn), st.args...)...)
		if code != 0 || !strings.Contains(out+errOut, st.want) {
			t.Fatalf("%s in the image: exit %d, want %q\n%s%s", strings.Join(st.args, " "), code, st.want, out, errOut)
		}
		for _, s := range secrets {
			if strings.Contains(out+errOut, s) {
				t.Fatalf("%s printed the DSN's password:\n%s%s", strings.Join(st.args, " "), out, errOut)
			}
		}
	}
}

// containerManifestStdio runs the image the way server.json tells an MCP
// host to (its runtime and package arguments, podman standing in for
// docker), and speaks MCP over stdio with the official Go SDK.
func containerManifestStdio(t *testing.T, p *podman) {
	m := loadManifest(t)
	pkg := m.Packages[0]
	trace, cfgDir := t.TempDir(), t.TempDir()
	for _, d := range []string{trace, filepath.Join(trace, "events"), filepath.Join(trace, "guard"), cfgDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		p.chown(d, p.uid)
	}
	values := map[string]string{"trace_root": trace, "config_dir": cfgDir, "agent_id": "registry-host"}
	args := slices.Concat(p.global, []string{"run", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"},
		argv(t, pkg.RuntimeArguments, values), []string{imageName}, argv(t, pkg.PackageArguments, values))
	client := mcp.NewClient(&mcp.Implementation{Name: "registry-host", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.Command("podman", args...)
	cmd.Stderr = &stderr
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect over stdio to the manifest's command line: %v\n%s", err, stderr.String())
	}
	defer cs.Close()
	var check struct {
		Decision string `json:"decision"`
	}
	callJSON(t, cs, "check_before_pay", map[string]any{"counterparty": sellerSilent, "amount": "0.10"}, &check)
	if check.Decision == "" {
		t.Errorf("check_before_pay over stdio gave no decision")
	}
	cs.Close()
	if _, err := os.Stat(filepath.Join(cfgDir, "signing-key.pem")); err != nil {
		t.Errorf("the signing key was not created in the config_dir mount: %v\n%s", err, stderr.String())
	}
}

// with returns p reporting to t (a subtest).
func (p *podman) with(t *testing.T) *podman {
	c := *p
	c.t = t
	return &c
}

func containerTopology(t *testing.T, p *podman, bin string) {
	start := time.Now()

	compose := loadCompose(t)
	srvName, srv := serverService(t, compose)
	var signerName string
	for n, s := range compose.Services {
		if len(s.Entrypoint) > 1 && s.Entrypoint[1] == "signer" {
			signerName = n
		}
	}
	signer := compose.Services[signerName]
	initSvc, ok := compose.Services["trace-init"]
	if !ok {
		t.Fatal("compose has no trace-init service")
	}

	// Secrets: the signing key, the paramsHash key and the HS256 secret
	// (instead of the JWKS), each 0600 and owned by the image's user.
	secDir := t.TempDir()
	secrets := map[string]string{}
	for _, sec := range slices.Concat(signer.Secrets, srv.Secrets) {
		path := filepath.Join(secDir, sec)
		switch sec {
		case "jwks.json": // replaced by the HMAC secret
			continue
		case "reviewers.json":
			// The human's own key, made on the host as a reviewer would;
			// only the public half reaches the server.
			rk := filepath.Join(secDir, "reviewer-key")
			if out, err := exec.Command(bin, "reviewer", "init", "--id", "ops@example.com", "--key-file", rk, "--reviewers", path).CombinedOutput(); err != nil {
				t.Fatalf("reviewer init: %v\n%s", err, out)
			}
			p.chown(rk, p.uid)
			p.chown(path, p.uid)
			secrets[sec] = path
			secrets["reviewer-key"] = rk
			continue
		}
		writeKey(t, p, path)
		secrets[sec] = path
	}
	hmacSecret := make([]byte, 32)
	if _, err := rand.Read(hmacSecret); err != nil {
		t.Fatal(err)
	}
	hmacText := []byte(hex.EncodeToString(hmacSecret))
	secrets["hmac-secret"] = filepath.Join(secDir, "hmac-secret")
	if err := os.WriteFile(secrets["hmac-secret"], hmacText, 0o600); err != nil {
		t.Fatal(err)
	}
	p.chown(secrets["hmac-secret"], p.uid)
	srv.Secrets = append(slices.DeleteFunc(slices.Clone(srv.Secrets), func(s string) bool { return s == "jwks.json" }), "hmac-secret")

	for v := range compose.Volumes {
		p.try("volume", "rm", "-f", v)
		p.run("volume", "create", v)
		t.Cleanup(func() { p.with(t).try("volume", "rm", "-f", v) })
	}
	port := freePort(t)
	publicURL := "http://127.0.0.1:" + port
	resource := publicURL + "/mcp"

	// trace-init: the first mount of the empty volume copies the image's
	// /trace (events/, guard/, owned by the image's user) into it.
	p.run(append(append([]string{"run", "--rm"}, composeRun(t, p, "trace-init", initSvc, secrets, port)...), imageName)...)
	traceDir := volumePath(t, p, "trace")
	for _, d := range []string{"events", "guard"} {
		if uid := p.owner(filepath.Join(traceDir, d)); uid != p.uid {
			t.Fatalf("the trace volume's %s/ is owned by uid %d after trace-init, want %d", d, uid, p.uid)
		}
	}

	p.run(append(append(append([]string{"run", "-d"}, composeRun(t, p, signerName, signer, secrets, port)...), imageName), signer.Command...)...)
	t.Cleanup(func() { p.with(t).try("rm", "-f", "-t", "2", signerName) })
	// The server needs the socket at start (it dials the signer).
	sockDir := volumePath(t, p, "signer-socket")
	waitFor(t, p, signerName, "the signer's socket", func() bool {
		_, err := os.Stat(filepath.Join(sockDir, "signer.sock"))
		return err == nil
	})

	cmd := serverCommand(t, srv.Command, "/run/secrets/hmac-secret", publicURL)
	p.run(append(append(append([]string{"run", "-d"}, composeRun(t, p, srvName, srv, secrets, port)...), imageName), cmd...)...)
	t.Cleanup(func() { p.with(t).try("rm", "-f", "-t", "2", srvName) })
	logs := func() string { out, errOut, _ := p.try("logs", srvName); return out + errOut }
	waitFor(t, p, srvName, "the server's /healthz", func() bool {
		resp, err := http.Get(publicURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	t.Logf("trace-init, signer and server up in %v", time.Since(start).Round(time.Millisecond))

	// The image's own HEALTHCHECK, run by podman inside the container.
	if out, errOut, code := p.try("healthcheck", "run", srvName); code != 0 {
		t.Errorf("podman healthcheck run: exit %d %s%s", code, out, errOut)
	}

	// Non-root, read-only, no network for the signer.
	for _, ctr := range []string{srvName, signerName} {
		for _, u := range processUIDs(t, p, ctr) {
			if u != strconv.Itoa(p.uid) {
				t.Errorf("container %s: a process runs as %q, want uid %d only", ctr, u, p.uid)
			}
		}
		if ro := strings.TrimSpace(p.run("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", ctr)); ro != "true" {
			t.Errorf("container %s: read-only root filesystem is %s", ctr, ro)
		}
	}
	if nm := strings.TrimSpace(p.run("inspect", "--format", "{{.HostConfig.NetworkMode}}", signerName)); nm != "none" {
		t.Errorf("signer network mode %q, want none", nm)
	}

	// A recorder in its own container writes a run into events/ of the
	// shared volume after the server started.
	p.run("run", "--rm", "--read-only", "--network", "none", "--cap-drop", "ALL", "--read-only-tmpfs=false", "--passwd=false",
		"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096",
		"-v", filepath.Join(traceDir, "events")+":/trace/events:rw", recorderImage,
		"--root", "/trace", "--run", "run-container", "--seller-settles", sellerSettles, "--seller-silent", sellerSilent)
	recorded := snapshot(t, traceDir)
	if _, ok := recorded["events/run-container.ndjson"]; !ok {
		t.Fatalf("the recorder wrote no events/run-container.ndjson: %v", recorded)
	}

	// An agent over HTTP with an HS256 token for this resource.
	token, err := mintHS256(hmacText, map[string]any{"iss": testIssuer, "aud": resource, "sub": "container-agent",
		"scope": "trace:read trace:guard", "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Post(resource, "application/json", strings.NewReader(`{}`)); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a request without a token: HTTP %d, want 401", resp.StatusCode)
	}
	cs := connectHTTP(t, resource, token)
	var ops struct {
		Operations []struct {
			RunID       string `json:"run_id"`
			OperationID string `json:"operation_id"`
		} `json:"operations"`
	}
	callJSON(t, cs, "list_operations", map[string]any{}, &ops)
	seen := map[string]bool{}
	for _, o := range ops.Operations {
		if o.RunID == "run-container" {
			seen[o.OperationID] = true
		}
	}
	if !seen["op-settled"] || !seen["op-silent"] {
		t.Fatalf("the server does not list the recorder's operations: %+v\n%s", ops, logs())
	}
	var check struct {
		Decision string `json:"decision"`
		ReviewID string `json:"review_id"`
	}
	callJSON(t, cs, "check_before_pay", map[string]any{"counterparty": sellerSilent, "amount": "0.10"}, &check)
	if check.Decision != "review" || check.ReviewID == "" {
		t.Fatalf("check_before_pay for the silent seller: %+v, want a review", check)
	}

	// The human rejects it with a key of their own, which the server never
	// holds: from a one-off container of the same image that sees the Trace
	// root (guard/ writable) and the reviewer's key, and has no network.
	traceHost := volumePath(t, p, "trace")
	reject := []string{"run", "--rm", "--no-healthcheck", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--network", "none", "--user", srv.User, "--read-only",
		"-v", "trace:/trace:ro", "-v", filepath.Join(traceHost, "guard") + ":/trace/guard",
		"-v", secrets["reviewer-key"] + ":/run/secrets/reviewer-key:ro", "-v", secrets["reviewers.json"] + ":/run/secrets/reviewers.json:ro",
		"--entrypoint", "/haia-trace-mcp", imageName,
		"review", "reject", check.ReviewID, "--dir", "/trace", "--note", "seller never settled",
		"--reviewer-key", "/run/secrets/reviewer-key", "--reviewers", "/run/secrets/reviewers.json"}
	if out, errOut, code := p.try(reject...); code != 0 {
		t.Fatalf("review reject from the reviewer's container: exit %d\n%s%s", code, out, errOut)
	}
	// ...and the server's own container shows it, as podman exec reads it.
	if out, errOut, code := p.try("exec", srvName, "/haia-trace-mcp", "review", "show", check.ReviewID, "--dir", "/trace",
		"--reviewers", "/run/secrets/reviewers.json"); code != 0 || !strings.Contains(out, "rejected") || !strings.Contains(out, "ops@example.com") {
		t.Fatalf("review show through podman exec: exit %d\n%s%s", code, out, errOut)
	}
	var status struct {
		Status string `json:"status"`
	}
	callJSON(t, cs, "get_review_status", map[string]any{"review_id": check.ReviewID}, &status)
	if status.Status != "rejected" {
		t.Errorf("get_review_status after the rejection: %+v", status)
	}
	cs.Close()

	// The decisions verify, read inside the container.
	list := strings.Fields(p.run("exec", srvName, "/haia-trace-mcp", "chain", "list", "--dir", "/trace"))
	if len(list) < 2 {
		t.Fatalf("chain list: %q", list)
	}
	if out, errOut, code := p.try("exec", srvName, "/haia-trace-mcp", "verify", list[1], "--keyring", "/trace/guard/keyring.json"); code != 0 || !strings.Contains(out, "VALID") {
		t.Errorf("verify in the container: exit %d\n%s%s", code, out, errOut)
	}

	// Writes: only guard/ changed in the volume; the containers' own
	// filesystems show nothing but the runtime's mount points.
	after := snapshot(t, traceDir)
	for path, v := range recorded {
		if strings.HasPrefix(path, "guard"+string(filepath.Separator)) || path == "guard" {
			continue
		}
		if after[path] != v {
			t.Errorf("%s changed outside guard/: %q → %q", path, v, after[path])
		}
	}
	var guardFiles int
	for path := range after {
		if _, ok := recorded[path]; !ok {
			if !strings.HasPrefix(path, "guard"+string(filepath.Separator)) {
				t.Errorf("%s appeared outside guard/", path)
			}
			guardFiles++
		}
	}
	if guardFiles == 0 {
		t.Error("nothing was written in guard/")
	}
	for _, ctr := range []string{srvName, signerName} {
		checkDiff(t, p, ctr)
	}
	if socks := snapshot(t, volumePath(t, p, "signer-socket")); len(socks) != 2 {
		t.Errorf("the socket volume holds %v; want only signer.sock", socks)
	}
	if !strings.Contains(logs(), "serving MCP over Streamable HTTP") {
		t.Errorf("server logs:\n%s", logs())
	}
	t.Logf("topology checked in %v", time.Since(start).Round(time.Millisecond))
}

// containerDefaultsWithoutHome: in the image, with no key flags, the
// defaults go to HAIA_CONFIG_DIR. On a read-only root with nothing mounted
// there, the server refuses to start and names the flag; with a writable
// mount, it creates its key there and serves.
func containerDefaultsWithoutHome(t *testing.T, p *podman, cfg finalConfig) {
	dir := cfg.env["HAIA_CONFIG_DIR"]
	base := []string{"run", "--rm", "--read-only", "--read-only-tmpfs=false", "--network", "none",
		"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--entrypoint", "/haia-trace-mcp"}
	cases := []struct {
		name     string
		opts     []string
		wantCode int
		want     string
	}{
		{"nothing mounted", nil, 1, "--key-file"},
		{"no HAIA_CONFIG_DIR, HOME=/", []string{"--env", "HAIA_CONFIG_DIR=", "--env", "HOME=/"}, 1, "HAIA_CONFIG_DIR"},
		// A fresh named volume starts as the image's directory: owned by
		// the image's user, mode 0700.
		{"a volume on it", []string{"-v", "haia-config:" + dir}, 0, `"key_file":"` + dir + `/signing-key.pem"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append(append(append([]string{}, base...), c.opts...), imageName, "--dir", "/trace")
			out, errOut, code := p.try(args...)
			if code != c.wantCode || !strings.Contains(errOut, c.want) {
				t.Errorf("exit %d, want %d with %q in stderr:\n%s%s", code, c.wantCode, c.want, out, errOut)
			}
			if strings.Contains(errOut, "mkdir /.config") {
				t.Errorf("the server tried to create /.config:\n%s", errOut)
			}
		})
	}
	vol := volumePath(t, p, "haia-config")
	key := filepath.Join(vol, "signing-key.pem")
	st, err := os.Stat(key)
	if err != nil {
		t.Fatalf("no key in the volume: %v", err)
	}
	if st.Mode().Perm() != 0o600 || p.owner(key) != p.uid || p.owner(vol) != p.uid {
		t.Errorf("key %v owned by %d in a directory owned by %d; want 0600, both uid %d", st.Mode(), p.owner(key), p.owner(vol), p.uid)
	}
}

// checkDiff fails on any change in a container's root filesystem that is
// not a mount point the runtime made (or a directory leading to one).
func checkDiff(t *testing.T, p *podman, ctr string) {
	t.Helper()
	var ms []struct{ Destination string }
	if err := json.Unmarshal([]byte(p.run("inspect", "--format", "{{json .Mounts}}", ctr)), &ms); err != nil {
		t.Fatalf("inspect %s mounts: %v", ctr, err)
	}
	var mounts []string
	for _, m := range ms {
		mounts = append(mounts, m.Destination)
	}
	// The runtime bind-mounts these into /etc of every container.
	mounts = append(mounts, "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv")
	for _, line := range strings.Split(strings.TrimSpace(p.run("diff", ctr)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		path := f[1]
		ok := false
		for _, m := range mounts {
			if path == m || strings.HasPrefix(m, path+"/") {
				ok = true
			}
		}
		if !ok {
			t.Errorf("container %s: %s %s in its root filesystem, not a mount point", ctr, f[0], path)
		}
	}
}

// waitFor polls cond until it holds, while ctr runs, for at most a minute
// (start-up, not a timed assertion), failing with the container's logs.
func waitFor(t *testing.T, p *podman, ctr, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		state := strings.TrimSpace(p.run("inspect", "--format", "{{.State.Status}}", ctr))
		if state != "running" || time.Now().After(deadline) {
			out, errOut, _ := p.try("logs", ctr)
			t.Fatalf("%s not ready (container %s is %s):\n%s%s", what, ctr, state, out, errOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bearerTransport adds the token to every request of the SDK client.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func connectHTTP(t *testing.T, resource, token string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "container-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: resource, HTTPClient: &http.Client{Transport: bearerTransport{token}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect to %s: %v", resource, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callJSON(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %+v", tool, res.Content)
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v in %s", tool, err, b)
	}
}

// latestSchema is the newest migration this checkout's binary carries: the
// highest numbered file in reviewlog/pgstore/migrations, so the image's
// `store migrate` is held to the migrations of the same commit.
func latestSchema(t *testing.T) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "reviewlog", "pgstore", "migrations", "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations found under reviewlog/pgstore/migrations (%v)", err)
	}
	latest := 0
	for _, f := range files {
		var v int
		if _, err := fmt.Sscanf(filepath.Base(f), "%d_", &v); err != nil {
			t.Fatalf("migration %s: its name does not start with a version: %v", f, err)
		}
		latest = max(latest, v)
	}
	return latest
}
