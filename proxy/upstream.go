package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// UpstreamConfig says how to reach the MCP server behind the proxy: a
// command spoken to over stdio, or a Streamable HTTP URL.
type UpstreamConfig struct {
	// Command and Args start a stdio upstream.
	Command string
	Args    []string
	// URL is a Streamable HTTP upstream; Token, when set, is sent as a
	// bearer token.
	URL   string
	Token string
	// Restart restarts a stdio upstream that exits, with backoff from
	// RestartMin doubling up to RestartMax.
	Restart                bool
	RestartMin, RestartMax time.Duration
	// Stderr receives the upstream process's stderr.
	Stderr io.Writer
	// Version is reported to the upstream as the client's version.
	Version string
	Logger  *slog.Logger
	// OnNotification receives every notification the upstream sends.
	OnNotification func(mcp.JSONRPCNotification)
	// OnConnect is called (on its own goroutine) after each connection
	// other than the first: a restarted upstream's tools are read again.
	OnConnect func()
	// OnDisconnect is called when a stdio upstream exits, before any
	// restart: nothing is forwarded until its tools are checked again.
	OnDisconnect func(error)
	// Asks, when set, answers the upstream's requests to the client
	// (sampling, elicitation, roots) by asking the host; the upstream
	// client then declares those capabilities.
	Asks Asker
}

// Asker answers the requests an upstream sends its client.
type Asker interface {
	CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error)
	Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error)
	ListRoots(ctx context.Context, req mcp.ListRootsRequest) (*mcp.ListRootsResult, error)
}

// ErrUpstreamDown means the upstream is not connected now.
var ErrUpstreamDown = errors.New("the upstream MCP server is not running")

// Upstream is the one connection to the upstream server, replaced when a
// stdio upstream is restarted.
type Upstream struct {
	cfg    UpstreamConfig
	mu     sync.Mutex
	cur    *conn
	down   error
	closed bool
	ctx    context.Context
	cancel context.CancelFunc
	ids    atomic.Int64
	wg     sync.WaitGroup
}

type conn struct {
	c *client.Client
	// caps are what the upstream declared when it initialized.
	caps mcp.ServerCapabilities
	cmd  *exec.Cmd
	dead chan struct{}
	// pid is the upstream process, for the operator's log.
	pid int
}

