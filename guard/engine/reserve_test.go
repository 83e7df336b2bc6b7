package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// The policy of the concurrency proof: 1.00 at a time, at most 5.00 to
// one counterparty and in all, at most 3 payments an hour.
const tightPolicy = `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}, "totalLimit": {"amount": "5.00"},
	"velocity": {"perCounterparty": {"count": 3, "windowMinutes": 60}}}`

// fleet is several engines (replicas, or processes on one root) over one
// store, one Trace root, one key and one clock the test moves.
type fleet struct {
	mu      sync.Mutex
	now     time.Time
	dir     string
	engines []*Engine
	logs    []*reviewlog.Log
	// edit rewrites the review log as whoever can write the store's
	// medium (the volume, the database) can.
	edit func(t *testing.T, fn func([]byte) []byte)
	// key and pol are the fleet's signing key and policy (engineFor).
	key ed25519.PrivateKey
	pol *guard.Config
	// dsn is the fleet's database ("" on files).
	dsn  string
	kind storeKind
	// reviewers, when set, are the trusted reviewers of every engine
	// fresh adds.
	reviewers reviewlog.Reviewers
	// passkeys, when set, are the trusted reviewers' passkeys of every
	// engine fresh adds.
	passkeys reviewlog.Passkeys
}

// fresh is one more engine over the fleet's store, as a process that
// starts now (nothing read yet), added to the fleet.
func (f *fleet) fresh(t testing.TB) *Engine { return f.freshWith(t, nil) }

