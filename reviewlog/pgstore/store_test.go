package pgstore_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/storetest"
)

// freshStore makes an empty database for one test, migrated when asked.
func freshStore(t testing.TB, migrate bool) string {
	t.Helper()
	dsn := pgtest.Database(t, pgtest.DSN(t))
	if migrate {
		if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	return dsn
}

func open(t testing.TB, dsn string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The PostgreSQL store keeps the store contract; each handle is its own
// connection pool, as each replica has.
func TestPostgresStoreContract(t *testing.T) {
	storetest.Run(t, pgStores)
}

func pgStores(t testing.TB) (reviewlog.Store, func() reviewlog.Store, storetest.Tamperer) {
	dsn := freshStore(t, true)
	return open(t, dsn), func() reviewlog.Store { return open(t, dsn) }, databaseWriter(dsn)
}

// BenchmarkPostgresStoreAsk: HAIA_TEST_POSTGRES=… go test -bench PostgresStoreAsk ./reviewlog/pgstore/
//
// 16 callers (8 a CPU on 2 CPUs) each asking of a counterparty of its
// own (distinct) or all of one (shared), over 1 and 3 handles (replicas).
// Besides decisions/s it reports the statements and round trips one
// decision sends to the database.
func BenchmarkPostgresStoreAsk(b *testing.B) {
	for _, handles := range []int{1, 3} {
		for _, shape := range []string{"distinct", "shared"} {
			b.Run(fmt.Sprintf("replicas=%d/counterparties=%s", handles, shape), func(b *testing.B) {
				var c pgstore.Counter
				counted := func(t testing.TB) (reviewlog.Store, func() reviewlog.Store, storetest.Tamperer) {
					dsn := freshStore(t, true)
					openCounted := func() reviewlog.Store {
						s, err := pgstore.OpenCounted(t.Context(), dsn, &c)
						if err != nil {
							t.Fatal(err)
						}
						return s
					}
					return openCounted(), openCounted, databaseWriter(dsn)
				}
				storetest.Bench(b, counted, handles, shape == "shared", func() (int64, int64) { return c.Statements.Load(), c.RoundTrips.Load() })
			})
		}
	}
}

// databaseWriter writes the guard's tables directly, as anyone holding the
// DSN can.
type databaseWriter string

func (d databaseWriter) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), string(d))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

func (d databaseWriter) AppendLogLine(t *testing.T, line []byte) {
	line = append(line, '\n')
	d.exec(t, `WITH s AS (UPDATE guard_streams SET size = size + length($1::bytea) WHERE name = 'decisions.ndjson' RETURNING size - length($1::bytea) AS off)
		INSERT INTO review_lines (stream, off, line) SELECT 'decisions.ndjson', off, $1 FROM s`, line)
}

func (d databaseWriter) EmptyLog(t *testing.T) {
	d.exec(t, `DELETE FROM review_lines WHERE stream = 'decisions.ndjson'`)
	d.exec(t, `UPDATE guard_streams SET size = 0 WHERE name = 'decisions.ndjson'`)
}

// EditLog rewrites the row of the line in place with SQL, as anyone
// holding the DSN can; the line keeps its length, so its offset and the
// stream's size stay true.
func (d databaseWriter) EditLog(t *testing.T, reviewID, old, new string) {
	t.Helper()
	if len(old) != len(new) {
		t.Fatalf("EditLog keeps the size: %q and %q differ in length", old, new)
	}
	conn, err := pgx.Connect(t.Context(), string(d))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tag, err := conn.Exec(t.Context(), `UPDATE review_lines SET line = convert_to(replace(convert_from(line, 'UTF8'), $2, $3), 'UTF8')
		WHERE stream = 'decisions.ndjson' AND off = (SELECT min(off) FROM review_lines WHERE stream = 'decisions.ndjson'
		AND position(convert_to($1, 'UTF8') IN line) > 0 AND position(convert_to($2, 'UTF8') IN line) > 0)`, reviewID, old, new)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("no line of the log holds %s and %q", reviewID, old)
	}
}

