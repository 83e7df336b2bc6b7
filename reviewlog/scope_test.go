package reviewlog

import (
	"slices"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

func TestScopeLockKeys(t *testing.T) {
	key := func(kind, tenant, k string) int64 { return Scope{Kind: kind, Tenant: tenant, Key: k}.LockKey() }
	tests := []struct {
		name string
		a, b int64
		same bool
	}{
		{"one counterparty of one tenant", key(ScopeCounterparty, "acme", "0xabc"), key(ScopeCounterparty, "acme", "0xabc"), true},
		{"a counterparty in another case", key(ScopeCounterparty, "acme", "0xABC"), key(ScopeCounterparty, "acme", "0xabc"), true},
		{"a resource in another case", key(ScopeResource, "acme", "https://A.example/x"), key(ScopeResource, "acme", "https://a.example/x"), true},
		{"the same counterparty of another tenant", key(ScopeCounterparty, "acme", "0xabc"), key(ScopeCounterparty, "globex", "0xabc"), false},
		{"the totals of another tenant", key(ScopeTotals, "acme", ""), key(ScopeTotals, "globex", ""), false},
		{"a caller named as a counterparty", key(ScopeCaller, "acme", "0xabc"), key(ScopeCounterparty, "acme", "0xabc"), false},
		{"callers differ in case", key(ScopeCaller, "acme", "Bot"), key(ScopeCaller, "acme", "bot"), false},
		// The parts are length-prefixed: no two splits of one string
		// collide.
		{"tenant and key split differently", key(ScopeCaller, "ab", "c"), key(ScopeCaller, "a", "bc"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if (tc.a == tc.b) != tc.same {
				t.Fatalf("keys %d and %d: same = %v, want %v", tc.a, tc.b, tc.a == tc.b, tc.same)
			}
		})
	}
}

func TestLockOrder(t *testing.T) {
	cp := Scope{Kind: ScopeCounterparty, Tenant: "t", Key: "0xabc"}
	sharedTotals := Scope{Kind: ScopeTotals, Tenant: "t", Shared: true}
	totals := Scope{Kind: ScopeTotals, Tenant: "t"}
	caller := Scope{Kind: ScopeCaller, Tenant: "t", Key: "bot"}
	got := LockOrder([]Scope{sharedTotals, cp, caller, totals, cp, sharedTotals})
	if len(got) != 3 {
		t.Fatalf("%d locks, want 3 (one a key): %+v", len(got), got)
	}
	if !slices.IsSortedFunc(got, func(a, b Scope) int { return compareKeys(a.LockKey(), b.LockKey()) }) {
		t.Fatalf("not in key order: %+v", got)
	}
	for _, s := range got {
		if s.Kind == ScopeTotals && s.Shared {
			t.Fatalf("the totals are held shared where one of the scopes reads them: %+v", got)
		}
	}
	if got := LockOrder([]Scope{sharedTotals, sharedTotals}); len(got) != 1 || !got[0].Shared {
		t.Fatalf("shared only: %+v, want one shared lock", got)
	}
}

func compareKeys(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Two decisions share a lock only where one could change the other's
// answer: the same caller, counterparty or resource, or the totals read
// by one of them. Another tenant's decisions share none.
func TestAskScopes(t *testing.T) {
	ask := func(tenant, caller, cp, payTo, resource string, totals bool) AskRequest {
		return AskRequest{Tenant: tenant, Caller: caller, Resource: resource, Totals: totals,
			Question: guard.Question{Counterparty: cp, PayTo: payTo, Amount: "1.00", Asset: "USDC"}}
	}
	tests := []struct {
		name string
		a, b AskRequest
		// wait: the two wait for each other (share a key that one of
		// them holds alone).
		wait bool
	}{
		{"different callers paying different counterparties", ask("t", "a", "0x1", "", "", false), ask("t", "b", "0x2", "", "", false), false},
		{"different callers paying one counterparty", ask("t", "a", "0x1", "", "", false), ask("t", "b", "0x1", "", "", false), true},
		{"one caller paying different counterparties", ask("t", "a", "0x1", "", "", false), ask("t", "a", "0x2", "", "", false), true},
		{"a host and the address it pays", ask("t", "a", "api.example.com", "0x2", "", false), ask("t", "b", "0x2", "", "", false), true},
		{"one resource", ask("t", "a", "0x1", "", "https://x.example/r", false), ask("t", "b", "0x2", "", "https://x.example/r", false), true},
		{"a decision that reads the totals", ask("t", "a", "0x1", "", "", true), ask("t", "b", "0x2", "", "", false), true},
		{"another tenant, same caller and counterparty", ask("t", "a", "0x1", "", "", true), ask("u", "a", "0x1", "", "", true), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			held := map[int64]bool{} // key → shared
			for _, s := range LockOrder(tc.a.scopes()) {
				held[s.LockKey()] = s.Shared
			}
			wait := false
			for _, s := range LockOrder(tc.b.scopes()) {
				if shared, ok := held[s.LockKey()]; ok && !(shared && s.Shared) {
					wait = true
				}
			}
			if wait != tc.wait {
				t.Fatalf("wait = %v, want %v\n a: %+v\n b: %+v", wait, tc.wait, LockOrder(tc.a.scopes()), LockOrder(tc.b.scopes()))
			}
		})
	}
}