// freshWith is fresh whose PostgreSQL store is wrapped (nil: as opened).
func (f *fleet) freshWith(t testing.TB, wrap func(*pgstore.Store) reviewlog.Store) *Engine {
	t.Helper()
	root, events := openTestRoot(t, f.dir)
	var st reviewlog.Store = filestore.New(root)
	if f.kind == pgKind {
		s, err := pgstore.Open(t.Context(), f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		st = s
		if wrap != nil {
			st = wrap(s)
		}
	}
	opts := reviewlog.Options{Now: f.clock, ReviewTTL: f.pol.ReviewTTL, LockWait: 30 * time.Second}
	if f.reviewers != nil {
		opts.Reviewers = func() (reviewlog.Reviewers, error) { return f.reviewers, nil }
	}
	if f.passkeys != nil {
		opts.Passkeys = func() (reviewlog.Passkeys, error) { return f.passkeys, nil }
	}
	log := reviewlog.OpenStore(st, opts)
	eng, err := New(Config{Policy: f.pol, Templates: bundledTemplates(t), History: ScanHistory{Events: events}, Log: log,
		Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(f.key)}, ParamsKey: ParamsKeyFrom(f.key.Seed()), Now: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	f.engines = append(f.engines, eng)
	f.logs = append(f.logs, log)
	return eng
}

// engineFor is another engine over the first replica's log, serving
// tenant (as a tenant's stack whose store was copied from this one).
func (f *fleet) engineFor(t *testing.T, tenant string) *Engine {
	t.Helper()
	_, events := openTestRoot(t, f.dir)
	eng, err := New(Config{Policy: f.pol, Templates: bundledTemplates(t), History: ScanHistory{Events: events}, Log: f.logs[0],
		Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(f.key), Tenant: tenant}, ParamsKey: ParamsKeyFrom(f.key.Seed()), Now: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

func (f *fleet) clock() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
func (f *fleet) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

type storeKind string

const (
	fileKind storeKind = "file"
	pgKind   storeKind = "postgres"
)

func stores(t *testing.T) []storeKind {
	if os.Getenv("HAIA_TEST_POSTGRES") == "" {
		t.Log("HAIA_TEST_POSTGRES is not set: the PostgreSQL cases are skipped")
		return []storeKind{fileKind}
	}
	return []storeKind{fileKind, pgKind}
}

func newFleet(t testing.TB, kind storeKind, n int, policyJSON string) *fleet {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	pol, err := guard.ParseConfig([]byte(policyJSON), "")
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	f := &fleet{now: start.Add(time.Hour), dir: dir, key: key, pol: pol}
	var dsn string
	if kind == pgKind {
		dsn = pgtest.Database(t, pgtest.DSN(t))
		if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
			t.Fatal(err)
		}
		f.edit = func(t *testing.T, fn func([]byte) []byte) { pgEditLog(t, dsn, fn) }
		f.dsn = dsn
	} else {
		path := filepath.Join(dir, reviewlog.DirName, reviewlog.FileName)
		f.edit = func(t *testing.T, fn func([]byte) []byte) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, fn(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.kind = kind
	for range n {
		f.fresh(t)
	}
	return f
}

// askAll asks q ten times at once, spread over the fleet, and counts the
// decisions.
func (f *fleet) askAll(t *testing.T, n int, q Question) map[string]int {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := f.engines[i%len(f.engines)].Check(context.Background(), "agent-"+string(rune('a'+i)), q)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("Check: %v", err)
				return
			}
			got[a.Decision]++
		}()
	}
	wg.Wait()
	return got
}

// Ten questions of 1.00 at once: the velocity rule (3 an hour) lets three
// through, whichever replica answers; with no velocity rule the limits of
// 5.00 let five through.
func TestReservationsHoldUnderConcurrency(t *testing.T) {
	for _, kind := range stores(t) {
		for _, replicas := range []int{1, 3} {
			t.Run(string(kind)+"/replicas="+string(rune('0'+replicas)), func(t *testing.T) {
				f := newFleet(t, kind, replicas, tightPolicy)
				got := f.askAll(t, 10, Question{Counterparty: sellerA, Amount: "1.00"})
				if got[guard.Allow] != 3 || got[guard.Review] != 7 {
					t.Fatalf("velocity 3/h: %v, want 3 allow and 7 review", got)
				}
				g := newFleet(t, kind, replicas, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}, "totalLimit": {"amount": "5.00"}}`)
				got = g.askAll(t, 10, Question{Counterparty: sellerA, Amount: "1.00"})
				if got[guard.Allow] != 5 || got[guard.Review] != 5 {
					t.Fatalf("limits 5.00: %v, want 5 allow and 5 review", got)
				}
			})
		}
	}
}

// Many replicas at once, each caller on either of two counterparties:
// where the policy judges each counterparty alone, their decisions run
// side by side and each counterparty still lets exactly its limit
// through; where it judges the total, the total holds across both.
func TestLimitsExactAcrossManyReplicas(t *testing.T) {
	tests := []struct {
		name   string
		policy string
		// resource every question pays for ("" none)
		resource string
		// allows per counterparty (A, B) and in all
		perCP, total int
	}{
		{"velocity per counterparty", `{"reviewAbove": "1000", "velocity": {"perCounterparty": {"count": 3, "windowMinutes": 60}}}`, "", 3, 6},
		{"limit per counterparty", `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "4.00"}}`, "", 4, 8},
		{"total limit", `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}, "totalLimit": {"amount": "5.00"}}`, "", -1, 5},
		{"total velocity", `{"reviewAbove": "1000", "velocity": {"total": {"count": 4, "windowMinutes": 60}}}`, "", -1, 4},
		// One resource paid for at two counterparties: the first allow
		// makes every other a duplicate, whoever is paid.
		{"duplicate window", `{"reviewAbove": "1000", "duplicatePayment": {"windowMinutes": 60}}`, "https://api.example.com/report", -1, 1},
	}
	for _, kind := range stores(t) {
		for _, tc := range tests {
			t.Run(string(kind)+"/"+tc.name, func(t *testing.T) {
				f := newFleet(t, kind, 6, tc.policy)
				var wg sync.WaitGroup
				var mu sync.Mutex
				allows := map[string]int{}
				for i := range 24 {
					seller := sellerA
					if i%2 == 1 {
						seller = sellerB
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						a, err := f.engines[i%len(f.engines)].Check(context.Background(), fmt.Sprintf("agent-%02d", i), Question{Counterparty: seller, Amount: "1.00", Resource: tc.resource})
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							t.Errorf("Check: %v", err)
							return
						}
						if a.Decision == guard.Allow {
							allows[seller]++
						} else if a.Decision != guard.Review {
							t.Errorf("%s: %s, want allow or review", seller, a.Decision)
						}
					}()
				}
				wg.Wait()
				if tc.perCP >= 0 && (allows[sellerA] != tc.perCP || allows[sellerB] != tc.perCP) {
					t.Fatalf("allows %v, want %d to each counterparty", allows, tc.perCP)
				}
				if allows[sellerA]+allows[sellerB] != tc.total {
					t.Fatalf("allows %v, want %d in all", allows, tc.total)
				}
			})
		}
	}
}

func check(t *testing.T, e *Engine, caller string, q Question) Answer {
	t.Helper()
	a, err := e.Check(context.Background(), caller, q)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func reasonOf(a Answer, rule string) string {
	for _, r := range a.Reasons {
		if r.Rule == rule {
			return r.Detail
		}
	}
	return ""
}

// An allow says what it reserves; the reservation lapses after
// reservationMinutes; a recorded payment of the same terms shows it, and
// then counts once.
func TestReservationLifecycle(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "2.00"}, "reservationMinutes": 10}`)
			e := f.engines[0]
			q := Question{Counterparty: sellerA, Amount: "1.00"}
			a := check(t, e, "bot", q)
			if a.Decision != guard.Allow || a.Reservation == nil || !strings.Contains(reasonOf(a, guard.RuleReserved), "reserves 1 USDC to "+strings.ToLower(sellerA)) {
				t.Fatalf("first: %+v", a)
			}
			if a.Reservation.Until == "" || a.Reservation.ReceiptID != a.ReceiptID {
				t.Fatalf("reservation: %+v", a.Reservation)
			}
			// Another caller's question counts it.
			if b := check(t, e, "other", Question{Counterparty: sellerA, Amount: "1.50"}); b.Decision != guard.Review || reasonOf(b, guard.RulePerCounterparty) == "" {
				t.Fatalf("over the limit with the reservation: %+v", b)
			}
			if b := check(t, e, "other", q); b.Decision != guard.Allow {
				t.Fatalf("exactly at the limit: %+v", b)
			}
			// Both reservations lapse.
			f.advance(11 * time.Minute)
			if b := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "2.00"}); b.Decision != guard.Allow {
				t.Fatalf("after the reservations lapsed: %+v", b)
			}
			// The Trace shows that payment: it counts once, as the payment.
			rec, err := simrec.New(f.dir, "run-paid", f.clock())
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.Pay(simrec.Payment{OperationID: "p1", URL: "https://api.example.com/x", PayTo: sellerA, Amount: "2000000", Outcome: "settled"}); err != nil {
				t.Fatal(err)
			}
			f.advance(time.Minute)
			b := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "0.01"})
			if b.Decision != guard.Review || !strings.Contains(reasonOf(b, guard.RulePerCounterparty), "2 USDC already paid") {
				t.Fatalf("the payment counts once: %+v", b)
			}
			if strings.Contains(reasonOf(b, guard.RuleHistory), "reservation") {
				t.Fatalf("the reservation still counts beside its payment: %s", reasonOf(b, guard.RuleHistory))
			}
		})
	}
}

