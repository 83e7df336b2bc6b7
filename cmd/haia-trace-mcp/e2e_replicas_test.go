package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// e2eDatabase creates an empty database on the HAIA_TEST_POSTGRES server
// for one test, migrated with the binary's `store migrate`, and returns its
// DSN. Without the variable the test skips.
func e2eDatabase(t *testing.T) string {
	t.Helper()
	return e2eDatabaseOn(t, pgtest.DSN(t))
}

func e2eDatabaseOn(t *testing.T, dsn string) string {
	t.Helper()
	out := pgtest.Database(t, dsn)
	// To the newest schema (deploy's latestSchema holds the number).
	if stdout, stderr, code := runCLI(t, "store", "migrate", "--store", out); code != 0 || !strings.Contains(stdout, "schema version 0 → ") {
		t.Fatalf("store migrate: %d %s %s", code, stdout, stderr)
	}
	return out
}

// replicaSet is several server processes on one PostgreSQL store.
type replicaSet struct {
	root, key, dsn string
	procs          []*httpProc
	sessions       []*mcp.ClientSession
}

func startReplicas(t *testing.T, dsn string, n int, extra ...string) *replicaSet {
	t.Helper()
	rs := &replicaSet{root: loopRoot(t), dsn: dsn, key: filepath.Join(t.TempDir(), "signing.pem")}
	// One key for every replica, made once: each would make its own.
	runCLI(t, "chain", "checkpoint", "none", "--dir", rs.root, "--key-file", rs.key)
	for range n {
		p := startHTTPBinary(t, append([]string{"--dir", rs.root, "--key-file", rs.key, "--store", rs.dsn, "--http-insecure-no-auth",
			"--rate-limit", "100000", "--rate-burst", "100000"}, extra...)...)
		cs, err := httpSession(t, p.resource, func() string { return "" })
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, p.logs())
		}
		t.Cleanup(func() { cs.Close() })
		rs.procs = append(rs.procs, p)
		rs.sessions = append(rs.sessions, cs)
	}
	if _, err := os.Stat(filepath.Join(rs.root, reviewlog.DirName, reviewlog.FileName)); !os.IsNotExist(err) {
		t.Fatalf("the PostgreSQL store wrote the file store's log (stat: %v)", err)
	}
	return rs
}

func askCheck(ctx context.Context, cs *mcp.ClientSession, amount string) (*mcp.CallToolResult, error) {
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": sellerB, "amount": amount}})
}

