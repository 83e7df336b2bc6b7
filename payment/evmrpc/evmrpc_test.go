package evmrpc

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const (
	payer = "0x857b06519E91e3A54538791bDbb0E22373e36b66"
	nonce = "0x5bb3d8d2eb3bdc9b4f8d5d5b1e5fa3c0f2f1b9e6c1a2d3e4f5a6b7c8d9e0f1a2"
	token = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
)

// The selector is keccak256("authorizationState(address,bytes32)")[:4],
// as solc writes it (0xe94a0102), and the arguments are two 32-byte words.
func TestCallData(t *testing.T) {
	got, err := CallData(payer, nonce)
	if err != nil {
		t.Fatal(err)
	}
	want := "e94a0102" + "000000000000000000000000857b06519e91e3a54538791bdbb0e22373e36b66" + nonce[2:]
	if hex.EncodeToString(got) != want {
		t.Fatalf("call data\n got %x\nwant %s", got, want)
	}
	for _, bad := range [][2]string{{"0x857b", nonce}, {payer, "0x00"}, {"857b06519E91e3A54538791bDbb0E22373e36b6600", nonce}, {payer, "0x" + strings.Repeat("zz", 32)}} {
		if _, err := CallData(bad[0], bad[1]); err == nil {
			t.Fatalf("CallData(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func TestDecodeBool(t *testing.T) {
	word := func(last string) string { return "0x" + strings.Repeat("0", 62) + last }
	for _, tc := range []struct {
		in   string
		want bool
		err  string
	}{
		{word("00"), false, ""},
		{word("01"), true, ""},
		{word("02"), false, "not a bool"},
		{"0x" + "01" + strings.Repeat("0", 62), false, "not a bool"},
		{"0x", false, "no contract"},
		{"0x01", false, "not one 32-byte bool"},
		{word("01") + "00", false, "not one 32-byte bool"},
		{strings.Repeat("0", 66), false, "not one 32-byte bool"},
		{"0x" + strings.Repeat("g", 64), false, "not one 32-byte bool"},
	} {
		got, err := DecodeBool(tc.in)
		if tc.err == "" && (err != nil || got != tc.want) {
			t.Fatalf("DecodeBool(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Fatalf("DecodeBool(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.err)
		}
	}
}

func TestQuantity(t *testing.T) {
	for in, want := range map[string]uint64{"0x0": 0, "0x1": 1, "0x14a34": 84532, "0xffffffffffffffff": 1<<64 - 1} {
		if got, err := Quantity(in); err != nil || got != want {
			t.Fatalf("Quantity(%q) = %d, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0x", "0x01", "14a34", "0xg", "0x10000000000000000", "-0x1", "0X1"} {
		if _, err := Quantity(bad); err == nil {
			t.Fatalf("Quantity(%q) accepted", bad)
		}
	}
}

func TestParse(t *testing.T) {
	e, err := Parse([]string{"eip155:84532=https://base-sepolia.example/v2/SECRETKEY", "eip155:1337=http://127.0.0.1:8545"})
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := e.Endpoint("eip155:84532"); !ok || h != "base-sepolia.example" {
		t.Fatalf("endpoint host %q %v", h, ok)
	}
	if _, ok := e.Endpoint("eip155:8453"); ok {
		t.Fatal("an endpoint for a network not named")
	}
	for _, tc := range []struct{ spec, want string }{
		{"https://rpc.example/v2/SECRETKEY", "want NETWORK=URL"},
		{"eip155:8453", "want NETWORK=URL"},
		{"base=https://rpc.example", "not an EVM network"},
		{"eip155:0=https://rpc.example", "not an EVM network"},
		{"solana:mainnet=https://rpc.example", "not an EVM network"},
		{"eip155:8453=rpc.example/v2/SECRETKEY", "not an http(s) URL"},
		{"eip155:8453=ftp://rpc.example", "not an http(s) URL"},
		{"eip155:8453=http://rpc.example/v2/SECRETKEY", "must be https"},
		{"eip155:8453=https://rpc.example/#x", "fragment"},
		{"eip155:99999999999999999999=https://rpc.example", "not an EVM network"},
	} {
		_, err := Parse([]string{tc.spec})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--chain-rpc") {
			t.Fatalf("Parse(%q) = %v; want an error naming --chain-rpc and saying %q", tc.spec, err, tc.want)
		}
		if strings.Contains(err.Error(), "SECRETKEY") {
			t.Fatalf("the error repeats the URL's key: %v", err)
		}
	}
	if _, err := Parse([]string{"eip155:1=https://a.example", "eip155:1=https://b.example"}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a network named twice: %v", err)
	}
}

// rpcServer answers like a node whose newest block is at ts, with answer
// as eth_call's whole JSON-RPC reply (its id replaced), unless hostile
// replaces everything.
type rpcServer struct {
	chainID string
	ts      int64
	call    func(id json.RawMessage) string
	calls   []string
}

func (s *rpcServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params []any           `json:"params"`
	}
	body, _ := io.ReadAll(r.Body)
	json.Unmarshal(body, &req)
	s.calls = append(s.calls, req.Method)
	switch req.Method {
	case "eth_chainId":
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%q}`, req.ID, s.chainID)
	case "eth_getBlockByNumber":
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"number":"0x2a","timestamp":"0x%x","hash":"0x00"}}`, req.ID, s.ts)
	case "eth_call":
		p, _ := req.Params[0].(map[string]any)
		if p["data"] != "0xe94a0102000000000000000000000000857b06519e91e3a54538791bdbb0e22373e36b66"+nonce[2:] || p["to"] != strings.ToLower(token) || req.Params[1] != "0x2a" {
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32000,"message":"unexpected call %v"}}`, req.ID, req.Params)
			return
		}
		io.WriteString(w, s.call(req.ID))
	default:
		http.Error(w, "no", http.StatusBadRequest)
	}
}

// AuthorizationUsed answers true or false only on a well-formed answer of
// the right chain at a block past validBefore; every other answer — an
// error object, a result of the wrong length, a huge body, another id,
// HTTP errors, a redirect, no answer in time — is an error.
func TestAuthorizationUsed(t *testing.T) {
	vb := time.Unix(1_800_000_000, 0)
	ok := func(last string) func(json.RawMessage) string {
		return func(id json.RawMessage) string {
			return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":"0x%s%s"}`, id, strings.Repeat("0", 62), last)
		}
	}
	fixed := func(s string) func(json.RawMessage) string {
		return func(id json.RawMessage) string { return strings.ReplaceAll(s, "ID", string(id)) }
	}
	for _, tc := range []struct {
		name    string
		chainID string
		ts      int64
		call    func(json.RawMessage) string
		used    bool
		err     string
	}{
		{"unused", "0x14a34", vb.Unix(), ok("00"), false, ""},
		{"used", "0x14a34", vb.Unix() + 100, ok("01"), true, ""},
		{"newest block before validBefore", "0x14a34", vb.Unix() - 1, ok("00"), false, "could still be used"},
		{"another chain", "0x2105", vb.Unix(), ok("00"), false, "serves chain 8453"},
		{"an error object", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID,"error":{"code":-32000,"message":"execution reverted"}}`), false, "error -32000"},
		{"result and error", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID,"result":"0x","error":{"code":1,"message":"x"}}`), false, "both"},
		{"no result", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID}`), false, "no result"},
		{"null result", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID,"result":null}`), false, "no result"},
		{"another id", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":999999,"result":"0x` + strings.Repeat("0", 64) + `"}`), false, "another request id"},
		{"short result", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID,"result":"0x00"}`), false, "not one 32-byte bool"},
		{"empty result", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID,"result":"0x"}`), false, "no contract"},
		{"long result", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID,"result":"0x` + strings.Repeat("0", 128) + `"}`), false, "not one 32-byte bool"},
		{"not a bool", "0x14a34", vb.Unix(), ok("07"), false, "not a bool"},
		{"a number for a string", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID,"result":1}`), false, "not what the method returns"},
		{"not JSON", "0x14a34", vb.Unix(), fixed(`<html>`), false, "not a JSON-RPC object"},
		{"huge", "0x14a34", vb.Unix(), fixed(`{"jsonrpc":"2.0","id":ID,"result":"0x` + strings.Repeat("0", MaxAnswer) + `"}`), false, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &rpcServer{chainID: tc.chainID, ts: tc.ts, call: tc.call}
			srv := httptest.NewServer(s)
			defer srv.Close()
			e, err := Parse([]string{"eip155:84532=" + srv.URL + "/v2/SECRETKEY"})
			if err != nil {
				t.Fatal(err)
			}
			used, err := e.AuthorizationUsed(context.Background(), "eip155:84532", token, payer, nonce, vb)
			if tc.err == "" && (err != nil || used != tc.used) {
				t.Fatalf("got %v, %v; want %v", used, err, tc.used)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("got %v, %v; want an error saying %q", used, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "SECRETKEY") {
				t.Fatalf("the error repeats the URL: %v", err)
			}
		})
	}
}

