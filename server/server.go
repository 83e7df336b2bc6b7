// Package server defines the MCP tools of haia-trace-mcp and serves them
// over stdio or Streamable HTTP. Handlers are thin: they validate
// arguments, call the receipt and guard packages, and render results.
package server

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

//go:embed schema/*.json
var schemaFiles embed.FS

// Config is what a Server needs; the caller opens the root once.
type Config struct {
	// Catalog reads the Trace root's runs: the read tools list and find
	// operations through it, and the guard's engine reads its history
	// from the same one.
	Catalog *catalog.Catalog
	// Version is reported to clients.
	Version string
	Logger  *slog.Logger
	Now     func() time.Time
	// ToolsListChanged announces notifications/tools/list_changed (the
	// guard proxy's tool list follows its upstream's).
	ToolsListChanged bool
	// Instructions replaces the instructions given to clients.
	Instructions string
}

// Server holds the tool handlers and the state they share.
type Server struct {
	cfg Config
	mcp *mcpserver.MCPServer
	// guard is set by EnableGuard, which adds check_before_pay and
	// get_review_status; without it only the read tools are served.
	guard *Guard
	// collectors are served on /metrics beside the HTTP transport's own.
	collectors []prometheus.Collector
	// toolScopes are the per-tool scopes of the HTTP front (tool → scope);
	// tools/list shows a caller only the tools its token may call.
	toolScopes atomic.Pointer[map[string]string]
	// links keeps the answers that asked a client to show a review's
	// console page, for the client's retry (see review_link.go).
	links linkStates
}

// SetToolScopes tells the server which scope each tool needs beyond the
// base ones, so that tools/list leaves out what a token may not call.
// NewHTTP sets it for every server it fronts.
func (s *Server) SetToolScopes(scopes map[string]string) {
	m := maps.Clone(scopes)
	s.toolScopes.Store(&m)
}

// visibleTools is the tools/list filter: with a verified identity (HTTP),
// a tool whose per-tool scope the token lacks is not listed — a client
// shown a tool it cannot call may end its session on the 403. Without an
// identity (stdio, or HTTP without authentication) every tool is listed.
func (s *Server) visibleTools(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	id, ok := auth.IdentityFrom(ctx)
	scopes := s.toolScopes.Load()
	if !ok || scopes == nil {
		return tools
	}
	out := make([]mcp.Tool, 0, len(tools))
	for _, t := range tools {
		if need, ok := (*scopes)[t.Name]; ok && !id.HasScope(need) {
			continue
		}
		out = append(out, t)
	}
	return out
}

// AddMetrics has /metrics serve these collectors too (the guard's and the
// notifier's); call it before NewHTTP.
func (s *Server) AddMetrics(cs ...prometheus.Collector) { s.collectors = append(s.collectors, cs...) }

// New builds the server and registers its tools.
func New(cfg Config) (*Server, error) {
	if cfg.Catalog == nil {
		return nil, errors.New("server: no catalog of the Trace root")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg}
	instructions := cfg.Instructions
	if instructions == "" {
		instructions = "Read your own Haia Trace operation receipts and ask check_before_pay before paying a counterparty again. " +
			"Reviews are decided by a human from the command line; no tool can approve or reject them."
	}
	s.mcp = mcpserver.NewMCPServer("haia-trace-mcp", cfg.Version,
		mcpserver.WithToolCapabilities(cfg.ToolsListChanged),
		mcpserver.WithLogging(),
		mcpserver.WithRecovery(),
		mcpserver.WithToolFilter(s.visibleTools),
		mcpserver.WithInstructions(instructions),
	)
	if err := s.addTools(s.tools()); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) addTools(tools []toolDef) error {
	for _, t := range tools {
		tool, err := t.build()
		if err != nil {
			return err
		}
		s.mcp.AddTool(tool, s.wrap(t.name, t.handler))
	}
	return nil
}

// MCP returns the underlying mcp-go server (for transports, the guard
// proxy's tools and tests).
func (s *Server) MCP() *mcpserver.MCPServer { return s.mcp }

// OwnToolNames lists the tools this server defines itself (ToolNames
// also lists tools added through MCP, such as the guard proxy's).
func (s *Server) OwnToolNames() []string {
	var names []string
	for _, t := range s.tools() {
		names = append(names, t.name)
	}
	if s.guard != nil {
		for _, t := range s.guardTools() {
			names = append(names, t.name)
		}
	}
	return names
}