// Three server processes on one PostgreSQL store: the same question asked
// 40 times at once opens one review that every answer carries, and the
// review is notified once across the fleet; four CLI decisions race and
// one wins; a replica killed mid-burst leaves nothing half-written; the
// chains export VALID and round-trip through a file store byte for byte.
func TestReplicasShareOnePostgresStore(t *testing.T) {
	secret := []byte(strings.Repeat("r", 48))
	hookSecret := filepath.Join(t.TempDir(), "webhook-secret")
	if err := os.WriteFile(hookSecret, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	hook := newWebhookReceiver(t, secret, http.StatusOK)
	rs := startReplicas(t, e2eDatabase(t), 3, "--notify-url", hook.srv.URL, "--notify-secret-file", hookSecret)
	ctx := t.Context()

	// A reviewer's `review watch` with an hour between polls: only the
	// store's NOTIFY can wake it in time.
	watch := exec.Command(binPath, "review", "watch", "--dir", rs.root, "--store", rs.dsn, "--json", "--interval", "1h")
	var watched, watchErr lockedBuffer
	watch.Stdout, watch.Stderr = &watched, &watchErr
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watch.Process.Kill(); watch.Wait() })
	// Its first read is done (before the review exists): what it prints
	// next it learnt from a wake.
	waitFor(t, "review watch to start", func() bool { return strings.Contains(watchErr.String(), "watching postgres://") })

	// 40 identical questions, spread over the replicas, at once.
	const askers = 40
	var wg sync.WaitGroup
	start := make(chan struct{})
	answers := make([]checkAnswer, askers)
	errs := make([]string, askers)
	for i := range askers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := askCheck(ctx, rs.sessions[i%3], "0.30")
			switch {
			case err != nil:
				errs[i] = err.Error()
			case res.IsError:
				errs[i] = resultText(res)
			default:
				decodeStructured(t, res, &answers[i])
			}
		}()
	}
	close(start)
	wg.Wait()
	for i, a := range answers {
		if errs[i] != "" {
			t.Fatalf("asker %d: %s\n%s", i, errs[i], rs.procs[i%3].logs())
		}
		if a.Decision != "review" || a.ReviewID == "" || a.ReviewID != answers[0].ReviewID {
			t.Fatalf("asker %d: %+v; asker 0 got review %s — every answer must carry the one review", i, a, answers[0].ReviewID)
		}
	}
	id := answers[0].ReviewID
	out, errOut, code := runCLI(t, "review", "list", "--dir", rs.root, "--store", rs.dsn, "--json")
	if code != 0 || strings.Count(out, `"created_at"`) != 1 || !strings.Contains(out, id) {
		t.Fatalf("review list: %d %s %s", code, out, errOut)
	}
	waitFor(t, "the webhook to hear of the review", func() bool { return hook.count(id) >= 1 })
	waitFor(t, "review watch to be woken by the store", func() bool {
		out := watched.String()
		return strings.Contains(out, `"event":"review.opened"`) && strings.Contains(out, id)
	})
	time.Sleep(300 * time.Millisecond) // any second delivery would arrive by now
	if n := hook.count(id); n != 1 || hook.bad != 0 {
		t.Fatalf("the review was notified %d times across 3 replicas (bad %d), want once", n, hook.bad)
	}

	// Four CLI decisions at once: one wins.
	type result struct {
		verb, stderr string
		code         int
	}
	results := make([]result, 4)
	for i := range results {
		verb := []string{"approve", "reject"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, e, c := runCLI(t, "review", verb, id, "--dir", rs.root, "--store", rs.dsn, "--note", "race "+verb)
			results[i] = result{verb, e, c}
		}()
	}
	wg.Wait()
	winner := ""
	for _, r := range results {
		switch {
		case r.code == 0 && winner == "":
			winner = r.verb
		case r.code == 0:
			t.Fatalf("two decisions won: %+v", results)
		case !strings.Contains(r.stderr, "already decided"):
			t.Fatalf("a losing decision says %q (exit %d), want already decided", r.stderr, r.code)
		}
	}
	if winner == "" {
		t.Fatalf("no decision won: %+v", results)
	}
	var st map[string]any
	decodeStructured(t, callTool(t, rs.sessions[2], "get_review_status", map[string]any{"review_id": id}), &st)
	if want := map[string]string{"approve": "approved", "reject": "rejected"}[winner]; st["status"] != want {
		t.Fatalf("status on replica 3 after %s won: %v", winner, st)
	}

	// A replica killed with SIGKILL in the middle of a burst of decisions.
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			askCheck(cctx, rs.sessions[0], "0.5"+string(rune('0'+i%10))) // errors expected once it is killed
		}()
	}
	time.Sleep(40 * time.Millisecond)
	if err := rs.procs[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	<-rs.procs[0].exited
	var after checkAnswer
	decodeStructured(t, callTool(t, rs.sessions[1], "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.77"}), &after)
	if after.Decision != "review" || after.ReviewID == "" {
		t.Fatalf("a surviving replica after the kill: %+v", after)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", rs.root, "--store", rs.dsn); code != 0 || !strings.Contains(out, "CONSISTENT") {
		t.Fatalf("audit after the kill: exit %d\n%s\n%s", code, out, errOut)
	}

	// The chains, exported, verify VALID; through a file store and a
	// second database they come back byte for byte.
	exported := filepath.Join(t.TempDir(), "export")
	if out, errOut, code := runCLI(t, "store", "export", "--store", rs.dsn, "--dir", exported); code != 0 {
		t.Fatalf("store export: %d %s %s", code, out, errOut)
	}
	keyring := filepath.Join(exported, reviewlog.DirName, reviewlog.KeyringFile)
	list, _, code := runCLI(t, "chain", "list", "--store", rs.dsn)
	// The service key's chain, its lanes (replicas answering side by
	// side each append to a lane of their own) and alice's.
	if code != 0 || strings.Count(list, "\n") < 2 || !strings.Contains(list, "\n") {
		t.Fatalf("chain list: %d %q (want the service chain, its lanes, and alice's)", code, list)
	}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		chain := strings.Split(line, "\t")[0]
		js, errOut, code := runCLI(t, "chain", "export", chain, "--store", rs.dsn)
		if code != 0 {
			t.Fatalf("chain export %s: %d %s", chain, code, errOut)
		}
		arr := filepath.Join(t.TempDir(), chain+".json")
		if err := os.WriteFile(arr, []byte(js), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, errOut, code := runCLI(t, "verify", arr, keyring); code != 0 || !strings.HasPrefix(out, "VALID") {
			t.Fatalf("verify the exported %s: %d %s %s", chain, code, out, errOut)
		}
		if out, _, code := runCLI(t, "verify", chain, "--store", rs.dsn, "--keyring", keyring); code != 0 || !strings.HasPrefix(out, "VALID") {
			t.Fatalf("verify --store %s: %d %s", chain, code, out)
		}
	}
	second := e2eDatabase(t)
	if out, errOut, code := runCLI(t, "store", "import", "--dir", exported, "--store", second); code != 0 || !strings.Contains(out, "VALID before and after") {
		t.Fatalf("store import: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, "store", "import", "--dir", exported, "--store", second); code == 0 || !strings.Contains(errOut, "not empty") {
		t.Fatalf("a second import into the same store: %d %s", code, errOut)
	}
	again := filepath.Join(t.TempDir(), "again")
	if _, errOut, code := runCLI(t, "store", "export", "--store", second, "--dir", again); code != 0 {
		t.Fatalf("second export: %s", errOut)
	}
	sameTree(t, filepath.Join(exported, reviewlog.DirName), filepath.Join(again, reviewlog.DirName))

	// The decided review moves to an archive inside the database, and the
	// audit still checks it against its receipts.
	before, _, _ := runCLI(t, "audit", "--dir", rs.root, "--store", rs.dsn)
	time.Sleep(10 * time.Millisecond)
	if out, errOut, code := runCLI(t, "review", "archive", "--dir", rs.root, "--store", rs.dsn, "--older-than", "5ms"); code != 0 || !strings.Contains(out, "archived 1 reviews") {
		t.Fatalf("review archive on PostgreSQL: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", rs.root, "--store", rs.dsn); code != 0 || !strings.HasPrefix(out, "CONSISTENT") || out != before {
		t.Fatalf("audit after the archive: %d %s %s, want as before it: %s", code, out, errOut, before)
	}
	if out, _, _ := runCLI(t, "review", "list", "--dir", rs.root, "--store", rs.dsn, "--all", "--json"); strings.Contains(out, id) {
		t.Fatalf("the archived review is still in the log: %s", out)
	}
	// Three servers, every command above: nothing was written under the
	// Trace root, which may as well have been mounted read-only.
	if _, err := os.Stat(filepath.Join(rs.root, reviewlog.DirName)); !os.IsNotExist(err) {
		t.Fatalf("guard/ exists under the Trace root with the PostgreSQL store (stat: %v)", err)
	}
}

// sameTree fails unless every regular file under a is under b with the
// same bytes, and b has no other.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	files := func(dir string) map[string]string {
		out := map[string]string{}
		filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err != nil || !info.Mode().IsRegular() || strings.HasSuffix(p, ".lock") {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			out[rel] = string(data)
			return nil
		})
		return out
	}
	fa, fb := files(a), files(b)
	if len(fa) == 0 || len(fa) != len(fb) {
		t.Fatalf("%d files under %s, %d under %s", len(fa), a, len(fb), b)
	}
	for name, data := range fa {
		if fb[name] != data {
			t.Fatalf("%s differs after the round trip", name)
		}
	}
}

