package pgstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// reservedLine is a reserved line of the review log (sealed with a MAC
// no one checks here: the store indexes, the engine verifies).
func reservedLine(receipt, tenant, payTo, until string) string {
	t := ""
	if tenant != "" {
		t = `,"tenant":"` + tenant + `"`
	}
	u := ""
	if until != "" {
		u = `,"until":"` + until + `"`
	}
	return `{"type":"reserved","at":"2026-12-01T09:00:00.000Z","reservation":{"receipt_id":"` + receipt + `","caller":"agent-1"` + t +
		`,"pay_to":"` + payTo + `","resource":"https://api.example.com/r","atomic":"250000","asset":"usdc"` + u + `,"mac":"00"}}` + "\n"
}

func releasedLine(receipt string) string {
	return `{"type":"released","at":"2026-12-01T09:01:00.000Z","release":{"receipt_id":"` + receipt + `","caller":"agent-1","outcome":"upstream_refused","outcome_receipt":"rx-out","mac":"00"}}` + "\n"
}

// resRow is a reservations row as the tests compare it.
type resRow struct {
	ReceiptID, Tenant, Caller, PayTo, Resource, Atomic, Asset string
	Until                                                     string
	Open                                                      bool
	Off                                                       int64
	ReleaseOff                                                int64 // -1: none
}