// A dry run answers as the guard would, and writes nothing at all.
func TestDryRunWritesNothing(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 1, `{"reviewAbove": "1.00", "perCounterpartyLimit": {"amount": "5.00"}}`)
			e := f.engines[0]
			state := func() (int, int) {
				rs, probs, err := e.Reservations(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				list, err := f.logs[0].List(context.Background(), true)
				if err != nil {
					t.Fatal(err)
				}
				return len(rs) + len(probs), len(list)
			}
			for _, q := range []Question{{Counterparty: sellerA, Amount: "0.50"}, {Counterparty: sellerA, Amount: "3.00"}} {
				a, err := e.CheckWith(context.Background(), "bot", q, CheckOptions{DryRun: true})
				if err != nil {
					t.Fatal(err)
				}
				if !a.DryRun || a.ReceiptID != "" || a.Reservation != nil || a.ReviewID != "" || a.Reasons[0].Rule != RuleDryRun {
					t.Fatalf("dry run answer: %+v", a)
				}
				if r, n := state(); r != 0 || n != 0 {
					t.Fatalf("the dry run wrote %d reservations and %d reviews", r, n)
				}
			}
			a, _ := e.CheckWith(context.Background(), "bot", Question{Counterparty: sellerA, Amount: "3.00"}, CheckOptions{DryRun: true})
			if a.Decision != guard.Review || !strings.Contains(a.Reasons[0].Detail, "a review would be opened") {
				t.Fatalf("dry run of a review: %+v", a)
			}
			var chains []reviewlog.ChainInfo
			err := f.logs[0].Store().View(context.Background(), func(r reviewlog.Reader) error {
				var err error
				chains, err = reviewlog.ListChains(context.Background(), r)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(chains) != 0 {
				t.Fatalf("a dry run signed receipts: %+v", chains)
			}
		})
	}
}

