package server

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// propSchema is the part of a JSON schema property the walk reads.
type propSchema struct {
	Type      schemaType `json:"type"`
	Pattern   string     `json:"pattern"`
	MinLength *int       `json:"minLength"`
	MaxLength *int       `json:"maxLength"`
	Minimum   *float64   `json:"minimum"`
	Maximum   *float64   `json:"maximum"`
	Enum      []any      `json:"enum"`
}

// schemaType is a property's "type": one name or a list of them.
type schemaType []string

func (st *schemaType) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*st = schemaType{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*st = many
	return nil
}

func (st schemaType) has(name string) bool { return slices.Contains(st, name) }

// TestInputSchemasAgreeWithBehaviour walks every tool's input schema: for
// each argument, every kind of value the schema refuses (wrong type, a
// string the pattern refuses, one past a length bound, a value outside
// enum or range), a missing required argument and an unknown one must each
// be a tool error. Each call starts from arguments the tool accepts.
func TestInputSchemasAgreeWithBehaviour(t *testing.T) {
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
	call := func(tool string, args map[string]any) (bool, string) {
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": tool, "arguments": args}})
		raw, _ := json.Marshal(s.MCP().HandleMessage(ctx, body))
		var msg struct {
			Result struct {
				IsError bool `json:"isError"`
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"result"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(raw, &msg); err != nil {
			t.Fatal(err)
		}
		if msg.Error != nil {
			return true, msg.Error.Message
		}
		text := ""
		if len(msg.Result.Content) > 0 {
			text = msg.Result.Content[0].Text
		}
		return msg.Result.IsError, text
	}
	// Arguments each tool accepts; the walk changes one at a time.
	valid := map[string]map[string]any{
		"list_operations":   {"template": "x402-buyer", "run": "run-1", "completeness": "full", "limit": 10},
		"get_receipt":       {"run_id": "run-1", "operation_id": "op-1", "template": "x402-buyer"},
		"explain":           {"run_id": "run-1", "operation_id": "op-1", "template": "x402-buyer"},
		"check_before_pay":  {"counterparty": "0x209693bc6afc0c5328ba36faf03c514ef312287c", "amount": "0.10", "asset": "USDC", "template": "x402-buyer"},
		"get_review_status": {"review_id": ""}, // filled below with a real review
		"authorize_payment": {"payment_required": paymentRequired("10000", "0x209693bc6afc0c5328ba36faf03c514ef312287c"), "resource": "https://api.seller.example/data"},
	}
	s.MCP().HandleMessage(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	var review struct {
		ReviewID string `json:"review_id"`
	}
	{
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "check_before_pay",
			"arguments": map[string]any{"counterparty": "api.other.example", "amount": "3.00"}}})
		raw, _ := json.Marshal(s.MCP().HandleMessage(ctx, body))
		var msg struct {
			Result struct {
				Structured json.RawMessage `json:"structuredContent"`
			} `json:"result"`
		}
		json.Unmarshal(raw, &msg)
		json.Unmarshal(msg.Result.Structured, &review)
		if review.ReviewID == "" {
			t.Fatalf("no review to ask about: %s", raw)
		}
		valid["get_review_status"]["review_id"] = review.ReviewID
	}
	{
		// record_receipt settles an authorization signed here.
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "authorize_payment",
			"arguments": map[string]any{"payment_required": paymentRequired("20000", "0x209693bc6afc0c5328ba36faf03c514ef312287c")}}})
		raw, _ := json.Marshal(s.MCP().HandleMessage(ctx, body))
		var msg struct {
			Result struct {
				Structured struct {
					Authorization struct{ Nonce, Payer string }
				} `json:"structuredContent"`
			} `json:"result"`
		}
		json.Unmarshal(raw, &msg)
		au := msg.Result.Structured.Authorization
		if au.Nonce == "" {
			t.Fatalf("no authorization to settle: %s", raw)
		}
		valid["record_receipt"] = map[string]any{"nonce": au.Nonce, "payment_response": map[string]any{"success": true,
			"transaction": "0x" + strings.Repeat("ab", 32), "network": "eip155:8453", "payer": au.Payer}}
	}
	for _, def := range append(s.tools(), s.guardTools()...) {
		raw, err := schemaFiles.ReadFile("schema/" + def.name + ".input.json")
		if err != nil {
			t.Fatal(err)
		}
		var schema struct {
			Properties           map[string]propSchema `json:"properties"`
			Required             []string              `json:"required"`
			AdditionalProperties *bool                 `json:"additionalProperties"`
		}
		if err := json.Unmarshal(raw, &schema); err != nil {
			t.Fatal(err)
		}
		base, ok := valid[def.name]
		if !ok {
			t.Errorf("tool %s has no valid arguments in this walk: add them", def.name)
			continue
		}
		with := func(name string, v any) map[string]any {
			out := map[string]any{}
			for k, x := range base {
				out[k] = x
			}
			if v == nil {
				delete(out, name)
			} else {
				out[name] = v
			}
			return out
		}
		if isErr, text := call(def.name, base); isErr {
			t.Errorf("%s: the valid arguments %v are refused: %s", def.name, base, text)
			continue
		}
		for _, req := range schema.Required {
			if isErr, _ := call(def.name, with(req, nil)); !isErr {
				t.Errorf("%s: missing required %s is accepted", def.name, req)
			}
		}
		if schema.AdditionalProperties != nil && !*schema.AdditionalProperties {
			if isErr, _ := call(def.name, with("no_such_argument", "x")); !isErr {
				t.Errorf("%s: an unknown argument is accepted", def.name)
			}
		}
		for name, p := range schema.Properties {
			var bad []any
			switch {
			case p.Type.has("string") && p.Type.has("number"):
				// A decimal as a string or a JSON number read from its text.
				bad = append(bad, true, []any{"x"}, map[string]any{}, json.Number("-1"), json.Number("1e3"), json.Number("1E-2"), json.Number("-0"),
					json.Number("1"+strings.Repeat("0", *p.MaxLength)))
				fallthrough
			case p.Type.has("string"):
				if !p.Type.has("number") {
					bad = append(bad, 7, true, []any{"x"})
				}
				if p.Pattern != "" {
					re := regexp.MustCompile(p.Pattern)
					for _, c := range []string{"1e3", "-1", "a b", "../x", "x\u200b", "", "%", "\u0661"} {
						if !re.MatchString(c) {
							bad = append(bad, c)
						}
					}
				}
				if p.MaxLength != nil {
					bad = append(bad, strings.Repeat("a", *p.MaxLength+1))
				}
				if p.MinLength != nil && *p.MinLength > 0 {
					bad = append(bad, "")
				}
				if len(p.Enum) > 0 {
					bad = append(bad, "not-one-of-them")
				}
			case p.Type.has("integer"):
				bad = append(bad, "10", 1.5, true)
				if p.Minimum != nil {
					bad = append(bad, *p.Minimum-1)
				}
				if p.Maximum != nil {
					bad = append(bad, *p.Maximum+1)
				}
			}
			for _, v := range bad {
				if isErr, text := call(def.name, with(name, v)); !isErr {
					t.Errorf("%s: %s = %s is outside the schema but accepted (%s)", def.name, name, show(v), text)
				}
			}
		}
	}
}

func show(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 40 {
		return fmt.Sprintf("%s… (%d bytes)", b[:40], len(b))
	}
	return string(b)
}
