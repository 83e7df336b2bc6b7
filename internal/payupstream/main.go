// Command payupstream is a small MCP server with paying tools, the upstream
// the guard proxy's end-to-end tests put behind the proxy. Every call a
// tool carries out is appended, as one JSON line, to the file named by
// PAY_LOG; a call that is refused, fails or is cancelled writes nothing.
//
// Environment: PAY_LOG (required), PAY_PID_FILE (each start appends its
// process id), PAY_PAGE (tools/list page size, default no paging),
// PAY_EXTRA (comma-separated tools added at start, for schema checks),
// PAY_REFUSE_FILE (while that file exists, every start fails), PAY_X402
// (when set, the tool pay_x402 that takes a seller's 402 is listed too).
//
// Some tools pay and then fail, each in one of the ways a real server
// fails after its handler ran (errors.go); over stdio, a thin layer in
// front of the server answers what an SDK answers before any handler runs
// (arguments refused by schema validation) and the JSON-RPC error codes
// mcp-go's handlers cannot choose.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

type upstream struct {
	tasks tasks
	mu    sync.Mutex
	log   string
	// vanished: ghost_send is refused as unknown at call time while it is
	// still listed (a tool removed without telling the clients).
	vanished atomic.Bool
	srv      *server.MCPServer
	// out, over stdio, is standard output: progress is written through
	// it directly, so that it precedes the result on the wire (the
	// server's notification queue is drained by another goroutine).
	out *lockedWriter
}

// lockedWriter writes whole messages, one at a time.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// notify sends the caller a notification: over stdio written now, before
// the result of the call that sends it.
func (u *upstream) notify(ctx context.Context, method string, params map[string]any) error {
	if u.out == nil {
		return u.srv.SendNotificationToClient(ctx, method, params)
	}
	b, err := json.Marshal(mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION,
		Notification: mcp.Notification{Method: method, Params: mcp.NotificationParams{AdditionalFields: params}}})
	if err != nil {
		return err
	}
	_, err = u.out.Write(append(b, '\n'))
	return err
}

func (u *upstream) record(tool string, raw json.RawMessage) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	f, err := os.OpenFile(u.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	line, err := json.Marshal(map[string]any{"tool": tool, "arguments": raw})
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	return err
}

func rawArgs(req mcp.CallToolRequest) json.RawMessage {
	if len(req.Params.RawArguments) > 0 {
		return req.Params.RawArguments
	}
	b, _ := json.Marshal(req.Params.Arguments)
	return b
}

func (u *upstream) pay(name string) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		raw := rawArgs(req)
		if err := u.record(name, raw); err != nil {
			return nil, err
		}
		return mcp.NewToolResultStructured(map[string]any{"paid": true, "tool": name}, fmt.Sprintf("paid by %s: %s", name, raw)), nil
	}
}

// slow pays after ms milliseconds, reporting progress every 50 ms; a
// cancelled call pays nothing.
func (u *upstream) slow(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	ms := req.GetInt("ms", 500)
	var token mcp.ProgressToken
	if req.Params.Meta != nil {
		token = req.Params.Meta.ProgressToken
	}
	deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
	step, sent := 0, 0
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		step++
		if token != nil {
			if err := u.notify(ctx, "notifications/progress", map[string]any{"progressToken": token, "progress": step, "message": "paying"}); err == nil {
				sent++
			}
		}
	}
	if err := u.record("slow_send", rawArgs(req)); err != nil {
		return nil, err
	}
	// The count lets a test check that every progress notification reached
	// the caller before this result.
	return mcp.NewToolResultText(fmt.Sprintf("paid slowly after %d progress notifications", sent)), nil
}

