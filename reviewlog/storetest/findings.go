package storetest

import (
	"strings"
	"sync"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

func runFindings(t *testing.T, factory Factory) {
	t.Run("AmbiguityRecordedOnce", func(t *testing.T) { testAmbiguityOnce(t, newFixture(t, factory)) })
	t.Run("FindingsReadForTheOutbox", func(t *testing.T) { testFindingsForOutbox(t, newFixture(t, factory)) })
}

func ambiguity(n string) reviewlog.Ambiguity {
	return reviewlog.Ambiguity{Kind: reviewlog.AmbiguousSettlement, Nonces: []string{"0x" + strings.Repeat("2", 64), "0x" + strings.Repeat(n, 64)},
		Transactions: []string{"0x" + strings.Repeat("a", 64)}, TraceRun: "run-1", TraceLine: 4,
		Text: "the Trace's settlement 0xaaaa… has the terms of 2 authorizations: none is bound"}
}

// One ambiguity recorded by several replicas at once, and again later, is
// one record: a person is told of it once. Another set of authorizations
// is another ambiguity.
func testAmbiguityOnce(t *testing.T, f *fixture) {
	ctx := t.Context()
	var wg sync.WaitGroup
	var mu sync.Mutex
	recorded := 0
	for i := 0; i < 4; i++ {
		l := f.log(0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := l.RecordAmbiguity(ctx, ambiguity("1"))
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				recorded++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if again, err := f.log(0).RecordAmbiguity(ctx, ambiguity("1")); err != nil || again {
		t.Fatalf("the same ambiguity again: recorded %v, %v", again, err)
	}
	if ok, err := f.log(0).RecordAmbiguity(ctx, ambiguity("3")); err != nil || !ok {
		t.Fatalf("another ambiguity: recorded %v, %v", ok, err)
	}
	all, err := f.log(0).Ambiguities(ctx)
	if err != nil || recorded != 1 || len(all) != 2 || all[0].Key != reviewlog.AmbiguityKey(reviewlog.AmbiguousSettlement, ambiguity("1").Nonces, ambiguity("1").Transactions) {
		t.Fatalf("recorded %d times, read back %+v, %v", recorded, all, err)
	}
	// What does not name its ambiguity exactly is refused, nothing written.
	bad := ambiguity("4")
	bad.Transactions = []string{"0xnot"}
	if _, err := f.log(0).RecordAmbiguity(ctx, bad); err == nil {
		t.Fatal("an ambiguity with a bad transaction was recorded")
	}
}

// The log's findings — a settlement recorded with findings, an ambiguity —
// are read for the notification outbox by their ids, from where the last
// reading stopped; a settlement without findings and an opened review are
// not among them.
func testFindingsForOutbox(t *testing.T, f *fixture) {
	ctx := t.Context()
	l := f.log(0)
	settle := func(n string, findings []string) {
		t.Helper()
		s := reviewlog.Settled{Nonce: "0x" + strings.Repeat(n, 64), AuthorizationReceipt: "r-auth-" + n, DecisionReceipt: "r-dec-" + n, Success: true,
			Transaction: "0x" + strings.Repeat(n, 64), Network: "eip155:8453", Payer: "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0",
			Digest: "0x" + strings.Repeat("d", 64), Findings: findings}
		if _, err := l.RecordSettlement(ctx, "agent-1", s, func(reviewlog.Tx) (string, error) { return "r-settled-" + n, nil }); err != nil {
			t.Fatal(err)
		}
	}
	settle("5", nil)
	settle("6", []string{"amount: the receipt names 1, the authorization 2"})
	if _, err := f.ask(ctx, l, "agent-1", 21, "review"); err != nil {
		t.Fatal(err)
	}
	ids, cur, err := l.NotificationsSince(ctx, reviewlog.LogCursor{})
	if err != nil || strings.Join(ids, ",") != reviewlog.NotifySettlement+"0x"+strings.Repeat("6", 64) {
		t.Fatalf("the findings: %v, %v", ids, err)
	}
	if _, err := l.RecordAmbiguity(ctx, ambiguity("7")); err != nil {
		t.Fatal(err)
	}
	more, _, err := f.log(0).NotificationsSince(ctx, cur)
	key := reviewlog.AmbiguityKey(reviewlog.AmbiguousSettlement, ambiguity("7").Nonces, ambiguity("7").Transactions)
	if err != nil || strings.Join(more, ",") != reviewlog.NotifyAmbiguity+key {
		t.Fatalf("the findings since: %v, %v", more, err)
	}
}
