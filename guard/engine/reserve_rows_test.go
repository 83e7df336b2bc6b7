package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// On PostgreSQL a decision finds the reservations of its scopes by the
// reservations table's indexes, then reads their lines: a row is an index,
// never a record. Whoever writes the database and edits, deletes, moves or
// invents rows gets review, never an allow the lines would not give.
func TestReservationRowsAreAnIndex(t *testing.T) {
	pgtest.DSN(t) // skips, saying why, without a PostgreSQL server
	for _, tc := range []struct {
		name string
		sql  string
		// why is what the answer's reservation_unverified reason says.
		why string
	}{
		{"row deleted, line kept", `DELETE FROM reservations`, "has no row in the reservations index"},
		{"amount lowered in the row", `UPDATE reservations SET atomic = '1'`, "disagrees with the reserved line of receipt"},
		{"row moved to another payee", `UPDATE reservations SET pay_to = '` + strings.ToLower(sellerB) + `'`, "has no row in the reservations index"},
		{"row made to lapse", `UPDATE reservations SET until = at`, "has no row in the reservations index"},
		{"row pointed at another line", `UPDATE reservations SET off = 0`, "where the log holds no reserved line of that receipt"},
		{"row pointed past the log", `UPDATE reservations SET off = off + 1`, "has no row in the reservations index"},
		{"row of another tenant", `UPDATE reservations SET tenant = 'globex'`, "has no row in the reservations index"},
		{"row invented, without a line", `INSERT INTO reservations (receipt_id, tenant, caller, pay_to, atomic, asset, at, until, open, off)
			SELECT 'rcpt_invented', '', 'bot', pay_to, '1', asset, at, until, false, 1 FROM reservations`, "where the log holds no line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, pgKind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}}`)
			e := f.engines[0]
			// An unrelated allow first, so the reservation is not the log's
			// first line.
			if a := check(t, e, "bot", Question{Counterparty: sellerB, Amount: "0.01"}); a.Decision != guard.Allow {
				t.Fatalf("first: %+v", a)
			}
			if a := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "4.00"}); a.Decision != guard.Allow {
				t.Fatalf("second: %+v", a)
			}
			// Untouched, the rows give what the lines give: 4.00 + 0.50 fits.
			if a := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "0.50"}); a.Decision != guard.Allow {
				t.Fatalf("before the edit: %+v", a)
			}
			conn, err := pgx.Connect(t.Context(), f.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			// Only the rows of sellerA's reservations.
			sql := tc.sql + " WHERE pay_to = $1"
			if strings.HasPrefix(sql, "INSERT") {
				sql += " LIMIT 1"
			}
			if tag, err := conn.Exec(t.Context(), sql, strings.ToLower(sellerA)); err != nil || tag.RowsAffected() == 0 {
				t.Fatalf("%s: %v (%d rows)", sql, err, tag.RowsAffected())
			}
			a := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "0.10"})
			if a.Decision == guard.Allow || !strings.Contains(reasonOf(a, guard.RuleReservationUnverified), tc.why) {
				t.Fatalf("after the edit: %s, %q; want review saying %q", a.Decision, reasonOf(a, guard.RuleReservationUnverified), tc.why)
			}
		})
	}
}

// A decision on PostgreSQL keeps the reservation records of the log's
// lines read since its lane last answered, by what each line says: a
// reserved line whose kind column is edited away is read all the same,
// and with its row deleted the answer is review.
func TestReservationLinesReadWhateverTheirKind(t *testing.T) {
	pgtest.DSN(t) // skips, saying why, without a PostgreSQL server
	f := newFleet(t, pgKind, 2, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}}`)
	if a := check(t, f.engines[0], "bot", Question{Counterparty: sellerA, Amount: "4.00"}); a.Decision != guard.Allow {
		t.Fatalf("first: %+v", a)
	}
	conn, err := pgx.Connect(t.Context(), f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, sql := range []string{`UPDATE review_lines SET kind = NULL WHERE kind = 'reserved'`, `DELETE FROM reservations`} {
		if tag, err := conn.Exec(t.Context(), sql); err != nil || tag.RowsAffected() == 0 {
			t.Fatalf("%s: %v (%d rows)", sql, err, tag.RowsAffected())
		}
	}
	// The other replica reads the log's lines for the first time.
	a := check(t, f.engines[1], "bot", Question{Counterparty: sellerA, Amount: "0.10"})
	if a.Decision == guard.Allow || !strings.Contains(reasonOf(a, guard.RuleReservationUnverified), "has no row in the reservations index") {
		t.Fatalf("after the kind was edited and the row deleted: %s, %q; want review naming the line without its row", a.Decision, reasonOf(a, guard.RuleReservationUnverified))
	}
}