// PostgreSQL stopped under running replicas: every decision is a tool
// error (no answer is given), /readyz says why; restarted, the replicas
// answer again without a restart of their own. It stops the server it
// uses, so it takes one of its own: HAIA_TEST_POSTGRES_RESTARTABLE, with
// the commands that stop and start it (.ci/run runs a second cluster).
func TestReplicasFailClosedWhilePostgresIsDown(t *testing.T) {
	dsn := os.Getenv("HAIA_TEST_POSTGRES_RESTARTABLE")
	stop, startCmd := os.Getenv("HAIA_TEST_POSTGRES_STOP"), os.Getenv("HAIA_TEST_POSTGRES_START")
	if dsn == "" || stop == "" || startCmd == "" {
		t.Skip("HAIA_TEST_POSTGRES_RESTARTABLE, HAIA_TEST_POSTGRES_STOP and HAIA_TEST_POSTGRES_START are not set: this test stops and starts a PostgreSQL server no other test uses (.ci/run starts one)")
	}
	rs := startReplicas(t, e2eDatabaseOn(t, dsn), 2)
	ctx := t.Context()
	var first checkAnswer
	decodeStructured(t, callTool(t, rs.sessions[0], "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.30"}), &first)
	sh := func(c string) {
		if out, err := exec.Command("sh", "-c", c).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c, err, out)
		}
	}
	sh(stop)
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			exec.Command("sh", "-c", startCmd).Run()
		}
	})
	for i, cs := range rs.sessions {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		res, err := askCheck(cctx, cs, "0.31")
		cancel()
		if err != nil {
			t.Fatalf("replica %d with PostgreSQL down: transport error %v, want a tool error", i, err)
		}
		if !res.IsError || !strings.Contains(resultText(res), "no decision is given") {
			t.Fatalf("replica %d with PostgreSQL down answered: isError=%v %q", i, res.IsError, resultText(res))
		}
		if code, body := getText(t, rs.procs[i].base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "store") {
			t.Fatalf("replica %d readyz with PostgreSQL down: %d %q", i, code, body)
		}
		if logs := rs.procs[i].logs(); !strings.Contains(logs, "PostgreSQL at postgres://haia") || strings.Contains(logs, "haia_ci:haia_ci@") {
			t.Fatalf("replica %d: the log should say PostgreSQL is the cause, without the password:\n%s", i, logs)
		}
	}
	sh(startCmd)
	restarted = true
	for i, cs := range rs.sessions {
		waitFor(t, "the replica to answer again", func() bool {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			res, err := askCheck(cctx, cs, "0.30")
			return err == nil && !res.IsError
		})
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.30"}), &a)
		if a.Decision != "review" || a.ReviewID != first.ReviewID {
			t.Fatalf("replica %d after the restart: %+v, want the review opened before (%s)", i, a, first.ReviewID)
		}
		if code, body := getText(t, rs.procs[i].base+"/readyz"); code != http.StatusOK {
			t.Fatalf("replica %d readyz after the restart: %d %q", i, code, body)
		}
	}
}

