package catalog

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// savingCatalog opens a catalog over dir that saves its run index in
// dir/guard.
func savingCatalog(t *testing.T, dir string) *Catalog {
	t.Helper()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	events, err := root.OpenDirLazy("events")
	if err != nil {
		t.Fatal(err)
	}
	state, err := root.MkdirAll("guard", 0o700)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.Close(); state.Close(); root.Close() })
	c, err := New(Config{Root: root, Events: events, State: state})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// everything is every page of the listing and the guard's history.
func everything(t *testing.T, c *Catalog) (ops []Summary, hist any) {
	t.Helper()
	q := ListQuery{Limit: 7}
	for {
		p, err := c.List(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Operations {
			ops = append(ops, *s)
		}
		if p.NextCursor == "" {
			break
		}
		q.Cursor = p.NextCursor
	}
	tmpl, err := c.Template("")
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.History(context.Background(), tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return ops, h.Ops
}

// A restarted catalog answers from the saved index — every run adopted,
// none read — exactly what one that reads the runs answers; a saved index
// that was changed is not used; a run file that grew, was truncated or was
// rewritten since is read (from where it was, or from the start), the
// others adopted.
func TestSavedIndexAfterARestart(t *testing.T) {
	cases := []struct {
		name string
		// change alters the root (and its saved index) between the two
		// processes.
		change       func(t *testing.T, dir string)
		adopted      int64
		full, append int64
	}{
		{name: "unchanged", adopted: 4},
		{name: "index tampered with", change: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "guard", runindex.IndexFile)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			// "partial" where "full" was: the same length, another answer.
			i := indexOf(b, "full")
			if i < 0 {
				t.Fatal("no completeness in the saved index")
			}
			copy(b[i:], "fuLL")
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, full: 4},
		{name: "index truncated", change: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "guard", runindex.IndexFile)
			if err := os.Truncate(p, 100); err != nil {
				t.Fatal(err)
			}
		}, full: 4},
		{name: "key replaced", change: func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "guard", runindex.KeyFile), make([]byte, 32), 0o600); err != nil {
				t.Fatal(err)
			}
		}, full: 4},
		{name: "a run grew", change: func(t *testing.T, dir string) {
			rec, err := simrec.New(dir, "run-01", time.Date(2026, 7, 2, 0, 0, 0, 0, time.UTC))
			if err != nil {
				t.Fatal(err)
			}
			// op-3 again (it gets more events) and a new operation.
			if err := rec.PayAll([]simrec.Payment{
				{OperationID: "op-3", URL: "https://api.example.com/r", PayTo: fmt.Sprintf("0x%040x", 9), Amount: "10000", Outcome: "settled"},
				{OperationID: "op-new", URL: "https://api.example.com/r", PayTo: fmt.Sprintf("0x%040x", 9), Amount: "10000", Outcome: "unsettled"},
			}); err != nil {
				t.Fatal(err)
			}
		}, adopted: 4, append: 1},
		{name: "a run truncated", change: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "events", "run-02.ndjson")
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(p)
			cut := int64(lastLineStart(b[:len(b)-1]))
			if cut <= 0 || cut >= st.Size() {
				t.Fatal("cannot cut a line")
			}
			if err := os.Truncate(p, cut); err != nil {
				t.Fatal(err)
			}
		}, adopted: 3, full: 1},
		{name: "a run rewritten at the same size", change: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "events", "run-03.ndjson")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			// The last operation's id, op-9 → op-8: the same size, another
			// history.
			i := lastIndexOf(b, `"op-9"`)
			if i < 0 {
				t.Fatal("no op-9 in the run")
			}
			b[i+4] = '8'
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, adopted: 3, full: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := newRoot(t, 4, 10)
			first := savingCatalog(t, dir)
			everything(t, first)
			first.WaitSaved()
			if st := first.Stats(); st.Saves != 1 || st.FullReads != 4 {
				t.Fatalf("first process: %+v, want 4 runs read and one save", st)
			}
			if c.change != nil {
				c.change(t, dir)
			}
			second := savingCatalog(t, dir)
			gotOps, gotHist := everything(t, second)
			second.WaitSaved()
			wantOps, wantHist := everything(t, openCatalog(t, dir))
			if !reflect.DeepEqual(gotOps, wantOps) {
				t.Fatalf("listing after the restart:\n%+v\nwant what the runs say:\n%+v", gotOps, wantOps)
			}
			if !reflect.DeepEqual(gotHist, wantHist) {
				t.Fatalf("history after the restart:\n%+v\nwant:\n%+v", gotHist, wantHist)
			}
			st := second.Stats()
			if st.Adopted != c.adopted || st.FullReads != c.full || st.IncrementalRs != c.append {
				t.Fatalf("second process: %d adopted, %d read in full, %d from where they were (%+v); want %d, %d, %d",
					st.Adopted, st.FullReads, st.IncrementalRs, st, c.adopted, c.full, c.append)
			}
			// What the second process saved is used by a third as is.
			third := savingCatalog(t, dir)
			everything(t, third)
			if st := third.Stats(); st.Adopted != 4 || st.FullReads != 0 {
				t.Fatalf("third process: %+v, want every run adopted", st)
			}
		})
	}
}

func indexOf(b []byte, s string) int {
	for i := 0; i+len(s) <= len(b); i++ {
		if string(b[i:i+len(s)]) == s {
			return i
		}
	}
	return -1
}

func lastIndexOf(b []byte, s string) int {
	for i := len(b) - len(s); i >= 0; i-- {
		if string(b[i:i+len(s)]) == s {
			return i
		}
	}
	return -1
}

func lastLineStart(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			return i + 1
		}
	}
	return 0
}

// The first page after a restart is what reading every run gives, though
// only the runs it needs are decoded from the saved index (the others
// stay there until asked, or until the background decodes them): with and
// without a completeness, for the latest run and for one run, and the
// pages after it.
func TestFirstPageAfterARestartIsExact(t *testing.T) {
	dir, _ := newRoot(t, 12, 10)
	first := savingCatalog(t, dir)
	everything(t, first)
	first.WaitSaved()
	fresh := openCatalog(t, dir)
	queries := []ListQuery{
		{Limit: 3},
		{Limit: 1},
		{Limit: 100},
		{Limit: 4, Completeness: "full"},
		{Limit: 2, Completeness: "partial"},
		{Limit: 3, Run: "latest"},
		{Limit: 3, Run: "run-05"},
	}
	for _, q := range queries {
		t.Run(fmt.Sprintf("%+v", q), func(t *testing.T) {
			restarted := savingCatalog(t, dir)
			for page := 0; ; page++ {
				got, err := restarted.List(context.Background(), q)
				if err != nil {
					t.Fatal(err)
				}
				want, err := fresh.List(context.Background(), q)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got.Operations, want.Operations) || got.RunsScanned != want.RunsScanned || len(got.Operations) == 0 {
					t.Fatalf("page %d after the restart:\n%s\nwant what the runs say:\n%s", page, rows(got), rows(want))
				}
				if page == 0 {
					if st := restarted.Stats(); st.Adopted != 12 || st.FullReads != 0 {
						t.Fatalf("first page: %+v, want every run adopted, none read", st)
					}
				}
				if (got.NextCursor == "") != (want.NextCursor == "") || got.NextCursor == "" {
					break
				}
				q.Cursor = want.NextCursor
			}
		})
	}
}

func rows(p Page) string {
	var b strings.Builder
	for _, s := range p.Operations {
		fmt.Fprintf(&b, "%s %s %s %s\n", s.LastEventAt, s.RunID, s.OperationID, s.Completeness)
	}
	return b.String()
}
