package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/ingest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// The ingest variants of the topologies (compose.ingest.yaml,
// kubernetes/ingest/) are run like the others, then a recorder's run is
// posted to one replica with the key the operator made, and the other
// replicas, which share no Trace volume with it, are asked about it.

// replica is one running server of a topology.
type replica struct {
	name string
	p    *pod
	srv  corev1.Container
	logs fmt.Stringer // its log so far
	root string       // its own Trace root, on this machine
}

// ingestRun is what the test's recorder sends: simrec's run of one
// payment to the silent seller, as the Control Plane writer's batch.
const ingestRun = "run-ingest"

// envelopeOf maps one Event Contract line the way the recorder's Control
// Plane writer does: properties are the payload with seq, adapter, role
// and context_id beside it, context_id also as session_id, the run in meta.
func envelopeOf(t *testing.T, line, run string) map[string]any {
	t.Helper()
	var ev map[string]json.RawMessage
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatalf("the recorder's line %q: %v", line, err)
	}
	props := map[string]json.RawMessage{}
	if err := json.Unmarshal(ev["payload"], &props); err != nil {
		t.Fatalf("the recorder's payload %s: %v", ev["payload"], err)
	}
	for _, k := range []string{"seq", "adapter", "role", "context_id"} {
		if v, ok := ev[k]; ok {
			props[k] = v
		}
	}
	env := map[string]any{
		"event_type":      ev["event_type"],
		"occurred_at":     ev["occurred_at"],
		"client_event_id": ev["event_id"],
		"anonymous_id":    "topology-recorder",
		"properties":      props,
		"meta":            map[string]string{"source": "haia-trace", "trace_schema": "v1", "run_id": run},
	}
	if c, ok := ev["context_id"]; ok {
		env["session_id"] = c
	}
	return env
}

// ingestBatch is a recorder's run (simrec's, in a directory of its own) as
// one batch of the writer, and the number of its events.
func ingestBatch(t *testing.T, run string) ([]byte, int) {
	t.Helper()
	rec, err := simrec.New(t.TempDir(), run, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-silent", URL: "https://seller.example/x", PayTo: sellerSilent, Amount: "100000", Outcome: "unsettled"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(rec.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var events []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		events = append(events, envelopeOf(t, sc.Text(), run))
	}
	if err := sc.Err(); err != nil || len(events) == 0 {
		t.Fatalf("the recorder's run: %d events, %v", len(events), err)
	}
	body, err := json.Marshal(map[string]any{"events": events})
	if err != nil {
		t.Fatal(err)
	}
	return body, len(events)
}

// postEvents sends a batch to a replica's endpoint with key ("" sends
// none) and returns the status and body.
func postEvents(t *testing.T, r replica, key string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+r.p.port+ingest.Path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(ingest.KeyHeader, key)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST %s to %s: %v\n%s", ingest.Path, r.name, err, r.logs)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b)
}

// batchAnswer is the endpoint's answer to a batch it read.
type batchAnswer struct {
	Accepted   int               `json:"accepted"`
	Duplicates int               `json:"duplicates"`
	Rejections []json.RawMessage `json:"rejections"`
}

// listOperations asks a replica's list_operations over MCP, as an agent
// with a token from the topology's issuer.
func listOperations(t *testing.T, r replica, iss *authtest.Issuer, publicURL string) []string {
	t.Helper()
	tok, err := iss.Sign(map[string]any{"iss": iss.Issuer, "aud": iss.Resource, "sub": "topology-agent",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(), "scope": "trace:read"})
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(strings.TrimPrefix(publicURL, "https://"), "http://")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "topology", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   "http://127.0.0.1:" + r.p.port + "/mcp",
		HTTPClient: &http.Client{Transport: hostTransport{host: host, token: tok}},
		MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect to %s: %v\n%s", r.name, err, r.logs)
	}
	defer cs.Close()
	var ops struct {
		Operations []struct {
			OperationID string `json:"operation_id"`
		} `json:"operations"`
	}
	callJSON(t, cs, "list_operations", map[string]any{}, &ops)
	var ids []string
	for _, o := range ops.Operations {
		ids = append(ids, o.OperationID)
	}
	return ids
}

