package pgstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The server's runtime privileges, table by table. The records a reader
// verifies — receipts, their rows, the spend ledger, the keyring and the
// uses of approvals — are appended and never changed, so the runtime role
// may read and insert them and nothing else; the working tables it keeps
// up to date it may also update and delete from. It owns nothing: only an
// owner (or a superuser) can disable a trigger, drop a table or ALTER one.
var (
	appendOnlyTables = []string{"receipts", "receipt_rows", "ledger_entries", "keyring", "review_uses", "mandate_records", "decision_questions", "ingest_events"}
	workingTables    = []string{"guard_meta", "guard_streams", "review_lines", "notify_outbox", "reviews", "reservations", "console_signins"}
)

// Grant gives role what a server needs to run on the store at dsn and
// nothing more (see appendOnlyTables), revoking UPDATE, DELETE and
// TRUNCATE on the append-only tables should an earlier grant have given
// them. Run it as the role that migrated the schema (the tables' owner),
// after Migrate. It returns the statements it ran, for the operator.
func Grant(ctx context.Context, dsn, role string) ([]string, error) {
	if role == "" {
		return nil, fmt.Errorf("--grant names the role the server runs as; it is empty")
	}
	pool, err := connect(ctx, dsn, nil)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	where := Redact(dsn)
	var exists bool
	var self, schema string
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1), current_user, current_schema()", role).Scan(&exists, &self, &schema); err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: read the roles: %w", where, scrub(err))
	}
	switch {
	case !exists:
		return nil, fmt.Errorf("--grant %q: no such role on PostgreSQL at %s (create it first: CREATE ROLE %s LOGIN PASSWORD '…')", role, where, pgx.Identifier{role}.Sanitize())
	case role == self:
		return nil, fmt.Errorf("--grant %q is the role this migration runs as, which owns the tables: name the role the server runs as, a role of its own", role)
	}
	r := pgx.Identifier{role}.Sanitize()
	list := func(names []string) string {
		q := make([]string, len(names))
		for i, n := range names {
			q[i] = pgx.Identifier{schema, n}.Sanitize()
		}
		return strings.Join(q, ", ")
	}
	stmts := []string{
		fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), r),
		fmt.Sprintf("GRANT SELECT ON %s TO %s", pgx.Identifier{schema, versionTable}.Sanitize(), r),
		fmt.Sprintf("GRANT SELECT, INSERT ON %s TO %s", list(appendOnlyTables), r),
		fmt.Sprintf("REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON %s FROM %s", list(appendOnlyTables), r),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s", list(workingTables), r),
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: %w", where, scrub(err))
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("PostgreSQL at %s: %s: %w", where, s, scrub(err))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: commit the grants: %w", where, scrub(err))
	}
	return stmts, nil
}

// OwnsTables says whether the role the store is connected as owns the
// guard's tables, is a member of their owner, or is a superuser: a server
// that does can disable the triggers that keep its records fixed
// (docs/store.md, "Roles").
func (s *Store) OwnsTables(ctx context.Context) (bool, error) {
	var owns bool
	err := s.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = 'ledger_entries' AND pg_has_role(tableowner, 'USAGE')) OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)").Scan(&owns)
	if err != nil {
		return false, fmt.Errorf("PostgreSQL at %s: read the tables' owner: %w", s.describe, scrub(err))
	}
	return owns, nil
}
