package app_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/notify"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// told records the messages a replica's notifier was handed.
type told struct {
	mu  sync.Mutex
	got []notify.Message
}

func (r *told) Notify(m notify.Message) {
	r.mu.Lock()
	r.got = append(r.got, m)
	r.mu.Unlock()
}

func (r *told) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.got {
		out = append(out, m.Event+" "+m.ReviewID)
	}
	return out
}

// Findings are told through the store's outbox, like opened reviews: a
// finding recorded by a server that stopped before telling it (here, one
// that serves without a notifier) is told by the next to start, once
// across the replicas that serve the store, and not again by a replica
// started after — on the file store (guard/notify-outbox.ndjson) and on
// PostgreSQL (notify_outbox).
func TestFindingsToldThroughTheOutbox(t *testing.T) {
	for _, store := range []string{"file", "postgres"} {
		t.Run(store, func(t *testing.T) {
			cfg := newTraceRoot(t, t.TempDir())
			if store == "postgres" {
				dsn := pgtest.Database(t, pgtest.DSN(t))
				if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
					t.Fatal(err)
				}
				cfg.Store = dsn
			}
			ctx := t.Context()
			first := open(t, cfg)
			if err := first.Start(ctx); err != nil {
				t.Fatal(err)
			}
			nonce := "0x" + strings.Repeat("6", 64)
			s := reviewlog.Settled{Nonce: nonce, AuthorizationReceipt: "r-auth", DecisionReceipt: "r-dec", Success: true,
				Transaction: "0x" + strings.Repeat("7", 64), Network: "eip155:8453", Payer: "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0",
				Digest: "0x" + strings.Repeat("d", 64), Findings: []string{"payer: the settlement names 0x1199…, the authorization was signed by 0x2222…"}}
			if _, err := first.Log().RecordSettlement(ctx, "agent-1", s, func(reviewlog.Tx) (string, error) { return "r-settled", nil }); err != nil {
				t.Fatal(err)
			}
			am := reviewlog.Ambiguity{Kind: reviewlog.AmbiguousSettlement, Nonces: []string{"0x" + strings.Repeat("1", 64), "0x" + strings.Repeat("2", 64)},
				Transactions: []string{"0x" + strings.Repeat("a", 64)}, TraceRun: "run-1", TraceLine: 4, Text: "the Trace's settlement 0xaaaa… has the terms of 2 authorizations"}
			if ok, err := first.Log().RecordAmbiguity(ctx, am); err != nil || !ok {
				t.Fatalf("the ambiguity: %v %v", ok, err)
			}
			first.Close()
			want := []string{notify.EventSettlementFinding + " " + reviewlog.NotifyAmbiguity + reviewlog.AmbiguityKey(am.Kind, am.Nonces, am.Transactions),
				notify.EventSettlementFinding + " " + reviewlog.NotifySettlement + nonce}

			replica := func(name string) (*app.Stack, *told) {
				r := &told{}
				c := cfg
				c.Notifier, c.Replica = notify.Multi(r), name
				st, err := app.Open(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				return st, r
			}
			b, rb := replica("b")
			c, rc := replica("c")
			var wg sync.WaitGroup
			for _, st := range []*app.Stack{b, c} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := st.Start(ctx); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			var all []string
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if all = append(rb.ids(), rc.ids()...); len(all) >= 2 {
					break
				}
			}
			time.Sleep(500 * time.Millisecond) // a second delivery would come now
			all = append(rb.ids(), rc.ids()...)
			slices.Sort(all)
			if !slices.Equal(all, want) {
				t.Fatalf("told across two replicas: %q, want each finding once: %q", all, want)
			}
			b.Close()
			c.Close()
			d, rd := replica("d")
			t.Cleanup(d.Close)
			if err := d.Start(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			if got := rd.ids(); len(got) != 0 {
				t.Fatalf("a replica started after told them again: %q", got)
			}
		})
	}
}
