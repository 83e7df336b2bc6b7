// Package pgtest gives tests an empty PostgreSQL database of their own on
// the server named by HAIA_TEST_POSTGRES (.ci/run starts one), and skips
// them, saying why, where there is none. It never mocks the database.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Env names the DSN of the test server; its role must be allowed to
// create databases.
const Env = "HAIA_TEST_POSTGRES"

// DSN is the test server's DSN, or skips t.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(Env)
	if dsn == "" {
		t.Skip(Env + " is not set: no PostgreSQL server to test against (.ci/run starts one)")
	}
	return dsn
}

// Database creates an empty database on the server at dsn, dropped when
// the test ends, and returns its DSN.
func Database(t testing.TB, dsn string) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return create(t, dsn, "t_"+hex.EncodeToString(b[:]))
}

// Databases creates one empty database per name on the server at dsn
// (prefix_<name>, the prefix fresh), dropped when the test ends, and
// returns the DSN of each by name and the DSN with the name replaced by
// placeholder (for a URL that names a database per tenant).
func Databases(t testing.TB, dsn, placeholder string, names ...string) (map[string]string, string) {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	prefix := "t_" + hex.EncodeToString(b[:]) + "_"
	out := map[string]string{}
	for _, name := range names {
		out[name] = create(t, dsn, prefix+name)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("%s: %v", Env, err)
	}
	u.Path = "/" + prefix + "PLACEHOLDER"
	return out, strings.Replace(u.String(), "PLACEHOLDER", placeholder, 1)
}

// create makes database name (a plain identifier) and returns its DSN.
func create(t testing.TB, dsn, name string) string {
	t.Helper()
	admin, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect to the test PostgreSQL server: %v", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(context.Background(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create a test database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("%s: %v", Env, err)
	}
	u.Path = "/" + name
	return u.String()
}

// RuntimeEnv names a second login role on the same server (a DSN whose
// user and password are used; its database is not), one that owns
// nothing: the role a server runs as when `store migrate --grant` gave it
// its privileges.
const RuntimeEnv = "HAIA_TEST_POSTGRES_RUNTIME"

// AsRuntime is db's DSN with the runtime role's user and password, and
// that role's name; it skips t where RuntimeEnv is not set.
func AsRuntime(t testing.TB, db string) (dsn, role string) {
	t.Helper()
	rt := os.Getenv(RuntimeEnv)
	if rt == "" {
		t.Skip(RuntimeEnv + " is not set: no second PostgreSQL role to serve as (.ci/run creates one)")
	}
	ru, err := url.Parse(rt)
	if err != nil || ru.User == nil {
		t.Fatalf("%s: want postgres://ROLE:PASSWORD@HOST/DB", RuntimeEnv)
	}
	u, err := url.Parse(db)
	if err != nil {
		t.Fatalf("the test database's DSN: %v", err)
	}
	u.User = ru.User
	return u.String(), ru.User.Username()
}
