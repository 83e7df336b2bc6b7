package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// guardLockKey is the PostgreSQL store's advisory lock of a guard's whole
// state (pgstore's lockKey, "HaiaGuar"): every decision takes it shared.
const guardLockKey = 0x4861696147756172

// tenantRoots makes a --tenants-dir of two tenants, acme and globex, each
// a Trace root whose run left a payment open to its own seller (sellerA,
// sellerB).
func tenantRoots(t *testing.T) string {
	t.Helper()
	tenants := filepath.Join(t.TempDir(), "tenants")
	for name, seller := range map[string]string{"acme": sellerA, "globex": sellerB} {
		rec, err := simrec.New(filepath.Join(tenants, name), "run-"+name, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: "op-" + name, URL: "https://" + name + ".example/x", PayTo: seller, Amount: "100000", Outcome: "unsettled"}); err != nil {
			t.Fatal(err)
		}
	}
	return tenants
}

// tenantCaller connects to a --tenants-dir server as agent-1 of tenant,
// with an HS256 token of the server's secret naming the tenant in "org",
// and returns a function that calls a tool: whether it failed, its text
// and its structured answer.
func tenantCaller(t *testing.T, p *httpProc, secret []byte, tenant string) func(string, map[string]any) (bool, string, map[string]any) {
	t.Helper()
	tok := signHS256(t, secret, map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": "agent-1", "org": tenant,
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	cs, err := httpSession(t, p.resource, func() string { return tok })
	if err != nil {
		t.Fatalf("connect as %s: %v\n%s", tenant, err, p.logs())
	}
	return func(tool string, args map[string]any) (bool, string, map[string]any) {
		res := callTool(t, cs, tool, args)
		var m map[string]any
		if res.StructuredContent != nil {
			b, _ := json.Marshal(res.StructuredContent)
			json.Unmarshal(b, &m)
		}
		return res.IsError, resultText(res), m
	}
}

// Tenants on one PostgreSQL server, each in its own database (--store
// names it with {tenant}): while a session holds everything of acme's
// guard — its whole-store lock, alone — acme's question waits for it
// (pg_locks shows the server's backend waiting in acme's database) and
// globex's is answered at once, no lock of globex's database waiting; let
// go, acme's question is answered too. Each tenant's review is in its own
// database only.
func TestTenantsOnPostgresNeverShareALock(t *testing.T) {
	tenants := tenantRoots(t)
	dbs, store := pgtest.Databases(t, pgtest.DSN(t), app.TenantPlaceholder, "acme", "globex")
	for name, dsn := range dbs {
		if out, errOut, code := runCLI(t, "store", "migrate", "--store", dsn); code != 0 {
			t.Fatalf("store migrate of %s: %d %s %s", name, code, out, errOut)
		}
	}
	dir := t.TempDir()
	secret := []byte(strings.Repeat("t", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	// One database for both is refused, saying why, before serving.
	if _, errOut, code := runCLI(t, "--http", "127.0.0.1:0", "--tenants-dir", tenants, "--tenant-claim", "org", "--store", dbs["acme"],
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile); code == 0 || !strings.Contains(errOut, "database per tenant") {
		t.Fatalf("tenants on one database: %d %s", code, errOut)
	}
	p := startHTTPBinary(t, "--tenants-dir", tenants, "--tenant-claim", "org", "--store", store,
		"--key-file", filepath.Join(dir, "signing.pem"), "--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile)
	acme, globex := tenantCaller(t, p, secret, "acme"), tenantCaller(t, p, secret, "globex")
	// Each tenant asks of the seller its run left a payment open to: a
	// review, the same one each time it is asked.
	question := map[string]map[string]any{"acme": {"counterparty": sellerA, "amount": "0.10"}, "globex": {"counterparty": sellerB, "amount": "0.10"}}
	ids := map[string]string{}
	for name, ask := range map[string]func(string, map[string]any) (bool, string, map[string]any){"acme": acme, "globex": globex} {
		isErr, text, ans := ask("check_before_pay", question[name])
		if isErr || ans["review_id"] == nil {
			t.Fatalf("%s's first question: %v %s", name, isErr, text)
		}
		ids[name] = ans["review_id"].(string)
	}

	ctx := t.Context()
	holder, err := pgx.Connect(ctx, dbs["acme"])
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1::bigint)", int64(guardLockKey)); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		isErr bool
		text  string
		ans   map[string]any
	}
	acmeDone := make(chan answer, 1)
	go func() {
		isErr, text, ans := acme("check_before_pay", question["acme"])
		acmeDone <- answer{isErr, text, ans}
	}()
	// waiting counts the advisory locks some backend other than ours waits
	// for in the database of conn.
	waiting := func(conn *pgx.Conn) int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE l.locktype = 'advisory' AND NOT l.granted AND l.pid <> pg_backend_pid() AND d.datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(3 * time.Second)
	for waiting(holder) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("acme's question does not wait for acme's guard lock\n%s", p.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case a := <-acmeDone:
		t.Fatalf("acme answered while its guard was held: %+v", a)
	default:
	}
	// globex answers while acme's waits, and nothing waits in its database.
	begun := time.Now()
	isErr, text, ans := globex("check_before_pay", question["globex"])
	took := time.Since(begun)
	if isErr || ans["review_id"] != ids["globex"] {
		t.Fatalf("globex while acme's guard is held: %v %s", isErr, text)
	}
	if took > 2*time.Second {
		t.Fatalf("globex waited %s while acme's guard was held", took)
	}
	other, err := pgx.Connect(ctx, dbs["globex"])
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	if n := waiting(other); n != 0 {
		t.Fatalf("%d locks wait in globex's database", n)
	}
	select {
	case a := <-acmeDone:
		t.Fatalf("acme answered while its guard was held: %+v", a)
	default:
	}
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock($1::bigint)", int64(guardLockKey)); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-acmeDone:
		if a.isErr || a.ans["review_id"] != ids["acme"] {
			t.Fatalf("acme once its guard is let go: %v %s", a.isErr, a.text)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("acme's question was not answered once its guard was let go")
	}
	// Each tenant's review is in its own database only.
	for name, dsn := range dbs {
		for other, id := range ids {
			out, _, code := runCLI(t, "review", "show", id, "--tenants-dir", tenants, "--tenant", name, "--store", store)
			if (code == 0) != (name == other) {
				t.Errorf("tenant %s (%s) showing %s's review: exit %d %s", name, dsn[strings.LastIndex(dsn, "/"):], other, code, out)
			}
		}
	}
}
