package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// TestAmountAsJSONNumber: an amount sent as a JSON number is read exactly
// from the text the client sent, never through a float. Each case is one
// a float would get wrong (or, for 0.30, simply accept).
func TestAmountAsJSONNumber(t *testing.T) {
	dir := t.TempDir()
	rec, err := simrec.New(dir, "run-1", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-1", URL: "https://a.example.com/x", PayTo: "0x209693bc6afc0c5328ba36faf03c514ef312287c", Amount: "100000", Outcome: "settled"}); err != nil {
		t.Fatal(err)
	}
	s := newTestServer(t, dir)
	ctx := context.Background()
	s.MCP().HandleMessage(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	ask := func(amount string) (bool, string, map[string]any) {
		// The bytes of the request are written by hand: the amount is a JSON
		// number exactly as a client would send it.
		body := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"check_before_pay","arguments":{"counterparty":"api.numbers.example","amount":` + amount + `}}}`
		raw, _ := json.Marshal(s.MCP().HandleMessage(ctx, json.RawMessage(body)))
		var msg struct {
			Result struct {
				IsError    bool           `json:"isError"`
				Structured map[string]any `json:"structuredContent"`
				Content    []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"result"`
		}
		if err := json.Unmarshal(raw, &msg); err != nil {
			t.Fatal(err)
		}
		text := ""
		if len(msg.Result.Content) > 0 {
			text = msg.Result.Content[0].Text
		}
		return msg.Result.IsError, text, msg.Result.Structured
	}
	tests := []struct {
		amount   string
		decision string
		textHas  string
	}{
		{"0.30", "allow", ""},
		{"0.3", "allow", ""},
		// A float reads 1.0000000000000001 as 1, which is not above reviewAbove 1.00.
		{"1.0000000000000001", "review", `"1.0000000000000001" has 16 decimal places`},
		// A float reads 12345678901234567.12 as 12345678901234568.
		{"12345678901234567.12", "review", "12345678901234567.12 USDC is more than"},
		{"2.50", "review", "2.5 USDC is more than"},
	}
	for _, tc := range tests {
		isErr, text, st := ask(tc.amount)
		if isErr || st["decision"] != tc.decision || !strings.Contains(text, tc.textHas) {
			t.Errorf("amount %s: error %v, %v; want %s mentioning %q\n%s", tc.amount, isErr, st["decision"], tc.decision, tc.textHas, text)
		}
	}
	for _, bad := range []struct{ amount, has string }{
		{"3e-1", "exponent"},
		{"-0.30", "sign"},
		{"1E2", "exponent"},
		{"true", "must be a decimal string"},
	} {
		isErr, text, _ := ask(bad.amount)
		if !isErr || !strings.Contains(text, bad.has) || strings.Contains(text, "float") {
			t.Errorf("amount %s: error %v %q; want a tool error mentioning %q", bad.amount, isErr, text, bad.has)
		}
	}
}
