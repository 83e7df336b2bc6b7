package proxy

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestWords(t *testing.T) {
	for in, want := range map[string]string{
		"send_usdc":        "send usdc",
		"payTo":            "pay to",
		"recipientAddress": "recipient address",
		"amountUSD":        "amount usd",
		"USDCAmount":       "usdc amount",
		"x402-fetch":       "x402 fetch",
		"to":               "to",
		"":                 "",
	} {
		if got := strings.Join(words(in), " "); got != want {
			t.Errorf("words(%q) = %q, want %q", in, got, want)
		}
	}
}

// A tool looks like a payment by its name, or by an amount-like and an
// address-like property of its input, at any depth.
func TestPaymentLike(t *testing.T) {
	for _, c := range []struct {
		name, schema, want string
	}{
		{"echo", `{"type":"object","properties":{"text":{"type":"string"}}}`, ""},
		{"send_email", `{"type":"object","properties":{"to":{"type":"string"},"body":{"type":"string"}}}`, ""},
		{"set_price", `{"type":"object","properties":{"price":{"type":"string"},"sku":{"type":"string"}}}`, ""},
		{"pay_invoice", `{"type":"object"}`, `its name "pay_invoice" reads like a payment`},
		{"sendUSDC", `{"type":"object"}`, `its name "sendUSDC" reads like a payment`},
		{"late_send", `{"type":"object","properties":{"recipientAddress":{"type":"string"},"amount":{"type":"string"}}}`,
			`its input has an amount-like property "amount" and an address-like property "recipientAddress"`},
		{"settle", `{"type":"object","properties":{"payee":{"type":"object","properties":{"wallet":{"type":"string"}}},"total":{"type":"object","properties":{"value":{"type":"string"}}}}}`,
			`an amount-like property "total" and an address-like property "payee"`},
		{"batch", `{"type":"object","properties":{"items":{"type":"array","items":{"type":"object","properties":{"payTo":{"type":"string"},"fee":{"type":"string"}}}}}}`,
			`an amount-like property "items[].fee" and an address-like property "items[].payTo"`},
		{"transfer", `{"type":"object","properties":{"to":{},"amount":{}}}`, `its name "transfer" reads like a payment; its input has`},
		{"odd", `not json`, ""},
	} {
		got := paymentLike(c.name, json.RawMessage(c.schema))
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// The state file is read exactly: a member twice or in another case, an
// unknown member, an unknown status or a time that is not RFC 3339 is
// refused.
func TestReadToolsState(t *testing.T) {
	const ok = `{"written_at":"2026-12-01T10:00:00Z","pid":7,"upstream":"wallet","map_file":"m.json","map_read_at":"2026-12-01T09:00:00Z",
"unmapped":"forward","new_tools":"refuse","tools":[{"name":"send","status":"paying"},{"name":"late","status":"refused_new","payment_like":"x","new_since":"2026-12-01T09:30:00.5Z"}]}`
	s, err := ReadToolsState([]byte(ok))
	if err != nil {
		t.Fatal(err)
	}
	if u := s.UnmappedTools(); len(u) != 1 || u[0].Name != "late" || u[0].NewSince == "" {
		t.Fatalf("%+v", u)
	}
	for _, c := range []struct{ name, doc, want string }{
		{"a member twice", strings.Replace(ok, `"pid":7,`, `"pid":7,"pid":8,`, 1), "pid"},
		{"a member in another case", strings.Replace(ok, `"pid":7,`, `"pid":7,"PID":8,`, 1), "PID"},
		{"a tool's member twice", strings.Replace(ok, `"status":"paying"`, `"status":"paying","status":"refused_new"`, 1), "status"},
		{"a tool's member in another case", strings.Replace(ok, `"status":"paying"`, `"Status":"paying"`, 1), "Status"},
		{"an unknown member", strings.Replace(ok, `"pid":7,`, `"pid":7,"extra":1,`, 1), "extra"},
		{"an unknown status", strings.Replace(ok, `"status":"paying"`, `"status":"allowed"`, 1), `status "allowed"`},
		{"no name", strings.Replace(ok, `"name":"send",`, ``, 1), "without a name"},
		{"a bad time", strings.Replace(ok, `"2026-12-01T10:00:00Z"`, `"yesterday"`, 1), "written_at"},
		{"a bad new_since", strings.Replace(ok, `"2026-12-01T09:30:00.5Z"`, `"soon"`, 1), "new_since"},
		{"not JSON", `{`, ""},
		{"two values", ok + ok, ""},
		{"too large", `{"upstream":"` + strings.Repeat("a", MaxToolsStateBytes) + `"}`, "larger than"},
	} {
		if _, err := ReadToolsState([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error naming %q, got %v", c.name, c.want, err)
		}
	}
}

// FuzzReadToolsState: the state file is read from disk, where anyone who
// can write the Trace root can put anything; it never panics, and what it
// accepts has only the proxy's statuses and well-formed times.
func FuzzReadToolsState(f *testing.F) {
	f.Add([]byte(`{"written_at":"2026-12-01T10:00:00Z","pid":7,"upstream":"u","map_file":"m","map_read_at":"2026-12-01T09:00:00Z","unmapped":"forward","new_tools":"refuse","tools":[{"name":"a","status":"forwarded","payment_like":"p"}]}`))
	f.Add([]byte(`{"tools":[{"name":"a","status":"paying","Status":"x"}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ReadToolsState(data)
		if err != nil {
			return
		}
		for _, tool := range s.Tools {
			switch tool.Status {
			case ToolPaying, ToolForwarded, ToolRefusedUnmapped, ToolRefusedNew, ToolForwardedNew:
			default:
				t.Fatalf("accepted status %q", tool.Status)
			}
			if tool.Name == "" {
				t.Fatal("accepted a tool without a name")
			}
		}
	})
}

// FuzzPaymentLike: an upstream's tool name and input schema are its own
// bytes; judging them never panics.
func FuzzPaymentLike(f *testing.F) {
	f.Add("late_send", []byte(`{"type":"object","properties":{"to":{},"amount":{}}}`))
	f.Add("x", []byte(`{"properties":{"a":{"items":{"properties":{"b":{}}}}}}`))
	f.Fuzz(func(t *testing.T, name string, schema []byte) {
		_ = paymentLike(name, schema)
		_ = words(name)
		_ = schemaPrint(schema)
	})
}
