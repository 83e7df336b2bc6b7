package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// fakeChain answers AuthorizationUsed as a test says, and remembers what
// it was asked.
type fakeChain struct {
	mu       sync.Mutex
	networks map[string]string
	used     bool
	err      error
	asked    []string
}

func (c *fakeChain) Endpoint(network string) (string, bool) {
	h, ok := c.networks[network]
	return h, ok
}

func (c *fakeChain) AuthorizationUsed(_ context.Context, network, token, payer, nonce string, vb time.Time) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, strings.Join([]string{network, token, payer, nonce, vb.UTC().Format(time.RFC3339)}, " "))
	return c.used, c.err
}

func (c *fakeChain) count() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.asked) }

const testPayer = "0x00000000000000000000000000000000000000aa"

func testTerms(vb time.Time) AuthorizationTerms {
	return AuthorizationTerms{Payer: testPayer, ValidBefore: vb, Nonce: func(id string) string {
		return "0x" + fmt.Sprintf("%064x", len(id)) // any 32 bytes the test can recompute
	}}
}

// An authorization whose validBefore has passed (by more than the skew)
// and whose nonce the asset contract says was never used is released by
// the next decision, which is then judged without it; one the contract
// says was used, or whose state cannot be read, or whose network has no
// endpoint, keeps counting; nothing is asked or released before
// validBefore and the skew have passed.
func TestExpiredAuthorizationReleasedWhenUnused(t *testing.T) {
	network := "eip155:8453"
	for _, tc := range []struct {
		name     string
		after    time.Duration // past validBefore when asked again
		chain    *fakeChain
		terms    bool
		released bool
		asked    int
	}{
		{"unused", ExpirySkew + time.Second, &fakeChain{networks: map[string]string{network: "rpc.example"}}, true, true, 1},
		{"used", ExpirySkew + time.Second, &fakeChain{networks: map[string]string{network: "rpc.example"}, used: true}, true, false, 1},
		{"rpc error", ExpirySkew + time.Second, &fakeChain{networks: map[string]string{network: "rpc.example"}, err: errors.New("eth_call: no answer in time")}, true, false, 1},
		{"within the skew", ExpirySkew - time.Second, &fakeChain{networks: map[string]string{network: "rpc.example"}}, true, false, 0},
		{"before validBefore", -time.Second, &fakeChain{networks: map[string]string{network: "rpc.example"}}, true, false, 0},
		{"no endpoint for the network", ExpirySkew + time.Second, &fakeChain{networks: map[string]string{"eip155:1": "rpc.example"}}, true, false, 0},
		{"no chain reader", ExpirySkew + time.Second, nil, true, false, 0},
		{"no terms recorded", ExpirySkew + time.Second, &fakeChain{networks: map[string]string{network: "rpc.example"}}, false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, fileKind, 1, releasePolicy)
			e := f.engines[0]
			if tc.chain != nil {
				e.cfg.Authorizations = tc.chain
			} else {
				tc.chain = &fakeChain{}
			}
			vb := f.clock().Add(60 * time.Second).Truncate(time.Second)
			q := Question{Counterparty: sellerA, Amount: "1.50"}
			var a Answer
			var err error
			if tc.terms {
				a, err = e.AuthorizeTerms(context.Background(), "bot", q, testTerms(vb))
			} else {
				a, err = e.Authorize(context.Background(), "bot", q)
			}
			if err != nil || a.Decision != guard.Allow {
				t.Fatalf("authorize: %+v %v", a, err)
			}
			if tc.terms && (a.Reservation == nil || a.Reservation.ValidBefore != ledger.FormatTime(vb)) {
				t.Fatalf("the hold does not name its validBefore: %+v", a.Reservation)
			}
			f.advance(vb.Sub(f.clock()) + tc.after)
			b, err := e.Check(context.Background(), "bot", Question{Counterparty: sellerA, Amount: "1.40"})
			if err != nil {
				t.Fatal(err)
			}
			if (b.Decision == guard.Allow) != tc.released {
				t.Fatalf("after the authorization expired: %s %+v; want released %v", b.Decision, b.Reasons, tc.released)
			}
			if n := tc.chain.count(); n != tc.asked {
				t.Fatalf("the chain was asked %d times, want %d: %v", n, tc.asked, tc.chain.asked)
			}
			if tc.asked > 0 {
				want := fmt.Sprintf("%s %s %s 0x%064x %s", network, "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913", testPayer, len(a.ReceiptID), vb.Format(time.RFC3339))
				if tc.chain.asked[0] != want {
					t.Fatalf("asked %q, want %q", tc.chain.asked[0], want)
				}
			}
			_, counting, _ := e.book.Get(a.ReceiptID)
			if counting == tc.released {
				t.Fatalf("the hold counts: %v, want %v", counting, !tc.released)
			}
			// A fresh process reads the same from the ledger: the release
			// is a sealed entry, not this process's memory.
			g := f.fresh(t)
			infos, problems, err := g.Committed(context.Background())
			if err != nil || len(problems) > 0 {
				t.Fatalf("committed: %v %v", err, problems)
			}
			held := false
			for _, i := range infos {
				held = held || i.ReceiptID == a.ReceiptID
			}
			if held == tc.released {
				t.Fatalf("another process reads the hold as held: %v", held)
			}
			// What is known is not asked again: a used authorization is
			// set aside; a failed read waits expiryRetry.
			before := tc.chain.count()
			if _, err := e.Check(context.Background(), "bot", Question{Counterparty: sellerA, Amount: "1.30"}); err != nil {
				t.Fatal(err)
			}
			if n := tc.chain.count(); n != before {
				t.Fatalf("asked again at once: %d → %d", before, n)
			}
			if tc.name == "rpc error" {
				f.advance(expiryRetry)
				if _, err := e.Check(context.Background(), "bot", Question{Counterparty: sellerA, Amount: "1.20"}); err != nil {
					t.Fatal(err)
				}
				if n := tc.chain.count(); n != before+1 {
					t.Fatalf("a failed read was not retried after %s: %d", expiryRetry, n)
				}
			}
		})
	}
}

