package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// The PostgreSQL compose topology run the way compose runs it, with the
// real binary: each service's user, its entrypoint and command, its
// secrets at /run/secrets/NAME, its configs and volumes at their targets,
// its env_file, in the order its depends_on gives. The postgres service is
// the host's PostgreSQL 15 doing what the postgres image's entrypoint does
// on an empty data volume: initdb as POSTGRES_USER with the password of
// POSTGRES_PASSWORD_FILE, a server on its unix socket only, POSTGRES_DB
// created, every .sql the service mounts in /docker-entrypoint-initdb.d run
// by psql with ON_ERROR_STOP, then the server on TCP, password required
// (the image's pg_hba asks the other containers for one). The env files
// hold what the compose file's header documents, the placeholders filled
// in. Then: store-migrate as the owner, the signer, every replica ready as
// the runtime role, each asked a question; none may say its role owns the
// tables, and the runtime role's password reaches no log.
//
// What differs from compose, forced by running without an engine: every
// container's "/" is one directory on this machine (a mount takes the path
// it covers), the postgres image's programs are the host's, and the ports
// are free ones (the service name "postgres" is 127.0.0.1).

// pgBinDir is where the host's PostgreSQL 15 programs are, or "".
func pgBinDir() string {
	for _, dir := range []string{"/usr/lib/postgresql/15/bin"} {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir
		}
	}
	return ""
}

// composeContainer is one compose service as the corev1.Container the pod
// helpers rewrite paths for: its named volumes, and each secret and config
// as a mount of the one file.
func composeContainer(name string, s composeService, c *composeFile, volumeDir map[string]string, fsroot string) corev1.Container {
	ctr := corev1.Container{Name: name}
	for _, m := range s.Volumes {
		name, dir := "volume:"+m.Source, filepath.Join(fsroot, ".volumes", m.Source)
		if m.Type == "bind" {
			// A directory of the operator's beside the compose file.
			name, dir = "bind:"+m.Source, filepath.Join(fsroot, ".binds", filepath.Base(m.Source))
		}
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: m.Target, SubPath: m.Volume.Subpath, ReadOnly: m.ReadOnly})
		volumeDir[name] = dir
	}
	for _, sec := range s.Secrets {
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "secret:" + sec, MountPath: "/run/secrets/" + sec, ReadOnly: true})
		volumeDir["secret:"+sec] = filepath.Join(fsroot, ".secrets", filepath.Base(c.Secrets[sec].File))
	}
	for _, cf := range s.Configs {
		abs, _ := filepath.Abs(c.Configs[cf.Source].File)
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "config:" + cf.Source, MountPath: cf.Target, ReadOnly: true})
		volumeDir["config:"+cf.Source] = abs
	}
	return ctr
}

// composeUID is the uid a service runs as on this machine: its user when
// the test runs as root, else -1 (the test's own).
func composeUID(t *testing.T, s composeService, standIn map[int]int) int {
	t.Helper()
	if os.Geteuid() != 0 {
		return -1
	}
	uid, _, _ := strings.Cut(s.User, ":")
	n, err := strconv.Atoi(uid)
	if err != nil {
		t.Fatalf("user %q is not numeric", s.User)
	}
	if m, ok := standIn[n]; ok {
		return m
	}
	return n
}

// documentedDSN is the DSN the header of compose file composeFile gives
// for env file.
func documentedDSN(t *testing.T, composeFile, file string) *url.URL {
	t.Helper()
	data, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "#") {
			break
		}
		if !strings.Contains(l, file) {
			continue
		}
		for _, next := range lines[i:] {
			if _, dsn, ok := strings.Cut(next, "HAIA_STORE="); ok {
				u, err := url.Parse(strings.TrimSpace(dsn))
				if err != nil {
					t.Fatalf("the header's DSN for %s: %v", file, err)
				}
				return u
			}
		}
	}
	t.Fatalf("the header documents no HAIA_STORE= line for %s", file)
	return nil
}

// pgRunner runs the host's PostgreSQL programs as the postgres service's
// user.
type pgRunner struct {
	t      *testing.T
	bin    string
	uid    int
	socket string
}

func (r pgRunner) cmd(ctx context.Context, prog string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(r.bin, prog), args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "PGHOST=" + r.socket}
	cmd.Dir = r.socket
	if r.uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(r.uid), Gid: uint32(r.uid)}}
	}
	return cmd
}