// Transport failures are errors that do not repeat the URL, and a slow
// endpoint is given up on when the caller's context ends.
func TestAuthorizationUsedTransport(t *testing.T) {
	vb := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		err     string
	}{
		{"HTTP 500", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }, "HTTP 500"},
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "https://elsewhere.example/", http.StatusTemporaryRedirect)
		}, "HTTP 307"},
		{"slow", func(w http.ResponseWriter, r *http.Request) { time.Sleep(2 * time.Second) }, "no answer in time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			e, err := Parse([]string{"eip155:84532=" + srv.URL + "/v2/SECRETKEY"})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			used, err := e.AuthorizationUsed(ctx, "eip155:84532", token, payer, nonce, vb)
			if err == nil || used || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "SECRETKEY") {
				t.Fatalf("got %v, %v; want an error saying %q without the URL", used, err, tc.err)
			}
		})
	}
	e, _ := Parse([]string{"eip155:84532=http://127.0.0.1:1/v2/SECRETKEY"})
	if _, err := e.AuthorizationUsed(context.Background(), "eip155:84532", token, payer, nonce, vb); err == nil || strings.Contains(err.Error(), "SECRETKEY") {
		t.Fatalf("a refused connection: %v", err)
	}
	if _, err := e.AuthorizationUsed(context.Background(), "eip155:1", token, payer, nonce, vb); err == nil || !strings.Contains(err.Error(), "no --chain-rpc endpoint") {
		t.Fatalf("a network without an endpoint: %v", err)
	}
}

// FuzzParseAnswer: no answer makes the parser panic, and a result it
// accepts is JSON.
func FuzzParseAnswer(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":7,"result":"0x0000000000000000000000000000000000000000000000000000000000000001"}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"execution reverted"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":7,"result":null}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"7","result":"0x"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		raw, err := ParseAnswer(body, 7)
		if err != nil {
			return
		}
		if !json.Valid(raw) {
			t.Fatalf("accepted a result that is not JSON: %q", raw)
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if v, err := DecodeBool(s); err == nil && s != "0x"+strings.Repeat("0", 63)+map[bool]string{false: "0", true: "1"}[v] {
				t.Fatalf("DecodeBool(%q) = %v", s, v)
			}
			Quantity(s)
		}
	})
}
