package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

const newPayeePolicy = `{"reviewAbove": "1000", "reviewNewPayee": true, "payees": {"` + sellerB + `": "Weather API"}}`

// reviewerOf is a decider over the fleet's store that signs as alice, a
// reviewer the fleet's engines trust (set before they start).
func (f *fleet) reviewerOf(t *testing.T) Decider {
	t.Helper()
	_, aliceKey, _ := ed25519.GenerateKey(rand.Reader)
	trusted := reviewlog.Reviewers{"alice": aliceKey.Public().(ed25519.PublicKey)}
	f.reviewers = trusted
	var st reviewlog.Store
	if f.kind == pgKind {
		s, err := pgstore.Open(t.Context(), f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		st = s
	} else {
		root, _ := openTestRoot(t, f.dir)
		st = filestore.New(root)
	}
	log := reviewlog.OpenStore(st, reviewlog.Options{Now: f.clock, ReviewTTL: f.pol.ReviewTTL, LockWait: 30 * time.Second,
		Reviewers: func() (reviewlog.Reviewers, error) { return trusted, nil }})
	return Decider{Log: log, Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(aliceKey)}}
}

// A first payment to a new payee: ten questions at once, spread over two
// replicas, all review and none allow; after one approval is used, the
// payee is known on every replica and to a process that starts later.
func TestNewPayeeReviewedOnceAcrossReplicas(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 0, newPayeePolicy)
			reviewer := f.reviewerOf(t)
			f.fresh(t)
			f.fresh(t)
			ctx := context.Background()
			// sellerA was paid before: it is no new payee.
			rec, err := simrec.New(f.dir, "run-1", start)
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.Pay(settled("op-1", sellerA, "https://api.example.com/a")); err != nil {
				t.Fatal(err)
			}
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				answers []Answer
			)
			for i := range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					a, err := f.engines[i%2].Check(ctx, "agent-"+string(rune('a'+i)), Question{Counterparty: sellerB, Amount: "0.10"})
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Errorf("Check: %v", err)
						return
					}
					answers = append(answers, a)
				}()
			}
			wg.Wait()
			want := "first payment to " + strings.ToLower(sellerB) + " (Weather API)"
			for _, a := range answers {
				if a.Decision != guard.Review || !strings.Contains(reasonOf(a, guard.RuleNewPayee), want) {
					t.Fatalf("a question for a new payee: %s %+v, want review saying %q", a.Decision, a.Reasons, want)
				}
			}
			if len(answers) != 10 {
				t.Fatalf("%d answers", len(answers))
			}
			// The known payee is allowed meanwhile.
			if a, err := f.engines[1].Check(ctx, "agent-z", Question{Counterparty: sellerA, Amount: "0.10"}); err != nil || a.Decision != guard.Allow {
				t.Fatalf("a payee the Trace shows paid: %+v %v", a, err)
			}

			first, err := f.engines[0].Check(ctx, "agent-a", Question{Counterparty: sellerB, Amount: "0.10"})
			if err != nil || first.Decision != guard.Review || first.ReviewID == "" {
				t.Fatalf("the retry: %+v %v", first, err)
			}
			f.advance(time.Minute)
			if _, err := reviewer.Decide(ctx, first.ReviewID, reviewlog.Approved, "our weather vendor", "alice"); err != nil {
				t.Fatal(err)
			}
			// Before the approval is used the payee is still new.
			if a, err := f.engines[0].Check(ctx, "agent-b", Question{Counterparty: sellerB, Amount: "0.20"}); err != nil || a.Decision != guard.Review {
				t.Fatalf("another question before the approval is used: %+v %v", a, err)
			}
			use, err := f.engines[1].Check(ctx, "agent-a", Question{Counterparty: sellerB, Amount: "0.10"})
			if err != nil || use.Decision != guard.Allow || use.ReviewID != first.ReviewID {
				t.Fatalf("the approved retry on the other replica: %+v %v", use, err)
			}
			// Now known: on the first replica, to another caller and amount,
			// and to a process started afterwards.
			for i, eng := range []*Engine{f.engines[0], f.engines[1], f.fresh(t)} {
				a, err := eng.Check(ctx, "agent-c", Question{Counterparty: strings.ToUpper("0x" + sellerB[2:]), Amount: "0.30"})
				if err != nil || a.Decision != guard.Allow || reasonOf(a, guard.RuleNewPayee) != "" {
					t.Fatalf("engine %d after the approval's use: %+v %v", i, a, err)
				}
			}
		})
	}
}

// A Trace with a run that cannot be read cannot say whether a payee was
// paid: a new payee is reviewed even where the policy ignores unreadable
// runs, and the reason says why.
func TestNewPayeeWithUnreadableTrace(t *testing.T) {
	f := newFixture(t, t.TempDir(), `{"reviewAbove": "1000", "reviewNewPayee": true, "unreadableHistory": "ignore"}`)
	f.pay(t, "run-2", simrec.Payment{OperationID: "x", URL: "https://api.example.com/a", PayTo: sellerB, Amount: "1", Outcome: "walked-away", OfferExtra: deepJSON(5000)})
	a, err := f.eng.Check(context.Background(), "agent", Question{Counterparty: sellerB, Amount: "0.10"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Decision != guard.Review || !strings.Contains(reasonOf(a, guard.RuleNewPayee), "1 run of the Trace cannot be read") {
		t.Fatalf("%s %+v", a.Decision, a.Reasons)
	}
}
