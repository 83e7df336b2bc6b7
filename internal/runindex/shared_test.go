package runindex

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// Callers of the present that list at once each see every run file as it
// was when they asked, or later: each appends a line of its own to its own
// run and lists, and its line is always there, whoever's listing answered
// it. Some listings are shared (the point), and a shared one equals the
// listing a caller would have made itself.
func TestSharedListingsSeeWhatWasThereWhenAsked(t *testing.T) {
	ix, dir, tmpl := newIndex(t)
	const callers, rounds = 8, 40
	var wg sync.WaitGroup
	for c := range callers {
		path := filepath.Join(dir, fmt.Sprintf("run-%02d.ndjson", c))
		wg.Go(func() {
			for r := range rounds {
				op := fmt.Sprintf("c%d-r%d", c, r)
				f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
				if err != nil {
					t.Error(err)
					return
				}
				_, err = f.WriteString(line(op, r))
				f.Close()
				if err != nil {
					t.Error(err)
					return
				}
				l, err := ix.List(context.Background(), tmpl)
				if err != nil {
					t.Error(err)
					return
				}
				found := false
				for _, rv := range l.Runs {
					for _, it := range rv.Items {
						found = found || it.op == op
					}
				}
				if !found {
					t.Errorf("caller %d's listing after its append does not hold %s", c, op)
					return
				}
			}
		})
	}
	wg.Wait()
	st := ix.Stats()
	t.Logf("%d listings of %d shared", st.SharedLists, callers*rounds)

	// Nothing changes now: a shared answer and a fresh listing agree.
	shared, err := ix.List(t.Context(), tmpl)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := ix.listAt(t.Context(), tmpl, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(shared, fresh) {
		t.Fatalf("shared %+v, fresh %+v", shared, fresh)
	}
}

// A listing begun before the caller asked is never its answer: one that
// completed before the call is not reused, so a file written between the
// two is seen.
func TestListingBeforeTheCallIsNotReused(t *testing.T) {
	ix, dir, tmpl := newIndex(t)
	if err := os.WriteFile(filepath.Join(dir, "run-a.ndjson"), []byte(line("a", 0)), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := ops(t, ix, tmpl); strings.Join(got, ",") != "run-a/a" {
		t.Fatalf("first listing: %v", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "run-b.ndjson"), []byte(line("b", 0)), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := ops(t, ix, tmpl); strings.Join(got, ",") != "run-a/a,run-b/b" {
		t.Fatalf("after run-b was written: %v", got)
	}
	if st := ix.Stats(); st.SharedLists != 0 {
		t.Fatalf("%d listings shared with nobody waiting", st.SharedLists)
	}
}

// BenchmarkListConcurrent: 16 callers listing 50 runs at once, each
// listing anew (each) or sharing a listing begun after it asked (shared).
func BenchmarkListConcurrent(b *testing.B) {
	for _, share := range []bool{false, true} {
		name := "each"
		if share {
			name = "shared"
		}
		b.Run(name, func(b *testing.B) {
			ix, dir, tmpl := newIndex(b)
			for r := range 50 {
				var sb strings.Builder
				for i := range 20 {
					sb.WriteString(line(fmt.Sprintf("r%d-op%d", r, i), i))
				}
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("run-%02d.ndjson", r)), []byte(sb.String()), 0o644); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := ix.List(context.Background(), tmpl); err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(8) // 16 callers on 2 cores
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := ix.listAt(context.Background(), tmpl, nil, share); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