// StartUpstream connects to the upstream and initializes it. A first
// connection that fails stops the proxy's start.
func StartUpstream(ctx context.Context, cfg UpstreamConfig) (*Upstream, error) {
	if (cfg.Command == "") == (cfg.URL == "") {
		return nil, errors.New("proxy: name exactly one upstream: a command (after --) or --upstream-url")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	if cfg.RestartMin <= 0 {
		cfg.RestartMin = 500 * time.Millisecond
	}
	if cfg.RestartMax < cfg.RestartMin {
		cfg.RestartMax = 30 * time.Second
	}
	u := &Upstream{cfg: cfg}
	u.ctx, u.cancel = context.WithCancel(context.WithoutCancel(ctx))
	c, err := u.connect(ctx)
	if err != nil {
		u.cancel()
		return nil, err
	}
	u.cur = c
	u.watch(c)
	return u, nil
}

func (u *Upstream) connect(ctx context.Context) (*conn, error) {
	c := &conn{dead: make(chan struct{})}
	var tr transport.Interface
	if u.cfg.URL != "" {
		var opts []transport.StreamableHTTPCOption
		if u.cfg.Token != "" {
			opts = append(opts, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + u.cfg.Token}))
		}
		// The session's GET stream carries the upstream's notifications
		// (list changes, log messages) on the protocol the proxy speaks.
		//lint:ignore SA1019 the proxy speaks the session protocol (see WithLegacyProtocolOnly below)
		opts = append(opts, transport.WithContinuousListening())
		h, err := transport.NewStreamableHTTP(u.cfg.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("upstream %s: %w", u.cfg.URL, err)
		}
		tr = exactHTTP{h}
	} else {
		cmd := exec.Command(u.cfg.Command, u.cfg.Args...)
		cmd.Stderr = u.cfg.Stderr
		// Its own process group: a signal meant for the proxy's terminal
		// does not reach it, the proxy stops it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, fmt.Errorf("upstream %s: %w", u.cfg.Command, err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, fmt.Errorf("upstream %s: %w", u.cfg.Command, err)
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("upstream command %s could not be started: %w", u.cfg.Command, err)
		}
		c.cmd, c.pid = cmd, cmd.Process.Pid
		s := transport.NewIO(stdout, stdin, nil)
		tr = exactStdio{s}
		go func() {
			err := cmd.Wait()
			u.cfg.Logger.Warn("upstream process exited", "pid", c.pid, "err", err)
			_ = s.Close()
			close(c.dead)
		}()
	}
	// The initialize handshake and a session: upstream notifications
	// (progress, tools/list_changed, log messages) and cancellation pass
	// through on the session, as every upstream speaks it today.
	//lint:ignore SA1019 the session protocol is what passes notifications through; revisit when upstreams speak 2026-07-28
	opts := []client.ClientOption{client.WithLegacyProtocolOnly()}
	if u.cfg.Asks != nil {
		opts = append(opts, client.WithSamplingHandler(u.cfg.Asks), client.WithElicitationHandler(u.cfg.Asks), client.WithRootsHandler(u.cfg.Asks))
	}
	c.c = client.NewClient(tr, opts...)
	if u.cfg.OnNotification != nil {
		c.c.OnNotification(u.cfg.OnNotification)
	}
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The transport keeps the context it is started with for the requests
	// the upstream sends (sampling, elicitation, roots): the connection's
	// own, not the handshake's.
	if err := c.c.Start(u.ctx); err != nil {
		u.kill(c)
		return nil, fmt.Errorf("upstream: start: %w", err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "haia-trace-mcp-proxy", Version: u.cfg.Version}
	ir, err := c.c.Initialize(ictx, init)
	if err != nil {
		u.kill(c)
		return nil, fmt.Errorf("upstream: the MCP handshake failed: %w", err)
	}
	c.caps = ir.Capabilities
	u.cfg.Logger.Info("upstream connected", "upstream", u.describe(), "pid", c.pid)
	return c, nil
}

func (u *Upstream) describe() string {
	if u.cfg.URL != "" {
		return u.cfg.URL
	}
	return u.cfg.Command
}

func (u *Upstream) kill(c *conn) {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
		<-c.dead
	} else if c.c != nil {
		_ = c.c.Close()
	}
}

// watch restarts a stdio upstream when it dies (with Restart), else marks
// it down for good.
func (u *Upstream) watch(c *conn) {
	if c.cmd == nil {
		return
	}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		select {
		case <-c.dead:
		case <-u.ctx.Done():
			return
		}
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			return
		}
		u.cur = nil
		if u.cfg.OnDisconnect != nil {
			u.cfg.OnDisconnect(errors.New("the upstream exited; its tools are checked against the guard map again once it is back"))
		}
		if !u.cfg.Restart {
			u.down = fmt.Errorf("%w: it exited and --upstream-restart is off", ErrUpstreamDown)
			u.mu.Unlock()
			u.cfg.Logger.Error("upstream exited; not restarting (--upstream-restart is off)")
			return
		}
		u.down = fmt.Errorf("%w: it exited and is being restarted", ErrUpstreamDown)
		u.mu.Unlock()
		wait := u.cfg.RestartMin
		for {
			u.cfg.Logger.Warn("restarting the upstream", "in", wait)
			select {
			case <-time.After(wait):
			case <-u.ctx.Done():
				return
			}
			nc, err := u.connect(u.ctx)
			if err == nil {
				u.mu.Lock()
				if u.closed {
					u.mu.Unlock()
					u.kill(nc)
					return
				}
				u.cur, u.down = nc, nil
				u.mu.Unlock()
				u.watch(nc)
				if u.cfg.OnConnect != nil {
					go u.cfg.OnConnect()
				}
				return
			}
			u.cfg.Logger.Error("upstream restart failed", "err", err)
			wait = min(wait*2, u.cfg.RestartMax)
		}
	}()
}