// run runs prog to completion, stdin given, and returns its output.
func (r pgRunner) run(stdin string, prog string, args ...string) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := r.cmd(ctx, prog, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("postgres service: %s %q: %v\n%s", prog, args, err, out)
	}
	return string(out)
}

// randomHex is a fresh password that needs no escaping in a DSN.
func randomHex(t *testing.T) string {
	t.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// chownTo gives path to uid (when the test runs as root).
func chownTo(t *testing.T, path string, uid int) {
	t.Helper()
	if uid < 0 {
		return
	}
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

func runComposePostgresTopology(t *testing.T, bin string, cfg finalConfig, v composeVariant) {
	file := v.file
	pgBin := pgBinDir()
	if pgBin == "" {
		t.Skip("no PostgreSQL 15 programs (/usr/lib/postgresql/15/bin): the compose PostgreSQL topology needs initdb and postgres (.ci/run's image has them)")
	}
	c := loadComposeFile(t, file)
	// The postgres image's user (999) is the host's postgres user here.
	standIn := map[int]int{}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("running as root and no postgres user to run PostgreSQL as: %v", err)
		}
		n, _ := strconv.Atoi(u.Uid)
		standIn[999] = n
	}
	var pgName, migrateName, signerName string
	for n, s := range c.Services {
		switch {
		case strings.HasPrefix(s.Image, "docker.io/library/postgres:"):
			pgName = n
		case slices.Equal(s.Entrypoint, storeMigrateArgv()):
			migrateName = n
		case len(s.Entrypoint) > 1 && s.Entrypoint[1] == "signer":
			signerName = n
		}
	}
	if pgName == "" || migrateName == "" || signerName == "" {
		t.Fatalf("postgres %q, store-migrate %q, signer %q: the test runs these", pgName, migrateName, signerName)
	}
	pgSvc, migrateSvc, signerSvc := c.Services[pgName], c.Services[migrateName], c.Services[signerName]
	servers := serverServices(c)

	fsroot, err := os.MkdirTemp("", "compose")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(fsroot) })
	secretsDir := filepath.Join(fsroot, ".secrets")
	for _, d := range []string{fsroot, secretsDir, filepath.Join(fsroot, ".volumes"), filepath.Join(fsroot, ".binds")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	volumeDir := map[string]string{}
	containers := map[string]corev1.Container{}
	for n, s := range c.Services {
		containers[n] = composeContainer(n, s, c, volumeDir, fsroot)
	}
	p := &pod{t: t, fsroot: fsroot, uid: composeUID(t, c.Services[servers[0]], standIn), env: cfg.env, port: freePort(t), volumeDir: volumeDir}
	pgUID := composeUID(t, pgSvc, standIn)
	// The binary at the image's path, as COPY puts it (root's, 0755).
	exe, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	p.bin = p.at(binaryName)
	if err := os.WriteFile(p.bin, exe, 0o755); err != nil {
		t.Fatal(err)
	}

	// The operator's files, as the header says: the keys and reviewers
	// for the project's image (uid 65532, 0600), the two passwords for
	// the postgres image's user (0600).
	publicURL := flagValue(c.Services[servers[0]].Command, "--public-url")
	iss, err := authtest.NewIssuer(t.TempDir(), flagValue(c.Services[servers[0]].Command, "--auth-issuer"), publicURL+"/mcp")
	if err != nil {
		t.Fatal(err)
	}
	keys := testSecrets(t, bin, t.TempDir(), iss, "")
	ownerPassword, runtimePassword := randomHex(t), randomHex(t)
	files := map[string][]byte{
		"signing.key": keys["signing.key"], "params.key": keys["params.key"], "jwks.json": keys["jwks.json"], "reviewers.json": keys["reviewers.json"],
	}
	for name, ref := range c.Secrets {
		path := filepath.Join(secretsDir, filepath.Base(ref.File))
		data, ok := files[filepath.Base(ref.File)]
		owner := p.uid
		switch {
		case ok:
		case name == strings.TrimPrefix(pgSvc.Environment["POSTGRES_PASSWORD_FILE"], "/run/secrets/"):
			data, owner = []byte(ownerPassword+"\n"), pgUID
		case slices.Contains(pgSvc.Secrets, name):
			data, owner = []byte(runtimePassword+"\n"), pgUID
		default:
			t.Fatalf("secret %s (%s): the test has no value for it", name, ref.File)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		chownTo(t, path, owner)
	}
	// The image's own directories; the named volumes, fresh.
	for _, d := range []string{"/trace", "/etc/haia-trace-mcp", "/run/haia-signer", "/run/secrets"} {
		if err := os.MkdirAll(p.at(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for v := range c.Volumes {
		dir := volumeDir["volume:"+v]
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		chownTo(t, dir, p.uid)
	}

	// postgres: a fresh data volume initialised as the image does.
	pgc := containers[pgName]
	data := volumeDir["volume:postgres-data"]
	if data == "" {
		t.Fatalf("service %s mounts no postgres-data volume", pgName)
	}
	chownTo(t, data, pgUID)
	socket, err := os.MkdirTemp("", "pgs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(socket) })
	if err := os.Chmod(socket, 0o755); err != nil {
		t.Fatal(err)
	}
	chownTo(t, socket, pgUID)
	pg := pgRunner{t: t, bin: pgBin, uid: pgUID, socket: socket}
	owner, db := pgSvc.Environment["POSTGRES_USER"], pgSvc.Environment["POSTGRES_DB"]
	pg.run("", "initdb", "-D", data, "--username="+owner, "--pwfile="+p.in(pgc, pgSvc.Environment["POSTGRES_PASSWORD_FILE"]),
		"--auth-local=trust", "--auth-host=scram-sha-256")
	pgLog := filepath.Join(socket, "postgres.log")
	pg.run("", "pg_ctl", "-D", data, "-o", "-c listen_addresses='' -c unix_socket_directories="+socket, "-l", pgLog, "-w", "start")
	pg.run(`CREATE DATABASE :"db" ;`, "psql", "-v", "ON_ERROR_STOP=1", "--username", owner, "--no-password", "--no-psqlrc", "--dbname", "postgres", "--set", "db="+db)
	var inits []corev1.VolumeMount
	for _, m := range pgc.VolumeMounts {
		if strings.HasPrefix(m.MountPath, initdbDir) {
			inits = append(inits, m)
		}
	}
	sort.Slice(inits, func(i, j int) bool { return inits[i].MountPath < inits[j].MountPath })
	for _, m := range inits {
		if !strings.HasSuffix(m.MountPath, ".sql") {
			t.Fatalf("init script %s: only .sql is a shape the test runs", m.MountPath)
		}
		sql, err := os.ReadFile(p.in(pgc, m.MountPath))
		if err != nil {
			t.Fatal(err)
		}
		// Its paths as the postgres container sees them.
		text := string(sql)
		for _, sec := range pgSvc.Secrets {
			text = strings.ReplaceAll(text, "/run/secrets/"+sec, p.in(pgc, "/run/secrets/"+sec))
		}
		script := filepath.Join(socket, filepath.Base(m.MountPath))
		if err := os.WriteFile(script, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		pg.run("", "psql", "-v", "ON_ERROR_STOP=1", "--username", owner, "--no-password", "--no-psqlrc", "--dbname", db, "-f", script)
	}
	pg.run("", "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
	pgPort := freePort(t)
	pg.run("", "pg_ctl", "-D", data, "-o", "-c listen_addresses=127.0.0.1 -p "+pgPort+" -c unix_socket_directories="+socket, "-l", pgLog, "-w", "start")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = pg.cmd(ctx, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop").Run()
	})
	// Its healthcheck, over TCP.
	hc := pgSvc.Healthcheck.Test[1:]
	for i, a := range hc {
		if a == "--port=5432" {
			hc[i] = "--port=" + pgPort
		}
	}
	pg.run("", hc[0], hc[1:]...)

	// The env files, as the header documents them.
	envFiles := map[string]string{}
	for _, f := range slices.Concat(migrateSvc.EnvFile, c.Services[servers[0]].EnvFile) {
		u := documentedDSN(t, file, f)
		if u.Hostname() != pgName || u.Port() != "5432" {
			t.Fatalf("the header's DSN for %s is not on %s:5432: %s", f, pgName, u.Redacted())
		}
		u.Host = "127.0.0.1:" + pgPort
		switch u.User.Username() {
		case owner:
			u.User = url.UserPassword(owner, ownerPassword)
		default:
			u.User = url.UserPassword(u.User.Username(), runtimePassword)
		}
		envFiles[f] = "HAIA_STORE=" + u.String()
	}
	env := func(name string) []string {
		ctr := containers[name]
		out := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/"}
		for k, v := range p.env {
			out = append(out, k+"="+p.rewrite(ctr, v))
		}
		for _, f := range c.Services[name].EnvFile {
			line, ok := envFiles[f]
			if !ok {
				t.Fatalf("service %s: env_file %s: the test has no content for it", name, f)
			}
			out = append(out, line)
		}
		return out
	}

	// store-migrate, as the owner.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := p.command(ctx, containers[migrateName], slices.Concat(migrateSvc.Entrypoint[1:], migrateSvc.Command), env(migrateName)).CombinedOutput()
	if role := grantedRole(migrateSvc.Command); err != nil || !strings.Contains(string(out), "granted "+role) {
		t.Fatalf("service %s: %v, want it to grant %s\n%s", migrateName, err, role, out)
	}

	// A recorder's run in the Trace volume, then the volume read-only for
	// the servers; or, with ingest, the operator's key made as the header
	// says. The signer; every replica.
	trace := volumeDir["volume:trace"]
	var ingestKey string
	var revoke func(id string)
	if v.ingest {
		ingestKey, revoke = composeIngestKey(t, p, file, c, containers[servers[0]])
		// Each replica's fresh volume gets the image's /trace (events/ and
		// guard/, the image user's) on its first mount.
		for _, name := range servers {
			root := p.in(containers[name], flagValue(c.Services[name].Command, "--dir"))
			for _, d := range []string{root, filepath.Join(root, "events"), filepath.Join(root, "guard")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				p.own(d)
			}
		}
	} else {
		if err := os.MkdirAll(filepath.Join(trace, "events"), 0o755); err != nil {
			t.Fatal(err)
		}
		rec, err := simrec.New(trace, "run-topology", time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: "op-silent", URL: "https://seller.example/x", PayTo: sellerSilent, Amount: "100000", Outcome: "unsettled"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range servers {
		p.readOnly(containers[name])
	}
	sig := p.start(containers[signerName], slices.Concat(signerSvc.Entrypoint[1:], signerSvc.Command), env(signerName))
	sock := p.in(containers[signerName], strings.TrimPrefix(flagValue(signerSvc.Command, "--listen"), "unix:"))
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
	ready := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz"}}, TimeoutSeconds: 5}
	var replicas []replica
	for _, name := range servers {
		s := c.Services[name]
		if len(s.Entrypoint) > 0 {
			t.Fatalf("service %s overrides the image's ENTRYPOINT; the test follows the image's", name)
		}
		r := *p
		r.port = freePort(t)
		logs := r.start(containers[name], slices.Concat(cfg.entrypoint[1:], s.Command), env(name))
		deadline := time.Now().Add(time.Minute)
		for {
			code, body, err := r.probe(ready)
			if err == nil && code == http.StatusOK {
				break
			}
			select {
			case <-logs.done:
				t.Fatalf("service %s exited before it was ready (%d %q %v):\n%s", name, code, body, err, logs)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("service %s never ready within a minute (last %d %q %v):\n%s", name, code, body, err, logs)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !v.ingest {
			ask(t, &r, containers[name], iss, publicURL, "", logs)
		}
		if strings.Contains(logs.String(), ownsTablesWarning) {
			t.Errorf("service %s runs as a role that owns the guard's tables:\n%s", name, logs)
		}
		replicas = append(replicas, replica{name: name, p: &r, srv: containers[name], logs: logs,
			root: r.in(containers[name], flagValue(s.Command, "--dir"))})
	}
	if v.ingest {
		checkIngestAcrossReplicas(t, replicas, ingestKey, iss, publicURL, revoke)
	} else if _, err := os.Stat(filepath.Join(trace, "guard")); err == nil {
		t.Errorf("the PostgreSQL topology wrote guard/ under the Trace root")
	}
	if logged, err := os.ReadFile(pgLog); err != nil {
		t.Fatal(err)
	} else if strings.Contains(string(logged), runtimePassword) || strings.Contains(string(logged), ownerPassword) {
		t.Errorf("a database password reached PostgreSQL's log:\n%s", logged)
	}
	t.Logf("%s: %d replicas ready and answering as a role that owns nothing", file, len(servers))
}