func reservationRows(t *testing.T, dsn string) []resRow {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(t.Context(), `SELECT receipt_id, tenant, caller, COALESCE(pay_to, ''), COALESCE(resource, ''), atomic, asset,
		COALESCE(to_char(until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), ''), open, off, COALESCE(release_off, -1)
		FROM reservations ORDER BY off`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (resRow, error) {
		var x resRow
		err := r.Scan(&x.ReceiptID, &x.Tenant, &x.Caller, &x.PayTo, &x.Resource, &x.Atomic, &x.Asset, &x.Until, &x.Open, &x.Off, &x.ReleaseOff)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

const (
	payA   = "0xB0B0000000000000000000000000000000000001"
	payB   = "0xB0B0000000000000000000000000000000000002"
	untilA = "2026-12-01T09:15:00.000Z"
)

// Every reserved line is a row of reservations, written with it, at its
// offset, whether a decision holds the whole store's lock or only its
// scopes; a released line marks its reservation's row; a line the log
// does not read as a record indexes nothing.
func TestReservationRowsFollowTheLog(t *testing.T) {
	dsn := freshStore(t, true)
	s := open(t, dsn)
	defer s.Close()
	ctx := t.Context()
	opened := `{"type":"opened","review_id":"1b4e28ba-2fa1-4d2c-883f-0016d3cca427","at":"2026-12-01T08:59:00.000Z","counterparty":"api.example.com","amount":"1","asset":"a","reasons":[]}` + "\n"
	first := opened + reservedLine("rx-1", "", payA, untilA)
	if err := s.Locked(ctx, time.Second, func(w reviewlog.Writer) error { return w.AppendLog(ctx, []byte(first)) }); err != nil {
		t.Fatal(err)
	}
	scopes := []reviewlog.Scope{{Kind: reviewlog.ScopeCounterparty, Tenant: "t1", Key: payB}}
	forged := `{"type":"reserved","at":"2026-12-01T09:00:00.000Z","reservation":{"receipt_id":"rx-forged","caller":"agent-1","pay_to":"x","atomic":"1","asset":"a","mac":"00","Extra":1}}` + "\n"
	second := reservedLine("rx-2", "t1", payB, "") + forged
	if err := s.LockedScopes(ctx, time.Second, scopes, nil, func(w reviewlog.Writer) error { return w.AppendLog(ctx, []byte(second)) }); err != nil {
		t.Fatal(err)
	}
	// Releases: the scoped writer's and the whole lock's.
	if err := s.LockedScopes(ctx, time.Second, scopes, nil, func(w reviewlog.Writer) error { return w.AppendLog(ctx, []byte(releasedLine("rx-2"))) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Locked(ctx, time.Second, func(w reviewlog.Writer) error {
		return w.AppendLog(ctx, []byte(releasedLine("rx-1")+releasedLine("rx-1")))
	}); err != nil {
		t.Fatal(err)
	}
	off1 := int64(len(opened))
	off2 := int64(len(first))
	rel2 := off2 + int64(len(second))
	rel1 := rel2 + int64(len(releasedLine("rx-2")))
	want := []resRow{
		{"rx-1", "", "agent-1", payA, "https://api.example.com/r", "250000", "usdc", untilA, false, off1, rel1},
		{"rx-2", "t1", "agent-1", payB, "https://api.example.com/r", "250000", "usdc", "", false, off2, rel2},
	}
	if got := reservationRows(t, dsn); !slices.Equal(got, want) {
		t.Fatalf("reservations:\n%+v\nwant\n%+v", got, want)
	}
	// A rewritten log (an archive run) indexes its kept lines again, at
	// their new offsets.
	kept := reservedLine("rx-2", "t1", payB, "")
	if err := s.Locked(ctx, time.Second, func(w reviewlog.Writer) error {
		return w.ReplaceLog(ctx, "decisions.archive-20261201T100000Z.ndjson", []byte(opened), []byte(kept))
	}); err != nil {
		t.Fatal(err)
	}
	want = []resRow{{"rx-2", "t1", "agent-1", payB, "https://api.example.com/r", "250000", "usdc", "", false, 0, -1}}
	if got := reservationRows(t, dsn); !slices.Equal(got, want) {
		t.Fatalf("reservations after the archive run:\n%+v\nwant\n%+v", got, want)
	}
}

// A database an older release wrote (schema 2) moves forward: its
// reserved lines become rows, each at its line, with its first release.
func TestMigrationMovesReservationsForward(t *testing.T) {
	dsn := freshStore(t, false)
	if err := pgstore.MigrateTo(t.Context(), dsn, 2); err != nil {
		t.Fatal(err)
	}
	d := databaseWriter(dsn)
	d.exec(t, `INSERT INTO guard_streams (name, size, generation) VALUES ('decisions.ndjson', 0, 'g1')`)
	lines := []string{reservedLine("rx-1", "", payA, untilA), releasedLine("rx-0"), reservedLine("rx-2", "t1", payB, ""), releasedLine("rx-1"), reservedLine("rx-1", "", payB, untilA), releasedLine("rx-1")}
	kinds := []string{"reserved", "released", "reserved", "released", "reserved", "released"}
	var offs []int64
	var off int64
	for i, l := range lines {
		d.AppendLogLine(t, []byte(l[:len(l)-1]))
		d.exec(t, `UPDATE review_lines SET kind = $1 WHERE off = $2`, kinds[i], off)
		offs = append(offs, off)
		off += int64(len(l))
	}
	// A line the log does not read as a record (no kind) is no row.
	d.AppendLogLine(t, []byte(`{"type":"reserved"}`))
	if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	want := []resRow{
		{"rx-1", "", "agent-1", payA, "https://api.example.com/r", "250000", "usdc", untilA, false, offs[0], offs[3]},
		{"rx-2", "t1", "agent-1", payB, "https://api.example.com/r", "250000", "usdc", "", false, offs[2], -1},
	}
	if got := reservationRows(t, dsn); !slices.Equal(got, want) {
		t.Fatalf("reservations after the migration:\n%+v\nwant\n%+v", got, want)
	}
	// A replica of the previous release, still answering on the migrated
	// database, writes a line and no row; `store migrate` run again
	// indexes it, and its release.
	size := off + int64(len(`{"type":"reserved"}`)+1)
	late := reservedLine("rx-3", "", payA, untilA)
	d.AppendLogLine(t, []byte(late[:len(late)-1]))
	d.exec(t, `UPDATE review_lines SET kind = 'reserved' WHERE off = $1`, size)
	d.AppendLogLine(t, []byte(releasedLine("rx-3")[:len(releasedLine("rx-3"))-1]))
	d.exec(t, `UPDATE review_lines SET kind = 'released' WHERE off = $1`, size+int64(len(late)))
	if got := reservationRows(t, dsn); len(got) != 2 {
		t.Fatalf("rows before migrate runs again: %+v", got)
	}
	if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	want = append(want, resRow{"rx-3", "", "agent-1", payA, "https://api.example.com/r", "250000", "usdc", untilA, false, size, size + int64(len(late))})
	if got := reservationRows(t, dsn); !slices.Equal(got, want) {
		t.Fatalf("reservations after store migrate ran again:\n%+v\nwant\n%+v", got, want)
	}
}

// store import from a file root fills the rows as the lines are copied.
func TestImportFillsReservationRows(t *testing.T) {
	root, err := confined.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	fs := filestore.New(root)
	ctx := t.Context()
	data := reservedLine("rx-1", "", payA, untilA) + releasedLine("rx-1") + reservedLine("rx-2", "t1", payB, "")
	if err := fs.Locked(ctx, time.Second, func(w reviewlog.Writer) error { return w.AppendLog(ctx, []byte(data)) }); err != nil {
		t.Fatal(err)
	}
	dsn := freshStore(t, true)
	s := open(t, dsn)
	defer s.Close()
	if _, err := reviewlog.CopyStore(ctx, fs, s); err != nil {
		t.Fatal(err)
	}
	r1 := int64(len(reservedLine("rx-1", "", payA, untilA)))
	want := []resRow{
		{"rx-1", "", "agent-1", payA, "https://api.example.com/r", "250000", "usdc", untilA, false, 0, r1},
		{"rx-2", "t1", "agent-1", payB, "https://api.example.com/r", "250000", "usdc", "", false, r1 + int64(len(releasedLine("rx-1"))), -1},
	}
	if got := reservationRows(t, dsn); !slices.Equal(got, want) {
		t.Fatalf("reservations after the import:\n%+v\nwant\n%+v", got, want)
	}
}