// Logger is the server's logger.
func (s *Server) Logger() *slog.Logger { return s.cfg.Logger }

// toolDef describes one tool; schemas live in schema/<name>.{input,output}.json.
type toolDef struct {
	name        string
	title       string
	description string
	readOnly    bool
	idempotent  bool
	handler     func(ctx context.Context, raw any) (*mcp.CallToolResult, error)
}

func (t toolDef) build() (mcp.Tool, error) {
	in, err := schemaFiles.ReadFile("schema/" + t.name + ".input.json")
	if err != nil {
		return mcp.Tool{}, fmt.Errorf("tool %s: input schema: %w", t.name, err)
	}
	out, err := schemaFiles.ReadFile("schema/" + t.name + ".output.json")
	if err != nil {
		return mcp.Tool{}, fmt.Errorf("tool %s: output schema: %w", t.name, err)
	}
	// NewTool would set a default structured input schema, which cannot
	// coexist with a raw one; start from the raw-schema constructor.
	tool := mcp.NewToolWithRawSchema(t.name, t.description, json.RawMessage(in))
	for _, opt := range []mcp.ToolOption{
		mcp.WithRawOutputSchema(json.RawMessage(out)),
		mcp.WithTitleAnnotation(t.title),
		mcp.WithReadOnlyHintAnnotation(t.readOnly),
		mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(t.idempotent),
		mcp.WithOpenWorldHintAnnotation(false),
	} {
		opt(&tool)
	}
	if _, err := json.Marshal(tool); err != nil {
		return mcp.Tool{}, fmt.Errorf("tool %s: %w", t.name, err)
	}
	return tool, nil
}

// toolError is an error whose message is meant for the caller.
type toolError struct{ msg string }

func (e *toolError) Error() string { return e.msg }

func userErrorf(format string, a ...any) error { return &toolError{msg: fmt.Sprintf(format, a...)} }

// wrap turns handler errors into tool errors: a toolError's message goes to
// the caller as is; anything else is logged and reported generically, so no
// Go internals reach a client.
func (s *Server) wrap(name string, h func(ctx context.Context, raw any) (*mcp.CallToolResult, error)) mcpserver.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		start := s.cfg.Now()
		ctx = context.WithValue(withRoundTrip(ctx, req.Params.MultiRoundTripParams), wireArgumentsKey{}, bytes.TrimSpace(req.Params.RawArguments))
		res, err := h(ctx, arguments(req))
		if err != nil {
			var te *toolError
			if errors.As(err, &te) {
				s.cfg.Logger.Info("tool call refused", "tool", name, "reason", te.msg)
				return mcp.NewToolResultError(te.msg), nil
			}
			s.cfg.Logger.Error("tool call failed", "tool", name, "err", err)
			return mcp.NewToolResultError(name + " failed on the server side; the operator's log has the details"), nil
		}
		s.cfg.Logger.Debug("tool call", "tool", name, "duration", time.Since(start))
		return res, nil
	}
}

// wireArgumentsKey holds a call's arguments as the client sent them (none
// for an in-process call), for a tool that reads them exactly.
type wireArgumentsKey struct{}

// wireArguments are the bytes of the call's arguments as sent, or nil.
func wireArguments(ctx context.Context) []byte {
	b, _ := ctx.Value(wireArgumentsKey{}).([]byte)
	return b
}

// arguments are the call's arguments decoded from the bytes the client sent,
// numbers kept as their JSON text (json.Number), so that an amount sent as
// 0.30 is read exactly as written, never through a float. Without the wire
// bytes (an in-process call) they are mcp-go's decoding.
func arguments(req mcp.CallToolRequest) any {
	raw := bytes.TrimSpace(req.Params.RawArguments)
	if len(raw) == 0 {
		return req.Params.Arguments
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return req.Params.Arguments // mcp-go read them; keep its reading
	}
	return v
}

// structured answers with a JSON value and a text rendering of it.
func structured(v any, text string) *mcp.CallToolResult {
	return mcp.NewToolResultStructured(v, text)
}

// template resolves a template argument.
func (s *Server) template(name string) (*receipt.Template, error) {
	t, err := s.cfg.Catalog.Template(name)
	if err != nil {
		return nil, userErrorf("%s", err.Error())
	}
	return t, nil
}
