package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestProxySellerRotatingPayees: a guard map that names the URL a paying
// tool pays for judges the payee address with that URL's host, so a seller
// that names a new address on every call meets its 5.00 limit after five
// calls of 1.00 instead of being paid seven times.
func TestProxySellerRotatingPayees(t *testing.T) {
	gmap := `{"tools": {"send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "asset": "USDC",
	  "resource": {"value": "https://pay.rotating.example/api"}}}, "unmapped": "forward"}`
	e := newProxyEnv(t, gmap, `{"perCounterpartyLimit": {"amount": "5.00", "windowHours": 24}, "reviewAbove": "100", "velocity": null}`)
	payUpstream(t)
	e.start(t, nil)
	forwarded := 0
	for i := 0; i < 7; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res, err := e.cs.CallTool(ctx, &mcp.CallToolParams{Name: "send_usdc",
			Arguments: json.RawMessage(fmt.Sprintf(`{"to":"0x%040x","amount":"1.00"}`, 0xbeef00+i))})
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if !res.IsError {
			forwarded++
			continue
		}
		if text := resultText(res); !strings.Contains(text, "per_counterparty_limit") || !strings.Contains(text, "pay.rotating.example") {
			t.Fatalf("call %d not forwarded for another reason: %s", i+1, text)
		}
	}
	if paid := len(e.paid(t)); forwarded != 5 || paid != 5 {
		t.Fatalf("%d calls of 1.00 forwarded (%d paid) to one seller under 5.00, each to a new address", forwarded, paid)
	}
}
