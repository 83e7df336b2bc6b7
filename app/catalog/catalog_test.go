package catalog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// newRoot writes runs×ops payments (every fifth unsettled) into a fresh
// Trace root and opens a catalog over it.
func newRoot(t *testing.T, runs, ops int) (string, *Catalog) {
	t.Helper()
	dir := t.TempDir()
	start := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	for r := range runs {
		rec, err := simrec.New(dir, fmt.Sprintf("run-%02d", r), start.Add(time.Duration(r)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ps := make([]simrec.Payment, ops)
		for i := range ps {
			outcome := "settled"
			if i%5 == 0 {
				outcome = "unsettled"
			}
			ps[i] = simrec.Payment{OperationID: fmt.Sprintf("op-%d", i), URL: "https://api.example.com/r",
				PayTo: fmt.Sprintf("0x%040x", i%3+1), Amount: "10000", Outcome: outcome}
		}
		if err := rec.PayAll(ps); err != nil {
			t.Fatal(err)
		}
	}
	return dir, openCatalog(t, dir)
}

func openCatalog(t *testing.T, dir string) *Catalog {
	t.Helper()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	events, err := root.OpenDirLazy("events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.Close(); root.Close() })
	c, err := New(Config{Root: root, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewNeedsEvents(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("a catalog without an events directory was built")
	}
}

// Every page follows the one before; together they list each operation
// once, newest first, and an append between pages changes nothing seen.
func TestListPagesSeeEveryOperationOnce(t *testing.T) {
	dir, c := newRoot(t, 4, 9)
	ctx := context.Background()
	seen := map[string]bool{}
	var last *Summary
	q := ListQuery{Limit: 5}
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("the listing does not end")
		}
		p, err := c.List(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if p.RunsScanned != 4 {
			t.Fatalf("runs scanned %d, want 4", p.RunsScanned)
		}
		for _, op := range p.Operations {
			key := op.RunID + "/" + op.OperationID
			if seen[key] {
				t.Fatalf("%s listed twice", key)
			}
			seen[key] = true
			if last != nil && !before(last.LastEventAt, last.RunID, last.OperationID, op.LastEventAt, op.RunID, op.OperationID) {
				t.Fatalf("%s/%s listed after %s/%s", op.RunID, op.OperationID, last.RunID, last.OperationID)
			}
			last = op
		}
		if pages == 0 {
			// An append after the first page is not in this listing.
			rec, err := simrec.New(dir, "run-99", time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.Pay(simrec.Payment{OperationID: "late", URL: "https://api.example.com/r", PayTo: "0x" + strings.Repeat("a", 40), Amount: "1", Outcome: "settled"}); err != nil {
				t.Fatal(err)
			}
		}
		if p.NextCursor == "" {
			break
		}
		q.Cursor = p.NextCursor
	}
	if len(seen) != 36 {
		t.Fatalf("%d operations listed, want 36", len(seen))
	}
}

func TestListSelections(t *testing.T) {
	_, c := newRoot(t, 3, 10)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		q        ListQuery
		wantOps  int
		wantRuns int
		check    func(*Summary) bool
	}{
		{"every run", ListQuery{Limit: 100}, 30, 3, func(*Summary) bool { return true }},
		{"one run", ListQuery{Run: "run-01", Limit: 100}, 10, 1, func(s *Summary) bool { return s.RunID == "run-01" }},
		{"the latest run", ListQuery{Run: "latest", Limit: 100}, 10, 1, func(s *Summary) bool { return s.RunID == "run-02" }},
		{"partial only", ListQuery{Completeness: "partial", Limit: 100}, 6, 3, func(s *Summary) bool { return s.Completeness == "partial" }},
		{"full only", ListQuery{Completeness: "full", Limit: 100}, 24, 3, func(s *Summary) bool { return s.Completeness == "full" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := c.List(ctx, tc.q)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Operations) != tc.wantOps || p.RunsScanned != tc.wantRuns || p.NextCursor != "" {
				t.Fatalf("%d operations from %d runs (cursor %q), want %d from %d", len(p.Operations), p.RunsScanned, p.NextCursor, tc.wantOps, tc.wantRuns)
			}
			for _, op := range p.Operations {
				if !tc.check(op) {
					t.Fatalf("%+v does not belong to this listing", op)
				}
			}
		})
	}
}

func TestListRefusals(t *testing.T) {
	dir, c := newRoot(t, 2, 4)
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(dir, "events", "broken.ndjson"), []byte("{not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	first, err := c.List(ctx, ListQuery{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Unreadable) != 1 || first.Unreadable[0].RunID != "broken" || strings.Contains(first.Unreadable[0].Error, dir) {
		t.Fatalf("unreadable %+v: want run broken, its reason without the root's path", first.Unreadable)
	}
	for _, tc := range []struct {
		name string
		q    ListQuery
		want func(error) bool
	}{
		{"unknown run", ListQuery{Run: "nope", Limit: 1}, func(err error) bool {
			var re *RunError
			return errors.As(err, &re) && re.Unknown && re.RunID == "nope"
		}},
		{"unreadable run", ListQuery{Run: "broken", Limit: 1}, func(err error) bool {
			var re *RunError
			return errors.As(err, &re) && !re.Unknown && re.Detail != "" && !strings.Contains(re.Detail, dir)
		}},
		{"not a template name", ListQuery{Template: "../x", Limit: 1}, func(err error) bool {
			var te *TemplateError
			return errors.As(err, &te) && strings.Contains(te.Error(), "bare name")
		}},
		{"unknown template", ListQuery{Template: "no-such-template", Limit: 1}, func(err error) bool {
			var te *TemplateError
			return errors.As(err, &te) && te.Name == "no-such-template"
		}},
		{"garbage cursor", ListQuery{Limit: 1, Cursor: "!!!"}, func(err error) bool {
			var ce *CursorError
			return errors.As(err, &ce) && ce.Kind == CursorInvalid
		}},
		{"cursor of another listing", ListQuery{Limit: 1, Completeness: "full", Cursor: first.NextCursor}, func(err error) bool {
			var ce *CursorError
			return errors.As(err, &ce) && ce.Kind == CursorOtherListing && ce.Template == "x402-buyer" && ce.Completeness == ""
		}},
		{"cursor of another version", ListQuery{Limit: 1, Cursor: (&cursorCodec{}).encodeVersion(listCursor{Template: "x402-buyer", At: "a", Run: "r"}, 7)}, func(err error) bool {
			var ce *CursorError
			return errors.As(err, &ce) && ce.Kind == CursorOtherVersion
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.List(ctx, tc.q)
			if !tc.want(err) {
				t.Fatalf("err %v (%T)", err, err)
			}
		})
	}
}

func TestOperation(t *testing.T) {
	dir, c := newRoot(t, 1, 3)
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(dir, "events", "broken.ndjson"), []byte("{not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl, err := c.Template("")
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Operation(ctx, "run-00", "op-1", tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if r.Operation.OperationID != "op-1" || r.Completeness != "full" {
		t.Fatalf("receipt %+v", r.Operation)
	}
	var re *RunError
	if _, err := c.Operation(ctx, "run-07", "op-1", tmpl); !errors.As(err, &re) || !re.Unknown {
		t.Fatalf("unknown run: %v", err)
	}
	if _, err := c.Operation(ctx, "broken", "op-1", tmpl); !errors.As(err, &re) || re.Unknown || strings.Contains(re.Detail, dir) {
		t.Fatalf("unreadable run: %v", err)
	}
	var no *NoOperationError
	if _, err := c.Operation(ctx, "run-00", "op-9", tmpl); !errors.As(err, &no) || no.OperationID != "op-9" {
		t.Fatalf("no operation: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Operation(cancelled, "run-00", "op-1", tmpl); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// History is cached while no run changes, and follows an append.
func TestHistoryFollowsAppends(t *testing.T) {
	dir, c := newRoot(t, 2, 3)
	ctx := context.Background()
	tmpl, err := c.Template("")
	if err != nil {
		t.Fatal(err)
	}
	h1, err := c.History(ctx, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if h1.Runs != 2 || len(h1.Ops) != 6 {
		t.Fatalf("history of %d runs, %d operations; want 2, 6", h1.Runs, len(h1.Ops))
	}
	h2, err := c.History(ctx, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if &h1.Ops[0] != &h2.Ops[0] {
		t.Fatal("an unchanged root built its history again")
	}
	rec, err := simrec.New(dir, "run-00", time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "more", URL: "https://api.example.com/r", PayTo: "0x" + strings.Repeat("b", 40), Amount: "1", Outcome: "settled"}); err != nil {
		t.Fatal(err)
	}
	h3, err := c.History(ctx, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if len(h3.Ops) != 7 {
		t.Fatalf("after an append: %d operations, want 7", len(h3.Ops))
	}
}

// A root without events/ yet lists nothing, and says nothing is wrong.
func TestEmptyRoot(t *testing.T) {
	c := openCatalog(t, t.TempDir())
	p, err := c.List(context.Background(), ListQuery{Limit: 10})
	if err != nil || len(p.Operations) != 0 || p.RunsScanned != 0 {
		t.Fatalf("page %+v, err %v", p, err)
	}
	tmpl, _ := c.Template("")
	var re *RunError
	if _, err := c.Operation(context.Background(), "run", "op", tmpl); !errors.As(err, &re) || !re.Unknown {
		t.Fatalf("err %v", err)
	}
}

// FuzzDecodeCursor: a cursor is a caller's bytes; whatever they are, the
// decoder refuses them with a CursorError or returns a cursor whose parts
// agree, and never panics.
func FuzzDecodeCursor(f *testing.F) {
	var cc cursorCodec
	f.Add(cc.encode(listCursor{Template: "x402-buyer", At: "2026-01-01T00:00:00Z", Run: "r", Op: "o", Runs: []string{"r"}, Lines: []int{3}}))
	f.Add("")
	f.Add("AAAA")
	f.Add(strings.Repeat("_", 100))
	f.Fuzz(func(t *testing.T, s string) {
		c, err := decodeCursor(s)
		if err != nil {
			var ce *CursorError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is no CursorError", err)
			}
			return
		}
		if len(c.Runs) != len(c.Lines) || c.At == "" || c.Run == "" || c.V != cursorVersion {
			t.Fatalf("accepted an inconsistent cursor %+v", c)
		}
		for _, n := range c.Lines {
			if n < 0 {
				t.Fatalf("accepted a negative line count %+v", c)
			}
		}
	})
}
