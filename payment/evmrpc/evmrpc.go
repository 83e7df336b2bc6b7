// Package evmrpc reads EIP-3009 asset contracts through the JSON-RPC
// endpoints the operator configures (--chain-rpc NETWORK=URL): whether an
// authorization's nonce was used (authorizationState(address,bytes32)), at
// a block whose time is past the authorization's validBefore, so that the
// answer is final. It sends eth_chainId, eth_getBlockByNumber and eth_call
// over net/http, and nothing else: it signs and sends no transaction.
//
// The operator trusts the endpoint: one that lies can say an authorization
// was never used, and so release a hold the guard kept for it (SECURITY.md).
// An answer that cannot be read is an error, never "unused".
package evmrpc

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// MaxAnswer bounds the bytes read of one answer; a longer one is refused.
const MaxAnswer = 64 << 10

// Timeout bounds one request when the caller's context sets no deadline.
const Timeout = 5 * time.Second

var networkRE = regexp.MustCompile(`^eip155:[1-9][0-9]{0,18}$`)

// Endpoints are the configured endpoints, by network (CAIP-2, eip155:N).
// They are safe for concurrent use.
type Endpoints struct {
	byNetwork map[string]*endpoint
	client    *http.Client
	ids       atomic.Int64
}

type endpoint struct {
	network string
	chainID uint64
	url     string
	host    string
	// checked: the endpoint said once that it serves chainID.
	mu      sync.Mutex
	checked bool
}

