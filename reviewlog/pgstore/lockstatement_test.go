package pgstore

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// A decision's lock statement has one text for every question of one shape
// (so many scopes, which of them shared): a connection prepares it once, not once
// for each payee and caller. The keys go as parameters, in lock order,
// after the guard's own.
func TestLockStatementTextIsTheShapeAlone(t *testing.T) {
	scopes := func(caller, payee string) []reviewlog.Scope {
		return reviewlog.LockOrder([]reviewlog.Scope{
			{Kind: reviewlog.ScopeCounterparty, Tenant: "acme", Key: payee},
			{Kind: reviewlog.ScopeCaller, Tenant: "acme", Key: caller},
		})
	}
	a, b := scopes("agent-1", "0xaaa"), scopes("agent-2", "0xbbb")
	sqlA, argsA := lockStatement(a, time.Second)
	sqlB, argsB := lockStatement(b, time.Second)
	if sqlA != sqlB {
		t.Errorf("two questions of one shape, two texts:\n%s\n%s", sqlA, sqlB)
	}
	for _, c := range []struct {
		order []reviewlog.Scope
		args  []any
	}{{a, argsA}, {b, argsB}} {
		want := []any{"1000", int64(lockKey)}
		for _, s := range c.order {
			want = append(want, s.LockKey())
		}
		want = append(want, chainLanes, laneClass)
		if !slices.Equal(c.args, want) {
			t.Errorf("arguments %v, want the guard's key then each scope's in order %v", c.args, want)
		}
	}
	if one, _ := lockStatement(a[:1], time.Second); one == sqlA {
		t.Errorf("one scope and two share a text: %s", one)
	}
	// Which lock is shared is in the text.
	totals := reviewlog.Scope{Kind: reviewlog.ScopeTotals, Tenant: "acme"}
	alone, _ := lockStatement([]reviewlog.Scope{totals}, time.Second)
	totals.Shared = true
	if shared, _ := lockStatement([]reviewlog.Scope{totals}, time.Second); shared == alone || !strings.Contains(shared, "pg_advisory_xact_lock_shared($3::bigint),") {
		t.Errorf("the totals read and held alone: %q and %q", shared, alone)
	}
}