// A server refuses to start on a database whose schema is not migrated,
// saying what to run, and on tenants with one database for all of them.
func TestPostgresStoreStartRefusals(t *testing.T) {
	migrated := e2eDatabase(t)
	bare := pgtest.Database(t, pgtest.DSN(t))
	root := loopRoot(t)
	key := filepath.Join(t.TempDir(), "k.pem")
	_, errOut, code := runCLI(t, "--dir", root, "--key-file", key, "--store", bare)
	if code == 0 || !strings.Contains(errOut, "behind this binary") || !strings.Contains(errOut, "store migrate") {
		t.Fatalf("start on an unmigrated database: exit %d %s", code, errOut)
	}
	if strings.Contains(errOut, "haia_ci:haia_ci@") || strings.Contains(errOut, ":haia@") {
		t.Fatalf("the password is in the message: %s", errOut)
	}
	tenants := t.TempDir()
	if err := os.MkdirAll(filepath.Join(tenants, "acme", "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(strings.Repeat("s", 48)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runCLI(t, "--tenants-dir", tenants, "--tenant-claim", "org", "--store", migrated, "--key-file", key, "--http", "127.0.0.1:0",
		"--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile)
	if code == 0 || !strings.Contains(errOut, "--tenants-dir") || !strings.Contains(errOut, "database per tenant") {
		t.Fatalf("tenants on one database: exit %d %s", code, errOut)
	}
	if _, errOut, code := runCLI(t, "review", "list", "--dir", root, "--store", "mysql://x"); code != 2 || !strings.Contains(errOut, "want file:") {
		t.Fatalf("an unknown store: exit %d %s", code, errOut)
	}
}
