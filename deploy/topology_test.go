package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// The topology tests start the real binary the way each shipped
// Kubernetes topology starts the image: the image's ENTRYPOINT and ENV
// (from the Dockerfile), the container's args and env, the pod's volumes
// laid out at their mount paths (Secrets and ConfigMaps as files, with the
// manifest's data where it is real and test keys where it is a
// placeholder), the init containers run first, the user the pod runs as,
// read-only mounts unwritable. Then they wait for the readiness probe as
// the kubelet would (its path and port, within the startup probe's budget)
// and ask a question end to end over MCP with a token. A manifest whose
// probe cannot pass fails here.
//
// Two things differ from a cluster, both forced by running without one:
// the pod's filesystem is a directory (every absolute path the manifests
// name is taken under it), and the listen port is a free one instead of
// 3000 (a pod has its own network namespace; this machine does not).

// pod is one pod laid out on this machine.
type pod struct {
	t      *testing.T
	fsroot string            // the pod's "/"
	uid    int               // the pod's runAsUser when the test runs as root; else -1
	env    map[string]string // the image's ENV
	bin    string
	port   string // the free port standing in for containerPort
	// volumeDir is where each volume of the pod lives on this machine.
	volumeDir map[string]string
	// grant stands in for the role a `store migrate --grant ROLE` names:
	// the manifest's is the one the DBA creates; the test server's role
	// that owns nothing is pgtest's runtime role, which the server's DSN
	// names.
	grant string
}

// at is where a path of the image's own filesystem lives on this machine.
func (p *pod) at(path string) string { return filepath.Join(p.fsroot, filepath.FromSlash(path)) }

// in is where path, as container c sees it, lives on this machine: under
// the volume mounted at the longest prefix of it, else in the image.
func (p *pod) in(c corev1.Container, path string) string {
	best := -1
	for i, m := range c.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if (path == mp || strings.HasPrefix(path, mp+"/")) && (best < 0 || len(mp) > len(c.VolumeMounts[best].MountPath)) {
			best = i
		}
	}
	if best < 0 {
		return p.at(path)
	}
	m := c.VolumeMounts[best]
	rest := strings.TrimPrefix(path, strings.TrimSuffix(m.MountPath, "/"))
	return filepath.Join(p.volumeDir[m.Name], filepath.FromSlash(m.SubPath), filepath.FromSlash(rest))
}

// rewrite maps one argument's absolute paths (also behind unix:), as
// container c sees them, onto this machine, and the image's listen
// address onto the free port.
func (p *pod) rewrite(c corev1.Container, arg string) string {
	switch {
	case strings.HasPrefix(arg, "unix:/"):
		return "unix:" + p.in(c, strings.TrimPrefix(arg, "unix:"))
	case strings.HasPrefix(arg, "/"):
		return p.in(c, arg)
	case strings.HasSuffix(arg, ":3000") && !strings.Contains(arg, "/"):
		host, _, _ := strings.Cut(arg, ":")
		return host + ":" + p.port
	}
	return arg
}

// own gives path to the pod's user (a writable volume under fsGroup).
func (p *pod) own(path string) {
	p.t.Helper()
	if p.uid < 0 {
		return
	}
	if err := os.Lchown(path, p.uid, p.uid); err != nil {
		p.t.Fatal(err)
	}
}

