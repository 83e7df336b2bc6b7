package proxy

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
)

// Only an answer that proves the call was not run releases what its allow
// reserved (upstream_refused); every other failure keeps it. The MCP
// client's own errors are made here the way it makes them (AsError of the
// answer's error details; transport.NewError for what broke on the way),
// so a change of the client's errors fails this test.
func TestFailureOutcome(t *testing.T) {
	answer := func(code int, msg string) error {
		d := mcp.JSONRPCErrorDetails{Code: code, Message: msg}
		return clientAnswer("tools/call", d.AsError())
	}
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name      string
		ctx, cctx context.Context
		err       error
		want      engine.Outcome
	}{
		{"parse error", live, live, answer(-32700, "parse error"), engine.OutcomeRefused},
		{"invalid request", live, live, answer(-32600, "invalid request"), engine.OutcomeRefused},
		{"method not found", live, live, answer(-32601, "method not found"), engine.OutcomeRefused},
		{"unknown tool, mcp-go", live, live, answer(-32602, "tool 'x' not found: tool not found"), engine.OutcomeRefused},
		{"unknown tool, Go SDK", live, live, answer(-32602, `unknown tool "x"`), engine.OutcomeRefused},
		{"task request refused", live, live, &UpstreamError{Method: "tools/call", Code: -32602, Message: "invalid params"}, engine.OutcomeRefused},
		{"never sent", live, live, notSent(fmt.Errorf("%w: it exited", ErrUpstreamDown)), engine.OutcomeRefused},

		{"internal error", live, live, answer(-32603, "the receipt service failed"), engine.OutcomeErrorUnknown},
		{"panic recovered", live, live, answer(-32603, "panic recovered in pay tool handler"), engine.OutcomeErrorUnknown},
		{"server-defined code", live, live, answer(-32000, "server error"), engine.OutcomeErrorUnknown},
		{"application code", live, live, answer(4001, "declined after sending"), engine.OutcomeErrorUnknown},
		{"code 0, the Go SDK's thrown error", live, live, answer(0, "boom"), engine.OutcomeErrorUnknown},
		{"request interrupted", live, live, answer(-32800, "interrupted"), engine.OutcomeErrorUnknown},
		{"URL elicitation required", live, live, answer(-32042, "go to the URL"), engine.OutcomeErrorUnknown},
		{"task request, server code", live, live, &UpstreamError{Method: "tools/call", Code: -32001, Message: "x"}, engine.OutcomeErrorUnknown},
		{"a refusing code the client did not keep", live, live, &UpstreamError{CodeUnread: true, Code: -32602}, engine.OutcomeErrorUnknown},

		{"upstream exited during the call", live, live, fmt.Errorf("%w: it exited during the call", ErrUpstreamDown), engine.OutcomeLost},
		{"broken connection", live, live, transport.NewError(errors.New("transport closed")), engine.OutcomeLost},
		{"broken connection, task request", live, live, fmt.Errorf("upstream tools/call: %w", transport.ErrTransportClosed), engine.OutcomeLost},
		{"caller cancelled", ended, ended, answer(-32602, "invalid params"), engine.OutcomeLost},
		{"timeout", live, ended, transport.NewError(context.DeadlineExceeded), engine.OutcomeTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := failure(c.ctx, c.cctx, c.err)
			if got != c.want {
				t.Fatalf("%v: %s, want %s", c.err, got, c.want)
			}
			if got.Settled() != (c.want == engine.OutcomeRefused) {
				t.Fatalf("%s settles %v", got, got.Settled())
			}
		})
	}
}

// A call whose upstream is not connected is never sent, and says so.
func TestCallToolNotSent(t *testing.T) {
	u := &Upstream{down: fmt.Errorf("%w: it exited and --upstream-restart is off", ErrUpstreamDown)}
	_, err := u.CallTool(context.Background(), "send", []byte(`{}`), nil)
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, ErrUpstreamDown) {
		t.Fatalf("%v", err)
	}
	if o := failure(context.Background(), context.Background(), err); o != engine.OutcomeRefused {
		t.Fatalf("%s", o)
	}
	if got := describeFailure(engine.OutcomeRefused, err); got != "it was not sent: the upstream MCP server is not running: it exited and --upstream-restart is off" {
		t.Fatalf("%q", got)
	}
}
