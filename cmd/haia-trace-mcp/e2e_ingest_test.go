package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ingest"
)

// ingestEnvelope maps one run line the way the recorder's Control Plane
// writer does (toIngestEvent): properties are the payload with seq,
// adapter, role and context_id spread after it; context_id also goes as
// session_id, the run in meta.
func ingestEnvelope(t testing.TB, line, run string) json.RawMessage {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	var ev map[string]json.RawMessage
	if err := dec.Decode(&ev); err != nil {
		t.Fatal(err)
	}
	pdec := json.NewDecoder(bytes.NewReader(ev["payload"]))
	pdec.UseNumber()
	if _, err := pdec.Token(); err != nil {
		t.Fatal(err)
	}
	var props []string
	for pdec.More() {
		k, _ := pdec.Token()
		var v json.RawMessage
		if err := pdec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		kb, _ := json.Marshal(k)
		props = append(props, string(kb)+":"+string(v))
	}
	props = append(props, `"seq":`+string(ev["seq"]), `"adapter":`+string(ev["adapter"]))
	if r, ok := ev["role"]; ok {
		props = append(props, `"role":`+string(r))
	}
	session := ""
	if c, ok := ev["context_id"]; ok {
		props = append(props, `"context_id":`+string(c))
		session = `,"session_id":` + string(c)
	}
	return json.RawMessage(`{"event_type":` + string(ev["event_type"]) + `,"occurred_at":` + string(ev["occurred_at"]) +
		`,"client_event_id":` + string(ev["event_id"]) + `,"anonymous_id":"agent-e2e"` + session +
		`,"properties":{` + strings.Join(props, ",") + `},"meta":{"source":"haia-trace","trace_schema":"v1","run_id":"` + run + `"}}`)
}

// sameEvents compares two run files line by line as JSON values.
func sameEvents(t *testing.T, got, want []byte) {
	t.Helper()
	g := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	w := strings.Split(strings.TrimSuffix(string(want), "\n"), "\n")
	if len(g) != len(w) {
		t.Fatalf("%d lines, want %d:\n%s", len(g), len(w), got)
	}
	for i := range g {
		var a, b any
		da, db := json.NewDecoder(strings.NewReader(g[i])), json.NewDecoder(strings.NewReader(w[i]))
		da.UseNumber()
		db.UseNumber()
		if da.Decode(&a) != nil || db.Decode(&b) != nil || !reflect.DeepEqual(a, b) {
			t.Fatalf("line %d:\n got %s\nwant %s", i+1, g[i], w[i])
		}
	}
}