// testSecrets is what the test puts in place of a Secret's placeholder,
// by key: the keys the pod needs, made fresh.
func testSecrets(t *testing.T, bin, dir string, iss *authtest.Issuer, dsn string) map[string][]byte {
	t.Helper()
	key := func() []byte {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	reviewers := filepath.Join(dir, "reviewers.json")
	if out, err := exec.Command(bin, "reviewer", "init", "--id", "ops@example.com", "--key-file", filepath.Join(dir, "reviewer.key"), "--reviewers", reviewers).CombinedOutput(); err != nil {
		t.Fatalf("reviewer init: %v\n%s", err, out)
	}
	read := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return map[string][]byte{
		"signing.key":    key(),
		"params.key":     key(),
		"jwks.json":      read(iss.JWKSPath),
		"reviewers.json": read(reviewers),
		runtimeDSNKey:    []byte(dsn),
	}
}

// layOut creates the pod's volumes. A volume the server or the signer
// mounts sits where they see it (both must agree); a volume only an init
// container mounts sits apart, under /.volumes.
func (p *pod) layOut(spec *corev1.PodSpec, objs []k8sObject, secrets map[string][]byte) {
	t := p.t
	t.Helper()
	p.volumeDir = map[string]string{}
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			dir := p.at(strings.TrimSuffix(strings.TrimSuffix(m.MountPath, m.SubPath), "/"))
			if prev, ok := p.volumeDir[m.Name]; ok && prev != dir {
				t.Fatalf("volume %s is seen at %s and at %s by the pod's containers: the test lays a volume out at one place", m.Name, prev, dir)
			}
			p.volumeDir[m.Name] = dir
		}
	}
	for _, c := range spec.InitContainers {
		for _, m := range c.VolumeMounts {
			if _, ok := p.volumeDir[m.Name]; !ok {
				p.volumeDir[m.Name] = p.at("/.volumes/" + m.Name)
			}
		}
	}
	// The image's own directories (the Dockerfile's layout), owned by
	// root: the read-only root filesystem.
	for _, d := range []string{"/trace", "/etc/haia-trace-mcp", "/run/haia-signer"} {
		if err := os.MkdirAll(p.at(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range spec.Volumes {
		dir, ok := p.volumeDir[v.Name]
		if !ok {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case v.Secret != nil:
			s := find[*corev1.Secret](t, objs, v.Secret.SecretName)
			mode := os.FileMode(0o644)
			if v.Secret.DefaultMode != nil {
				mode = os.FileMode(*v.Secret.DefaultMode)
			}
			for k := range s.StringData {
				data, ok := secrets[k]
				if !ok {
					t.Fatalf("Secret %s key %s: the test has no value for it", s.Name, k)
				}
				p.writeVolumeFile(filepath.Join(dir, k), data, mode)
			}
		case v.ConfigMap != nil:
			cm := find[*corev1.ConfigMap](t, objs, v.ConfigMap.Name)
			mode := os.FileMode(0o644)
			if v.ConfigMap.DefaultMode != nil {
				mode = os.FileMode(*v.ConfigMap.DefaultMode)
			}
			for k, data := range cm.Data {
				p.writeVolumeFile(filepath.Join(dir, k), []byte(data), mode)
			}
		case v.EmptyDir != nil, v.PersistentVolumeClaim != nil:
			// Writable by the pod's user (fsGroup); a read-only mount is
			// made so once the recorder has written (see readOnly).
			p.own(dir)
		default:
			t.Fatalf("volume %s: a kind the test does not lay out", v.Name)
		}
	}
}

// readOnly makes what container c mounts read-only unwritable for the
// pod's user: its directories root's, mode 0755.
func (p *pod) readOnly(c corev1.Container) {
	p.t.Helper()
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly {
			continue
		}
		err := filepath.Walk(p.in(c, m.MountPath), func(path string, info os.FileInfo, err error) error {
			if err != nil || !info.IsDir() {
				return err
			}
			if p.uid >= 0 {
				if err := os.Lchown(path, 0, 0); err != nil {
					return err
				}
				return os.Chmod(path, 0o755)
			}
			return os.Chmod(path, 0o555)
		})
		if err != nil {
			p.t.Fatal(err)
		}
	}
}

// writeVolumeFile writes a Secret or ConfigMap file as the kubelet
// presents it under fsGroup: root-owned, group the pod's, the mode given.
func (p *pod) writeVolumeFile(path string, data []byte, mode os.FileMode) {
	p.t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		p.t.Fatal(err)
	}
	if p.uid >= 0 {
		if err := os.Lchown(path, 0, p.uid); err != nil {
			p.t.Fatal(err)
		}
	}
}