// An authorization holds its payment as open to the payee until the Trace
// shows it: the next question to that payee is reviewed (open_partial), and
// it never lapses.
func TestAuthorizationHoldsAsOpen(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "50.00"}, "reservationMinutes": 5}`)
			e := f.engines[0]
			a, err := e.Authorize(context.Background(), "bot", Question{Counterparty: "api.example.com", PayTo: sellerA, Amount: "1.00"})
			if err != nil {
				t.Fatal(err)
			}
			if a.Decision != guard.Allow || a.Reservation == nil || !a.Reservation.Open || a.Reservation.Until != "" || a.Reservation.PayTo != strings.ToLower(sellerA) {
				t.Fatalf("authorization: %+v", a)
			}
			// Long after its reservation time, within its window, it holds.
			f.advance(2 * time.Hour)
			b := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "1.00"})
			if b.Decision != guard.Review || reasonOf(b, guard.RuleOpenPartial) == "" {
				t.Fatalf("the held authorization does not count as open: %+v", b)
			}
			// The Trace shows it settled: it no longer holds.
			rec, err := simrec.New(f.dir, "run-paid", f.clock())
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.Pay(simrec.Payment{OperationID: "p1", URL: "https://api.example.com/x", PayTo: sellerA, Amount: "1000000", Outcome: "settled"}); err != nil {
				t.Fatal(err)
			}
			f.advance(time.Minute)
			if c := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "1.00"}); c.Decision != guard.Allow {
				t.Fatalf("after the Trace shows it settled: %+v", c)
			}
		})
	}
}

// A pending review that would now be answered without review is moot: it
// is shown so, and does not count towards the caller's pending cap.
//
// On PostgreSQL the judgement of another review's counterparty is made
// under the whole store's lock (the question's scopes do not hold it).
func TestMootReviewsDoNotCountTowardsTheCap(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}, "maxPendingReviewsPerCaller": 1,
			"velocity": {"perCounterparty": {"count": 1, "windowMinutes": 30}}}`)
			e := f.engines[0]
			if a := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "1.00"}); a.Decision != guard.Allow {
				t.Fatalf("first: %+v", a)
			}
			first := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "1.01"})
			if first.Decision != guard.Review {
				t.Fatalf("second: %+v", first)
			}
			if full := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "1.02"}); full.Decision != guard.Block || reasonOf(full, RuleQueueFull) == "" {
				t.Fatalf("the cap of 1: %+v", full)
			}
			// Moot over a listing judges each review as ReviewStatus does.
			listed := func(want bool) {
				t.Helper()
				reviews, err := e.cfg.Log.List(context.Background(), true)
				if err != nil || len(reviews) != 1 {
					t.Fatalf("list: %+v %v", reviews, err)
				}
				moot, problems, err := e.Moot(context.Background(), reviews)
				if err != nil || len(problems) != 0 || moot[first.ReviewID] != want || len(moot) > 1 {
					t.Fatalf("Moot over the listing: %v %v %v, want %s moot: %v", moot, problems, err, first.ReviewID, want)
				}
			}
			st, err := e.ReviewStatus(context.Background(), first.ReviewID)
			if err != nil || st.Moot || len(st.Reservations) != 1 || st.ReservedTotal != 1 {
				t.Fatalf("status while the reservation holds: %+v %v", st, err)
			}
			listed(false)
			f.advance(31 * time.Minute) // the velocity window passes: the review is moot
			st, err = e.ReviewStatus(context.Background(), first.ReviewID)
			if err != nil || !st.Moot || st.Status != reviewlog.Pending {
				t.Fatalf("status once moot: %+v %v", st, err)
			}
			listed(true)
			next := check(t, e, "bot", Question{Counterparty: sellerB, Amount: "6.00"})
			if next.Decision != guard.Review || next.ReviewID == "" {
				t.Fatalf("a moot review still counted towards the cap: %+v", next)
			}
		})
	}
}

