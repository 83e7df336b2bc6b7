package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// versionTable is goose's record of applied migrations.
const versionTable = "haia_schema_version"

// ErrSchema marks a database whose schema is not the one this binary
// speaks: behind (run `store migrate`) or ahead (a newer binary migrated
// it).
var ErrSchema = errors.New("the database schema does not match this binary")

// Versions are the schema version the database is at and the one this
// binary carries; after Migrate, Applied lists the migrations that run
// applied (an earlier one a database lacked among them, its version then
// unchanged).
type Versions struct {
	Database, Binary int64
	Applied          []int64
}

func provider(pool *pgxpool.Pool, logger *slog.Logger) (*goose.Provider, func(), error) {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, nil, err
	}
	// A session lock: replicas that all run `store migrate` at start take
	// turns, and each finds the work done by the first.
	// Retried every second for up to 5 minutes (the library's default
	// retries every 5 s, which makes every replica but the first wait that
	// long at start).
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	// Out of order: a database migrated by a build that carried a later
	// migration but not an earlier one (two changes developed side by
	// side) gets the earlier one applied, and is behind until it has.
	opts := []goose.ProviderOption{goose.WithTableName(versionTable), goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true),
		goose.WithAllowOutofOrder(true)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, opts...)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("schema migrations: %w", err)
	}
	return p, func() { db.Close() }, nil
}

func binaryVersion(p *goose.Provider) int64 {
	var v int64
	for _, s := range p.ListSources() {
		v = max(v, s.Version)
	}
	return v
}

// Migrate brings the schema to the version this binary carries and says
// where it started and ended. It refuses a schema ahead of the binary.
func Migrate(ctx context.Context, dsn string, logger *slog.Logger) (Versions, Versions, error) {
	pool, err := connect(ctx, dsn, nil)
	if err != nil {
		return Versions{}, Versions{}, err
	}
	defer pool.Close()
	pctx, cancel := context.WithTimeout(ctx, connectTimeout+statementTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		return Versions{}, Versions{}, fmt.Errorf("PostgreSQL at %s does not answer: %w", Redact(dsn), scrub(err))
	}
	p, done, err := provider(pool, logger)
	if err != nil {
		return Versions{}, Versions{}, err
	}
	defer done()
	before, err := versions(ctx, p)
	if err != nil {
		return Versions{}, Versions{}, err
	}
	if before.Database > before.Binary {
		return before, before, fmt.Errorf("%w: the database is at schema version %d, ahead of this binary's %d; run a newer haia-trace-mcp", ErrSchema, before.Database, before.Binary)
	}
	applied, err := p.Up(ctx)
	if err != nil {
		return before, before, fmt.Errorf("apply schema migrations: %w", err)
	}
	after, err := versions(ctx, p)
	if err != nil {
		return before, after, err
	}
	for _, r := range applied {
		if r.Source != nil && r.Error == nil {
			after.Applied = append(after.Applied, r.Source.Version)
		}
	}
	if err := reindexReservations(ctx, pool); err != nil {
		return before, after, err
	}
	return before, after, nil
}

func versions(ctx context.Context, p *goose.Provider) (Versions, error) {
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return Versions{}, fmt.Errorf("read the schema version: %w", err)
	}
	return Versions{Database: v, Binary: binaryVersion(p)}, nil
}

// checkSchema refuses a schema behind or ahead of the binary, saying what
// to run.
func checkSchema(ctx context.Context, pool *pgxpool.Pool, where string) (int64, error) {
	p, done, err := provider(pool, nil)
	if err != nil {
		return 0, err
	}
	defer done()
	v, err := versions(ctx, p)
	if err != nil {
		return 0, err
	}
	behind := v.Database < v.Binary
	if !behind && v.Database == v.Binary {
		// At the newest version, but an earlier migration may be missing.
		if behind, err = p.HasPending(ctx); err != nil {
			return 0, fmt.Errorf("read the schema version: %w", err)
		}
	}
	switch {
	case behind:
		return 0, fmt.Errorf("%w: %s is at schema version %d, behind this binary's %d; run `haia-trace-mcp store migrate --store URL` first", ErrSchema, where, v.Database, v.Binary)
	case v.Database > v.Binary:
		return 0, fmt.Errorf("%w: %s is at schema version %d, ahead of this binary's %d; run the newer haia-trace-mcp that migrated it", ErrSchema, where, v.Database, v.Binary)
	}
	return v.Binary, nil
}