// A schema behind the binary is refused with what to run; migrate brings
// it up to date, and is idempotent.
func TestSchemaVersionIsChecked(t *testing.T) {
	dsn := freshStore(t, false)
	_, err := pgstore.Open(t.Context(), dsn)
	if !errors.Is(err, pgstore.ErrSchema) {
		t.Fatalf("open before migrate: %v, want ErrSchema", err)
	}
	if want := "run `haia-trace-mcp store migrate --store URL` first"; !strings.Contains(err.Error(), want) {
		t.Fatalf("message %q does not say %q", err, want)
	}
	before, after, err := pgstore.Migrate(t.Context(), dsn, nil)
	if err != nil || before.Database != 0 || after.Database != after.Binary || after.Binary < 1 {
		t.Fatalf("migrate: %+v → %+v %v", before, after, err)
	}
	_, again, err := pgstore.Migrate(t.Context(), dsn, nil)
	if err != nil || again.Database != after.Database || again.Binary != after.Binary || len(again.Applied) != 0 {
		t.Fatalf("second migrate: %+v %v", again, err)
	}
	running := open(t, dsn)
	defer running.Close()
	if err := running.Ready(t.Context()); err != nil {
		t.Fatalf("ready on its own schema: %v", err)
	}
	// A schema ahead of the binary (a newer binary migrated it).
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), "INSERT INTO haia_schema_version (version_id, is_applied) VALUES (99, true)"); err != nil {
		t.Fatal(err)
	}
	if err := running.Ready(t.Context()); !errors.Is(err, pgstore.ErrSchema) {
		t.Fatalf("a running store after a newer binary migrated: ready says %v, want ErrSchema", err)
	}
	if _, err := pgstore.Open(t.Context(), dsn); !errors.Is(err, pgstore.ErrSchema) || !strings.Contains(err.Error(), "ahead of this binary") {
		t.Fatalf("open on a newer schema: %v", err)
	}
	if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); !errors.Is(err, pgstore.ErrSchema) {
		t.Fatalf("migrate on a newer schema: %v", err)
	}
}

// A password never appears in what the store says about itself.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://haia:s3cret@db:5432/guard?sslmode=verify-full": "postgres://haia:xxxxx@db:5432/guard",
		"postgresql://db/guard": "postgresql://db/guard",
	} {
		if got := pgstore.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// A row removed from the middle of the review log (the stream's size left
// as it was) is a gap the reader refuses: the log fails closed, it is
// never read as if the review had not been there — a listing names the
// gap, and a decision, which reads its question's reviews by index, finds
// the row of the review whose line is gone and honours nothing of it.
func TestAGapInTheLogFailsClosed(t *testing.T) {
	dsn := freshStore(t, true)
	st := open(t, dsn)
	defer st.Close()
	l := reviewlog.OpenStore(st, reviewlog.Options{})
	for _, amount := range []string{"0.01", "0.02", "0.03"} {
		if _, _, err := engine.OpenReview(t.Context(), l, guard.Question{Counterparty: "0xabc", Amount: amount, Asset: "USDC", Template: "x402-buyer"}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	databaseWriter(dsn).exec(t, `DELETE FROM review_lines WHERE stream = 'decisions.ndjson' AND off = (SELECT off FROM review_lines WHERE stream = 'decisions.ndjson' ORDER BY off OFFSET 1 LIMIT 1)`)
	fresh := open(t, dsn)
	defer fresh.Close()
	_, err := reviewlog.OpenStore(fresh, reviewlog.Options{}).List(t.Context(), true)
	if err == nil || !strings.Contains(err.Error(), "does not follow the one before") {
		t.Fatalf("listing a log with a gap: %v, want the gap named", err)
	}
	// A decision reads by index the reviews of its question only: the
	// review whose line is gone answers nothing (its row names no line),
	// and its question opens a review again.
	again, created, err := engine.OpenReview(t.Context(), reviewlog.OpenStore(fresh, reviewlog.Options{}), guard.Question{Counterparty: "0xabc", Amount: "0.02", Asset: "USDC", Template: "x402-buyer"}, nil, nil)
	if err != nil || !created || again.ID == "" {
		t.Fatalf("the question of the review whose line is gone: %+v created %v, %v; want a new review", again, created, err)
	}
	// A stream longer than its rows: the bytes past the last row are held
	// by no row, which is an error, not a crash or a short read.
	databaseWriter(dsn).exec(t, `DELETE FROM review_lines WHERE stream = 'decisions.ndjson' AND off > 0`)
	databaseWriter(dsn).exec(t, `UPDATE guard_streams SET size = size + 500 WHERE name = 'decisions.ndjson'`)
	_, err = reviewlog.OpenStore(fresh, reviewlog.Options{}).List(t.Context(), true)
	if err == nil || !(strings.Contains(err.Error(), "no row holds offset") || strings.Contains(err.Error(), "are not in the database")) {
		t.Fatalf("listing a log longer than its rows: %v, want the missing bytes named", err)
	}
	// A decision finds the log's last row short of its end: no clean end
	// to append after, so it reads the whole log, which fails.
	if _, _, err := engine.OpenReview(t.Context(), reviewlog.OpenStore(fresh, reviewlog.Options{}), guard.Question{Counterparty: "0xabc", Amount: "0.05", Asset: "USDC"}, nil, nil); err == nil {
		t.Fatal("a review was opened over a log longer than its rows")
	}
}

// A writer whose idea of a segment's length is not the database's is
// refused: a row is never written over or past another.
func TestAppendOnlyAtTheEnd(t *testing.T) {
	st := open(t, freshStore(t, true))
	defer st.Close()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c := &reviewlog.Chains{Signer: noa.NewKeySigner(key)}
	seal := func(w reviewlog.Writer) error {
		_, err := c.Append(t.Context(), w, noa.Draft{TS: time.Now(), Agent: noa.Agent{ID: "a", Principal: noa.PrincipalService},
			Action:     noa.Action{ID: "x", Canonical: "payment.x402", RiskClass: "IRREVERSIBLE", ParamsHash: "hmac-sha256:" + strings.Repeat("0", 64)},
			Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictAllowed}})
		return err
	}
	if err := st.Locked(t.Context(), time.Second, seal); err != nil {
		t.Fatal(err)
	}
	file := reviewlog.SegmentFile(c.ChainID(), 0)
	for _, end := range []int64{0, 1, 1 << 20} {
		err := st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
			return w.AppendSegment(t.Context(), file, end, []byte("{}\n"))
		})
		if err == nil || !strings.Contains(err.Error(), "refusing to append") {
			t.Errorf("append at byte %d of a segment that holds one receipt: %v, want refused", end, err)
		}
	}
	err = st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
		return w.AppendSegment(t.Context(), "other.ndjson", 5, []byte("{}\n"))
	})
	if err == nil || !strings.Contains(err.Error(), "refusing to append") {
		t.Errorf("append at byte 5 of a segment that does not exist: %v", err)
	}
	if err := st.Locked(t.Context(), time.Second, seal); err != nil {
		t.Fatalf("the next real receipt: %v", err)
	}
}