// pgEditLog rewrites the review log's rows as a database writer can.
func pgEditLog(t *testing.T, dsn string, fn func([]byte) []byte) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT line FROM review_lines WHERE stream = 'decisions.ndjson' ORDER BY off`)
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	for rows.Next() {
		var l []byte
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		data = append(data, l...)
	}
	rows.Close()
	data = fn(data)
	if _, err := conn.Exec(ctx, `DELETE FROM review_lines WHERE stream = 'decisions.ndjson'`); err != nil {
		t.Fatal(err)
	}
	var off int
	for _, l := range bytes.SplitAfter(data, []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		if _, err := conn.Exec(ctx, `INSERT INTO review_lines (stream, off, line) VALUES ('decisions.ndjson', $1, $2)`, off, l); err != nil {
			t.Fatal(err)
		}
		off += len(l)
	}
	if _, err := conn.Exec(ctx, `UPDATE guard_streams SET size = $1, generation = gen_random_uuid()::text WHERE name = 'decisions.ndjson'`, off); err != nil {
		t.Fatal(err)
	}
}

// An approval used reserves its payment like any allow, naming the review.
func TestApprovalUsedReserves(t *testing.T) {
	l := newLoop(t, `{"reviewAbove": "0.05", "perCounterpartyLimit": {"amount": "1.00"}, "maxOpenPartialPerCounterparty": 5}`)
	first := l.ask(t, "agent-1")
	if first.Decision != guard.Review {
		t.Fatalf("first: %+v", first)
	}
	l.advance(time.Minute)
	if _, err := l.decider.Decide(context.Background(), first.ReviewID, reviewlog.Approved, "", "alice"); err != nil {
		t.Fatal(err)
	}
	use := l.ask(t, "agent-1")
	if use.Decision != guard.Allow || use.Reservation == nil || use.Reservation.ReviewID != first.ReviewID || !has(use, guard.RuleReserved) {
		t.Fatalf("the approval used reserves nothing: %+v", use)
	}
	// The reservation counts: 0.10 paid (op-1, open) + 0.10 reserved + 0.81 is over 1.00.
	a, err := l.eng.Check(context.Background(), "agent-2", Question{Counterparty: sellerA, Amount: "0.81"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Decision != guard.Review || !strings.Contains(reasonOf(a, guard.RulePerCounterparty), "0.2 USDC (0.1 USDC paid, 0.1 USDC held by 1 earlier allow") {
		t.Fatalf("the used approval's reservation does not count: %+v", a)
	}
}
