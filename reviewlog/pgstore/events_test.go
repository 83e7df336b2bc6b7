package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/haia-trace-mcp/haia-trace-mcp/ingest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

func ingestEvent(run, id string, seq int) ingest.Event {
	return ingest.Event{Run: run, ID: id, Line: fmt.Appendf(nil, `{"event_id":%q,"event_type":"a.b.c","occurred_at":"2026-12-05T17:00:01.000Z","seq":%d,"adapter":"t","payload":{}}`, id, seq)}
}

// TestEventsStoreDedupesAndOrders: a retried batch stores nothing twice (a
// second copy inside one batch neither), tenants are kept apart, and
// Since reads a tenant's events in the order they were stored.
func TestEventsStoreDedupesAndOrders(t *testing.T) {
	dsn := freshStore(t, true)
	e, err := pgstore.OpenEvents(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	batch := []ingest.Event{ingestEvent("r1", "a", 0), ingestEvent("r2", "a", 0), ingestEvent("r1", "b", 1), ingestEvent("r1", "a", 0)}
	dup, err := e.Store(t.Context(), "", batch)
	if err != nil || fmt.Sprint(dup) != "[false false false true]" {
		t.Fatalf("store: %v %v", dup, err)
	}
	dup, _ = e.Store(t.Context(), "", batch)
	if fmt.Sprint(dup) != "[true true true true]" {
		t.Fatalf("retry: %v", dup)
	}
	if dup, _ = e.Store(t.Context(), "acme", batch[:1]); fmt.Sprint(dup) != "[false]" {
		t.Fatalf("another tenant: %v", dup)
	}
	got, err := e.Since(t.Context(), "", 0, 10)
	if err != nil || len(got) != 3 {
		t.Fatalf("since: %d %v", len(got), err)
	}
	for i, want := range []string{"r1/a", "r2/a", "r1/b"} {
		if got[i].Run+"/"+got[i].ID != want || string(got[i].Line) != string(batch[i].Line) {
			t.Errorf("event %d: %s/%s", i, got[i].Run, got[i].ID)
		}
	}
	if more, _ := e.Since(t.Context(), "", got[1].Pos, 10); len(more) != 1 || more[0].ID != "b" {
		t.Fatalf("since the second: %+v", more)
	}
}

// TestEventsMirrorOfConcurrentReplicas: batches stored at once by several
// handles (replicas) are all copied, once each, into a root by a mirror
// that reads while they commit — none is passed over by its position.
func TestEventsMirrorOfConcurrentReplicas(t *testing.T) {
	dsn := freshStore(t, true)
	root := t.TempDir()
	reader, err := pgstore.OpenEvents(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	m := ingest.NewMirror(reader, map[string]string{"": root}, nil)
	defer m.Close()
	ctx, cancel := context.WithCancel(t.Context())
	var copying sync.WaitGroup
	copying.Go(func() {
		for ctx.Err() == nil {
			if _, err := m.Sync(ctx, ""); err != nil && ctx.Err() == nil {
				t.Error(err)
				return
			}
		}
	})
	var wg sync.WaitGroup
	for w := range 4 {
		e, err := pgstore.OpenEvents(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		wg.Go(func() {
			for b := range 25 {
				var batch []ingest.Event
				for i := range 10 {
					batch = append(batch, ingestEvent(fmt.Sprintf("run-%d", w), fmt.Sprintf("e%d-%d", b, i), b*10+i))
				}
				if _, err := e.Store(t.Context(), "", batch); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	cancel()
	copying.Wait()
	if _, err := m.Sync(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	for w := range 4 {
		b, err := os.ReadFile(filepath.Join(root, "events", fmt.Sprintf("run-%d.ndjson", w)))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n != 250 {
			t.Errorf("run-%d holds %d events, want 250", w, n)
		}
	}
}

// TestEventsAsTheRuntimeRole: the role the server runs as (store migrate
// --grant) stores and reads ingested events, and cannot change or remove
// one.
func TestEventsAsTheRuntimeRole(t *testing.T) {
	dsn := freshStore(t, true)
	rt, role := pgtest.AsRuntime(t, dsn)
	if _, err := pgstore.Grant(t.Context(), dsn, role); err != nil {
		t.Fatal(err)
	}
	e, err := pgstore.OpenEvents(t.Context(), rt)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if dup, err := e.Store(t.Context(), "", []ingest.Event{ingestEvent("r", "a", 0)}); err != nil || dup[0] {
		t.Fatalf("store as %s: %v %v", role, dup, err)
	}
	if got, err := e.Since(t.Context(), "", 0, 10); err != nil || len(got) != 1 {
		t.Fatalf("read as %s: %v %v", role, got, err)
	}
	pool, err := pgxpool.New(t.Context(), rt)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []string{`UPDATE ingest_events SET line = 'x'`, `DELETE FROM ingest_events`, `TRUNCATE ingest_events`} {
		if _, err := pool.Exec(t.Context(), q); err == nil {
			t.Errorf("%s: allowed", q)
		}
	}
	owner, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.Exec(t.Context(), `UPDATE ingest_events SET line = 'x'`); err == nil || !strings.Contains(err.Error(), "written once") {
		t.Errorf("the owner's UPDATE: %v", err)
	}
}
