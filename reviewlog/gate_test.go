package reviewlog

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestScopeGate: a scope held alone waits for its holder, shared scopes
// and other scopes do not, a wait ends at the deadline or with its context
// having taken nothing, and no turn outlives its sections.
func TestScopeGate(t *testing.T) {
	g := newScopeGate()
	ctx := t.Context()
	payee := Scope{Kind: ScopeCounterparty, Key: "0xaa"}
	totals := Scope{Kind: ScopeTotals, Shared: true}
	soon := func() time.Time { return time.Now().Add(50 * time.Millisecond) }

	leave, err := g.enter(ctx, LockOrder([]Scope{payee, totals}), soon(), "test", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Shared and other scopes: at once.
	for _, order := range [][]Scope{{totals}, {{Kind: ScopeCounterparty, Key: "0xbb"}, totals}} {
		other, err := g.enter(ctx, LockOrder(order), soon(), "test", time.Second)
		if err != nil {
			t.Fatalf("%+v: %v", order, err)
		}
		other()
	}
	// The same scope held alone: until the deadline, then refused with
	// nothing held.
	caller := Scope{Kind: ScopeCaller, Key: "c"}
	if _, err := g.enter(ctx, LockOrder([]Scope{caller, payee}), soon(), "test", time.Second); !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("err = %v, want ErrLockTimeout", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.enter(cancelled, []Scope{payee}, time.Now().Add(time.Minute), "test", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// The caller's turn was given back when the payee's timed out.
	again, err := g.enter(ctx, []Scope{caller}, soon(), "test", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	again()
	// A waiter takes the turn once it is given back.
	got := make(chan error, 1)
	go func() {
		l, err := g.enter(ctx, []Scope{payee}, time.Now().Add(time.Minute), "test", time.Minute)
		if err == nil {
			l()
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	leave()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.turns) != 0 {
		t.Fatalf("%d turns left behind", len(g.turns))
	}
}
