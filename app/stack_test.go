package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// The PostgreSQL store dispatches opened reviews through its outbox; the
// stack finds that out through the optional interface, not its type.
var _ app.OpenedDispatcher = (*pgstore.Store)(nil)

// seller is a payee of testdata/guard/buyer-run.ndjson, with payments
// whose outcome the run never confirmed.
const seller = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"

// newTraceRoot makes a Trace root holding the buyer run the guard's tests
// use, a signing key and a trusted reviewers file, and returns the
// configuration of a stack over it.
func newTraceRoot(t *testing.T, dir string) app.Config {
	t.Helper()
	run, err := os.ReadFile(filepath.Join("..", "testdata", "guard", "buyer-run.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "events", "buyer.ndjson"), run, 0o644); err != nil {
		t.Fatal(err)
	}
	keys := t.TempDir()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	reviewers := filepath.Join(keys, "reviewers.json")
	if _, err := reviewlog.AddReviewer(reviewers, "alice", pub); err != nil {
		t.Fatal(err)
	}
	return app.Config{
		Dir:           dir,
		Signing:       app.Signing{KeyFile: filepath.Join(keys, "signing-key.pem"), Tenant: "test"},
		ReviewersPath: reviewers,
		Store:         "file:",
		Replica:       "test",
	}
}

func open(t *testing.T, cfg app.Config) *app.Stack {
	t.Helper()
	st, err := app.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// ask asks the stack's engine a question and checks the answer is recorded.
func ask(t *testing.T, st *app.Stack, q engine.Question) engine.Answer {
	t.Helper()
	ans, err := st.Engine().CheckWith(t.Context(), "agent-1", q, engine.CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ans.ReceiptID == "" || len(ans.Reasons) == 0 {
		t.Fatalf("answer %+v: want a signed receipt and its reasons", ans)
	}
	return ans
}

// checkStack asks questions through a stack's engine and its catalog.
func checkStack(t *testing.T, st *app.Stack) {
	t.Helper()
	if err := st.Ready(t.Context()); err != nil {
		t.Fatalf("a fresh stack is not ready: %v", err)
	}
	page, err := st.Catalog().List(t.Context(), catalogQuery())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Operations) == 0 || page.RunsScanned != 1 {
		t.Fatalf("catalog lists %d operations from %d runs; want the buyer run's", len(page.Operations), page.RunsScanned)
	}
	// The run leaves an operation unattributable, so any question is
	// reviewed; the decision names a review a human decides.
	ans := ask(t, st, engine.Question{Counterparty: "0x9999999999999999999999999999999999999999", Amount: "0.10"})
	if ans.Decision != guard.Review || ans.ReviewID == "" {
		t.Fatalf("a new counterparty: %s (review %q), want a pending review", ans.Decision, ans.ReviewID)
	}
	// The store holds it: the review log reads it back.
	rv, err := st.Log().Get(t.Context(), ans.ReviewID)
	if err != nil || rv.Status != reviewlog.Pending {
		t.Fatalf("review %s in the store: %+v, %v", ans.ReviewID, rv, err)
	}
	// The history the engine read is the catalog's: the buyer run's open
	// payments to the seller are the evidence.
	again := ask(t, st, engine.Question{Counterparty: seller, Amount: "0.10"})
	found := false
	for _, r := range again.Reasons {
		if r.Rule == guard.RuleUnreadable {
			t.Fatalf("the engine could not read the catalog's history: %+v", r)
		}
		if r.Rule == guard.RuleOpenPartial && len(r.Evidence) == 3 && r.Evidence[0].RunID == "buyer" {
			found = true
		}
	}
	if !found {
		t.Fatalf("answer %+v: want open_partial resting on the buyer run's three open payments", again.Reasons)
	}
}

func TestOpenFileStore(t *testing.T) {
	st := open(t, newTraceRoot(t, t.TempDir()))
	checkStack(t, st)
	if st.Store().Describe() == "" || st.Chains() == nil || st.Payments() != nil {
		t.Fatal("the stack does not hold its store and chains (or holds a payer it was not given)")
	}
}

func TestOpenPostgres(t *testing.T) {
	dsn := pgtest.Database(t, pgtest.DSN(t))
	if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	cfg := newTraceRoot(t, t.TempDir())
	cfg.Store = dsn
	st := open(t, cfg)
	// The store tells of each append as it happens: after the catch-up
	// wake at LISTEN, the next wake is the question's review.
	listen := app.LogChanges(st.Store(), time.Hour, nil)
	if listen == nil {
		t.Fatal("the PostgreSQL store offers no way to hear of appends")
	}
	wakes := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go listen(ctx, func() { wakes <- struct{}{} })
	select {
	case <-wakes:
	case <-time.After(10 * time.Second):
		t.Fatal("no catch-up wake at LISTEN")
	}
	checkStack(t, st)
	select {
	case <-wakes:
	case <-time.After(10 * time.Second):
		t.Fatal("an append to the review log was not heard")
	}
	if !strings.HasPrefix(st.Store().Describe(), "postgres") {
		t.Fatalf("store %s, want PostgreSQL", st.Store().Describe())
	}
	// The root holds no guard/: the PostgreSQL store is the only state.
	if _, err := os.Stat(filepath.Join(cfg.Dir, reviewlog.DirName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("guard/ under the root with the PostgreSQL store: %v", err)
	}
}

// A database the schema was never applied to is refused with the reason,
// and nothing stays open.
func TestOpenPostgresUnmigrated(t *testing.T) {
	dsn := pgtest.Database(t, pgtest.DSN(t))
	cfg := newTraceRoot(t, t.TempDir())
	cfg.Store = dsn
	st, err := app.Open(t.Context(), cfg)
	if err == nil {
		st.Close()
		t.Fatal("opened on an unmigrated database")
	}
	if !strings.Contains(err.Error(), "migrate") {
		t.Fatalf("err %q: want it to say to migrate", err)
	}
}

func TestOpenReadOnly(t *testing.T) {
	dir := t.TempDir()
	cfg := newTraceRoot(t, dir)
	st := open(t, app.Config{Dir: cfg.Dir, ReadOnly: true})
	if st.Engine() != nil || st.Store() != nil {
		t.Fatal("a read-only stack opened a guard")
	}
	if err := st.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, reviewlog.DirName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a read-only stack wrote guard/: %v", err)
	}
}

func TestOpenRefusals(t *testing.T) {
	base := newTraceRoot(t, t.TempDir())
	for _, tc := range []struct {
		name string
		mod  func(*app.Config)
		want string
	}{
		{"no root", func(c *app.Config) { c.Dir = filepath.Join(t.TempDir(), "absent") }, "cannot be opened"},
		{"a store that is neither", func(c *app.Config) { c.Store = "mysql://x" }, "want file: (the Trace root's guard/) or a postgres:// URL"},
		{"a policy file that is not there", func(c *app.Config) { c.GuardConfig = filepath.Join(t.TempDir(), "nope.json") }, "--guard-config"},
		{"a signer address that is not unix:", func(c *app.Config) { c.Signing = app.Signing{Signer: "tcp:1", ParamsKeyFile: "p"} }, "want unix:PATH"},
		{"a signer beside a key", func(c *app.Config) { c.Signing.Signer = "unix:/nonexistent"; c.Signing.ParamsKeyFile = "p" }, "exclude each other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mod(&cfg)
			st, err := app.Open(t.Context(), cfg)
			if err == nil {
				st.Close()
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %q, want it to say %q", err, tc.want)
			}
		})
	}
	var re *app.RootError
	if _, err := app.Open(t.Context(), app.Config{Dir: filepath.Join(t.TempDir(), "absent")}); !errors.As(err, &re) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing root: %v, want a RootError wrapping ErrNotExist", err)
	}
}