// Parse reads the values of --chain-rpc, each NETWORK=URL: NETWORK an EVM
// network as x402 names it (eip155:8453), URL an https endpoint (http only
// on a loopback host), each network once. Its errors name the flag and the
// value, never the URL's path or query (an API key often sits there).
func Parse(specs []string) (*Endpoints, error) {
	e := &Endpoints{byNetwork: map[string]*endpoint{}, client: &http.Client{
		Timeout: Timeout,
		// A redirect would send the question (and the key in the URL)
		// elsewhere: the endpoint named is the one asked.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	for _, s := range specs {
		network, raw, ok := strings.Cut(s, "=")
		if !ok || network == "" || raw == "" {
			return nil, fmt.Errorf("--chain-rpc %q: want NETWORK=URL, e.g. eip155:8453=https://mainnet.base.org", clip(redact(s)))
		}
		if !networkRE.MatchString(network) {
			return nil, fmt.Errorf("--chain-rpc %q: the network %q is not an EVM network as x402 names it (eip155: and the chain id, e.g. eip155:84532)", clip(redact(s)), clip(network))
		}
		if _, dup := e.byNetwork[network]; dup {
			return nil, fmt.Errorf("--chain-rpc names %s twice; give one endpoint for each network", network)
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Opaque != "" {
			return nil, fmt.Errorf("--chain-rpc %s=…: the endpoint is not an http(s) URL with a host", network)
		}
		if u.Fragment != "" {
			return nil, fmt.Errorf("--chain-rpc %s=…: the endpoint URL has a #fragment, which is never sent; drop it", network)
		}
		if u.Scheme == "http" && !loopback(u.Hostname()) {
			return nil, fmt.Errorf("--chain-rpc %s=http://%s…: a remote endpoint must be https (what it answers can release a hold, and a plain http answer can be forged on the way); http is for a loopback node only", network, u.Host)
		}
		id, _ := strconv.ParseUint(strings.TrimPrefix(network, "eip155:"), 10, 64)
		if id == 0 {
			return nil, fmt.Errorf("--chain-rpc %s: the chain id is out of range", clip(network))
		}
		e.byNetwork[network] = &endpoint{network: network, chainID: id, url: raw, host: u.Host}
	}
	return e, nil
}

// redact is a --chain-rpc value with its URL cut to scheme and host (a
// value that is a URL alone, too).
func redact(s string) string {
	cut := func(raw string) string {
		if u, err := url.Parse(raw); err == nil && u.Host != "" {
			return u.Scheme + "://" + u.Host + "/…"
		}
		return "…"
	}
	if strings.Contains(s, "://") && !strings.Contains(s[:strings.Index(s, "://")], "=") {
		return cut(s)
	}
	n, raw, ok := strings.Cut(s, "=")
	if !ok {
		return s
	}
	return n + "=" + cut(raw)
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Len is how many networks have an endpoint.
func (e *Endpoints) Len() int {
	if e == nil {
		return 0
	}
	return len(e.byNetwork)
}

// Networks lists the networks with an endpoint and the endpoint's host.
func (e *Endpoints) Networks() map[string]string {
	out := map[string]string{}
	if e != nil {
		for n, p := range e.byNetwork {
			out[n] = p.host
		}
	}
	return out
}

// Endpoint names the host of network's endpoint (for logs: the URL may
// carry an API key), and whether there is one.
func (e *Endpoints) Endpoint(network string) (string, bool) {
	if e == nil {
		return "", false
	}
	p, ok := e.byNetwork[network]
	if !ok {
		return "", false
	}
	return p.host, true
}

// authorizationStateSelector is the first four bytes of
// keccak256("authorizationState(address,bytes32)").
var authorizationStateSelector = selector("authorizationState(address,bytes32)")

func selector(signature string) []byte {
	h := x402.Keccak256([]byte(signature))
	return h[:4]
}

// CallData is the ABI encoding of authorizationState(payer, nonce): the
// selector, the address left-padded to 32 bytes, the nonce.
func CallData(payer, nonce string) ([]byte, error) {
	a, err := fixedHex(payer, 20)
	if err != nil {
		return nil, fmt.Errorf("payer: %w", err)
	}
	n, err := fixedHex(nonce, 32)
	if err != nil {
		return nil, fmt.Errorf("nonce: %w", err)
	}
	out := make([]byte, 0, 4+32+32)
	out = append(out, authorizationStateSelector...)
	out = append(out, make([]byte, 12)...)
	out = append(out, a...)
	return append(out, n...), nil
}

// fixedHex reads 0x and exactly n bytes of hex (digits of either case).
func fixedHex(s string, n int) ([]byte, error) {
	if len(s) != 2+2*n || s[:2] != "0x" {
		return nil, fmt.Errorf("%q is not 0x and %d hex digits", clip(s), 2*n)
	}
	return hex.DecodeString(s[2:])
}

// DecodeBool reads an eth_call result that returns one bool: 0x and 32
// bytes, the last 0 or 1, the rest zero. Anything else (no code at the
// address answers "0x") is an error.
func DecodeBool(result string) (bool, error) {
	b, err := fixedHex(result, 32)
	if err != nil {
		if result == "0x" {
			return false, errors.New("the call returned nothing: no contract with authorizationState at that address on this chain")
		}
		return false, fmt.Errorf("the call returned %s, not one 32-byte bool", describe(result))
	}
	for _, c := range b[:31] {
		if c != 0 {
			return false, errors.New("the call returned a 32-byte word that is not a bool")
		}
	}
	switch b[31] {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, errors.New("the call returned a 32-byte word that is not a bool")
}

// describe says what a hostile or broken value is without repeating much
// of it.
func describe(s string) string {
	if len(s) > 24 {
		return fmt.Sprintf("%d characters starting %q", len(s), s[:16])
	}
	return strconv.Quote(s)
}

// Quantity reads a JSON-RPC quantity: 0x and hex digits without leading
// zeros (0x0 for zero), at most 64 bits.
func Quantity(s string) (uint64, error) {
	if len(s) < 3 || s[:2] != "0x" || (len(s) > 3 && s[2] == '0') || len(s) > 18 {
		return 0, fmt.Errorf("%s is not a quantity (0x and hex digits, no leading zero)", describe(s))
	}
	v, err := strconv.ParseUint(s[2:], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%s is not a quantity (0x and hex digits, no leading zero)", describe(s))
	}
	return v, nil
}

// RPCError is an endpoint's JSON-RPC error object.
type RPCError struct {
	Code    int64
	Message string
}

func (e *RPCError) Error() string {
	return fmt.Sprintf("the endpoint answered error %d: %q", e.Code, clip(e.Message))
}

// ParseAnswer reads one JSON-RPC answer to the request of id: its result,
// or the error object it carries as an *RPCError. An answer that is not
// one (another id, no result and no error, both, more than MaxAnswer
// bytes) is an error.
func ParseAnswer(body []byte, id int64) (json.RawMessage, error) {
	if len(body) > MaxAnswer {
		return nil, fmt.Errorf("the answer is more than %d bytes", MaxAnswer)
	}
	var a struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result"`
		Error   *struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, errors.New("the answer is not a JSON-RPC object")
	}
	if a.JSONRPC != "2.0" {
		return nil, errors.New("the answer is not JSON-RPC 2.0")
	}
	if string(a.ID) != strconv.FormatInt(id, 10) {
		return nil, errors.New("the answer names another request id")
	}
	hasResult := len(a.Result) > 0 && string(a.Result) != "null"
	switch {
	case a.Error != nil && hasResult:
		return nil, errors.New("the answer carries both a result and an error")
	case a.Error != nil:
		return nil, &RPCError{Code: a.Error.Code, Message: a.Error.Message}
	case !hasResult:
		return nil, errors.New("the answer carries no result")
	}
	return a.Result, nil
}

// call sends one JSON-RPC request and reads its result into out.
func (e *Endpoints) call(ctx context.Context, p *endpoint, method string, params []any, out any) error {
	id := e.ids.Add(1)
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return errors.New("the endpoint URL cannot be requested")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		// A *url.Error repeats the whole URL: keep only what went wrong.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: no answer in time", method)
		}
		return fmt.Errorf("%s: %w", method, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer+1))
	if err != nil {
		return fmt.Errorf("%s: reading the answer: %w", method, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: the endpoint answered HTTP %d", method, resp.StatusCode)
	}
	raw, err := ParseAnswer(data, id)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s: the result is not what the method returns", method)
	}
	return nil
}

// checkChain asks the endpoint its chain id, once: an endpoint of another
// chain would read another contract, or none.
func (e *Endpoints) checkChain(ctx context.Context, p *endpoint) error {
	p.mu.Lock()
	ok := p.checked
	p.mu.Unlock()
	if ok {
		return nil
	}
	var s string
	if err := e.call(ctx, p, "eth_chainId", []any{}, &s); err != nil {
		return err
	}
	id, err := Quantity(s)
	if err != nil {
		return fmt.Errorf("eth_chainId: %w", err)
	}
	if id != p.chainID {
		return fmt.Errorf("the endpoint serves chain %d, not %s: fix --chain-rpc", id, p.network)
	}
	p.mu.Lock()
	p.checked = true
	p.mu.Unlock()
	return nil
}

// AuthorizationUsed reads authorizationState(payer, nonce) of token at
// network's newest block. It is an error when that block's time is before
// validBefore (the authorization could still be used in a later block),
// and whenever the answer cannot be read.
func (e *Endpoints) AuthorizationUsed(ctx context.Context, network, token, payer, nonce string, validBefore time.Time) (bool, error) {
	if e == nil {
		return false, fmt.Errorf("no --chain-rpc endpoint for %s", network)
	}
	p, ok := e.byNetwork[network]
	if !ok {
		return false, fmt.Errorf("no --chain-rpc endpoint for %s", network)
	}
	if _, err := fixedHex(token, 20); err != nil {
		return false, fmt.Errorf("token: %w", err)
	}
	data, err := CallData(payer, nonce)
	if err != nil {
		return false, err
	}
	if err := e.checkChain(ctx, p); err != nil {
		return false, err
	}
	var block struct {
		Number    string `json:"number"`
		Timestamp string `json:"timestamp"`
	}
	if err := e.call(ctx, p, "eth_getBlockByNumber", []any{"latest", false}, &block); err != nil {
		return false, err
	}
	number, err := Quantity(block.Number)
	if err != nil {
		return false, fmt.Errorf("eth_getBlockByNumber: number: %w", err)
	}
	ts, err := Quantity(block.Timestamp)
	if err != nil {
		return false, fmt.Errorf("eth_getBlockByNumber: timestamp: %w", err)
	}
	// EIP-3009 accepts an authorization in a block whose time is before
	// validBefore; block times never go back, so once the newest block is
	// at or past it, what the contract says there is final.
	if vb := validBefore.Unix(); vb < 0 || ts < uint64(vb) {
		return false, fmt.Errorf("the chain's newest block (%d) is from %s, before the authorization's validBefore %s: it could still be used",
			number, time.Unix(int64(min(ts, 1<<62)), 0).UTC().Format(time.RFC3339), validBefore.UTC().Format(time.RFC3339))
	}
	var result string
	err = e.call(ctx, p, "eth_call", []any{map[string]string{"to": strings.ToLower(token), "data": "0x" + hex.EncodeToString(data)}, "0x" + strconv.FormatUint(number, 16)}, &result)
	if err != nil {
		return false, err
	}
	used, err := DecodeBool(result)
	if err != nil {
		return false, fmt.Errorf("eth_call authorizationState: %w", err)
	}
	return used, nil
}