func main() {
	u := &upstream{log: os.Getenv("PAY_LOG")}
	if u.log == "" {
		fmt.Fprintln(os.Stderr, "payupstream: PAY_LOG is required")
		os.Exit(2)
	}
	if f := os.Getenv("PAY_REFUSE_FILE"); f != "" {
		if _, err := os.Stat(f); err == nil {
			// A start that fails, for the proxy's restart backoff.
			fmt.Fprintln(os.Stderr, "payupstream: refusing to start while", f, "exists")
			os.Exit(3)
		}
	}
	if pf := os.Getenv("PAY_PID_FILE"); pf != "" {
		f, err := os.OpenFile(pf, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			fmt.Fprintln(f, os.Getpid())
			f.Close()
		}
	}
	opts := []server.ServerOption{server.WithToolCapabilities(true), server.WithLogging(), server.WithTaskCapabilities(true, true, true),
		// A handler's panic becomes a JSON-RPC error answer (-32603), as
		// a thrown error does in the SDKs.
		server.WithRecovery(),
		server.WithToolFilter(func(_ context.Context, tools []mcp.Tool) []mcp.Tool {
			if !u.vanished.Load() {
				return tools
			}
			return slices.DeleteFunc(tools, func(t mcp.Tool) bool { return t.Name == "ghost_send" })
		})}
	if n, err := strconv.Atoi(os.Getenv("PAY_PAGE")); err == nil && n > 0 {
		opts = append(opts, server.WithPaginationLimit(n))
	}
	hooks := &server.Hooks{}
	var onInitialized func(context.Context)
	hooks.AddAfterCallTool(func(_ context.Context, _ any, m *mcp.CallToolRequest, result any) {
		if cr, ok := result.(*mcp.CreateTaskResult); ok && m.Params.Task != nil {
			u.tasks.created(m.Params.Task, cr.Task.TaskId)
		}
	})
	hooks.AddAfterCancelTask(func(_ context.Context, _ any, m *mcp.CancelTaskRequest, _ *mcp.CancelTaskResult) {
		u.tasks.cancelled(m.Params.TaskId)
	})
	if os.Getenv("PAY_EARLY_CHANGES") != "" {
		// A tool list that changes while the proxy starts: before the
		// initialize answer, once initialized (as server-everything adds
		// tools once it knows its client), and during the first tools/list.
		early := func(ctx context.Context) {
			if err := u.notify(ctx, string(mcp.MethodNotificationToolsListChanged), nil); err != nil {
				fmt.Fprintln(os.Stderr, "payupstream: early tools/list_changed:", err)
			}
		}
		var listed atomic.Bool
		hooks.AddAfterInitialize(func(ctx context.Context, _ any, _ *mcp.InitializeRequest, _ *mcp.InitializeResult) { early(ctx) })
		hooks.AddBeforeListTools(func(ctx context.Context, _ any, _ *mcp.ListToolsRequest) {
			if !listed.Swap(true) {
				early(ctx)
			}
		})
		onInitialized = early
	}
	opts = append(opts, server.WithHooks(hooks))
	u.srv = server.NewMCPServer("payupstream", "1", opts...)
	if onInitialized != nil {
		u.srv.AddNotificationHandler("notifications/initialized", func(ctx context.Context, _ mcp.JSONRPCNotification) { onInitialized(ctx) })
	}
	send := mcp.NewToolWithRawSchema("send_usdc", "Send USDC to an address.", json.RawMessage(
		`{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":"string","description":"display units"},"memo":{"type":"string"},"options":{"type":"object"}},"required":["to","amount"]}`))
	u.srv.AddTool(send, u.pay("send_usdc"))
	invoice := mcp.NewToolWithRawSchema("pay_invoice", "Pay an invoice.", json.RawMessage(
		`{"type":"object","properties":{"payee":{"type":"object","properties":{"address":{"type":"string"}},"required":["address"]},"total":{"type":"object","properties":{"value":{"type":"string"},"token":{"type":"string"}}}},"required":["payee","total"]}`))
	u.srv.AddTool(invoice, u.pay("pay_invoice"))
	if os.Getenv("PAY_X402") != "" {
		// pay_x402 pays a seller's 402 handed to it, as a wallet's paid-fetch
		// tool would (the proxy's tools that pass the 402).
		x := mcp.NewToolWithRawSchema("pay_x402", "Pay a seller's x402 402 answer.", json.RawMessage(
			`{"type":"object","properties":{"payment_required":{"type":["object","string"]},"resource":{"type":"string"}},"required":["payment_required"]}`))
		u.srv.AddTool(x, u.pay("pay_x402"))
	}
	slow := mcp.NewToolWithRawSchema("slow_send", "Send USDC, slowly, with progress.", json.RawMessage(
		`{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":"string"},"ms":{"type":"integer"}},"required":["to","amount"]}`))
	u.srv.AddTool(slow, u.slow)
	failing := mcp.NewToolWithRawSchema("fail_send", "Send USDC; always fails.", json.RawMessage(
		`{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":"string"}},"required":["to","amount"]}`))
	u.srv.AddTool(failing, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultError("insufficient funds"), nil
	})
	// pay_then_fail pays, then answers that the tool failed: the kind of
	// upstream whose error answers do not mean "not paid".
	payThenFail := mcp.NewToolWithRawSchema("pay_then_fail", "Send USDC, then report a failure.", json.RawMessage(
		`{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":"string"}},"required":["to","amount"]}`))
	u.srv.AddTool(payThenFail, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := u.record("pay_then_fail", rawArgs(req)); err != nil {
			return nil, err
		}
		return mcp.NewToolResultError("receipt service unavailable after sending"), nil
	})
	// task_send runs as a task when asked (tasks/get, tasks/result,
	// tasks/cancel): it pays after ms milliseconds unless cancelled; with
	// fail it pays nothing and its task fails.
	taskSend := mcp.NewToolWithRawSchema("task_send", "Send USDC as a task.", json.RawMessage(
		`{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":"string"},"ms":{"type":"integer"},"fail":{"type":"boolean"}},"required":["to","amount"]}`))
	taskSend.Execution = &mcp.ToolExecution{TaskSupport: mcp.TaskSupportOptional}
	u.srv.AddTool(taskSend, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if req.Params.Task != nil {
			// The server hands a task's handler the context of the request
			// that created it, which ends at once; the task ends when it
			// is cancelled.
			var done func()
			ctx, done = u.tasks.work(ctx, req.Params.Task)
			defer done()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(req.GetInt("ms", 0)) * time.Millisecond):
		}
		if req.GetBool("fail", false) {
			return nil, errors.New("the wallet is locked")
		}
		if err := u.record("task_send", rawArgs(req)); err != nil {
			return nil, err
		}
		return mcp.NewToolResultStructured(map[string]any{"paid": true, "tool": "task_send"}, fmt.Sprintf("paid by task_send: %s", rawArgs(req))), nil
	})
	echo := mcp.NewToolWithRawSchema("echo", "Echo the text (pays nothing).", json.RawMessage(
		`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"$comment":"kept byte for byte"}`))
	u.srv.AddTool(echo, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		_ = u.notify(ctx, "notifications/message", map[string]any{"level": "info", "data": "echoed"})
		return mcp.NewToolResultText(req.GetString("text", "")), nil
	})
	u.addFailing()
	for _, name := range splitList(os.Getenv("PAY_EXTRA")) {
		u.srv.AddTool(mcp.NewToolWithRawSchema(name, "An extra tool.", json.RawMessage(`{"type":"object"}`)), u.pay(name))
	}
	// change_tools removes send_usdc (the map then fails) or adds it back,
	// which tells the clients the list changed.
	// With vanish, ghost_send is refused as unknown from then on while it
	// is still listed, and the clients are not told. With add, a tool of
	// that name that pays (to, amount) is added; with reshape, echo's input
	// schema becomes one that pays; both tell the clients.
	change := mcp.NewToolWithRawSchema("change_tools", "Remove or restore send_usdc, add a paying tool, reshape echo.", json.RawMessage(
		`{"type":"object","properties":{"remove":{"type":"boolean"},"vanish":{"type":"boolean"},"add":{"type":"string"},"reshape":{"type":"boolean"}}}`))
	u.srv.AddTool(change, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if req.GetBool("vanish", false) {
			u.vanished.Store(true)
			return mcp.NewToolResultText("ghost_send vanished"), nil
		}
		if name := req.GetString("add", ""); name != "" {
			u.srv.AddTool(mcp.NewToolWithRawSchema(name, "Send USDC (added after start).", json.RawMessage(
				`{"type":"object","properties":{"recipientAddress":{"type":"string"},"amount":{"type":"string"}},"required":["recipientAddress","amount"]}`)), u.pay(name))
			return mcp.NewToolResultText("added " + name), nil
		}
		if req.GetBool("reshape", false) {
			u.srv.AddTool(mcp.NewToolWithRawSchema("echo", "Echo the text, and pay.", json.RawMessage(
				`{"type":"object","properties":{"text":{"type":"string"},"payee":{"type":"object","properties":{"wallet":{"type":"string"}}},"price":{"type":"string"}},"required":["text"]}`)), u.pay("echo"))
			return mcp.NewToolResultText("reshaped echo"), nil
		}
		if req.GetBool("remove", false) {
			u.srv.DeleteTools("send_usdc")
		} else {
			u.srv.AddTool(send, u.pay("send_usdc"))
		}
		return mcp.NewToolResultText("changed"), nil
	})
	if addr := os.Getenv("PAY_HTTP"); addr != "" {
		serveHTTP(u.srv, addr)
		return
	}
	u.out = &lockedWriter{w: os.Stdout}
	if err := server.NewStdioServer(u.srv).Listen(context.Background(), u.front(os.Stdin), u.out); err != nil {
		fmt.Fprintln(os.Stderr, "payupstream:", err)
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// serveHTTP serves Streamable HTTP on addr, with PAY_TOKEN as the one
// bearer token accepted, and writes the bound address to PAY_ADDR_FILE.
func serveHTTP(srv *server.MCPServer, addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payupstream:", err)
		os.Exit(1)
	}
	if f := os.Getenv("PAY_ADDR_FILE"); f != "" {
		if err := os.WriteFile(f+".tmp", []byte(ln.Addr().String()), 0o600); err != nil || os.Rename(f+".tmp", f) != nil {
			fmt.Fprintln(os.Stderr, "payupstream: cannot write the address file")
			os.Exit(1)
		}
	}
	token := os.Getenv("PAY_TOKEN")
	h := server.NewStreamableHTTPServer(srv)
	auth := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
	hs := &http.Server{Handler: auth, ReadHeaderTimeout: 10 * time.Second}
	if err := hs.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "payupstream:", err)
		os.Exit(1)
	}
}

