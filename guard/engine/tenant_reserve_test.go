package engine

import (
	"bytes"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// A reservation record carries, under its seal, the tenant whose store it
// was written to: copied into another tenant's store it verifies there no
// more, and the answer is review. A record that names no tenant (written
// by an earlier version) reads as the store's own tenant's.
func TestReservationRecordNamesItsTenant(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}}`)
			acme := f.engineFor(t, "acme")
			first := check(t, acme, "bot", Question{Counterparty: sellerA, Amount: "4.00"})
			if first.Decision != guard.Allow {
				t.Fatalf("first: %+v", first)
			}
			// The tenant's own next question counts the reservation: 4.00
			// + 0.50 fits under 5.00, 4.00 + 1.50 does not.
			if a := check(t, acme, "bot", Question{Counterparty: sellerA, Amount: "0.50"}); a.Decision != guard.Allow {
				t.Fatalf("the tenant's own sealed record does not verify: %+v", a)
			}
			if a := check(t, acme, "bot", Question{Counterparty: sellerA, Amount: "1.50"}); a.Decision != guard.Review || reasonOf(a, guard.RulePerCounterparty) == "" || reasonOf(a, guard.RuleReservationUnverified) != "" {
				t.Fatalf("over the limit with the reservation: %+v", a)
			}
			// The same store read as another tenant's (copied there).
			globex := f.engineFor(t, "globex")
			a := check(t, globex, "bot", Question{Counterparty: sellerA, Amount: "0.10"})
			if a.Decision != guard.Review || !strings.Contains(reasonOf(a, guard.RuleReservationUnverified), `written for tenant "acme", not this store's "globex"`) {
				t.Fatalf("a record moved to another tenant's store: %+v", a)
			}
			// The tenant is sealed: a record whose tenant is taken out does
			// not verify (even for an engine that verified it before).
			f.edit(t, func(data []byte) []byte { return bytes.ReplaceAll(data, []byte(`,"tenant":"acme"`), nil) })
			// (On PostgreSQL the row, which names the tenant, disagrees with
			// the line first.)
			a = check(t, acme, "bot", Question{Counterparty: sellerA, Amount: "0.10"})
			if why := reasonOf(a, guard.RuleReservationUnverified); a.Decision != guard.Review ||
				!strings.Contains(why, "not sealed by this server's key") && !(kind == pgKind && strings.Contains(why, "disagrees with the reserved line of receipt "+first.ReceiptID+" on its tenant")) {
				t.Fatalf("a record whose tenant was taken out: %+v", a)
			}
			// Records that name no tenant read as the store's own.
			g := newFleet(t, kind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}}`)
			if a := check(t, g.engines[0], "bot", Question{Counterparty: sellerA, Amount: "4.00"}); a.Decision != guard.Allow {
				t.Fatalf("first, without tenants: %+v", a)
			}
			if a := check(t, g.engineFor(t, "acme"), "bot", Question{Counterparty: sellerA, Amount: "1.50"}); a.Decision != guard.Review || reasonOf(a, guard.RulePerCounterparty) == "" || reasonOf(a, guard.RuleReservationUnverified) != "" {
				t.Fatalf("a record without a tenant, read by a tenant's engine: %+v", a)
			}
		})
	}
}
