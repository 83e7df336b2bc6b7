package reviewlog_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// indexedChain is a PostgreSQL store whose chain holds, in order: an allow
// long before the reservation window, a deferred answer, the allow the
// test hides (inside the window, and with no reservation record: the
// record and its line are gone), and another deferred answer.
type indexedChain struct {
	dsn    string
	st     *pgstore.Store
	now    time.Time
	hidden string // the id of the allow to hide
	offs   map[string]int64
}

const reservationTTL = 15 * time.Minute

// indexedStore is a migrated PostgreSQL store of its own, and a chain to
// append to.
func indexedStore(t *testing.T) (string, *pgstore.Store, *reviewlog.Chains) {
	t.Helper()
	dsn := pgtest.Database(t, pgtest.DSN(t))
	if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	st, err := pgstore.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return dsn, st, &reviewlog.Chains{Signer: noa.NewKeySigner(key)}
}

func newIndexedChain(t *testing.T) *indexedChain {
	t.Helper()
	dsn, st, c := indexedStore(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	ic := &indexedChain{dsn: dsn, st: st, now: now, offs: map[string]int64{}}
	for i, d := range []struct {
		verdict string
		age     time.Duration
	}{{noa.VerdictAllowed, 2 * time.Hour}, {noa.VerdictDeferred, time.Minute}, {noa.VerdictAllowed, 30 * time.Second}, {noa.VerdictDeferred, 10 * time.Second}} {
		// Receipts as a copy brings them: no ledger entries (commitment_in_ledger).
		err := st.Locked(reviewlog.Bulk(t.Context()), time.Second, func(w reviewlog.Writer) error {
			r, err := c.Append(t.Context(), w, noa.Draft{TS: now.Add(-d.age), Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService},
				Action:     noa.Action{ID: "x402.pay", Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: "hmac-sha256:" + strings.Repeat("0", 64)},
				Governance: noa.Governance{Mode: "on", Verdict: d.verdict}})
			if i == 2 {
				ic.hidden = r.ID
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	conn := ic.conn(t)
	rows, err := conn.Query(t.Context(), "SELECT receipt_id, off FROM receipt_rows")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var off int64
		if err := rows.Scan(&id, &off); err != nil {
			t.Fatal(err)
		}
		ic.offs[id] = off
	}
	if rows.Err() != nil || len(ic.offs) != 4 {
		t.Fatalf("receipt rows: %v, %v", ic.offs, rows.Err())
	}
	return ic
}

func (ic *indexedChain) conn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), ic.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// problems are what a decision of a fresh process reads of the
// reservations: a signed allow of the window with no record is one.
func (ic *indexedChain) problems(t *testing.T, unchecked bool) []string {
	t.Helper()
	l := reviewlog.OpenStore(ic.st, reviewlog.Options{Now: func() time.Time { return ic.now }})
	if unchecked {
		reviewlog.UncheckReceiptIndex(l)
	}
	v, err := l.Reservations(t.Context(), reservationTTL)
	if err != nil {
		t.Fatal(err)
	}
	return v.Problems
}

// A database writer hides the signed allow of a reservation whose record
// and line they removed — the edit that would free its headroom — by
// editing the chains' receipt index alone: every such edit is seen (the
// decision reads the reservations as unverified: review), and each gets
// through with the index's checks turned off.
func TestReceiptIndexEditsAreSeen(t *testing.T) {
	for _, tc := range []struct {
		name string
		// sql edits the rows: $1 is the hidden allow's receipt id, %[1]d
		// its offset and %[2]d the offset of the receipt before it.
		sql []string
		why string
		// lineTime: the edit is seen without the index's checks too (the
		// row is still read, and its line's time counts).
		lineTime bool
	}{
		{"row deleted", []string{`DELETE FROM receipt_rows WHERE receipt_id = $1`}, "lacks reserving receipts 2 of", false},
		{"row made to reserve nothing", []string{`UPDATE receipt_rows SET reserves = NULL WHERE receipt_id = $1`}, "lacks reserving receipts 2 of", false},
		{"row moved out of the window", []string{`UPDATE receipt_rows SET ts = ts - interval '1 day' WHERE receipt_id = $1`}, "a row moved out of the window", true},
		{"row moved to another segment", []string{`UPDATE receipt_rows SET stream = 'receipts/other.ndjson' WHERE receipt_id = $1`}, "lacks reserving receipts 2 of", false},
		{"row renumbered below the window", []string{`UPDATE receipt_rows SET rcount = 0 WHERE receipt_id = $1`}, "lacks reserving receipts 2 of", false},
		{"row pointed at another receipt", []string{
			`UPDATE receipt_rows SET off = 1000000000 WHERE receipt_id = $1`,
			`UPDATE receipt_rows SET off = %[1]d WHERE off = %[2]d`,
			`UPDATE receipt_rows SET off = %[2]d WHERE off = 1000000000`,
		}, "where the segment holds another receipt", false},
		{"row pointed inside its line", []string{
			`UPDATE receipt_rows SET off = off + 1 WHERE receipt_id = $1`,
		}, "where the segment holds no receipt", false},
		{"row pointed past the segment", []string{
			`UPDATE receipt_rows SET off = 1000000000 WHERE receipt_id = $1`,
		}, "lacks reserving receipts 2 of", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ic := newIndexedChain(t)
			// Untouched, the index gives the allow: it has no record.
			if p := ic.problems(t, false); len(p) != 1 || !strings.Contains(p[0], ic.hidden) {
				t.Fatalf("before the edit: %q, want the allow %s without its record", p, ic.hidden)
			}
			conn := ic.conn(t)
			// The rows refuse every change while their trigger stands.
			if _, err := conn.Exec(t.Context(), tc.sql[0], ic.hidden); err == nil || !strings.Contains(err.Error(), "never changed") {
				t.Fatalf("an edit with the trigger in place: %v", err)
			}
			if _, err := conn.Exec(t.Context(), `ALTER TABLE receipt_rows DISABLE TRIGGER receipt_rows_fixed`); err != nil {
				t.Fatal(err)
			}
			var before int64
			if err := conn.QueryRow(t.Context(), `SELECT max(off) FROM receipt_rows WHERE off < $1`, ic.offs[ic.hidden]).Scan(&before); err != nil {
				t.Fatal(err)
			}
			for _, sql := range tc.sql {
				var args []any
				if strings.Contains(sql, "$1") {
					args = append(args, ic.hidden)
				} else {
					sql = fmt.Sprintf(sql, ic.offs[ic.hidden], before)
				}
				if tag, err := conn.Exec(t.Context(), sql, args...); err != nil || tag.RowsAffected() != 1 {
					t.Fatalf("%s: %v (%d rows)", sql, err, tag.RowsAffected())
				}
			}
			p := ic.problems(t, false)
			if len(p) == 0 || !strings.Contains(strings.Join(p, "\n"), tc.why) {
				t.Fatalf("after the edit: %q, want a problem saying %q", p, tc.why)
			}
			if p := ic.problems(t, true); (len(p) == 0) == tc.lineTime {
				t.Fatalf("with the index's checks off: %q (seen by the line's time alone: %v)", p, tc.lineTime)
			}
		})
	}
}

// A row of the receipt index moved to another review, caller or passkey
// gives the lookup of its new place nothing (its line says otherwise),
// and the lookup of its old place loses it: a decision then reads the
// review undecided or unverified, never another's decision.
func TestReceiptRowsMovedFindNothing(t *testing.T) {
	dsn, st, c := indexedStore(t)
	ph := "hmac-sha256:" + strings.Repeat("ab", 32)
	model := "webauthn-assertion:eyJjcmVkZW50aWFsX2lkIjoiY3JlZC0xIiwiYXV0aGVudGljYXRvcl9kYXRhIjoiIiwiY2xpZW50X2RhdGFfanNvbiI6IiIsInNpZ25hdHVyZSI6IiJ9"
	for _, d := range []noa.Draft{
		{Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService}, Action: noa.Action{ID: "review:r1", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictDeferred}},
		{Agent: noa.Agent{ID: "alice", Principal: noa.PrincipalHuman, Model: &model}, Action: noa.Action{ID: "review:r1", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictBlocked, Approval: &noa.Approval{By: "alice", At: noa.FormatTS(time.Now())}}},
		{Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService}, Action: noa.Action{ID: "review:r2", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictDeferred}},
	} {
		d.TS, d.Action.Canonical, d.Action.RiskClass, d.Governance.Mode = time.Now(), "x402.payment", "IRREVERSIBLE", "on"
		if err := st.Locked(reviewlog.Bulk(t.Context()), time.Second, func(w reviewlog.Writer) error { _, err := c.Append(t.Context(), w, d); return err }); err != nil {
			t.Fatal(err)
		}
	}
	look := func() (r1, r2 int, reviews []string, byKey int) {
		err := st.View(t.Context(), func(r reviewlog.Reader) error {
			actions, reviewsOf, passkeys := reviewlog.IndexedLookups(t.Context(), r.(reviewlog.ReceiptIndex))
			a1, err := actions("review:r1")
			if err != nil {
				return err
			}
			a2, err := actions("review:r2")
			if err != nil {
				return err
			}
			if reviews, err = reviewsOf("bot", ph); err != nil {
				return err
			}
			pk, err := passkeys("cred-1")
			r1, r2, byKey = len(a1), len(a2), len(pk)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if r1, r2, reviews, pk := look(); r1 != 2 || r2 != 1 || strings.Join(reviews, ",") != "review:r1,review:r2" || pk != 1 {
		t.Fatalf("untouched: %d and %d receipts, reviews %q, %d of the passkey", r1, r2, reviews, pk)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, sql := range []string{
		`ALTER TABLE receipt_rows DISABLE TRIGGER receipt_rows_fixed`,
		// The reviewer's rejection of r1 moved to r2, and its passkey's.
		`UPDATE receipt_rows SET action_id = 'review:r2', credential = 'cred-2' WHERE principal = 'HUMAN'`,
		// r1's question moved to another caller.
		`UPDATE receipt_rows SET agent_id = 'mallory' WHERE action_id = 'review:r1'`,
	} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	if r1, r2, reviews, pk := look(); r1 != 1 || r2 != 1 || strings.Join(reviews, ",") != "review:r2" || pk != 0 {
		t.Fatalf("moved: %d and %d receipts, reviews %q, %d of the passkey; want 1 (the deferred answer alone), 1, review:r2, 0", r1, r2, reviews, pk)
	}
	err = st.View(t.Context(), func(r reviewlog.Reader) error {
		_, reviewsOf, passkeys := reviewlog.IndexedLookups(t.Context(), r.(reviewlog.ReceiptIndex))
		if got, err := reviewsOf("mallory", ph); err != nil || len(got) != 0 {
			t.Errorf("the moved question's new caller: %q, %v", got, err)
		}
		if got, err := passkeys("cred-2"); err != nil || len(got) != 0 {
			t.Errorf("the moved decision's new passkey: %d, %v", len(got), err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A lane reads each reserving receipt through the index once: what it
// counted stays counted, and an index that later counts fewer is seen.
func TestReceiptIndexLaneKeepsWhatItCounted(t *testing.T) {
	ic := newIndexedChain(t)
	l := reviewlog.OpenStore(ic.st, reviewlog.Options{Now: func() time.Time { return ic.now }, Parallel: 1})
	read := func() []string {
		v, err := l.Reservations(t.Context(), reservationTTL)
		if err != nil {
			t.Fatal(err)
		}
		return v.Problems
	}
	if p := read(); len(p) != 1 || !strings.Contains(p[0], ic.hidden) {
		t.Fatalf("first read: %q", p)
	}
	conn := ic.conn(t)
	for _, sql := range []string{`ALTER TABLE receipt_rows DISABLE TRIGGER receipt_rows_fixed`,
		`DELETE FROM receipt_rows WHERE reserves IS NOT NULL`, `UPDATE receipt_rows SET rcount = 0`} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	p := strings.Join(read(), "\n")
	if !strings.Contains(p, ic.hidden) || !strings.Contains(p, "fewer than the 2 it counted before") {
		t.Fatalf("after every reserving row was removed and the rest renumbered: %q", p)
	}
}