// runInit runs one init container: the image's binary as its command
// says, or the two shell shapes the manifests use in busybox (mkdir -p;
// umask 077 && cp -f SRC DST && chmod 0600 DST), done by the test.
func (p *pod) runInit(c corev1.Container, env []string) {
	t := p.t
	t.Helper()
	argv := slices.Concat(c.Command, c.Args)
	switch {
	case len(argv) > 0 && argv[0] == binaryName:
		args := slices.Clone(argv[1:])
		if i := slices.Index(args, "--grant"); i >= 0 && i+1 < len(args) {
			if p.grant == "" {
				t.Fatalf("init container %s grants %s, and the test has no role to stand in for it", c.Name, args[i+1])
			}
			args[i+1] = p.grant
		}
		p.exec(c, args, env)
	case len(argv) > 2 && argv[0] == "/bin/mkdir" && argv[1] == "-p":
		for _, d := range argv[2:] {
			if err := os.MkdirAll(p.in(c, d), 0o755); err != nil {
				t.Fatal(err)
			}
			p.own(p.in(c, d))
		}
	case len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c":
		f := strings.Fields(argv[2])
		if len(f) != 11 || strings.Join([]string{f[0], f[1], f[2], f[3], f[4], f[7], f[8], f[9]}, " ") != "umask 077 && cp -f && chmod 0600" || f[6] != f[10] {
			t.Fatalf("init container %s: %q is not a shape the test runs", c.Name, argv[2])
		}
		data, err := os.ReadFile(p.in(c, f[5]))
		if err != nil {
			t.Fatalf("init container %s: %v", c.Name, err)
		}
		dst := p.in(c, f[6])
		if err := os.WriteFile(dst, data, 0o600); err != nil {
			t.Fatal(err)
		}
		p.own(dst)
	default:
		t.Fatalf("init container %s: command %q is not one the test knows how to run", c.Name, argv)
	}
}

// command is the binary started as a container of the pod.
func (p *pod) command(ctx context.Context, c corev1.Container, args []string, env []string) *exec.Cmd {
	rewritten := make([]string, len(args))
	for i, a := range args {
		rewritten[i] = p.rewrite(c, a)
	}
	cmd := exec.CommandContext(ctx, p.bin, rewritten...)
	cmd.Env = env
	cmd.Dir = p.fsroot
	if p.uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(p.uid), Gid: uint32(p.uid)}}
	}
	return cmd
}

// exec runs a one-shot container to completion.
func (p *pod) exec(c corev1.Container, args []string, env []string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := p.command(ctx, c, args, env).CombinedOutput()
	if err != nil {
		p.t.Fatalf("container %s (%q): %v\n%s", c.Name, args, err, out)
	}
}

// proc is a long-running container.
type proc struct {
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
}

func (pr *proc) String() string { pr.mu.Lock(); defer pr.mu.Unlock(); return pr.logs.String() }

func (p *pod) start(c corev1.Container, args, env []string) *proc {
	p.t.Helper()
	name := c.Name
	ctx, cancel := context.WithCancel(context.Background())
	cmd := p.command(ctx, c, args, env)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	pr := &proc{done: make(chan struct{})}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		cancel()
		p.t.Fatalf("container %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			pr.mu.Lock()
			pr.logs.WriteString(sc.Text() + "\n")
			pr.mu.Unlock()
		}
		_ = cmd.Wait()
		close(pr.done)
	}()
	p.t.Cleanup(func() { cancel(); <-pr.done })
	return pr
}

// containerEnv is the environment a container starts with: the image's
// ENV, then the container's env (a secretKeyRef read from the Secret as
// the test filled it).
func (p *pod) containerEnv(c corev1.Container, objs []k8sObject, secrets map[string][]byte) []string {
	p.t.Helper()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/"}
	for k, v := range p.env {
		env = append(env, k+"="+p.rewrite(c, v))
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s := find[*corev1.Secret](p.t, objs, ref.Name)
			if _, ok := s.StringData[ref.Key]; !ok {
				p.t.Fatalf("env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			env = append(env, e.Name+"="+string(secrets[ref.Key]))
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+p.rewrite(c, e.Value))
		default:
			p.t.Fatalf("env %s: a source the test does not read", e.Name)
		}
	}
	return env
}