// The last row of a log a reader has folded is deleted behind its back
// (the stream's size left as it was): the reader's next look at the bytes
// before its offset finds no row holding them, which is a finding or an
// error, never a crash.
func TestADeletedTailIsNoCrash(t *testing.T) {
	dsn := freshStore(t, true)
	st := open(t, dsn)
	defer st.Close()
	l := reviewlog.OpenStore(st, reviewlog.Options{})
	for _, amount := range []string{"0.01", "0.02"} {
		if _, _, err := engine.OpenReview(t.Context(), l, guard.Question{Counterparty: "0xabc", Amount: amount, Asset: "USDC", Template: "x402-buyer"}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := l.List(t.Context(), true); err != nil || len(list) != 2 {
		t.Fatalf("%d reviews, %v", len(list), err)
	}
	databaseWriter(dsn).exec(t, `DELETE FROM review_lines WHERE stream = 'decisions.ndjson' AND off = (SELECT max(off) FROM review_lines WHERE stream = 'decisions.ndjson')`)
	list, err := l.List(t.Context(), true)
	if err == nil {
		findings, ferr := l.Findings(t.Context())
		if ferr != nil || len(findings) == 0 {
			t.Fatalf("after the tail was deleted: %d reviews, no error and no finding (%v)", len(list), ferr)
		}
	}
}

// Every replica may run `store migrate` at start, at the same moment:
// they take turns on the migration lock, and each finds the schema done.
func TestConcurrentMigrations(t *testing.T) {
	dsn := freshStore(t, false)
	const replicas = 3
	errs := make(chan error, replicas)
	afters := make(chan pgstore.Versions, replicas)
	for range replicas {
		go func() {
			_, after, err := pgstore.Migrate(t.Context(), dsn, nil)
			errs <- err
			afters <- after
		}()
	}
	for range replicas {
		if err := <-errs; err != nil {
			t.Fatalf("a concurrent migrate: %v", err)
		}
		if v := <-afters; v.Database != v.Binary {
			t.Fatalf("after a concurrent migrate: %+v", v)
		}
	}
	open(t, dsn).Close()
}

// A section holds only its scopes' locks: while one holds a tenant's
// counterparty, the same counterparty of another tenant, and another
// counterparty of the same tenant, are taken at once; the same
// counterparty waits (and times out); the whole store's lock waits for the
// section too, and a scope waits for it.
func TestScopedLocksIsolate(t *testing.T) {
	dsn := freshStore(t, true)
	a, b := open(t, dsn), open(t, dsn)
	defer a.Close()
	defer b.Close()
	scope := func(tenant, cp string) []reviewlog.Scope {
		return []reviewlog.Scope{{Kind: reviewlog.ScopeCounterparty, Tenant: tenant, Key: cp}, {Kind: reviewlog.ScopeTotals, Tenant: tenant, Shared: true}}
	}
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- a.LockedScopes(t.Context(), time.Second, scope("acme", "0xabc"), nil, func(w reviewlog.Writer) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	const wait = 300 * time.Millisecond
	tests := []struct {
		name    string
		scopes  []reviewlog.Scope
		waits   bool
		wholeTx bool
	}{
		{"the same counterparty of another tenant", scope("globex", "0xabc"), false, false},
		{"another counterparty of the same tenant", scope("acme", "0xdef"), false, false},
		{"the same counterparty in another case", scope("acme", "0xABC"), true, false},
		{"the tenant's totals, read", []reviewlog.Scope{{Kind: reviewlog.ScopeTotals, Tenant: "acme"}}, true, false},
		{"another tenant's totals, read", []reviewlog.Scope{{Kind: reviewlog.ScopeTotals, Tenant: "globex"}}, false, false},
		{"the whole store", nil, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			begun := time.Now()
			var err error
			if tc.wholeTx {
				err = b.Locked(t.Context(), wait, func(reviewlog.Writer) error { return nil })
			} else {
				err = b.LockedScopes(t.Context(), wait, tc.scopes, nil, func(reviewlog.Writer) error { return nil })
			}
			took := time.Since(begun)
			if tc.waits {
				if !errors.Is(err, reviewlog.ErrLockTimeout) {
					t.Fatalf("%v after %s, want ErrLockTimeout: the section's lock is shared", err, took)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v after %s, want the lock at once", err, took)
			}
		})
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Held alone, the whole store's lock keeps every scope out.
	held, release = make(chan struct{}), make(chan struct{})
	go func() {
		done <- a.Locked(t.Context(), time.Second, func(reviewlog.Writer) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	err := b.LockedScopes(t.Context(), wait, scope("globex", "0x123"), nil, func(reviewlog.Writer) error { return nil })
	if !errors.Is(err, reviewlog.ErrLockTimeout) {
		t.Fatalf("a scope while the whole store is held: %v, want ErrLockTimeout", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// An approval is used once, and the database refuses a second use
// whatever the code above it does: the second used line is refused at
// commit and nothing of its transaction is written. An archive run moves
// the line without using the approval again.
func TestApprovalUsedOnceByTheDatabase(t *testing.T) {
	st := open(t, freshStore(t, true))
	defer st.Close()
	id := "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f"
	used := []byte(`{"type":"used","review_id":"` + id + `","at":"2026-12-01T09:00:00.000Z","by":"agent-1"}` + "\n")
	appendLog := func(w reviewlog.Writer) error { return w.AppendLog(t.Context(), used) }
	if err := st.Locked(t.Context(), time.Second, appendLog); err != nil {
		t.Fatal(err)
	}
	for name, lock := range map[string]func() error{
		"the whole store": func() error { return st.Locked(t.Context(), time.Second, appendLog) },
		"a scoped section": func() error {
			return st.LockedScopes(t.Context(), time.Second, []reviewlog.Scope{{Kind: reviewlog.ScopeCaller, Tenant: "t", Key: "agent-1"}}, nil, appendLog)
		},
	} {
		if err := lock(); !errors.Is(err, reviewlog.ErrAlreadyDecided) {
			t.Fatalf("a second use in %s: %v, want ErrAlreadyDecided", name, err)
		}
	}
	if size := logSize(t, st); size != int64(len(used)) {
		t.Fatalf("the log after the refused uses: %d bytes, want the one line of %d", size, len(used))
	}
	if err := st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
		return w.ReplaceLog(t.Context(), "decisions.archive-20261201T090000Z.ndjson", used, used)
	}); err != nil {
		t.Fatalf("an archive run that moves the used line: %v", err)
	}
}

// A database an older release wrote (schema 1) moves forward: the uses of
// approvals its log holds become rows, and a second use of one is refused
// from then on.
func TestMigrationMovesUsesForward(t *testing.T) {
	dsn := freshStore(t, false)
	if err := pgstore.MigrateTo(t.Context(), dsn, 1); err != nil {
		t.Fatal(err)
	}
	d := databaseWriter(dsn)
	d.exec(t, `INSERT INTO guard_streams (name, size, generation) VALUES ('decisions.ndjson', 0, 'g1')`)
	ids := []string{"11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"}
	for _, id := range ids {
		d.AppendLogLine(t, []byte(`{"type":"used","review_id":"`+id+`","at":"2026-12-01T09:00:00.000Z","by":"agent-1"}`))
		d.exec(t, `UPDATE review_lines SET kind = 'used', review_id = $1 WHERE review_id IS NULL`, id)
	}
	if _, err := pgstore.Open(t.Context(), dsn); !errors.Is(err, pgstore.ErrSchema) {
		t.Fatalf("this binary on the older schema: %v, want ErrSchema (run store migrate)", err)
	}
	if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM review_uses WHERE review_id = ANY($1)", ids).Scan(&n); err != nil || n != 2 {
		t.Fatalf("uses moved forward: %d (%v), want 2", n, err)
	}
	st := open(t, dsn)
	defer st.Close()
	err = st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
		return w.AppendLog(t.Context(), []byte(`{"type":"used","review_id":"`+ids[0]+`","at":"2026-12-01T10:00:00.000Z","by":"agent-1"}`+"\n"))
	})
	if !errors.Is(err, reviewlog.ErrAlreadyDecided) {
		t.Fatalf("a second use of an approval used before the migration: %v, want ErrAlreadyDecided", err)
	}
}

// A process's receipt tail read on by one reader (a later section) and then
// caught up by a reader whose moment is older (a section of another scope
// whose snapshot came first) sees a segment shorter than it read: behind,
// not cut short. The tail keeps where it read to, reads nothing again, and
// still reads what is appended next; before, it started that segment over
// from byte 0, reading every receipt of it back in that section.
func TestAnOlderSnapshotDoesNotRewindTheReceiptTail(t *testing.T) {
	st := open(t, freshStore(t, true))
	defer st.Close()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c := &reviewlog.Chains{Signer: noa.NewKeySigner(key)}
	seal := func() {
		t.Helper()
		err := st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
			_, err := c.Append(t.Context(), w, noa.Draft{TS: time.Now(), Agent: noa.Agent{ID: "a", Principal: noa.PrincipalService},
				Action:     noa.Action{ID: "x", Canonical: "payment.x402", RiskClass: "IRREVERSIBLE", ParamsHash: "hmac-sha256:" + strings.Repeat("0", 64)},
				Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictAllowed}})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var tail reviewlog.ReceiptTail
	next := func(r reviewlog.Reader) map[string]reviewlog.SegmentMark {
		t.Helper()
		if _, err := tail.Next(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		return tail.Marks()
	}
	fresh := func() map[string]reviewlog.SegmentMark {
		t.Helper()
		var m map[string]reviewlog.SegmentMark
		if err := st.View(t.Context(), func(r reviewlog.Reader) error { m = next(r); return nil }); err != nil {
			t.Fatal(err)
		}
		return m
	}
	seal()
	first := fresh()
	file := reviewlog.SegmentFile(c.ChainID(), 0)
	if first[file].Off == 0 {
		t.Fatalf("after one receipt the tail is at %+v", first)
	}
	// The older reader: its snapshot is taken (its first statement) before
	// the second receipt, and it catches up after a newer reader did.
	taken, caughtUp := make(chan struct{}), make(chan struct{})
	var older map[string]reviewlog.SegmentMark
	done := make(chan error, 1)
	go func() {
		done <- st.View(t.Context(), func(r reviewlog.Reader) error {
			if _, err := r.Segments(t.Context()); err != nil {
				return err
			}
			close(taken)
			<-caughtUp
			if _, err := tail.Next(t.Context(), r); err != nil {
				return err
			}
			older = tail.Marks()
			return nil
		})
	}()
	<-taken
	seal()
	second := fresh()
	if second[file].Off <= first[file].Off {
		t.Fatalf("after the second receipt the tail is at %+v (first %+v)", second, first)
	}
	close(caughtUp)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if older[file] != second[file] {
		t.Fatalf("caught up by an older snapshot, the tail went from %+v to %+v", second[file], older[file])
	}
	// And it reads on from there.
	seal()
	if third := fresh(); third[file].Off <= second[file].Off {
		t.Fatalf("after a third receipt the tail is at %+v (was %+v)", third[file], second[file])
	}
}