// checkIngestAcrossReplicas: every replica starts with nothing to list; a
// batch under a wrong key or none is 401 and lands nowhere; the batch under
// the operator's key is acknowledged by the first replica, its retry on the
// last is all duplicates, and every replica — none sharing a Trace volume
// with another — lists the recorder's operation and opens a review for its
// silent seller. The key reaches no log. Then revoke revokes the key the
// way the operator would (the keys file replaced whole where the replicas
// read it), and every running replica refuses it from the next batch on.
func checkIngestAcrossReplicas(t *testing.T, replicas []replica, key string, iss *authtest.Issuer, publicURL string, revoke func(id string)) {
	t.Helper()
	if len(replicas) < 2 {
		t.Fatalf("%d replicas: the ingest topology is checked across two at least", len(replicas))
	}
	for _, r := range replicas {
		if ops := listOperations(t, r, iss, publicURL); len(ops) != 0 {
			t.Fatalf("%s lists %v before any recorder posted", r.name, ops)
		}
	}
	first, last := replicas[0], replicas[len(replicas)-1]

	refused, _ := ingestBatch(t, "run-refused")
	wrong := strings.TrimSuffix(key, key[len(key)-4:]) + "AAAA"
	if wrong == key {
		wrong = strings.TrimSuffix(key, key[len(key)-4:]) + "BBBB"
	}
	for _, k := range []string{"", wrong, "hik_000000000000_" + strings.Repeat("A", 43)} {
		if code, body := postEvents(t, first, k, refused); code != http.StatusUnauthorized {
			t.Fatalf("a batch with key %q: %d %s; want 401", redactKey(k, key), code, body)
		}
	}

	body, n := ingestBatch(t, ingestRun)
	var ans batchAnswer
	code, raw := postEvents(t, first, key, body)
	if code != http.StatusOK || json.Unmarshal([]byte(raw), &ans) != nil || ans.Accepted != n || ans.Duplicates != 0 || len(ans.Rejections) != 0 {
		t.Fatalf("the recorder's batch of %d events to %s: %d %s\n%s", n, first.name, code, raw, first.logs)
	}
	// The writer's retry, through the proxy to another replica.
	code, raw = postEvents(t, last, key, body)
	ans = batchAnswer{}
	if code != http.StatusOK || json.Unmarshal([]byte(raw), &ans) != nil || ans.Accepted != 0 || ans.Duplicates != n {
		t.Fatalf("the retry of the batch to %s: %d %s; want 0 accepted, %d duplicates", last.name, code, raw, n)
	}

	// Every replica reads the run from its own copy: the others first.
	for _, r := range append(replicas[1:], first) {
		deadline := time.Now().Add(15 * time.Second)
		for {
			ops := listOperations(t, r, iss, publicURL)
			if len(ops) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never listed the ingested operation (lists %v):\n%s", r.name, ops, r.logs)
			}
			time.Sleep(200 * time.Millisecond)
		}
		ask(t, r.p, r.srv, iss, publicURL, "", r.logs)
	}
	for _, r := range replicas {
		if _, err := os.Stat(filepath.Join(r.root, "events", ingestRun+".ndjson")); err != nil {
			t.Errorf("%s: the run is not in its own Trace root: %v", r.name, err)
		}
		if _, err := os.Stat(filepath.Join(r.root, "events", "run-refused.ndjson")); err == nil {
			t.Errorf("%s: the batch refused with 401 landed in its Trace root", r.name)
		}
		// The image's /trace holds an empty guard/, which a fresh volume
		// gets; on the PostgreSQL store the guard's state is not written
		// there, only the Trace reader's saved run index of this root.
		written, _ := os.ReadDir(filepath.Join(r.root, "guard"))
		for _, f := range written {
			if !strings.HasPrefix(f.Name(), "run-index.") {
				t.Errorf("%s wrote guard/%s under its Trace root on the PostgreSQL store", r.name, f.Name())
			}
		}
		if strings.Contains(r.logs.String(), key) {
			t.Errorf("%s logged the ingest key", r.name)
		}
	}

	// Revoked while they run: refused everywhere, without a restart.
	id, _, _ := strings.Cut(strings.TrimPrefix(key, "hik_"), "_")
	revoke(id)
	late, _ := ingestBatch(t, "run-after-revoke")
	for _, r := range replicas {
		if code, body := postEvents(t, r, key, late); code != http.StatusUnauthorized {
			t.Errorf("%s took a batch under the revoked key: %d %s", r.name, code, body)
		}
		if _, err := os.Stat(filepath.Join(r.root, "events", "run-after-revoke.ndjson")); err == nil {
			t.Errorf("%s: the batch under the revoked key landed", r.name)
		}
	}
	for i, a := range replicas {
		for _, b := range replicas[i+1:] {
			if a.root == b.root {
				t.Errorf("%s and %s share the Trace root %s", a.name, b.name, a.root)
			}
		}
	}
}