func (u *Upstream) conn() (*conn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cur == nil {
		if u.down != nil {
			return nil, u.down
		}
		return nil, ErrUpstreamDown
	}
	return u.cur, nil
}

// ListTools reads every page of the upstream's tools/list and returns each
// tool as the upstream wrote it.
func (u *Upstream) ListTools(ctx context.Context) ([]json.RawMessage, error) {
	return u.ListAll(ctx, string(mcp.MethodToolsList), "tools")
}

// ListAll reads every page of a list method (tools/list, resources/list,
// …) and returns each item of the result's key as the upstream wrote it.
func (u *Upstream) ListAll(ctx context.Context, method, key string) ([]json.RawMessage, error) {
	c, err := u.conn()
	if err != nil {
		return nil, err
	}
	var out []json.RawMessage
	seen := map[string]bool{}
	cursor := ""
	for page := 0; ; page++ {
		if page > 1000 {
			return nil, fmt.Errorf("upstream %s: more than 1000 pages", method)
		}
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		res, err := c.c.GetTransport().SendRequest(ctx, transport.JSONRPCRequest{
			JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId("haia-proxy-" + strconv.FormatInt(u.ids.Add(1), 10)),
			Method: method, Params: params,
		})
		if err != nil {
			return nil, fmt.Errorf("upstream %s: %w", method, err)
		}
		if res.Error != nil {
			return nil, fmt.Errorf("upstream %s: %w", method, res.Error.AsError())
		}
		var page struct {
			NextCursor string `json:"nextCursor"`
		}
		var items map[string]json.RawMessage
		if err := json.Unmarshal(res.Result, &page); err != nil {
			return nil, fmt.Errorf("upstream %s: %w", method, err)
		}
		if err := json.Unmarshal(res.Result, &items); err != nil {
			return nil, fmt.Errorf("upstream %s: %w", method, err)
		}
		var list []json.RawMessage
		if raw, ok := items[key]; ok && string(raw) != "null" {
			if err := json.Unmarshal(raw, &list); err != nil {
				return nil, fmt.Errorf("upstream %s: %s: %w", method, key, err)
			}
		}
		out = append(out, list...)
		if page.NextCursor == "" {
			return out, nil
		}
		if seen[page.NextCursor] {
			return nil, fmt.Errorf("upstream %s: a cursor repeats", method)
		}
		seen[page.NextCursor] = true
		cursor = page.NextCursor
	}
}

// Capabilities are what the upstream connected now declared.
func (u *Upstream) Capabilities() (mcp.ServerCapabilities, error) {
	c, err := u.conn()
	if err != nil {
		return mcp.ServerCapabilities{}, err
	}
	return c.caps, nil
}

// Request sends one request to the upstream and returns its result as the
// upstream wrote it; a JSON-RPC error answer is an *UpstreamError.
func (u *Upstream) Request(ctx context.Context, method string, params any) (json.RawMessage, error) {
	c, err := u.conn()
	if err != nil {
		return nil, notSent(err)
	}
	res, err := c.c.GetTransport().SendRequest(ctx, transport.JSONRPCRequest{
		JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId("haia-proxy-" + strconv.FormatInt(u.ids.Add(1), 10)),
		Method: method, Params: params,
	})
	if err != nil {
		select {
		case <-c.dead:
			return nil, fmt.Errorf("%w: it exited during the request: %w", ErrUpstreamDown, err)
		default:
		}
		return nil, fmt.Errorf("upstream %s: %w", method, err)
	}
	if res.Error != nil {
		return nil, &UpstreamError{Method: method, Code: res.Error.Code, Message: res.Error.Message, Data: res.Error.Data}
	}
	return res.Result, nil
}

