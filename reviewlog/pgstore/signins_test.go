package pgstore_test

import (
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A sign-in challenge is used once across replicas: two handles (two
// replicas' pools) on one database, the first use wins, every later one —
// on either, or at once — is refused; a challenge long expired is removed
// as others are recorded.
func TestUseSignInOnceAcrossReplicas(t *testing.T) {
	dsn := freshStore(t, true)
	a, b := open(t, dsn), open(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	id := func(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }
	exp := time.Now().Add(5 * time.Minute)

	for i, tc := range []struct {
		on   string
		want bool
	}{{"a", true}, {"a", false}, {"b", false}} {
		s := a
		if tc.on == "b" {
			s = b
		}
		fresh, err := s.UseSignIn(ctx, id("one"), exp)
		if err != nil || fresh != tc.want {
			t.Fatalf("use %d on %s: %v %v, want %v", i, tc.on, fresh, err, tc.want)
		}
	}
	// Sixteen replicas at once: one wins.
	var mu sync.Mutex
	wins := 0
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			fresh, err := s.UseSignIn(ctx, id("race"), exp)
			if err != nil {
				t.Error(err)
			}
			if fresh {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d of 16 concurrent uses of one challenge won, want 1", wins)
	}
	if _, err := a.UseSignIn(ctx, []byte("short"), exp); err == nil {
		t.Fatal("an id that is no SHA-256 was recorded")
	}
	// Rows whose challenge expired over an hour ago go; a recent one stays.
	if fresh, err := a.UseSignIn(ctx, id("old"), time.Now().Add(-2*time.Hour)); err != nil || !fresh {
		t.Fatalf("record an old sign-in: %v %v", fresh, err)
	}
	if _, err := b.UseSignIn(ctx, id("later"), exp); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var old, kept int
	if err := conn.QueryRow(ctx, "SELECT count(*) FILTER (WHERE challenge = $1), count(*) FILTER (WHERE challenge = $2) FROM console_signins", id("old"), id("one")).Scan(&old, &kept); err != nil {
		t.Fatal(err)
	}
	if old != 0 || kept != 1 {
		t.Fatalf("after cleaning: the long-expired row %d (want 0), the live one %d (want 1)", old, kept)
	}
}
