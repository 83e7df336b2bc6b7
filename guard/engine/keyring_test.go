package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// TestAKeyAnotherReplicaAddedIsSeen: a decision's section on PostgreSQL
// starts from the keyring as its process last read it; a replica that
// signs with a key of its own (a rotation) adds it to the keyring and
// signs a review's terms with it; the first replica, asked the same
// question again, must read that key before it judges the review (its
// terms verify: the review is reused, and nothing reads as tampered).
func TestAKeyAnotherReplicaAddedIsSeen(t *testing.T) {
	f := newFleet(t, pgKind, 1, `{"reviewAbove": "1.00", "perCounterpartyLimit": {"amount": "500.00"}}`)
	var integrity atomic.Int32
	a := f.engines[0]
	a.cfg.OnIntegrity = func() { integrity.Add(1) }
	ctx := context.Background()
	// The first replica reads the keyring (its own key in it).
	if ans, err := a.Check(ctx, "agent", Question{Counterparty: sellerA, Amount: "0.50"}); err != nil || ans.Decision != guard.Allow {
		t.Fatalf("%+v %v", ans, err)
	}
	// A second replica, with a signing key of its own.
	s, err := pgstore.Open(t.Context(), f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	_, key2, _ := ed25519.GenerateKey(rand.Reader)
	_, events := openTestRoot(t, f.dir)
	b, err := New(Config{Policy: f.pol, Templates: bundledTemplates(t), History: ScanHistory{Events: events},
		Log:    reviewlog.OpenStore(s, reviewlog.Options{Now: f.clock, ReviewTTL: f.pol.ReviewTTL, LockWait: 30 * time.Second}),
		Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(key2)}, ParamsKey: ParamsKeyFrom(f.key.Seed()), Now: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	f.advance(time.Second)
	q := Question{Counterparty: sellerA, Amount: "5.00"}
	opened, err := b.Check(ctx, "agent", q)
	if err != nil || opened.Decision != guard.Review || opened.ReviewID == "" {
		t.Fatalf("the second replica: %+v %v", opened, err)
	}
	f.advance(time.Second)
	again, err := a.Check(ctx, "agent", q)
	if err != nil {
		t.Fatal(err)
	}
	if again.Decision != guard.Review || again.ReviewID != opened.ReviewID || integrity.Load() != 0 {
		t.Fatalf("asked again on the first replica: %s, review %q (want %q), %d integrity warnings: %v",
			again.Decision, again.ReviewID, opened.ReviewID, integrity.Load(), reasonsText(again.Reasons))
	}
}

func reasonsText(rs []guard.Reason) string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Rule+": "+r.Detail)
	}
	return strings.Join(out, "; ")
}
