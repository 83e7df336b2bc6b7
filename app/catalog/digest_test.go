package catalog

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// variedRoot writes runs of every kind of payment to several payees and
// hosts: old runs, and recent ones (inside the windows of a decision now).
func variedRoot(t *testing.T, now time.Time) string {
	t.Helper()
	dir := t.TempDir()
	outcomes := []string{"settled", "settled", "unsettled", "declined", "walked-away", "settled"}
	for r := range 10 {
		start := now.Add(-time.Duration(40-r) * 24 * time.Hour)
		if r >= 8 {
			start = now.Add(-time.Duration(10-r) * time.Hour) // recent
		}
		rec, err := simrec.New(dir, fmt.Sprintf("run-%02d", r), start)
		if err != nil {
			t.Fatal(err)
		}
		ps := make([]simrec.Payment, 12)
		for i := range ps {
			ps[i] = simrec.Payment{OperationID: fmt.Sprintf("op-%d", i), URL: fmt.Sprintf("https://svc%d.example.com/r/%d", (i+r)%4, i%3),
				PayTo: fmt.Sprintf("0x%040x", (i*r)%5+1), Amount: fmt.Sprint(10000 * (1 + i%4)), Outcome: outcomes[(i+r)%len(outcomes)]}
			if i == 7 && r%3 == 0 {
				ps[i].Settle = map[string]any{"success": false} // settlement unconfirmed
			}
			if i == 9 && r%4 == 1 {
				ps[i].SubmittedPayTo = fmt.Sprintf("0x%040x", 77) // events that disagree
			}
		}
		if err := rec.PayAll(ps); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// quietCatalog is savingCatalog with no decoding in the background, so
// that what a question decodes can be counted.
func quietCatalog(t *testing.T, dir string) *Catalog {
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
	c, err := New(Config{Root: root, Events: events, State: state, noBackground: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// After a restart, the guard's decisions read from the saved index's
// digests (the runs' summaries left undecoded unless one of their
// operations is inside a window) are those the events give: a catalog that
// reads every run and hands the guard every operation. Where the saved
// index is stale (a run grew), tampered with or truncated, what changed is
// read from the files, and the decisions are still the events'.
func TestDecisionsFromTheSavedIndexAreTheEvents(t *testing.T) {
	now := time.Now().UTC()
	cfg, err := guard.ParseConfig([]byte(`{"reviewAbove":"100","perCounterpartyLimit":{"amount":"0.05","windowHours":24},"totalLimit":{"amount":"0.2","windowHours":24},"velocity":{"perCounterparty":{"count":3,"windowMinutes":600},"total":{"count":9,"windowMinutes":600}},"duplicatePayment":{"windowMinutes":600},"reviewNewPayee":true}`), "")
	if err != nil {
		t.Fatal(err)
	}
	since := now.Add(-25 * time.Hour)
	var questions []guard.RawRequest
	for p := 1; p <= 6; p++ {
		addr := fmt.Sprintf("0x%040x", p)
		questions = append(questions, guard.RawRequest{Counterparty: addr, Amount: "0.01"},
			guard.RawRequest{Counterparty: fmt.Sprintf("svc%d.example.com", p%5), Amount: "0.02", PayTo: addr, Resource: "https://svc1.example.com/r/1"},
			guard.RawRequest{Counterparty: fmt.Sprintf("svc%d.example.com", p%5), Amount: "0.01"})
	}
	cases := []struct {
		name   string
		change func(t *testing.T, dir string)
		// decoded is how many runs' summaries the first decision decodes
		// from the saved index; adopted how many runs it takes from it.
		// digests is how many runs' digests it reads.
		decoded, adopted, digests int64
	}{
		{name: "unchanged", decoded: 2, adopted: 10, digests: 10},
		{name: "a run grew", change: func(t *testing.T, dir string) {
			rec, err := simrec.New(dir, "run-01", now.Add(-30*24*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.PayAll([]simrec.Payment{{OperationID: "op-late", URL: "https://svc1.example.com/r/1", PayTo: fmt.Sprintf("0x%040x", 9), Amount: "10000", Outcome: "unsettled"}}); err != nil {
				t.Fatal(err)
			}
		}, decoded: 3, adopted: 10, digests: 9},
		{name: "index tampered with", change: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "guard", runindex.IndexFile)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			// A payee's count in a digest, in the authenticated headers.
			i := indexOf(b, "svc2.example.com")
			if i < 0 {
				t.Fatal("no host in the saved index's headers")
			}
			b[i+3] = '3'
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, decoded: 0, adopted: 0},
		{name: "index truncated", change: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "guard", runindex.IndexFile)
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, st.Size()-10); err != nil {
				t.Fatal(err)
			}
		}, decoded: 0, adopted: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := variedRoot(t, now)
			first := savingCatalog(t, dir)
			everything(t, first)
			first.WaitSaved()
			if c.change != nil {
				c.change(t, dir)
			}
			restarted := quietCatalog(t, dir)
			tmpl, err := restarted.Template("")
			if err != nil {
				t.Fatal(err)
			}
			got, err := restarted.HistorySince(context.Background(), tmpl, since)
			if err != nil {
				t.Fatal(err)
			}
			st := restarted.Stats()
			if st.Adopted != c.adopted || st.Decoded != c.decoded {
				t.Fatalf("the first decision's history took %d runs from the saved index and decoded %d (%+v); want %d and %d",
					st.Adopted, st.Decoded, st, c.adopted, c.decoded)
			}
			if n := restarted.DigestsRead(); n != c.digests {
				t.Fatalf("%d runs' digests read, want %d", n, c.digests)
			}
			fresh := openCatalog(t, dir)
			want, err := fresh.History(context.Background(), tmpl)
			if err != nil {
				t.Fatal(err)
			}
			if got.ElidedOps() == 0 && c.adopted > 0 {
				t.Fatal("the restored history left no operation out: the test proves little")
			}
			// The old runs taken from the saved index have no operation
			// inside a window: each is counted whole, its open operations
			// too; only the recent ones, and those read from their files,
			// are listed.
			for _, o := range got.Ops {
				if c.adopted > 0 && o.RunID != "run-08" && o.RunID != "run-09" && (c.change == nil || o.RunID != "run-01") {
					t.Fatalf("operation %s of the old run %s listed (open %v): the run was not counted whole", o.OperationID, o.RunID, o.Open)
				}
			}
			if len(got.Ops)+got.ElidedOps() != len(want.Ops) {
				t.Fatalf("%d operations listed and %d counted; the events hold %d", len(got.Ops), got.ElidedOps(), len(want.Ops))
			}
			for _, q := range questions {
				req, err := guard.ParseRequest(q, cfg)
				if err != nil {
					t.Fatal(err)
				}
				dg, dw := guard.Decide(req, got, cfg, now), guard.Decide(req, want, cfg, now)
				if testing.Verbose() {
					t.Logf("%s %v: %s", q.Counterparty, dg.Decision, dg.Reasons[len(dg.Reasons)-1].Detail)
				}
				if !reflect.DeepEqual(dg, dw) {
					t.Fatalf("%+v: from the saved index:\n%+v\nfrom the events:\n%+v", q, dg, dw)
				}
			}
			// Once the runs are decoded (the listing needs them all), the
			// decisions made from their summaries are the same.
			everything(t, restarted)
			again, err := restarted.HistorySince(context.Background(), tmpl, since)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range questions {
				req, _ := guard.ParseRequest(q, cfg)
				if dg, dw := guard.Decide(req, again, cfg, now), guard.Decide(req, want, cfg, now); !reflect.DeepEqual(dg, dw) {
					t.Fatalf("%+v, every run decoded: from the digests:\n%+v\nfrom the events:\n%+v", q, dg, dw)
				}
			}
		})
	}
}