// Two processes that both find an authorization unused write one release:
// the second reads the first's in its section and writes nothing.
func TestExpiredAuthorizationReleasedOnce(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 2, releasePolicy)
			chain := &fakeChain{networks: map[string]string{"eip155:8453": "rpc.example"}}
			for _, e := range f.engines {
				e.cfg.Authorizations = chain
			}
			vb := f.clock().Add(60 * time.Second).Truncate(time.Second)
			a, err := f.engines[0].AuthorizeTerms(context.Background(), "bot", Question{Counterparty: sellerA, Amount: "1.50"}, testTerms(vb))
			if err != nil || a.Decision != guard.Allow {
				t.Fatalf("authorize: %+v %v", a, err)
			}
			f.advance(95 * time.Second)
			// Both read the ledger, both ask the chain, then each writes.
			for _, e := range f.engines {
				if err := e.cfg.Log.Store().View(context.Background(), func(r reviewlog.Reader) error { return e.catchUp(context.Background(), r) }); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			for _, e := range f.engines {
				wg.Add(1)
				go func() { defer wg.Done(); e.expire(context.Background()) }()
			}
			wg.Wait()
			var raws []ledger.Raw
			err = f.logs[0].Store().View(context.Background(), func(r reviewlog.Reader) error {
				var err error
				raws, err = r.Ledger().Since(context.Background(), nil)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			releases := 0
			for _, r := range raws {
				if r.Line == nil {
					continue
				}
				en, err := ledger.Parse(r.Line, ParamsKeyFrom(f.key.Seed()))
				if err != nil {
					t.Fatal(err)
				}
				if en.Kind == ledger.KindRelease {
					releases++
					if en.Target != a.ReceiptID || en.Outcome != ledger.OutcomeUnused || en.Caller != "bot" {
						t.Fatalf("the release: %+v", en)
					}
				}
			}
			if releases != 1 {
				t.Fatalf("%d releases written, want 1", releases)
			}
			for i, e := range f.engines {
				if err := e.cfg.Log.Store().View(context.Background(), func(r reviewlog.Reader) error { return e.catchUp(context.Background(), r) }); err != nil {
					t.Fatal(err)
				}
				if p := e.book.Findings(); len(p) > 0 {
					t.Fatalf("engine %d: %v", i, p)
				}
			}
		})
	}
}
