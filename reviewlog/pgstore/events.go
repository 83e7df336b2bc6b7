package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/haia-trace-mcp/haia-trace-mcp/ingest"
)

// EventsChannel is notified (with the tenant) when a batch of ingested
// events commits.
const EventsChannel = "haia_ingest_events"

// Events is the table of the events recorders post (ingest_events): the
// ingest endpoint's store on a replica whose guard keeps its state in
// PostgreSQL, and the source every replica copies into its own run files
// (ingest.Mirror), so replicas on separate hosts share no volume.
type Events struct {
	pool     *pgxpool.Pool
	describe string
}

// OpenEvents connects to the database at dsn, whose schema must be this
// binary's.
func OpenEvents(ctx context.Context, dsn string) (*Events, error) {
	pool, err := connect(ctx, dsn, nil)
	if err != nil {
		return nil, err
	}
	where := Redact(dsn)
	if _, err := checkSchema(ctx, pool, "PostgreSQL at "+where); err != nil {
		pool.Close()
		return nil, err
	}
	return &Events{pool: pool, describe: where}, nil
}

// Close releases the connections.
func (e *Events) Close() { e.pool.Close() }

// Store implements ingest.Sink: the events not yet held (by tenant, run
// and event_id) are inserted in batch order in one transaction, committed
// (durable) before it returns. A tenant's inserts take a transaction lock,
// so that ids are committed in the order they are given and a replica
// reading past its last id misses none.
func (e *Events) Store(ctx context.Context, tenant string, events []ingest.Event) ([]bool, error) {
	runs := make([]string, len(events))
	ids := make([]string, len(events))
	lines := make([]string, len(events))
	for i, ev := range events {
		runs[i], ids[i], lines[i] = ev.Run, ev.ID, string(ev.Line)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: %w", e.describe, scrub(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('haia_ingest_events:' || $1, 0))`, tenant); err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: lock the tenant's events: %w", e.describe, scrub(err))
	}
	rows, err := tx.Query(ctx, `INSERT INTO ingest_events (tenant, run_id, event_id, line)
		SELECT $1, r, i, l FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS b(r, i, l, n) ORDER BY n
		ON CONFLICT (tenant, run_id, event_id) DO NOTHING
		RETURNING run_id, event_id`, tenant, runs, ids, lines)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: store ingested events: %w", e.describe, scrub(err))
	}
	type key struct{ run, id string }
	stored := map[key]bool{}
	for rows.Next() {
		var k key
		if err := rows.Scan(&k.run, &k.id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("PostgreSQL at %s: store ingested events: %w", e.describe, scrub(err))
		}
		stored[k] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: store ingested events: %w", e.describe, scrub(err))
	}
	if len(stored) > 0 {
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, EventsChannel, tenant); err != nil {
			return nil, fmt.Errorf("PostgreSQL at %s: %w", e.describe, scrub(err))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: commit ingested events: %w", e.describe, scrub(err))
	}
	dup := make([]bool, len(events))
	for i, ev := range events {
		k := key{ev.Run, ev.ID}
		dup[i] = !stored[k]
		delete(stored, k) // a second copy in the same batch is a duplicate
	}
	return dup, nil
}

// Since implements ingest.Source: a tenant's events after position after,
// in commit order, at most limit.
func (e *Events) Since(ctx context.Context, tenant string, after int64, limit int) ([]ingest.Stored, error) {
	rows, err := e.pool.Query(ctx, `SELECT id, run_id, event_id, line FROM ingest_events
		WHERE tenant = $1 AND id > $2 ORDER BY id LIMIT $3`, tenant, after, limit)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: read ingested events: %w", e.describe, scrub(err))
	}
	defer rows.Close()
	var out []ingest.Stored
	for rows.Next() {
		var s ingest.Stored
		var line string
		if err := rows.Scan(&s.Pos, &s.Run, &s.ID, &line); err != nil {
			return nil, fmt.Errorf("PostgreSQL at %s: read ingested events: %w", e.describe, scrub(err))
		}
		s.Line = []byte(line)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: read ingested events: %w", e.describe, scrub(err))
	}
	return out, nil
}

// Listen calls wake when a batch commits, and at least every interval.
func (e *Events) Listen(ctx context.Context, interval time.Duration, wake func(), logger *slog.Logger) {
	listen(ctx, e.pool, e.describe, EventsChannel, interval, wake, logger)
}