// Readiness asks every tenant and names the one that is not ready.
func TestTenantsReadiness(t *testing.T) {
	tenants := t.TempDir()
	var cfg app.Config
	for _, name := range []string{"acme", "globex"} {
		cfg = newTraceRoot(t, filepath.Join(tenants, name))
	}
	ts, err := app.OpenTenants(t.Context(), tenants, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	if got := strings.Join(ts.Names(), ","); got != "acme,globex" {
		t.Fatalf("tenants %s", got)
	}
	if err := ts.Ready(t.Context()); err != nil {
		t.Fatalf("fresh tenants not ready: %v", err)
	}
	for _, name := range ts.Names() {
		st := ts.Stack(name)
		if st.Tenant() != name {
			t.Fatalf("stack of %s serves %q", name, st.Tenant())
		}
		ans := ask(t, st, engine.Question{Counterparty: "0x9999999999999999999999999999999999999999", Amount: "0.10"})
		if _, err := os.Stat(filepath.Join(tenants, name, reviewlog.DirName)); err != nil {
			t.Fatalf("tenant %s's decision %s is not under its own root: %v", name, ans.ReceiptID, err)
		}
	}
	// globex's guard/ becomes a file: its store cannot take a decision.
	g := filepath.Join(tenants, "globex", reviewlog.DirName)
	if err := os.RemoveAll(g); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = ts.Ready(t.Context())
	var nr *engine.NotReadyError
	if !errors.As(err, &nr) || !strings.Contains(nr.Reason, `tenant "globex"`) || strings.Contains(nr.Reason, "acme") {
		t.Fatalf("readiness with globex broken: %v, want it to name globex alone", err)
	}
	if err := ts.Stack("acme").Ready(t.Context()); err != nil {
		t.Fatalf("acme is fine: %v", err)
	}
}

// TenantStore: the file store is every tenant's; a PostgreSQL URL names
// each tenant's database by {tenant} in its database name, and only there;
// no message repeats the URL (it may hold a password).
func TestTenantStore(t *testing.T) {
	const pw = "s3cret-pw"
	for _, tc := range []struct {
		name, spec, tenant, want, err string
	}{
		{"file store, tenant", "file:", "acme", "file:", ""},
		{"file store, none", "file:", "", "file:", ""},
		{"one database, no tenant", "postgres://u:" + pw + "@db:5432/haia?sslmode=disable", "", "postgres://u:" + pw + "@db:5432/haia?sslmode=disable", ""},
		{"a database per tenant", "postgres://u:" + pw + "@db:5432/haia_{tenant}?sslmode=disable", "acme", "postgres://u:" + pw + "@db:5432/haia_acme?sslmode=disable", ""},
		{"the name is the tenant", "postgresql://u@db/{tenant}", "globex-2", "postgresql://u@db/globex-2", ""},
		{"one database for every tenant", "postgres://u:" + pw + "@db/haia", "acme", "", "database per tenant"},
		{"twice", "postgres://u@db/{tenant}_{tenant}", "acme", "", "database per tenant"},
		{"in the host", "postgres://u@{tenant}.db/haia_{x}", "acme", "", "database per tenant"},
		{"in the host, not the name", "postgres://u@{tenant}.db/haia", "acme", "", "database per tenant"},
		{"in the user", "postgres://{tenant}:" + pw + "@db/haia", "acme", "", "database per tenant"},
		{"in the query", "postgres://u@db/haia?application_name={tenant}", "acme", "", "database per tenant"},
		{"in a path below the name", "postgres://u@db/haia/{tenant}", "acme", "", "database per tenant"},
		{"a placeholder and no tenant", "postgres://u:" + pw + "@db/haia_{tenant}", "", "", "give --tenants-dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := app.TenantStore(tc.spec, tc.tenant)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %q, %v; want an error saying %q", got, err, tc.err)
				}
				if strings.Contains(err.Error(), pw) {
					t.Fatalf("the error repeats the password: %v", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// One database named for every tenant is refused before any is opened.
	cfg := newTraceRoot(t, filepath.Join(t.TempDir(), "acme"))
	cfg.Store = "postgres://x@localhost/db"
	if _, err := app.OpenTenants(t.Context(), filepath.Dir(cfg.Dir), cfg); err == nil || !strings.Contains(err.Error(), "database per tenant") {
		t.Fatalf("err %v", err)
	}
	// A store a placeholder names is no store without a tenant.
	cfg.Store = "postgres://x@localhost/db_{tenant}"
	if st, err := app.Open(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "give --tenants-dir") {
		if st != nil {
			st.Close()
		}
		t.Fatalf("err %v", err)
	}
}

// tenantDatabases creates, on the test server, one migrated database per
// tenant, dropped when the test ends, and returns the --store URL that
// names them ({tenant}).
func tenantDatabases(t *testing.T, tenants ...string) string {
	t.Helper()
	dbs, store := pgtest.Databases(t, pgtest.DSN(t), app.TenantPlaceholder, tenants...)
	for _, dsn := range dbs {
		if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
			t.Fatal(err)
		}
	}
	return store
}

// Tenants on one PostgreSQL server, each in its own database: each
// tenant's review is in its database only, and its stack reads its own.
func TestTenantsOnPostgres(t *testing.T) {
	store := tenantDatabases(t, "acme", "globex")
	dir := t.TempDir()
	cfg := newTraceRoot(t, filepath.Join(dir, "acme"))
	newTraceRoot(t, filepath.Join(dir, "globex"))
	cfg.Store = store
	ts, err := app.OpenTenants(t.Context(), dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	if err := ts.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, name := range ts.Names() {
		st := ts.Stack(name)
		if d := st.Store().Describe(); !strings.Contains(d, "_"+name) {
			t.Fatalf("tenant %s's store is %s", name, d)
		}
		ans := ask(t, st, engine.Question{Counterparty: "0x9999999999999999999999999999999999999999", Amount: "0.10"})
		ids[name] = ans.ReviewID
	}
	for _, name := range ts.Names() {
		for other, id := range ids {
			_, err := ts.Stack(name).Log().Get(t.Context(), id)
			if (other == name) != (err == nil) {
				t.Errorf("tenant %s reading %s's review %s: %v", name, other, id, err)
			}
		}
	}
}

func TestInitRoot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".trace")
	made, err := app.InitRoot(dir)
	if err != nil || len(made) != 4 {
		t.Fatalf("made %q, %v; want the root and its three directories", made, err)
	}
	st, err := os.Stat(filepath.Join(dir, reviewlog.DirName))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("guard/: %v, %v; want mode 0700", st, err)
	}
	r, err := app.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check(); err != nil {
		t.Fatalf("a root init made is no Trace root: %v", err)
	}
	r.Close()
	if made, err := app.InitRoot(dir); err != nil || len(made) != 0 {
		t.Fatalf("again: made %q, %v; want nothing", made, err)
	}
	// An entry in the way stops it, naming it.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "events"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := app.InitRoot(other); err == nil || !strings.Contains(err.Error(), "events exists and is not a directory") {
		t.Fatalf("err %v", err)
	}
	// A directory that holds neither events/ nor guard/ is no Trace root.
	empty, err := app.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	if err := empty.Check(); !errors.Is(err, app.ErrNotTraceRoot) {
		t.Fatalf("an empty folder: %v", err)
	}
}

// The PostgreSQL store tells of appends as they happen; the file store is
// polled (no listener).
var _ app.Listener = (*pgstore.Store)(nil)

func TestLogChangesOfTheFileStore(t *testing.T) {
	st := open(t, newTraceRoot(t, t.TempDir()))
	if app.LogChanges(st.Store(), 0, nil) != nil {
		t.Fatal("the file store offered to tell of appends it cannot hear")
	}
}
