package pgstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// The store indexes a line, and queues the review it opens for
// notification, only as the log's own strict parser reads it
// (reviewlog.ParseLineHead): a line the log would not read as a record is
// kept byte for byte, unindexed, and notifies no one.
func TestAppendIndexesByTheLogsParser(t *testing.T) {
	dsn := freshStore(t, true)
	s := open(t, dsn)
	const (
		good   = "1b4e28ba-2fa1-4d2c-883f-0016d3cca427"
		forged = "2c5f39cb-3ab2-4e3d-994a-1127e4ddb538"
	)
	opened := func(id, extra string) string {
		return `{"type":"opened","review_id":"` + id + `","at":"2026-07-25T12:00:00.000Z","counterparty":"api.example.com","amount":"1","asset":"a","reasons":[]` + extra + "}\n"
	}
	lines := []string{
		opened(good, ""),
		opened(forged, `,"Review_ID":"x"`), // a field of another case: not a record
		`{"type":"repair","at":"2026-07-25T12:00:01.000Z","lines":[2]}` + "\n",
		"not json\n",
	}
	var data []byte
	for _, l := range lines {
		data = append(data, l...)
	}
	ctx := t.Context()
	if err := s.Locked(ctx, time.Second, func(w reviewlog.Writer) error { return w.AppendLog(ctx, data) }); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SELECT line, COALESCE(kind, ''), COALESCE(review_id, '') FROM review_lines WHERE stream = $1 ORDER BY off", reviewlog.FileName)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ line, kind, id string }
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		var line []byte
		err := r.Scan(&line, &x.kind, &x.id)
		x.line = string(line)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []row{{lines[0], "opened", good}, {lines[1], "", ""}, {lines[2], "repair", ""}, {lines[3], "", ""}}
	if !slices.Equal(got, want) {
		t.Fatalf("review_lines:\n%q\nwant\n%q", got, want)
	}
	ids, err := conn.Query(ctx, "SELECT review_id FROM notify_outbox ORDER BY review_id")
	if err != nil {
		t.Fatal(err)
	}
	queued, err := pgx.CollectRows(ids, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(queued, []string{good}) {
		t.Fatalf("notification outbox %q, want only %s", queued, good)
	}
}