// UpstreamError is the upstream's JSON-RPC error answer to a request.
type UpstreamError struct {
	Method string
	// Code is the answer's JSON-RPC error code, unless CodeUnread.
	Code int
	// CodeUnread: the answer came through the MCP client, which keeps the
	// code only of the errors it names (-32700, -32600, -32601, -32602,
	// -32603, -32800, -32002); this answer had another code (a
	// server-defined or application code, 0), and only its message is
	// known.
	CodeUnread bool
	Message    string
	Data       any
}

func (e *UpstreamError) Error() string { return e.Message }

// ErrNotSent marks a request that was never written to the upstream (it
// was not connected): the upstream cannot have run it.
var ErrNotSent = errors.New("the request was not sent")

// notSentError is why a request was not sent; it is ErrNotSent too.
type notSentError struct{ err error }

func (e notSentError) Error() string   { return e.err.Error() }
func (e notSentError) Unwrap() []error { return []error{e.err, ErrNotSent} }

func notSent(err error) error { return notSentError{err} }

// clientAnswerCodes are the JSON-RPC error codes the MCP client names with
// a sentinel error; any other code reaches the proxy as its message only.
var clientAnswerCodes = []struct {
	err  error
	code int
}{
	{mcp.ErrParseError, mcp.PARSE_ERROR},
	{mcp.ErrInvalidRequest, mcp.INVALID_REQUEST},
	{mcp.ErrMethodNotFound, mcp.METHOD_NOT_FOUND},
	{mcp.ErrInvalidParams, mcp.INVALID_PARAMS},
	{mcp.ErrInternalError, mcp.INTERNAL_ERROR},
	{mcp.ErrRequestInterrupted, mcp.REQUEST_INTERRUPTED},
	{mcp.ErrResourceNotFound, mcp.RESOURCE_NOT_FOUND},
}

// clientAnswer is the upstream's JSON-RPC error answer as the MCP client
// returned it (a transport.Error, what went wrong on the way, is not an
// answer and is not passed here).
func clientAnswer(method string, err error) *UpstreamError {
	for _, c := range clientAnswerCodes {
		if errors.Is(err, c.err) {
			return &UpstreamError{Method: method, Code: c.code, Message: err.Error()}
		}
	}
	return &UpstreamError{Method: method, CodeUnread: true, Message: err.Error()}
}

// Notify sends the upstream a notification.
func (u *Upstream) Notify(ctx context.Context, method string, params map[string]any) error {
	c, err := u.conn()
	if err != nil {
		return err
	}
	return c.c.GetTransport().SendNotification(ctx, mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION,
		Notification: mcp.Notification{Method: method, Params: mcp.NotificationParams{AdditionalFields: params}}})
}

// CallTool forwards one call. args are sent byte for byte.
func (u *Upstream) CallTool(ctx context.Context, name string, args json.RawMessage, meta *mcp.Meta) (*mcp.CallToolResult, error) {
	c, err := u.conn()
	if err != nil {
		return nil, notSent(err)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = name
	req.Params.Arguments = args
	req.Params.Meta = meta
	res, err := c.c.CallTool(ctx, req)
	if err != nil {
		select {
		case <-c.dead:
			return nil, fmt.Errorf("%w: it exited during the call: %w", ErrUpstreamDown, err)
		default:
		}
		// The client wraps what went wrong on the way (a broken
		// connection, the context's end) in a transport.Error; anything
		// else it returns is the upstream's JSON-RPC error answer.
		var te *transport.Error
		if errors.As(err, &te) {
			return nil, err
		}
		return nil, clientAnswer(string(mcp.MethodToolsCall), err)
	}
	return res, nil
}

// Close stops the upstream (a stdio one is killed after its stdin closes).
func (u *Upstream) Close() {
	u.mu.Lock()
	u.closed = true
	c := u.cur
	u.cur = nil
	u.mu.Unlock()
	u.cancel()
	if c != nil {
		if c.cmd != nil {
			done := make(chan struct{})
			go func() { _ = c.c.Close(); close(done) }()
			select {
			case <-c.dead:
			case <-time.After(2 * time.Second):
				u.kill(c)
			}
			<-done
		} else {
			_ = c.c.Close()
		}
	}
	u.wg.Wait()
}
