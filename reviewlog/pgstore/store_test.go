package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/storetest"
)

// freshStore makes an empty database for one test, migrated when asked.
func freshStore(t *testing.T, migrate bool) string {
	t.Helper()
	dsn := pgtest.Database(t, pgtest.DSN(t))
	if migrate {
		if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	return dsn
}

func open(t *testing.T, dsn string) *pgstore.Store {
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
	storetest.Run(t, func(t *testing.T) (reviewlog.Store, func() reviewlog.Store) {
		dsn := freshStore(t, true)
		return open(t, dsn), func() reviewlog.Store { return open(t, dsn) }
	})
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
	if err != nil || again != after {
		t.Fatalf("second migrate: %+v %v", again, err)
	}
	open(t, dsn).Close()
	// A schema ahead of the binary (a newer binary migrated it).
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), "INSERT INTO haia_schema_version (version_id, is_applied) VALUES (99, true)"); err != nil {
		t.Fatal(err)
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
