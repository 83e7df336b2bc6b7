package engine

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// Spend shows, per counterparty and in total, what the Trace shows paid
// and what the ledger holds in each limit's window, as the decision adds
// them up: a named payee with nothing paid is listed with its name.
func TestSpendAgainstLimits(t *testing.T) {
	f := newFixture(t, t.TempDir(), `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}, "totalLimit": {"amount": "10.00", "windowHours": 24},
	  "velocity": {"perCounterparty": {"count": 3, "windowMinutes": 120}, "total": {"count": 10}}, "payees": {"`+sellerB+`": "Weather API"}}`)
	f.pay(t, "run-1", settled("op-1", sellerA, "https://api.example.com/a"))
	a, err := f.eng.Check(context.Background(), "agent", Question{Counterparty: sellerA, Amount: "0.25"})
	if err != nil || a.Decision != guard.Allow {
		t.Fatalf("%+v %v", a, err)
	}
	v, err := f.eng.Spend(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(v)
	if len(v.Counterparties) != 2 {
		t.Fatalf("counterparties: %s", got)
	}
	first, second := v.Counterparties[0], v.Counterparties[1]
	if first.Counterparty != strings.ToLower(sellerA) || second.Counterparty != strings.ToLower(sellerB) || second.Name != "Weather API" {
		t.Fatalf("order or names: %s", got)
	}
	want := []LimitUse{
		{Limit: "perCounterpartyLimit", Window: "24 hours", Paid: "0.10 USDC", Held: "0.25 USDC", Used: "0.35 USDC", Max: "5.00 USDC", Percent: 7},
		{Limit: "velocity.perCounterparty", Window: "2 hours", Paid: "1 payment", Held: "1 payment", Used: "2 payments", Max: "3 payments", Percent: 66},
	}
	if g, _ := json.Marshal(first.Limits); string(g) != mustJSON(want) {
		t.Fatalf("sellerA:\n got %s\nwant %s", g, mustJSON(want))
	}
	if second.Limits[0].Used != "0.00 USDC" || second.Limits[1].Used != "0 payments" {
		t.Fatalf("sellerB: %s", got)
	}
	wantTotal := []LimitUse{
		{Limit: "totalLimit", Window: "24 hours", Paid: "0.10 USDC", Held: "0.25 USDC", Used: "0.35 USDC", Max: "10.00 USDC", Percent: 3},
		{Limit: "velocity.total", Window: "1 hour", Paid: "1 payment", Held: "1 payment", Used: "2 payments", Max: "10 payments", Percent: 20},
	}
	if g, _ := json.Marshal(v.Total); string(g) != mustJSON(wantTotal) {
		t.Fatalf("total:\n got %s\nwant %s", g, mustJSON(wantTotal))
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