// postBatch sends events to the batch endpoint with key and returns the
// status and body.
func postBatch(t *testing.T, base, key string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+ingest.Path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(ingest.KeyHeader, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func batchOf(events ...json.RawMessage) []byte {
	b, _ := json.Marshal(map[string]any{"events": events})
	return b
}

// newIngestKey runs `ingest-key create` and returns the key it prints.
func newIngestKey(t *testing.T, keys string, args ...string) string {
	t.Helper()
	out, errOut, code := runCLI(t, append([]string{"ingest-key", "create", "--ingest-keys", keys}, args...)...)
	if code != 0 {
		t.Fatalf("ingest-key create: %d %s", code, errOut)
	}
	return strings.TrimSpace(out)
}

// TestIngestEndToEnd: a recorder's run posted to the real binary lands in
// the Trace root byte for byte as the recorder's own file; every tool then
// reads it like any run (the guard judges the seller by it); a retry
// stores nothing twice; hostile requests are refused, each with its
// reason; the key appears in no log.
func TestIngestEndToEnd(t *testing.T) {
	recorded := sampleRoot(t) // the recorder's local copy: the truth to compare with
	local, err := os.ReadFile(filepath.Join(recorded, "events", "run-1.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), ".trace")
	if _, errOut, code := runCLI(t, "init", root); code != 0 {
		t.Fatalf("init: %s", errOut)
	}
	dir := t.TempDir()
	keys := filepath.Join(dir, "ingest-keys.json")
	key := newIngestKey(t, keys)
	otherTenant := newIngestKey(t, keys, "--tenant", "acme")
	revoked := newIngestKey(t, keys)
	list, _, _ := runCLI(t, "ingest-key", "list", "--ingest-keys", keys, "--json")
	var recs []ingest.KeyRecord
	if err := json.Unmarshal([]byte(list), &recs); err != nil || len(recs) != 3 {
		t.Fatalf("list: %s %v", list, err)
	}
	if _, errOut, code := runCLI(t, "ingest-key", "revoke", "--ingest-keys", keys, recs[2].ID); code != 0 {
		t.Fatalf("revoke: %s", errOut)
	}

	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"), "--http-insecure-no-auth",
		"--ingest", "--ingest-keys", keys, "--ingest-max-body", "200000", "--log-level", "debug")

	var events []json.RawMessage
	for _, line := range strings.Split(strings.TrimSpace(string(local)), "\n") {
		events = append(events, ingestEnvelope(t, line, "run-1"))
	}
	half := len(events) / 2
	status, body := postBatch(t, p.base, key, batchOf(events[:half]...))
	if status != 200 || body != fmt.Sprintf(`{"accepted":%d,"duplicates":0,"rejections":[]}`+"\n", half) {
		t.Fatalf("first batch: %d %s", status, body)
	}
	// A retry of the whole run: the first half are duplicates.
	status, body = postBatch(t, p.base, key, batchOf(events...))
	if status != 200 || body != fmt.Sprintf(`{"accepted":%d,"duplicates":%d,"rejections":[]}`+"\n", len(events)-half, half) {
		t.Fatalf("retry: %d %s", status, body)
	}
	got, err := os.ReadFile(filepath.Join(root, "events", "run-1.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	// The same events, member for member (the simulated recorder orders
	// its members differently from the real one, whose lines come back
	// byte for byte: TestIngestUpstreamWriter).
	sameEvents(t, got, local)

	// The tools read it like any run; the guard judges seller B by it.
	cs, err := httpSession(t, p.resource, func() string { return "" })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	exerciseEveryTool(t, cs)

	// Hostile requests.
	unknown := strings.Replace(string(events[0]), `"anonymous_id"`, `"tenant":"acme","anonymous_id"`, 1)
	status, body = postBatch(t, p.base, key, batchOf(json.RawMessage(unknown)))
	if status != 200 || !strings.Contains(body, `"accepted":0`) || !strings.Contains(body, `{"index":0,"issues":[{"code":"unknown_field","field":"tenant"`) {
		t.Errorf("unknown key: %d %s", status, body)
	}
	var many []json.RawMessage
	for range ingest.MaxBatch + 1 {
		many = append(many, json.RawMessage(`{}`))
	}
	big := batchOf(json.RawMessage(`{"event_type":"a","properties":{"pad":"` + strings.Repeat("x", 200000) + `"}}`))
	deep := []byte(`{"events":[` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `]}`)
	for _, c := range []struct {
		name, key string
		body      []byte
		status    int
		want      string
	}{
		{"no key", "", batchOf(events[0]), 401, "x-haia-api-key"},
		{"unknown key", "hik_000000000000_" + strings.Repeat("A", 43), batchOf(events[0]), 401, "unknown or revoked"},
		{"revoked key", revoked, batchOf(events[0]), 401, "unknown or revoked"},
		{"another tenant's key", otherTenant, batchOf(events[0]), 403, "not served here"},
		{"501 events", key, batchOf(many...), 400, "more than 500 events"},
		{"oversize body", key, big, 413, "larger than 200000 bytes"},
		{"deep nesting", key, deep, 400, "nests deeper than"},
		{"not a batch", key, []byte(`{"events":[],"project":"x"}`), 400, `unknown member \"project\"`},
	} {
		status, body := postBatch(t, p.base, c.key, c.body)
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s, want %d with %q", c.name, status, body, c.status, c.want)
		}
	}
	after, _ := os.ReadFile(filepath.Join(root, "events", "run-1.ndjson"))
	if !bytes.Equal(after, got) {
		t.Error("a refused request changed the run")
	}
	entries, _ := os.ReadDir(filepath.Join(root, "events"))
	if len(entries) != 1 {
		t.Errorf("events/ holds %d files, want the one run", len(entries))
	}
	if p.stop(t) != 0 {
		t.Errorf("exit:\n%s", p.logs())
	}
	logs := p.logs()
	for _, k := range []string{key, otherTenant, revoked} {
		secret := k[len(k)-43:]
		if strings.Contains(logs, secret) {
			t.Fatalf("an ingest key is in the server's log:\n%s", grepLines(logs, secret))
		}
	}
	if !strings.Contains(logs, `"key_id":"`+recs[0].ID+`"`) {
		t.Errorf("no log line names the key's id:\n%s", logs)
	}
}

// TestIngestFlagsRefused: --ingest needs --http, its flags need it, and a
// server without a keys file refuses to start rather than refuse every
// recorder.
func TestIngestFlagsRefused(t *testing.T) {
	root := sampleRoot(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--dir", root, "--ingest"}, exitUsage, "--ingest does nothing without --http"},
		{[]string{"--dir", root, "--ingest-keys", "k.json"}, exitUsage, "--ingest-keys does nothing without --ingest"},
		{[]string{"--dir", root, "--read-only", "--http", "127.0.0.1:0", "--http-insecure-no-auth", "--ingest"}, exitUsage, "--read-only writes nothing"},
		{[]string{"--dir", root, "--http", "127.0.0.1:0", "--http-insecure-no-auth", "--ingest", "--ingest-keys", filepath.Join(t.TempDir(), "none.json")}, exitFail, "no ingest keys file at"},
	} {
		_, errOut, code := runCLI(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, %s; want %d with %q", c.args, code, errOut, c.code, c.want)
		}
	}
}

// upstreamWriter finds what TestIngestUpstreamWriter runs: Node 22.18 or
// later (HAIA_NODE, which strips the sources' types) and the sources of
// Haia Trace core (HAIA_TRACE_CORE: packages/core/src of a checkout of
// Haia-Finance/haia-trace), else it skips saying why.
func upstreamWriter(t *testing.T) (node, core, harness string) {
	t.Helper()
	node, core = os.Getenv("HAIA_NODE"), os.Getenv("HAIA_TRACE_CORE")
	if node == "" || core == "" {
		t.Skip("set HAIA_NODE (Node 22.18 or later) and HAIA_TRACE_CORE (packages/core/src of a Haia-Finance/haia-trace checkout) to run the recorder's own Control Plane writer")
	}
	if _, err := os.Stat(filepath.Join(core, "sink", "cp.ts")); err != nil {
		t.Fatalf("HAIA_TRACE_CORE=%s holds no sink/cp.ts: %v", core, err)
	}
	harness, err := filepath.Abs(filepath.Join("..", "..", "tools", "ingeste2e"))
	if err != nil {
		t.Fatal(err)
	}
	return node, core, harness
}

// runWriter runs the recorder harness (tools/ingeste2e/writer.mjs) and
// returns its run file's path and the faults its writers reported.
func runWriter(t *testing.T, node, core, harness, url, key, runDir, runID string, events, batch, retries, pauseMs int) (string, []string) {
	t.Helper()
	cmd := exec.Command(node, "--import", "./register.mjs", "writer.mjs", core, url, key, runDir, runID,
		fmt.Sprint(events), fmt.Sprint(batch), fmt.Sprint(retries), fmt.Sprint(pauseMs))
	cmd.Dir = harness
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("writer: %v\n%s", err, stderr.String())
	}
	var res struct {
		Path   string   `json:"path"`
		Errors []string `json:"errors"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("writer said %q: %v\n%s", out, err, stderr.String())
	}
	return res.Path, res.Errors
}

// TestIngestUpstreamWriter: Haia Trace core's own recorder, its file sink
// and its Control Plane writer (createCpEventWriter, unmodified), pointed
// at the real binary. The run the server stores is byte for byte the
// recorder's own file — also when the server is killed (SIGKILL) again
// and again while batches arrive and comes back on the same address: the
// writer's retries lose nothing and double nothing.
func TestIngestUpstreamWriter(t *testing.T) {
	node, core, harness := upstreamWriter(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "ingest-keys.json")
	key := newIngestKey(t, keys)

	t.Run("a run", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), ".trace")
		if err := os.MkdirAll(filepath.Join(root, "events"), 0o755); err != nil {
			t.Fatal(err)
		}
		p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"), "--http-insecure-no-auth",
			"--ingest", "--ingest-keys", keys)
		local, errs := runWriter(t, node, core, harness, p.base, key, t.TempDir(), "1721709600000", 200, 50, 2, 0)
		if len(errs) > 0 {
			t.Fatalf("the writer reported: %v", errs)
		}
		want, _ := os.ReadFile(local)
		got, err := os.ReadFile(filepath.Join(root, "events", "1721709600000.ndjson"))
		if err != nil || !bytes.Equal(got, want) || len(want) == 0 {
			t.Fatalf("the stored run is not the recorder's file (%v):\n%s\nwant\n%s", err, got, want)
		}
		cs, err := httpSession(t, p.resource, func() string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		var list listing
		decodeStructured(t, callTool(t, cs, "list_operations", map[string]any{"limit": 100}), &list)
		if list.RunsScanned != 1 || len(list.Ops) != 50 {
			t.Fatalf("list_operations: %d runs, %d operations; want 1 and 50", list.RunsScanned, len(list.Ops))
		}
	})

	t.Run("killed mid-batch", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), ".trace")
		if err := os.MkdirAll(filepath.Join(root, "events"), 0o755); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		args := []string{"--dir", root, "--key-file", filepath.Join(dir, "signing.pem"), "--http", addr, "--http-insecure-no-auth",
			"--ingest", "--ingest-keys", keys}
		p := startHTTPCommand(t, args...)
		type result struct {
			path string
			errs []string
		}
		done := make(chan result, 1)
		go func() {
			path, errs := runWriter(t, node, core, harness, p.base, key, t.TempDir(), "1721709600001", 1200, 20, 10, 20)
			done <- result{path, errs}
		}()
		run := filepath.Join(root, "events", "1721709600001.ndjson")
		kills := 0
		for kills < 4 {
			select {
			case r := <-done:
				t.Fatalf("the writer finished before the server was killed 4 times (%d): %v", kills, r.errs)
			default:
			}
			st, err := os.Stat(run)
			if err != nil || st.Size() < int64(kills+1)*20000 {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			_ = p.cmd.Process.Kill() // SIGKILL: no shutdown, whatever batch is under way
			<-p.exited
			kills++
			time.Sleep(200 * time.Millisecond)
			p = startHTTPCommand(t, args...)
		}
		r := <-done
		if len(r.errs) > 0 {
			t.Fatalf("the writer reported: %v", r.errs)
		}
		want, _ := os.ReadFile(r.path)
		got, err := os.ReadFile(run)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("after %d kills the stored run is not the recorder's file (%v): %d bytes, want %d", kills, err, len(got), len(want))
		}
		if n := bytes.Count(got, []byte("\n")); n != 1200 {
			t.Fatalf("%d events stored, want 1200", n)
		}
	})
}

// TestIngestReplicasWithoutASharedVolume: two replicas on separate roots
// (no volume shared) and one PostgreSQL store. A recorder's run posted to
// one is read by the other's tools and judged by its guard; a retry sent
// to the other replica stores nothing twice; a replica started afterwards
// on an empty root copies every event before it serves.
func TestIngestReplicasWithoutASharedVolume(t *testing.T) {
	dsn := e2eDatabase(t)
	recorded := sampleRoot(t)
	local, err := os.ReadFile(filepath.Join(recorded, "events", "run-1.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keys := filepath.Join(dir, "ingest-keys.json")
	key := newIngestKey(t, keys)
	signing := filepath.Join(dir, "signing.pem")
	replica := func() (*httpProc, string) {
		root := filepath.Join(t.TempDir(), ".trace")
		if err := os.MkdirAll(filepath.Join(root, "events"), 0o755); err != nil {
			t.Fatal(err)
		}
		return startHTTPBinary(t, "--dir", root, "--key-file", signing, "--store", dsn, "--http-insecure-no-auth",
			"--ingest", "--ingest-keys", keys), root
	}
	a, rootA := replica()
	b, rootB := replica()
	var events []json.RawMessage
	for _, line := range strings.Split(strings.TrimSpace(string(local)), "\n") {
		events = append(events, ingestEnvelope(t, line, "run-1"))
	}
	status, body := postBatch(t, a.base, key, batchOf(events...))
	if status != 200 || !strings.Contains(body, fmt.Sprintf(`"accepted":%d,"duplicates":0`, len(events))) {
		t.Fatalf("replica A: %d %s", status, body)
	}
	// A acknowledged it: its own copy holds it already.
	got, _ := os.ReadFile(filepath.Join(rootA, "events", "run-1.ndjson"))
	sameEvents(t, got, local)
	// B copies it on A's commit.
	runB := filepath.Join(rootB, "events", "run-1.ndjson")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := os.ReadFile(runB); bytes.Count(got, []byte("\n")) == len(events) {
			sameEvents(t, got, local)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica B did not copy the run:\n%s", b.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	status, body = postBatch(t, b.base, key, batchOf(events...))
	if status != 200 || !strings.Contains(body, fmt.Sprintf(`"accepted":0,"duplicates":%d`, len(events))) {
		t.Fatalf("the retry on replica B: %d %s", status, body)
	}
	cs, err := httpSession(t, b.resource, func() string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	exerciseEveryTool(t, cs)

	c, rootC := replica()
	got, _ = os.ReadFile(filepath.Join(rootC, "events", "run-1.ndjson"))
	sameEvents(t, got, local)
	for _, p := range []*httpProc{a, b, c} {
		if p.stop(t) != 0 {
			t.Errorf("exit:\n%s", p.logs())
		}
	}
}

// TestIngestTenants: on a --tenants-dir server a key delivers to its own
// tenant's root and to no other; a key without a tenant is refused; a key
// revoked while the server runs is refused from the next request on.
func TestIngestTenants(t *testing.T) {
	tenants := tenantRoots(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("t", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(dir, "ingest-keys.json")
	acmeKey := newIngestKey(t, keys, "--tenant", "acme")
	noTenant := newIngestKey(t, keys)
	unknownTenant := newIngestKey(t, keys, "--tenant", "initech")
	p := startHTTPBinary(t, "--tenants-dir", tenants, "--tenant-claim", "org",
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile,
		"--ingest", "--ingest-keys", keys)
	line := `{"event_id":"e-1","event_type":"x402.payment.required","occurred_at":"2026-07-24T09:00:01.000Z","context_id":"op-ingested","seq":0,"adapter":"trace-x402","role":"client","payload":{}}`
	ev := ingestEnvelope(t, line, "run-ingested")
	// The body names globex: only the key decides.
	body := []byte(strings.Replace(string(batchOf(ev)), `"meta":{`, `"meta":{"tenant":"globex",`, 1))
	if status, got := postBatch(t, p.base, acmeKey, body); status != 200 || !strings.Contains(got, `"accepted":1`) {
		t.Fatalf("acme's key: %d %s", status, got)
	}
	if _, err := os.Stat(filepath.Join(tenants, "acme", "events", "run-ingested.ndjson")); err != nil {
		t.Fatalf("acme's root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tenants, "globex", "events", "run-ingested.ndjson")); !os.IsNotExist(err) {
		t.Fatalf("globex's root holds acme's run (%v)", err)
	}
	_, text, _ := tenantCaller(t, p, secret, "acme")("list_operations", map[string]any{})
	if !strings.Contains(text, "op-ingested") {
		t.Errorf("acme's list_operations does not show the ingested operation: %s", text)
	}
	_, text, _ = tenantCaller(t, p, secret, "globex")("list_operations", map[string]any{})
	if strings.Contains(text, "op-ingested") {
		t.Errorf("globex's list_operations shows acme's operation: %s", text)
	}
	for _, c := range []struct{ name, key, want string }{
		{"a key without a tenant", noTenant, "names no tenant"},
		{"a tenant not served", unknownTenant, "not served here"},
	} {
		if status, got := postBatch(t, p.base, c.key, batchOf(ev)); status != 403 || !strings.Contains(got, c.want) {
			t.Errorf("%s: %d %s", c.name, status, got)
		}
	}
	list, _, _ := runCLI(t, "ingest-key", "list", "--ingest-keys", keys, "--json")
	var recs []ingest.KeyRecord
	if err := json.Unmarshal([]byte(list), &recs); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runCLI(t, "ingest-key", "revoke", "--ingest-keys", keys, recs[0].ID); code != 0 {
		t.Fatal(errOut)
	}
	if status, got := postBatch(t, p.base, acmeKey, batchOf(ev)); status != 401 {
		t.Errorf("a key revoked while the server runs: %d %s", status, got)
	}
}

// TestIngestReplicaSavesItsRunIndex: a replica of a PostgreSQL store
// started on an empty root (its own copy of the events table, as the
// shipped topologies give it) saves its run index in guard/ like a server
// of the file store, so that its restart answers from the index instead of
// reading every run again; the restart answers what the first start did.
func TestIngestReplicaSavesItsRunIndex(t *testing.T) {
	dsn := e2eDatabase(t)
	local, err := os.ReadFile(filepath.Join(sampleRoot(t), "events", "run-1.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keys := filepath.Join(dir, "ingest-keys.json")
	key := newIngestKey(t, keys)
	root := filepath.Join(t.TempDir(), ".trace")
	if err := os.MkdirAll(filepath.Join(root, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(root, "guard", "run-index.bin")
	start := func() *httpProc {
		return startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"), "--store", dsn,
			"--http-insecure-no-auth", "--ingest", "--ingest-keys", keys)
	}
	list := func(p *httpProc) string {
		t.Helper()
		cs, err := httpSession(t, p.resource, func() string { return "" })
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, p.logs())
		}
		text := resultText(callTool(t, cs, "list_operations", map[string]any{"limit": 100}))
		cs.Close()
		return text
	}

	a := start()
	var events []json.RawMessage
	for _, line := range strings.Split(strings.TrimSpace(string(local)), "\n") {
		events = append(events, ingestEnvelope(t, line, "run-1"))
	}
	if status, body := postBatch(t, a.base, key, batchOf(events...)); status != 200 {
		t.Fatalf("ingest: %d %s", status, body)
	}
	first := list(a)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(index); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica saved no run index in %s:\n%s", index, a.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if a.stop(t) != 0 {
		t.Fatalf("exit:\n%s", a.logs())
	}
	if st, err := os.Stat(filepath.Dir(index)); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("guard/: %v %v, want a directory of mode 0700", st, err)
	}

	b := start()
	if again := list(b); again != first {
		t.Errorf("the restart answered\n%s\nwant\n%s", again, first)
	}
	if b.stop(t) != 0 || strings.Contains(b.logs(), "could not be saved") || strings.Contains(b.logs(), "is not used") {
		t.Errorf("restart:\n%s", b.logs())
	}
}
