package deploy

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// podmanLogs is a container's log, read when asked.
type podmanLogs struct {
	p    *podman
	name string
}

func (l podmanLogs) String() string {
	out, errOut, _ := l.p.try("logs", l.name)
	return out + errOut
}

// containerIngest runs compose.ingest.yaml's services from the image with
// podman: the key made by the header's `docker run … ingest-key create`
// line (podman standing in for docker), `store migrate` as the owner, the
// signer with no network, then every replica with its compose command,
// user, read-only root, limits, its own named volume at /trace and the
// keys' directory read-only, HAIA_STORE from an env file. The database is
// the test's PostgreSQL on the host, so the migration and the replicas use
// the host's network (compose's internal "store" network has no stand-in
// here), each replica listening on a port of its own (--http appended: the
// last --http wins). Then a recorder's run goes to one replica and every
// replica is asked (checkIngestAcrossReplicas).
func containerIngest(t *testing.T, p *podman, bin string) {
	const file = "compose.ingest.yaml"
	c := loadComposeFile(t, file)
	owner := pgtest.Database(t, pgtest.DSN(t))
	runtime, role := pgtest.AsRuntime(t, owner)
	dir := t.TempDir()
	envFile := func(name, dsn string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("HAIA_STORE="+dsn+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	// The operator's ingest/ directory and the key, as the header says.
	keysDir := filepath.Join(dir, "ingest")
	if err := os.Mkdir(keysDir, 0o700); err != nil {
		t.Fatal(err)
	}
	p.chown(keysDir, p.uid)
	words := composeIngestCommand(t, file)
	for i, w := range words {
		switch {
		case strings.HasPrefix(w, "$PWD/ingest:"):
			words[i] = keysDir + strings.TrimPrefix(w, "$PWD/ingest")
		case w == c.Services[serverServices(c)[0]].Image:
			words[i] = imageName
		}
	}
	out, errOut, code := p.try(append([]string{"run", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"}, words...)...)
	key := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(key, "hik_") || strings.Contains(errOut, key) {
		t.Fatalf("the header's ingest-key create in the image: exit %d, stdout %q\n%s", code, out, errOut)
	}

	// store-migrate, as the owner.
	migrate := c.Services["store-migrate"]
	args := slices.Concat([]string{"run", "--rm", "--network", "host", "--env-file", envFile("store-admin.env", owner)},
		composeRun(t, p, "store-migrate", migrate, nil, ""), []string{imageName, "--grant", role})
	if out, errOut, code := p.try(args...); code != 0 || !strings.Contains(out+errOut, "granted "+role) {
		t.Fatalf("store-migrate: exit %d\n%s%s", code, out, errOut)
	}

	// The secrets: fresh keys, the reviewers file, the issuer's JWKS.
	publicURL := flagValue(c.Services[serverServices(c)[0]].Command, "--public-url")
	iss, err := authtest.NewIssuer(t.TempDir(), flagValue(c.Services[serverServices(c)[0]].Command, "--auth-issuer"), publicURL+"/mcp")
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"bind:./ingest": keysDir}
	for name := range c.Secrets {
		path := filepath.Join(dir, name)
		switch name {
		case "signing-key", "params-key":
			writeKey(t, p, path)
		case "reviewers.json":
			if out, err := exec.Command(bin, "reviewer", "init", "--id", "ops@example.com", "--key-file", filepath.Join(dir, "reviewer.key"), "--reviewers", path).CombinedOutput(); err != nil {
				t.Fatalf("reviewer init: %v\n%s", err, out)
			}
		case "jwks.json":
			data, err := os.ReadFile(iss.JWKSPath)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		default:
			continue // the bundled postgres service's, which the host's database stands in for
		}
		p.chown(path, p.uid)
		secrets[name] = path
	}
	for v := range c.Volumes {
		if v != "postgres-data" {
			// The compose topology's subtest made some of the same names
			// (signer-socket) in this podman's storage: start them empty.
			p.try("volume", "rm", "-f", v)
			p.run("volume", "create", v)
			t.Cleanup(func() { p.with(t).try("volume", "rm", "-f", v) })
		}
	}

	signerName, signer := signerService(t, c)
	p.run(slices.Concat([]string{"run", "-d"}, composeRun(t, p, signerName, signer, secrets, ""), []string{imageName}, signer.Command)...)
	t.Cleanup(func() { p.with(t).try("rm", "-f", "-t", "2", signerName) })
	sockDir := volumePath(t, p, "signer-socket")
	waitFor(t, p, signerName, "the signer's socket", func() bool {
		_, err := os.Stat(filepath.Join(sockDir, "signer.sock"))
		return err == nil
	})

	runtimeEnv := envFile("store.env", runtime)
	var replicas []replica
	for _, name := range serverServices(c) {
		s := c.Services[name]
		s.Ports = nil // the host's network: the replica listens on its own port instead
		port := freePort(t)
		var root string
		for _, m := range s.Volumes {
			if m.Target == flagValue(s.Command, "--dir") {
				root = volumePath(t, p, m.Source)
			}
		}
		args := slices.Concat([]string{"run", "-d", "--network", "host", "--env-file", runtimeEnv}, composeRun(t, p, name, s, secrets, port),
			[]string{imageName}, s.Command, []string{"--http", "127.0.0.1:" + port})
		p.run(args...)
		t.Cleanup(func() { p.with(t).try("rm", "-f", "-t", "2", name) })
		waitFor(t, p, name, name+"'s /readyz", func() bool {
			resp, err := http.Get("http://127.0.0.1:" + port + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		replicas = append(replicas, replica{name: name, p: &pod{t: t, port: port}, srv: corev1.Container{Name: name, Args: s.Command},
			logs: podmanLogs{p: p, name: name}, root: root})
	}
	start := time.Now()
	// `ingest-key revoke ID` by the header's line: the keys file replaced
	// in the directory the replicas have mounted.
	revoke := func(id string) {
		create := slices.Index(words, "create")
		args := slices.Concat([]string{"run", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"}, words[:create], []string{"revoke", id}, words[create+1:])
		if out, errOut, code := p.try(args...); code != 0 {
			t.Fatalf("ingest-key revoke in the image: exit %d\n%s%s", code, out, errOut)
		}
	}
	checkIngestAcrossReplicas(t, replicas, key, iss, publicURL, revoke)
	for _, r := range replicas {
		if logs := r.logs.String(); strings.Contains(logs, ownsTablesWarning) {
			t.Errorf("%s runs as a role that owns the guard's tables:\n%s", r.name, logs)
		}
	}
	t.Logf("%d replicas from the image: a run posted to one, read by all, in %v", len(replicas), time.Since(start).Round(time.Millisecond))
}
