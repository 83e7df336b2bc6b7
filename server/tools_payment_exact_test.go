package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// callRaw calls a tool with arguments given as JSON text, byte for byte.
func callRaw(t *testing.T, s *Server, name, args string) (bool, string, json.RawMessage) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + name + `","arguments":` + args + `}}`
	raw, _ := json.Marshal(s.MCP().HandleMessage(context.Background(), json.RawMessage(body)))
	var msg struct {
		Result struct {
			IsError    bool            `json:"isError"`
			Structured json.RawMessage `json:"structuredContent"`
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

// authorize_payment's arguments are read from the bytes the agent sent,
// as exactly as the review log: a member named twice at any depth (the
// 402's payTo, the resource) or an argument named in another case is
// refused, where a decoder would have kept one of the two.
func TestAuthorizePaymentArgumentsAreExact(t *testing.T) {
	s := newTestServer(t, t.TempDir())
	pr, _ := json.Marshal(paymentRequired("10000", sellerA))
	const other = "0x00000000000000000000000000000000000000c3"
	twoPayees := strings.Replace(string(pr), `"payTo":"`+sellerA+`"`, `"payTo":"`+sellerA+`","payTo":"`+other+`"`, 1)
	if twoPayees == string(pr) {
		t.Fatal("no payTo to repeat")
	}
	for _, tc := range []struct{ name, args, want string }{
		{"payTo twice in the 402", `{"payment_required":` + twoPayees + `}`, `payment_required.accepts[0]: the field "payTo" appears twice`},
		{"resource twice", `{"payment_required":` + string(pr) + `,"resource":"https://other.example/x","resource":"https://api.seller.example/data"}`, `the field "resource" appears twice`},
		{"payment_required twice", `{"payment_required":"AAAA","payment_required":` + string(pr) + `}`, "appears twice"},
		{"resource in another case", `{"payment_required":` + string(pr) + `,"Resource":"https://api.seller.example/data"}`, "Resource"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isErr, text, _ := callRaw(t, s, "authorize_payment", tc.args)
			if !isErr || !strings.Contains(text, "cannot be read exactly") || !strings.Contains(text, tc.want) || !strings.Contains(text, "nothing was asked or signed") {
				t.Fatalf("isError %v: %s", isErr, text)
			}
		})
	}
	// The same 402 sent once, exactly, is judged and signed.
	isErr, text, st := callRaw(t, s, "authorize_payment", `{"payment_required":`+string(pr)+`,"resource":"https://api.seller.example/data"}`)
	var a authorizeAnswer
	json.Unmarshal(st, &a)
	if isErr || a.Decision != "allow" || !strings.EqualFold(a.Accepted.PayTo, sellerA) {
		t.Fatalf("the exact call: %v %s", isErr, text)
	}
}

// repeatedKey reports a member named twice in one object, by a plain
// token walk of its own.
func repeatedKey(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		keys   map[string]bool
		obj    bool
		expect bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF || err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.expect {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return true
				}
				top.keys[k] = true
				top.expect = false
				continue
			}
		}
		if top != nil && top.obj {
			top.expect = true
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, obj: true, expect: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].obj {
				stack[len(stack)-1].expect = true
			}
		}
	}
}

// FuzzExactPaymentArgs: whatever bytes an agent sends as authorize_payment's
// arguments, the exact reader does not panic, never accepts a document
// that names a member twice, and hands on the 402 object as the very bytes
// the agent sent.
func FuzzExactPaymentArgs(f *testing.F) {
	pr, _ := json.Marshal(paymentRequired("10000", sellerA))
	f.Add([]byte(`{"payment_required":` + string(pr) + `,"resource":"https://api.seller.example/data"}`))
	f.Add([]byte(`{"payment_required":"eyJ4NDAyVmVyc2lvbiI6Mn0"}`))
	f.Add([]byte(`{"payment_required":{"a":1,"a":2}}`))
	f.Add([]byte(`{"Payment_Required":{},"resource":"x"}`))
	f.Add([]byte(`{"payment_required":{"x402Version":2,"accepts":[{"payTo":"a","PayTo":"b"}]}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, wire []byte) {
		obj, err := exactPaymentArgs(wire)
		if err != nil || !json.Valid(wire) {
			return
		}
		if repeatedKey(wire) {
			t.Fatalf("accepted a member named twice: %s", wire)
		}
		if obj == nil {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(wire, &m) != nil || !bytes.Equal(bytes.TrimSpace(m["payment_required"]), obj) {
			t.Fatalf("the 402 handed on is not the bytes sent: %s", wire)
		}
	})
}