// redactKey shows a test key in a failure message without the real one.
func redactKey(k, real string) string {
	switch k {
	case real:
		return "(the operator's key)"
	case "":
		return "(none)"
	}
	return fmt.Sprintf("%.20s…", k)
}

// composeIngestCommand is the `docker run … ingest-key create` line of the
// compose file's header, in words, the shell's quotes taken off.
func composeIngestCommand(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "#") {
			break
		}
		f := strings.Fields(strings.ReplaceAll(strings.TrimPrefix(l, "#"), `"`, ""))
		if len(f) > 2 && f[0] == "docker" && f[1] == "run" && strings.Contains(l, "ingest-key create") {
			return f[2:]
		}
	}
	t.Fatalf("%s: the header gives no `docker run … ingest-key create` line", file)
	return nil
}

// composeIngestKey makes the operator's ingest key the way the compose
// file's header says: the image's binary as its user, no network, no log
// kept by the engine, the operator's directory (the one the replicas
// mount) at the mount the line gives. It returns the key, which the
// command prints on stdout alone.
func composeIngestKey(t *testing.T, p *pod, file string, c *composeFile, srv corev1.Container) (string, func(id string)) {
	t.Helper()
	words := composeIngestCommand(t, file)
	flags := map[string]string{}
	var rest []string
	for i := 0; i < len(words); i++ {
		switch w := words[i]; w {
		case "--rm", "--read-only", "-i":
			flags[w] = "true"
		case "--log-driver", "--network", "--user", "-v", "--entrypoint":
			if i+1 == len(words) {
				t.Fatalf("%s: %s without a value", file, w)
			}
			flags[w] = words[i+1]
			i++
		default:
			if strings.HasPrefix(w, "-") {
				t.Fatalf("%s: the ingest-key line's flag %s is not one the test runs", file, w)
			}
			rest = words[i:]
			i = len(words)
		}
	}
	server := c.Services[serverServices(c)[0]]
	for k, want := range map[string]string{"--rm": "true", "--log-driver": "none", "--network": "none", "--read-only": "true",
		"--user": server.User, "--entrypoint": binaryName} {
		if flags[k] != want {
			t.Errorf("%s: the ingest-key line has %s %q; want %q", file, k, flags[k], want)
		}
	}
	if len(rest) < 3 || rest[0] != server.Image || rest[1] != "ingest-key" || rest[2] != "create" {
		t.Fatalf("%s: the ingest-key line runs %q; want the servers' image %s, then ingest-key create", file, rest, server.Image)
	}
	host, target, ok := strings.Cut(flags["-v"], ":")
	host = "./" + strings.TrimPrefix(host, "$PWD/")
	// The replicas' mount of the same directory.
	keys := flagValue(server.Command, "--ingest-keys")
	var mount *corev1.VolumeMount
	for i, m := range srv.VolumeMounts {
		if m.Name == "bind:"+host {
			mount = &srv.VolumeMounts[i]
		}
	}
	if !ok || mount == nil {
		t.Fatalf("%s: the ingest-key line mounts %q, not the directory the servers mount", file, flags["-v"])
	}
	if want := target + "/" + filepath.Base(keys); flagValue(rest, "--ingest-keys") != want || filepath.Dir(keys) != mount.MountPath {
		t.Fatalf("%s: the line writes %s, the servers read %s from their mount at %s", file, flagValue(rest, "--ingest-keys"), keys, mount.MountPath)
	}
	dir := p.volumeDir[mount.Name]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p.own(dir)
	tool := corev1.Container{Name: "ingest-key", VolumeMounts: []corev1.VolumeMount{{Name: mount.Name, MountPath: target}}}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/"}
	for k, v := range p.env {
		env = append(env, k+"="+p.rewrite(tool, v))
	}
	run := func(args []string) (string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := p.command(ctx, tool, args, env)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: the ingest-key line (%q): %v\n%s", file, args, err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	stdout, stderr := run(rest[1:])
	// `ingest-key revoke ID` runs the same way.
	revoke := func(id string) {
		// The operator's directory is theirs (the replicas' mounts of it
		// are read-only, which the test made it for them).
		if err := os.Chmod(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		p.own(dir)
		run(slices.Concat([]string{"ingest-key", "revoke", id}, rest[3:]))
	}
	key := strings.TrimSpace(stdout)
	if !strings.HasPrefix(key, "hik_") || strings.Contains(key, "\n") {
		t.Fatalf("ingest-key create printed %q on stdout; want the key alone", key)
	}
	if strings.Contains(stderr, key) {
		t.Fatalf("ingest-key create printed the key on stderr too:\n%s", stderr)
	}
	return key, revoke
}

// k8sIngestKeys makes a key as the ingest Secret's header says (the
// `ingest-key create` line, on the operator's machine), puts the keys file
// it wrote where the Secret's placeholder is, and returns the key.
func k8sIngestKeys(t *testing.T, bin string, secrets map[string][]byte) (string, func(id string) []byte) {
	t.Helper()
	file := filepath.Join(k8sIngestDir, "secret.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, l := range strings.Split(string(data), "\n") {
		line, comment := strings.CutPrefix(l, "#")
		if cmd, ok := strings.CutPrefix(strings.TrimSpace(line), "haia-trace-mcp ingest-key create "); ok && comment {
			cmd, _, _ = strings.Cut(cmd, "|")
			args = strings.Fields(strings.TrimSuffix(strings.TrimSpace(cmd), `\`))
			break
		}
	}
	keys := flagValue(args, "--ingest-keys")
	if keys == "" || filepath.Base(keys) != ingestKeysKey {
		t.Fatalf("%s: the header's ingest-key create line writes %q; want --ingest-keys …/%s, the Secret's key", file, keys, ingestKeysKey)
	}
	dir := t.TempDir()
	for i, a := range args {
		if a == keys {
			args[i] = filepath.Join(dir, filepath.Base(keys))
		}
	}
	cmd := exec.Command(bin, append([]string{"ingest-key", "create"}, args...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s's ingest-key create: %v\n%s", file, err, stderr.String())
	}
	key := strings.TrimSpace(stdout.String())
	if !strings.HasPrefix(key, "hik_") || strings.Contains(stderr.String(), key) {
		t.Fatalf("ingest-key create printed %q on stdout (want the key alone) and on stderr:\n%s", key, stderr.String())
	}
	if secrets[ingestKeysKey], err = os.ReadFile(filepath.Join(dir, ingestKeysKey)); err != nil {
		t.Fatal(err)
	}
	// `ingest-key revoke ID` on the same keys file: the Secret's new data.
	revoke := func(id string) []byte {
		t.Helper()
		cmd := exec.Command(bin, "ingest-key", "revoke", id, "--ingest-keys", filepath.Join(dir, ingestKeysKey))
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ingest-key revoke: %v\n%s", err, out)
		}
		data, err := os.ReadFile(filepath.Join(dir, ingestKeysKey))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	return key, revoke
}