// probe is one kubelet HTTP probe: success is a status in 200–399.
func (p *pod) probe(pr *corev1.Probe) (int, string, error) {
	if pr == nil || pr.HTTPGet == nil {
		return 0, "", fmt.Errorf("not an httpGet probe")
	}
	timeout := time.Duration(max(pr.TimeoutSeconds, 1)) * time.Second
	client := &http.Client{Timeout: timeout}
	resp, err := client.Get("http://127.0.0.1:" + p.port + pr.HTTPGet.Path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(body), nil
}

// waitProbes waits for the startup probe, then the readiness probe, each
// within the budget its failureThreshold × periodSeconds gives (polled
// more often than the kubelet would, to keep the test short).
func (p *pod) waitProbes(srv corev1.Container, logs *proc) {
	p.t.Helper()
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
	}{{"startupProbe", srv.StartupProbe}, {"readinessProbe", srv.ReadinessProbe}} {
		if pr.probe == nil {
			p.t.Fatalf("the server container has no %s", pr.name)
		}
		threshold := pr.probe.FailureThreshold
		if threshold == 0 {
			threshold = 3
		}
		period := pr.probe.PeriodSeconds
		if period == 0 {
			period = 10
		}
		deadline := time.Now().Add(time.Duration(threshold*period) * time.Second)
		var last string
		for {
			code, body, err := p.probe(pr.probe)
			if err == nil && code >= 200 && code < 400 {
				break
			}
			last = fmt.Sprintf("%d %q %v", code, strings.TrimSpace(body), err)
			select {
			case <-logs.done:
				p.t.Fatalf("the server exited before its %s passed (last: %s):\n%s", pr.name, last, logs)
			default:
			}
			if time.Now().After(deadline) {
				p.t.Fatalf("%s %s never passed within %d×%ds (last: %s); the orchestrator would never route to this pod:\n%s",
					pr.name, pr.probe.HTTPGet.Path, threshold, period, last, logs)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// hostTransport sends the public name as Host, as the proxy in front does.
type hostTransport struct{ host, token string }

func (h hostTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	r.Header.Set("Authorization", "Bearer "+h.token)
	return http.DefaultTransport.RoundTrip(r)
}

func TestTopologiesBecomeReady(t *testing.T) {
	bin, err := buildBinary(t)
	if err != nil {
		t.Fatalf("go build: %v", err)
	}
	cfg, err := parseFinalConfig(finalStage(loadDockerfile(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range k8sVariants(t) {
		t.Run("kubernetes "+v.name, func(t *testing.T) {
			if v.postgres && os.Getenv("HAIA_TEST_POSTGRES") == "" {
				t.Skip("HAIA_TEST_POSTGRES not set: the PostgreSQL topology needs a server")
			}
			runK8sTopology(t, bin, cfg, v)
		})
	}
	for _, v := range composeVariants() {
		if v.postgres {
			t.Run("compose "+v.file, func(t *testing.T) { runComposePostgresTopology(t, bin, cfg, v) })
		}
	}
}

func runK8sTopology(t *testing.T, bin string, cfg finalConfig, v k8sVariant) {
	objs := loadK8sFiles(t, v.files)
	dep := find[*appsv1.Deployment](t, objs, "haia-trace-mcp")
	spec := &dep.Spec.Template.Spec
	srv := container(t, spec, serverContainer)
	publicURL := flagValue(srv.Args, "--public-url")
	iss, err := authtest.NewIssuer(t.TempDir(), flagValue(srv.Args, "--auth-issuer"), publicURL+"/mcp")
	if err != nil {
		t.Fatal(err)
	}
	// With PostgreSQL, two roles as the manifests have them: the
	// migration runs as the test database's owner, the server as a role
	// that owns nothing.
	owner, runtime, grant := "", "", ""
	if v.postgres {
		owner = pgtest.Database(t, pgtest.DSN(t))
		runtime, grant = pgtest.AsRuntime(t, owner)
	}
	secrets := testSecrets(t, bin, t.TempDir(), iss, runtime)
	secrets[ownerDSNKey] = []byte(owner)
	var ingestKey string
	var revokeKey func(id string) []byte
	if v.ingest {
		ingestKey, revokeKey = k8sIngestKeys(t, bin, secrets)
	}

	// One pod; with ingest two, each with its own volumes (the same
	// Secrets, the same database), as the Deployment's replicas are.
	var replicas []replica
	pods := 1
	if v.ingest {
		pods = 2
	}
	for i := range pods {
		p, logs := startK8sPod(t, bin, cfg, v, objs, spec, secrets, grant)
		replicas = append(replicas, replica{name: fmt.Sprintf("pod %d", i+1), p: p, srv: srv, logs: logs,
			root: p.in(srv, flagValue(srv.Args, "--dir"))})
	}
	if v.ingest {
		// The operator re-applies the Secret; the kubelet swaps each pod's
		// mounted file for the new one (a new inode at the same path).
		revoke := func(id string) {
			data := revokeKey(id)
			for _, r := range replicas {
				keys := r.p.in(srv, flagValue(srv.Args, "--ingest-keys"))
				next := keys + ".new"
				if err := os.Chmod(filepath.Dir(keys), 0o755); err != nil { // the test's own when not root
					t.Fatal(err)
				}
				r.p.writeVolumeFile(next, data, 0o440)
				if err := os.Rename(next, keys); err != nil {
					t.Fatal(err)
				}
			}
		}
		checkIngestAcrossReplicas(t, replicas, ingestKey, iss, publicURL, revoke)
	}
	p, logs := replicas[0].p, replicas[0].logs

	// Ready means it answers: list the recorder's operation and ask (each
	// tenant, with a token naming it).
	roots := k8sRoots(t, p, spec, v)
	for tenant, root := range roots {
		if v.ingest {
			break // asked above, on every replica
		}
		ask(t, p, srv, iss, publicURL, tenant, logs)
		if v.postgres {
			// Nothing was written under the read-only Trace root.
			if _, err := os.Stat(filepath.Join(root, "guard")); err == nil {
				t.Errorf("the PostgreSQL topology wrote guard/ under the Trace root")
			}
		}
	}
	for _, r := range replicas {
		if code, body, _ := r.p.probe(srv.ReadinessProbe); code != http.StatusOK {
			t.Errorf("%s: readiness after the questions: %d %q", r.name, code, body)
		}
		if v.postgres && strings.Contains(r.logs.String(), ownsTablesWarning) {
			t.Errorf("%s: the server runs as a role that owns the guard's tables:\n%s", r.name, r.logs)
		}
	}
	ready := "1 pod"
	if len(replicas) != 1 {
		ready = fmt.Sprintf("%d pods", len(replicas))
	}
	t.Logf("%s: %s ready and answering", v.name, ready)
}

// k8sRoots are the Trace roots of the pod's server by tenant ("" without
// tenants), on this machine.
func k8sRoots(t *testing.T, p *pod, spec *corev1.PodSpec, v k8sVariant) map[string]string {
	t.Helper()
	srv := container(t, spec, serverContainer)
	roots := map[string]string{"": p.in(srv, flagValue(srv.Args, "--dir"))}
	if v.tenants {
		roots = map[string]string{}
		events, _ := tenantMounts(t, spec)
		for tenant := range events {
			roots[tenant] = p.in(srv, flagValue(srv.Args, "--tenants-dir")+"/"+tenant)
		}
	}
	return roots
}

// startK8sPod lays out one pod of the Deployment, runs its init
// containers, a recorder's run in its Trace root (not with ingest: the
// recorders post theirs), then its signer and its server, and waits for
// the server's probes.
func startK8sPod(t *testing.T, bin string, cfg finalConfig, v k8sVariant, objs []k8sObject, spec *corev1.PodSpec, secrets map[string][]byte, grant string) (*pod, *proc) {
	t.Helper()
	fsroot, err := os.MkdirTemp("", "topo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(fsroot) })
	p := &pod{t: t, fsroot: fsroot, uid: -1, env: cfg.env, port: freePort(t), grant: grant}
	if os.Geteuid() == 0 && spec.SecurityContext != nil && spec.SecurityContext.RunAsUser != nil {
		p.uid = int(*spec.SecurityContext.RunAsUser)
	}
	if err := os.Chmod(fsroot, 0o755); err != nil {
		t.Fatal(err)
	}
	// The binary at the image's path, as COPY puts it (root's, 0755).
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	p.bin = p.at(binaryName)
	if err := os.WriteFile(p.bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := container(t, spec, serverContainer)
	signer := container(t, spec, signerContainer)
	p.layOut(spec, objs, secrets)

	for _, c := range spec.InitContainers {
		p.runInit(c, p.containerEnv(c, objs, secrets))
	}

	// A recorder wrote a run into events/ before the pod started (on
	// PostgreSQL the Trace root is the recorders' alone), into each
	// tenant's root with tenants.
	if !v.ingest {
		for _, root := range k8sRoots(t, p, spec, v) {
			rec, err := simrec.New(root, "run-topology", time.Now().Add(-time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.Pay(simrec.Payment{OperationID: "op-silent", URL: "https://seller.example/x", PayTo: sellerSilent, Amount: "100000", Outcome: "unsettled"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	p.readOnly(srv)
	p.readOnly(signer)

	if len(signer.Command) == 0 || signer.Command[0] != binaryName {
		t.Fatalf("the signer container runs %q, not the image's binary", signer.Command)
	}
	sig := p.start(signer, slices.Concat(signer.Command[1:], signer.Args), p.containerEnv(signer, objs, secrets))
	sock := p.in(signer, strings.TrimPrefix(flagValue(signer.Args, "--listen"), "unix:"))
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the signer made no socket:\n%s", sig)
		}
		time.Sleep(50 * time.Millisecond)
	}
	srvArgs := slices.Concat(cfg.entrypoint[1:], srv.Args)
	if len(srv.Command) > 0 {
		t.Fatalf("the server container overrides the image's ENTRYPOINT; the test follows the image's")
	}
	logs := p.start(srv, srvArgs, p.containerEnv(srv, objs, secrets))
	p.waitProbes(srv, logs)
	return p, logs
}

// ownsTablesWarning is what a server says at start when its PostgreSQL role
// owns the guard's tables, is a member of their owner or a superuser.
const ownsTablesWarning = "owns the guard's tables"

// ask lists the recorder's operation and asks about its silent seller as
// an agent of tenant (none when ""), the way a client behind the public URL
// would: it must list one operation and open a review.
func ask(t *testing.T, p *pod, srv corev1.Container, iss *authtest.Issuer, publicURL, tenant string, logs fmt.Stringer) {
	t.Helper()
	u := strings.TrimPrefix(strings.TrimPrefix(publicURL, "https://"), "http://")
	claims := map[string]any{"iss": iss.Issuer, "aud": iss.Resource, "sub": "topology-agent",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(), "scope": "trace:read trace:guard"}
	if tenant != "" {
		claims[flagValue(srv.Args, "--tenant-claim")] = tenant
	}
	tok, err := iss.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "topology", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   "http://127.0.0.1:" + p.port + "/mcp",
		HTTPClient: &http.Client{Transport: hostTransport{host: u, token: tok}},
		MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, logs)
	}
	defer cs.Close()
	var ops struct {
		Operations []struct {
			OperationID string `json:"operation_id"`
		} `json:"operations"`
	}
	callJSON(t, cs, "list_operations", map[string]any{}, &ops)
	if len(ops.Operations) != 1 || ops.Operations[0].OperationID != "op-silent" {
		t.Fatalf("list_operations (tenant %q): %+v", tenant, ops)
	}
	var check struct {
		Decision string `json:"decision"`
		ReviewID string `json:"review_id"`
	}
	callJSON(t, cs, "check_before_pay", map[string]any{"counterparty": sellerSilent, "amount": "0.10"}, &check)
	if check.Decision != "review" || check.ReviewID == "" {
		t.Fatalf("check_before_pay for the silent seller (tenant %q): %+v\n%s", tenant, check, logs)
	}
}

// readmeTenantsCommand is the server command line of the Tenants section of
// docs/http.md, continuation lines joined.
func readmeTenantsCommand(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "docs", "http.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Tenants\n")
	if !ok {
		t.Fatal("docs/http.md has no Tenants section")
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal("the Tenants section of docs/http.md has no sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasSuffix(f[0], "haia-trace-mcp") && slices.Contains(f, "--tenants-dir") && slices.Contains(f, "--http") {
			return f[1:]
		}
	}
	t.Fatal("the Tenants block of docs/http.md has no server command with --http and --tenants-dir")
	return nil
}

// The tenants topology as the README gives it: two tenants' roots under
// --tenants-dir, the README's flags with its paths under a temporary
// directory and the port a free one. /readyz turns 200 only once every
// tenant can record (the trusted reviewers file included), then each
// tenant's token asks its own question.
func TestTenantsTopologyBecomesReady(t *testing.T) {
	bin, err := buildBinary(t)
	if err != nil {
		t.Fatalf("go build: %v", err)
	}
	args := readmeTenantsCommand(t)
	dir := t.TempDir()
	port := freePort(t)
	value := func(name string) string { return flagValue(args, name) }
	tenantsDir := filepath.Join(dir, "tenants")
	for _, name := range []string{"acme", "globex"} {
		rec, err := simrec.New(filepath.Join(tenantsDir, name), "run-"+name, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: "op-" + name, URL: "https://" + name + ".example/x", PayTo: sellerSilent, Amount: "100000", Outcome: "unsettled"}); err != nil {
			t.Fatal(err)
		}
	}
	resource := "http://127.0.0.1:" + port + "/mcp"
	iss, err := authtest.NewIssuer(dir, value("--auth-issuer"), resource)
	if err != nil {
		t.Fatal(err)
	}
	var run []string
	for _, a := range args {
		switch {
		case a == value("--tenants-dir"):
			a = tenantsDir
		case a == value("--auth-jwks"):
			a = iss.JWKSPath
		case a == value("--guard-config"):
			a = filepath.Join(dir, filepath.Base(a))
			if err := os.WriteFile(a, []byte("{}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		case a == value("--http"):
			a = "127.0.0.1:" + port
		}
		run = append(run, a)
	}
	cfg := filepath.Join(dir, "config")
	env := append(os.Environ(), "HAIA_CONFIG_DIR="+cfg)
	start := func() (*exec.Cmd, *proc) {
		cmd := exec.Command(bin, run...)
		cmd.Env = env
		pr := &proc{done: make(chan struct{})}
		cmd.Stderr = &lockedWriter{pr: pr}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = cmd.Wait(); close(pr.done) }()
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); <-pr.done })
		return cmd, pr
	}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz"}}, TimeoutSeconds: 5}
	p := &pod{t: t, port: port}

	// Without a trusted reviewers file in the configuration directory the
	// server cannot verify a human decision: not ready, and it says why.
	_, logs := start()
	deadline := time.Now().Add(time.Minute)
	for {
		code, body, err := p.probe(probe)
		if err == nil && code == http.StatusServiceUnavailable && strings.Contains(body, "reviewers") {
			break
		}
		if err == nil && code == http.StatusOK {
			t.Fatalf("ready without a trusted reviewers file:\n%s", logs)
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never said why it is not ready (last %d %q %v):\n%s", code, body, err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := exec.Command(bin, "reviewer", "init", "--id", "ops@example.com", "--key-file", filepath.Join(dir, "reviewer.key"),
		"--reviewers", filepath.Join(cfg, "reviewers.json")).CombinedOutput(); err != nil {
		t.Fatalf("reviewer init: %v\n%s", err, out)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		code, body, err := p.probe(probe)
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never 200 once the reviewers file exists (last %d %q %v):\n%s", code, body, err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	claim := value("--tenant-claim")
	for _, name := range []string{"acme", "globex"} {
		tok, err := iss.Sign(map[string]any{"iss": iss.Issuer, "aud": resource, "sub": "agent-" + name, claim: name,
			"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(), "scope": "trace:read"})
		if err != nil {
			t.Fatal(err)
		}
		client := mcp.NewClient(&mcp.Implementation{Name: "tenants", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: resource,
			HTTPClient: &http.Client{Transport: hostTransport{host: "127.0.0.1:" + port, token: tok}}, MaxRetries: -1}, nil)
		if err != nil {
			cancel()
			t.Fatalf("connect as %s: %v\n%s", name, err, logs)
		}
		var check struct {
			Decision string `json:"decision"`
		}
		callJSON(t, cs, "check_before_pay", map[string]any{"counterparty": sellerSilent, "amount": "0.10"}, &check)
		cs.Close()
		cancel()
		if check.Decision != "review" {
			t.Errorf("tenant %s: %+v", name, check)
		}
	}
}

// lockedWriter appends a process's stderr to a proc's log.
type lockedWriter struct{ pr *proc }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.pr.mu.Lock()
	defer w.pr.mu.Unlock()
	return w.pr.logs.Write(b)
}
