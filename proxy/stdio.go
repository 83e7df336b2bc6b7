package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// StdioOut is the proxy's standard output when it serves stdio. The MCP
// server writes every message through it, one whole line per Write, and the
// proxy writes the upstream's notifications through it directly, in the
// order the upstream sent them: a notification the upstream sent before a
// result has been written before that result reaches the proxy, so it
// reaches the caller first. (The server's own notifications go through a
// queue that a separate goroutine drains, which gives no such order.)
type StdioOut struct {
	mu      sync.Mutex
	w       io.Writer
	session mcpserver.ClientSession
	// ready: the client said notifications/initialized (the session is
	// initialized when it asks initialize, before it has the answer).
	ready bool
	// modern: the client speaks protocol 2026-07-28, on which it receives
	// outside its calls only what it opted in to through
	// subscriptions/listen.
	modern bool
}

// isModern reports a client of protocol 2026-07-28.
func (o *StdioOut) isModern() bool {
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.modern
}

// request is the before-any hook: it learns the client's protocol.
func (o *StdioOut) request(ctx context.Context, _ any, _ mcp.MCPMethod, _ any) {
	if info := mcpserver.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		o.mu.Lock()
		o.modern = true
		o.mu.Unlock()
	}
}

// initialized is the handler of the client's notifications/initialized.
func (o *StdioOut) initialized(context.Context, mcp.JSONRPCNotification) { o.markReady() }

// markReady records that the client is past its handshake: it said
// notifications/initialized, or sent a request the proxy serves (a client
// of protocol 2026-07-28 has no handshake).
func (o *StdioOut) markReady() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.ready = true
	o.mu.Unlock()
}

// NewStdioOut writes to w.
func NewStdioOut(w io.Writer) *StdioOut { return &StdioOut{w: w} }

// Write writes one message; writes never interleave.
func (o *StdioOut) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.w.Write(p)
}

// Session is the stdio transport's context function: it learns the one
// client session, so that nothing is written to a client before it
// initialized.
func (o *StdioOut) Session(ctx context.Context) context.Context {
	if s := mcpserver.ClientSessionFromContext(ctx); s != nil {
		o.mu.Lock()
		o.session = s
		o.mu.Unlock()
	}
	return ctx
}

// client is the one client session, once it initialized (nil before).
func (o *StdioOut) client() mcpserver.ClientSession {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.session == nil || !o.ready || !o.session.Initialized() {
		return nil
	}
	return o.session
}

// notify writes a notification now. It reports false when the client has
// not initialized yet (nothing is written); inCall says the notification
// belongs to a call the client made, which it may always receive.
func (o *StdioOut) notify(method string, params map[string]any, inCall bool) (bool, error) {
	if inCall {
		o.markReady()
	}
	s := o.client()
	if s == nil {
		return false, nil
	}
	if !inCall && (o.isModern() || listening(s)) {
		// What it opted in to through subscriptions/listen comes on that
		// stream; nothing else outside its calls.
		return false, nil
	}
	n := mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{Method: method, Params: mcp.NotificationParams{AdditionalFields: params}}}
	b, err := json.Marshal(n)
	if err != nil {
		return true, fmt.Errorf("encode notification %s: %w", method, err)
	}
	_, err = o.Write(append(b, '\n'))
	return true, err
}