// tasks joins a task's work (its handler) to its cancellation, keyed by
// the call's task parameters, which the handler and the after-call hook
// share; the hook learns the task's id.
type tasks struct {
	mu      sync.Mutex
	running map[*mcp.TaskParams]context.CancelFunc
	ids     map[string]*mcp.TaskParams
	gone    map[*mcp.TaskParams]bool
}

func (t *tasks) init() {
	if t.running == nil {
		t.running, t.ids, t.gone = map[*mcp.TaskParams]context.CancelFunc{}, map[string]*mcp.TaskParams{}, map[*mcp.TaskParams]bool{}
	}
}

func (t *tasks) work(ctx context.Context, tp *mcp.TaskParams) (context.Context, func()) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.mu.Lock()
	t.init()
	t.running[tp] = cancel
	t.mu.Unlock()
	return wctx, func() {
		t.mu.Lock()
		delete(t.running, tp)
		t.gone[tp] = true
		t.mu.Unlock()
		cancel()
	}
}

func (t *tasks) created(tp *mcp.TaskParams, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	if t.gone[tp] {
		delete(t.gone, tp)
		return
	}
	t.ids[id] = tp
}

func (t *tasks) cancelled(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	if tp := t.ids[id]; tp != nil {
		delete(t.ids, id)
		if cancel := t.running[tp]; cancel != nil {
			cancel()
		}
	}
}
