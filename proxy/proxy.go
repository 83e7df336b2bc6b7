// Package proxy puts the pre-payment guard in front of another MCP server.
// The upstream's tools are served unchanged beside this product's read
// tools; a call of a tool the guard map names as paying becomes one
// question to the decision engine (guard/engine) and is forwarded only when
// the engine allows it. The proxy decides nothing itself: it reads the
// question out of the call's arguments, asks, and records what became of
// the forwarded call.
package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/steptime"
	"github.com/haia-trace-mcp/haia-trace-mcp/server"
)

// DefaultCallTimeout bounds a forwarded call.
const DefaultCallTimeout = 2 * time.Minute

// Config is what a Proxy needs.
type Config struct {
	// Server serves this product's read tools; the upstream's tools are
	// added to it. Its guard must be enabled (get_review_status).
	Server *server.Server
	// Engine is the one decision engine every paying call is asked of.
	Engine *engine.Engine
	// Map is the guard map in force at start; Reload replaces it.
	Map *Map
	// MapFile and Upstream name the map's file and the upstream for the
	// operator (the state file `status` reads).
	MapFile, Upstream string
	// StateDir, when set, is the Trace root: the proxy writes what it
	// does with each upstream tool to its guard/ToolsStateFile.
	StateDir *confined.Dir
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// CallTimeout bounds a forwarded call (DefaultCallTimeout when 0).
	CallTimeout time.Duration
	Logger      *slog.Logger
	// AfterDecision, when set, is called after each paying call's
	// decision (a decision that read the Trace), once the call's answer is
	// made: the payment authorizer binds the Trace's settlements there
	// (payment.Authorizer.SettleFromTraceSeen), as after check_before_pay.
	AfterDecision func(ctx context.Context)
	// Stdio, when the proxy serves stdio, is its standard output: the
	// upstream's notifications are written through it directly, so that
	// they reach the caller in the order the upstream sent them, before
	// the result they preceded.
	Stdio *StdioOut
}

// Proxy serves an upstream's tools through the guard.
type Proxy struct {
	cfg Config
	up  *Upstream
	// attached is set (under attachMu) once Attach has read and served
	// the upstream; a changed list or a restart before that only sets
	// missed, and Attach reads everything once more before it returns.
	attachMu sync.Mutex
	attached bool
	missed   bool
	// tools, resources and prompts each read their list again after the
	// upstream says it changed: one read at a time, however many
	// notifications come meanwhile.
	tools, resources, prompts rereads

	mu sync.Mutex
	// gm is the guard map in force, read at mapReadAt.
	gm        *Map
	mapReadAt time.Time
	// known are the upstream's tools when the map was read, each with its
	// input schema's print (nil until the first tools/list after it was
	// read); a tool the map does not name and that is not known (or whose
	// schema changed) is new since newSince, and held (refused) under
	// "newTools": "refuse".
	known    map[string]string
	newSince map[string]time.Time
	held     map[string]bool
	// state is what was last written for `status`.
	state ToolsState
	// mapped are the paying tools as resolved against the upstream's
	// current tools/list; broken, when set, is why every upstream call is
	// refused (the map no longer matches the upstream).
	mapped   map[string]*resolved
	upstream []string
	broken   error

	syncMu sync.Mutex

	progress sync.Map // upstream progress token → progressRoute
	tokens   atomic.Int64

	// inflight are the forwarded calls waiting for the upstream (call
	// number → the caller's context), to find the host an upstream's
	// request is for.
	inflight sync.Map
	// extrasOnce declares, once, what the upstream offers besides tools;
	// caps is what it declared.
	extrasOnce sync.Once
	caps       mcp.ServerCapabilities
	// tasks joins a task's work to its cancellation (tasks.go).
	tasks taskLinks
	// listens bridges the hosts' subscriptions/listen streams (listen.go).
	listenMu sync.Mutex
	listens  listens
	// outcomes counts the outcome receipts still being signed after their
	// calls were answered (Drain).
	outcomes pending
}

// pending counts work started in the background, for Drain.
type pending struct {
	mu   sync.Mutex
	n    int
	idle *sync.Cond
}

func (w *pending) start() {
	w.mu.Lock()
	w.n++
	w.mu.Unlock()
}

func (w *pending) done() {
	w.mu.Lock()
	w.n--
	if w.n == 0 && w.idle != nil {
		w.idle.Broadcast()
	}
	w.mu.Unlock()
}

// wait returns once nothing started is still running.
func (w *pending) wait() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.idle == nil {
		w.idle = sync.NewCond(&w.mu)
	}
	for w.n > 0 {
		w.idle.Wait()
	}
}

// Drain waits until the outcome of every call already answered is
// recorded: the server calls it before it closes its store.
func (p *Proxy) Drain() { p.outcomes.wait() }

type progressRoute struct {
	ctx   context.Context
	token mcp.ProgressToken
	// stream is the caller's HTTP response (nil over stdio); from is how
	// many progress notifications it had written when the call began, and
	// sent how many of this call's the proxy has handed to mcp-go since.
	stream *server.Stream
	from   int64
	sent   atomic.Int64
}

// progressFlushWait bounds how long a call's result waits for its progress
// notifications to be written before it (server.Stream says why it waits).
const progressFlushWait = 250 * time.Millisecond

// New builds a proxy; Attach connects it to its upstream.
func New(cfg Config) (*Proxy, error) {
	if cfg.Server == nil || cfg.Engine == nil || cfg.Map == nil {
		return nil, errors.New("proxy: a server, an engine and a guard map are needed")
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Proxy{cfg: cfg, gm: cfg.Map, mapReadAt: cfg.Now()}, nil
}

// Notify passes on a notification the upstream sent (UpstreamConfig's
// OnNotification): progress to the caller whose call it concerns, a changed
// tool list after checking the map again, everything else to every client.
func (p *Proxy) Notify(n mcp.JSONRPCNotification) { p.onNotification(n) }

// Disconnected refuses every upstream call until the upstream is back and
// its tools have been checked again (UpstreamConfig's OnDisconnect).
func (p *Proxy) Disconnected(why error) {
	p.mu.Lock()
	p.broken = why
	st := p.state
	p.mu.Unlock()
	if st.WrittenAt != "" {
		st.Broken, st.WrittenAt = why.Error(), p.cfg.Now().UTC().Format(time.RFC3339Nano)
		p.writeState(st)
	}
}

// Reconnected reads a restarted upstream's tools again (UpstreamConfig's
// OnConnect).
func (p *Proxy) Reconnected() {
	if !p.ready() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Sync(ctx); err != nil {
		p.cfg.Logger.Error("the restarted upstream's tools do not match the guard map; every upstream call is refused until they do", "err", err)
	}
	if err := p.syncExtras(ctx, p.caps); err != nil {
		p.cfg.Logger.Error("the restarted upstream's resources or prompts could not be read", "err", err)
	}
}

// Attach reads the upstream's tools, checks the guard map against them
// and serves them. An error here stops the proxy's start.
func (p *Proxy) Attach(ctx context.Context, up *Upstream) error {
	p.up = up
	for pass := 1; ; pass++ {
		if err := p.Sync(ctx); err != nil {
			return err
		}
		if pass == 1 {
			if err := p.attachExtras(ctx); err != nil {
				return fmt.Errorf("the upstream's resources or prompts: %w", err)
			}
		} else if err := p.syncExtras(ctx, p.caps); err != nil {
			return fmt.Errorf("the upstream's resources or prompts: %w", err)
		}
		p.attachMu.Lock()
		again := p.missed
		p.missed = false
		if !again || pass == maxAttachPasses {
			p.attached = true
		}
		p.attachMu.Unlock()
		if !again {
			return nil
		}
		if pass == maxAttachPasses {
			// An upstream that keeps changing its lists: serve what was
			// read and read it again as after any later change.
			go p.Reconnected()
			return nil
		}
	}
}

// maxAttachPasses bounds how often Attach reads an upstream whose lists
// change while it reads them.
const maxAttachPasses = 3

// ready reports whether Attach is done; until it is, it notes that the
// upstream changed something Attach must read again.
func (p *Proxy) ready() bool {
	p.attachMu.Lock()
	defer p.attachMu.Unlock()
	if !p.attached {
		p.missed = true
	}
	return p.attached
}

// Sync reads the upstream's tools again, checks the map and the names, and
// updates what is served. When the check fails, every upstream call is
// refused (with the reason) until a later Sync succeeds. A tool the map
// does not name that the upstream did not list when the map was read (or
// whose input schema changed since) is new: refused until the map is
// re-read, unless the map says "newTools": "forward".
func (p *Proxy) Sync(ctx context.Context) error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	p.mu.Lock()
	gm := p.gm
	p.mu.Unlock()
	tools, schemas, mapped, err := p.check(ctx, gm)
	if tools == nil {
		p.mu.Lock()
		p.broken = fmt.Errorf("the upstream's tools no longer match the guard map (%w); the operator must fix the map or the upstream", err)
		p.mu.Unlock()
		return err
	}
	p.mu.Lock()
	if p.known == nil {
		p.known = schemaPrints(schemas)
	}
	prevHeld := p.held
	st := p.classify(gm, tools, schemas)
	if err != nil {
		p.broken = fmt.Errorf("the upstream's tools no longer match the guard map (%w); the operator must fix the map or the upstream", err)
		st.Broken = p.broken.Error()
	} else {
		p.mapped, p.broken = mapped, nil
	}
	p.state = st
	known := p.known
	p.mu.Unlock()
	// Serve what the upstream lists now (every call refused while broken),
	// so that clients hear the list changed.
	p.serve(tools)
	p.logTools(st, prevHeld, known)
	p.writeState(st)
	return err
}

// Reload puts a re-read guard map in force (on SIGHUP): it is checked
// against the upstream's tools as at start, and every tool listed now is
// known to it — no tool is new. When the check fails, the running map stays
// in force and the error says why.
func (p *Proxy) Reload(ctx context.Context, m *Map) error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	tools, schemas, mapped, err := p.check(ctx, m)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.gm, p.mapReadAt = m, p.cfg.Now()
	p.known, p.newSince, p.held = schemaPrints(schemas), nil, nil
	st := p.classify(m, tools, schemas)
	p.mapped, p.broken = mapped, nil
	p.state = st
	known := p.known
	p.mu.Unlock()
	p.serve(tools)
	p.cfg.Logger.Info("SIGHUP: the guard map was re-read; every tool the upstream lists now is known to it", "map", p.cfg.MapFile, "paying", len(mapped))
	p.logTools(st, nil, known)
	p.writeState(st)
	return nil
}

// classify says what the proxy does with each upstream tool, and notes the
// new ones (p.mu held).
func (p *Proxy) classify(gm *Map, tools []mcp.Tool, schemas map[string]json.RawMessage) ToolsState {
	now := p.cfg.Now()
	st := ToolsState{WrittenAt: now.UTC().Format(time.RFC3339Nano), PID: os.Getpid(), Upstream: p.cfg.Upstream, MapFile: p.cfg.MapFile,
		MapReadAt: p.mapReadAt.UTC().Format(time.RFC3339Nano), Unmapped: gm.Unmapped, NewTools: gm.NewTools, Tools: []ToolState{}}
	held, since := map[string]bool{}, map[string]time.Time{}
	for _, t := range tools {
		ts := ToolState{Name: t.Name}
		if _, ok := gm.Tools[t.Name]; ok {
			ts.Status = ToolPaying
			st.Tools = append(st.Tools, ts)
			continue
		}
		in := schemas[t.Name]
		ts.PaymentLike = paymentLike(t.Name, in)
		fresh := p.known[t.Name] != schemaPrint(in)
		if fresh {
			at, ok := p.newSince[t.Name]
			if !ok {
				at = now
			}
			since[t.Name] = at
			ts.NewSince = at.UTC().Format(time.RFC3339Nano)
		}
		switch {
		case gm.Unmapped == UnmappedRefuse:
			ts.Status = ToolRefusedUnmapped
		case fresh && gm.NewTools == NewToolsRefuse:
			ts.Status = ToolRefusedNew
			held[t.Name] = true
		case fresh:
			ts.Status = ToolForwardedNew
		default:
			ts.Status = ToolForwarded
		}
		st.Tools = append(st.Tools, ts)
	}
	p.held, p.newSince = held, since
	return st
}

// logTools tells the operator which upstream tools the map does not name,
// which of them are refused as new, and which look like payments.
func (p *Proxy) logTools(st ToolsState, prevHeld map[string]bool, known map[string]string) {
	l := p.cfg.Logger
	var paying, forwarded, refused []string
	for _, t := range st.Tools {
		switch t.Status {
		case ToolPaying:
			paying = append(paying, t.Name)
		case ToolForwarded, ToolForwardedNew:
			forwarded = append(forwarded, t.Name)
		default:
			refused = append(refused, t.Name)
		}
		switch {
		case t.Status == ToolRefusedNew && !prevHeld[t.Name]:
			what := "the upstream added a tool the guard map does not name after the map was read"
			if _, ok := known[t.Name]; ok {
				what = "the input schema of an upstream tool the guard map does not name changed after the map was read"
			}
			l.Warn(what+"; it is refused until the map names it or is re-read (SIGHUP)", "tool", t.Name, "looks_like_payment", t.PaymentLike)
		case t.Status == ToolForwardedNew && t.PaymentLike != "":
			l.Warn("the upstream added a tool the guard map does not name that looks like a payment; it is forwarded unchecked (newTools: forward)", "tool", t.Name, "looks_like_payment", t.PaymentLike)
		case t.Status == ToolForwarded && t.PaymentLike != "":
			l.Warn("an upstream tool the guard map does not name looks like a payment; it is forwarded unchecked (unmapped: forward)", "tool", t.Name, "looks_like_payment", t.PaymentLike)
		case t.Status == ToolRefusedUnmapped && t.PaymentLike != "":
			l.Info("an upstream tool the guard map does not name looks like a payment; it is refused (unmapped: refuse)", "tool", t.Name, "looks_like_payment", t.PaymentLike)
		}
	}
	l.Info("upstream tools served", "tools", len(st.Tools), "paying", strings.Join(paying, ","), "forwarded_unchecked", strings.Join(forwarded, ","),
		"refused", strings.Join(refused, ","), "unmapped", st.Unmapped, "new_tools", st.NewTools)
}

func schemaPrints(schemas map[string]json.RawMessage) map[string]string {
	out := make(map[string]string, len(schemas))
	for name, in := range schemas {
		out[name] = schemaPrint(in)
	}
	return out
}

// serve makes the served upstream tools the given ones.
func (p *Proxy) serve(tools []mcp.Tool) {
	var names []string
	var add []mcpserver.ServerTool
	for _, t := range tools {
		names = append(names, t.Name)
		add = append(add, mcpserver.ServerTool{Tool: t, Handler: p.handler(t.Name)})
	}
	p.mu.Lock()
	var gone []string
	for _, n := range p.upstream {
		if !slices.Contains(names, n) {
			gone = append(gone, n)
		}
	}
	p.upstream = names
	p.mu.Unlock()
	srv := p.cfg.Server.MCP()
	if len(gone) > 0 {
		srv.DeleteTools(gone...)
	}
	srv.AddTools(add...)
}

// check reads the upstream's tools and resolves gm's paying tools against
// them. tools and schemas are nil when the list could not be read; mapped
// is nil when gm does not match it.
func (p *Proxy) check(ctx context.Context, gm *Map) (tools []mcp.Tool, schemas map[string]json.RawMessage, mapped map[string]*resolved, err error) {
	raws, err := p.up.ListTools(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	own := p.cfg.Server.OwnToolNames()
	pol := p.cfg.Engine.Policy()
	schemas = map[string]json.RawMessage{}
	for i, raw := range raws {
		t, in, err := upstreamTool(raw)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("upstream tool #%d: %w", i, err)
		}
		if slices.Contains(own, t.Name) {
			return nil, nil, nil, fmt.Errorf("the upstream's tool %q has the name of one of this product's tools (%s); the proxy refuses to shadow either", t.Name, strings.Join(own, ", "))
		}
		if _, dup := schemas[t.Name]; dup {
			return nil, nil, nil, fmt.Errorf("the upstream lists tool %q twice", t.Name)
		}
		schemas[t.Name] = in
		tools = append(tools, t)
	}
	mapped = map[string]*resolved{}
	for name, tm := range gm.Tools {
		in, ok := schemas[name]
		if !ok {
			return tools, schemas, nil, fmt.Errorf("the guard map names tool %q, which the upstream does not list (it lists %d tools)", name, len(tools))
		}
		r, err := tm.resolve(name, in, pol)
		if err != nil {
			return tools, schemas, nil, fmt.Errorf("guard map: %w", err)
		}
		mapped[name] = r
	}
	return tools, schemas, mapped, nil
}

// upstreamTool reads a tool as the upstream listed it; its input and
// output schemas are kept byte for byte.
func upstreamTool(raw json.RawMessage) (mcp.Tool, json.RawMessage, error) {
	var t mcp.Tool
	if err := json.Unmarshal(raw, &t); err != nil {
		return mcp.Tool{}, nil, err
	}
	var schemas struct {
		In  json.RawMessage `json:"inputSchema"`
		Out json.RawMessage `json:"outputSchema"`
	}
	if err := json.Unmarshal(raw, &schemas); err != nil {
		return mcp.Tool{}, nil, err
	}
	if t.Name == "" {
		return mcp.Tool{}, nil, errors.New("a tool without a name")
	}
	if len(schemas.In) == 0 || string(schemas.In) == "null" {
		return mcp.Tool{}, nil, fmt.Errorf("tool %q has no input schema", t.Name)
	}
	t.InputSchema = mcp.ToolInputSchema{}
	t.RawInputSchema = schemas.In
	t.OutputSchema = mcp.ToolOutputSchema{}
	if len(schemas.Out) > 0 && string(schemas.Out) != "null" {
		t.RawOutputSchema = schemas.Out
	}
	return t, schemas.In, nil
}

// Decision is the structured content of a call the guard did not let
// through.
type Decision struct {
	Decision  string         `json:"decision"`
	Reasons   []guard.Reason `json:"reasons"`
	ReviewID  string         `json:"review_id,omitempty"`
	ReceiptID string         `json:"receipt_id"`
	Tool      string         `json:"tool"`
	Forwarded bool           `json:"forwarded"`
}

func (p *Proxy) handler(name string) mcpserver.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		p.cfg.Stdio.markReady()
		if req.Params.Task != nil {
			// A task's work outlives the request that created it.
			var done func()
			ctx, done = p.taskContext(ctx, req.Params.Task)
			defer done()
		}
		p.mu.Lock()
		broken, r, gm, held := p.broken, p.mapped[name], p.gm, p.held[name]
		p.mu.Unlock()
		if broken != nil {
			return toolError("%s was not forwarded: %s", name, broken), nil
		}
		raw := []byte(req.Params.RawArguments)
		if len(raw) == 0 && req.Params.Arguments != nil {
			if r != nil {
				// A paying call is read from the client's own bytes only.
				return toolError("the arguments of paying tool %s did not arrive as JSON text, so they cannot be read exactly; nothing was forwarded", name), nil
			}
			b, err := json.Marshal(req.Params.Arguments)
			if err != nil {
				return toolError("the arguments of %s cannot be read", name), nil
			}
			raw = b
		}
		if r == nil {
			if gm.Unmapped == UnmappedRefuse {
				return toolError("%s is not in the guard map and the map refuses every tool it does not name (unmapped: refuse); nothing was forwarded", name), nil
			}
			if held {
				p.cfg.Logger.Warn("a call of a tool the upstream added after the guard map was read was refused", "tool", name, "caller", p.cfg.Server.CallerID(ctx))
				return toolError("%s was added by the upstream (or its input schema changed) after the guard map was read, and is refused until the operator names it in the map or re-reads the map (SIGHUP); nothing was forwarded", name), nil
			}
			if len(raw) == 0 {
				raw = []byte("{}")
			}
			return p.forward(ctx, req, name, raw)
		}
		return p.paying(ctx, req, name, r, raw)
	}
}

func (p *Proxy) paying(ctx context.Context, req mcp.CallToolRequest, name string, r *resolved, raw []byte) (*mcp.CallToolResult, error) {
	// At debug level the time of each step is logged (see
	// docs/performance.md): the proxy's own share of a paying call.
	clock := steptime.Start(ctx, p.cfg.Logger)
	caller := p.cfg.Server.CallerID(ctx)
	q, canon, err := r.read(raw, p.cfg.Engine.Policy().For(caller), p.cfg.Now())
	if err != nil {
		var ae *ArgError
		if errors.As(err, &ae) {
			p.cfg.Logger.Info("paying call refused", "tool", name, "caller", caller, "reason", ae.Msg)
			return mcp.NewToolResultError(ae.Msg), nil
		}
		return nil, err
	}
	clock.Step("read")
	ans, err := p.cfg.Engine.CheckCall(ctx, caller, q, engine.Call{Tool: name, Arguments: canon})
	clock.Step("decide")
	if err == nil && p.cfg.AfterDecision != nil {
		defer p.cfg.AfterDecision(context.WithoutCancel(ctx))
	}
	if err != nil {
		var refused *engine.RefusedError
		var notRecorded *engine.NotRecordedError
		switch {
		case errors.As(err, &refused):
			return toolError("%s was not forwarded: %s", name, refused.Message), nil
		case errors.As(err, &notRecorded):
			return toolError("%s was not forwarded: %s", name, notRecorded.Message), nil
		}
		p.cfg.Logger.Error("paying call: the engine failed", "tool", name, "err", err)
		return toolError("%s was not forwarded: the guard could not decide; the operator's log says why", name), nil
	}
	if ans.Decision != guard.Allow {
		d := Decision{Decision: ans.Decision, Reasons: ans.Reasons, ReviewID: ans.ReviewID, ReceiptID: ans.ReceiptID, Tool: name}
		res := mcp.NewToolResultStructured(d, renderDecision(d))
		res.IsError = true
		return res, nil
	}
	res, outcome, err := p.call(ctx, req, name, canon)
	clock.Step("forward")
	if outcome == engine.OutcomeToolError && r.m.Errors != ErrorsUnpaid {
		// Only the operator can say a tool's error means "not paid".
		outcome = engine.OutcomeToolErrorUnknown
	}
	record := func(ctx context.Context) {
		if rec, rerr := p.cfg.Engine.RecordOutcome(ctx, caller, ans, outcome); rerr != nil {
			p.cfg.Logger.Error("the outcome of a forwarded call could not be recorded", "tool", name, "decision_receipt", ans.ReceiptID, "outcome", string(outcome), "err", rerr)
		} else if rec.Released {
			p.cfg.Logger.Info("the upstream did not carry out the call: its reservation is released", "tool", name, "decision_receipt", ans.ReceiptID, "outcome_receipt", rec.ReceiptID)
		}
	}
	if outcome.Settled() {
		// The release of what the allow committed is in force before the
		// caller hears the call was not run, so that its next call is
		// judged without it.
		record(context.WithoutCancel(ctx))
	} else {
		// Any other outcome changes no commitment: the allow's spend entry
		// counts for its whole window whatever is recorded after it, and a
		// crash before the outcome's receipt leaves it counted just the
		// same. So the receipt is signed after the answer is handed back,
		// not before; Drain waits for it at shutdown.
		p.outcomes.start()
		go func() {
			defer p.outcomes.done()
			record(context.WithoutCancel(ctx))
		}()
	}
	clock.Step("record_outcome")
	clock.Log(ctx, p.cfg.Logger, "paying call steps", "tool", name, "decision_receipt", ans.ReceiptID, "outcome", string(outcome))
	if err != nil {
		return toolError("%s was allowed (receipt %s) and forwarded, but %s", name, ans.ReceiptID, describeFailure(outcome, err)), nil
	}
	return res, nil
}

// forward passes an unmapped call through untouched.
func (p *Proxy) forward(ctx context.Context, req mcp.CallToolRequest, name string, raw []byte) (*mcp.CallToolResult, error) {
	res, outcome, err := p.call(ctx, req, name, raw)
	if err != nil {
		return toolError("%s: %s", name, describeFailure(outcome, err)), nil
	}
	return res, nil
}

// call forwards one call with the caller's progress token routed back to it.
func (p *Proxy) call(ctx context.Context, req mcp.CallToolRequest, name string, args []byte) (*mcp.CallToolResult, engine.Outcome, error) {
	var meta *mcp.Meta
	if m := req.Params.Meta; m != nil {
		// The caller's own _meta passes on; the protocol's keys belong to
		// the caller's connection, and the upstream connection has its own.
		meta = &mcp.Meta{AdditionalFields: map[string]any{}}
		for k, v := range m.AdditionalFields {
			if !strings.HasPrefix(k, "io.modelcontextprotocol/") {
				meta.AdditionalFields[k] = v
			}
		}
		if m.ProgressToken != nil {
			tok := "haia-proxy-" + strconv.FormatInt(p.tokens.Add(1), 10)
			route := &progressRoute{ctx: ctx, token: m.ProgressToken, stream: server.StreamFrom(ctx)}
			if route.stream != nil {
				route.from = route.stream.Progress()
			}
			p.progress.Store(tok, route)
			defer func() {
				// The upstream's notifications all came before its result;
				// the result leaves only once they are out to the caller.
				if n := route.sent.Load(); route.stream != nil && n > 0 {
					route.stream.WaitProgress(ctx, route.from+n, progressFlushWait)
				}
				p.progress.Delete(tok)
			}()
			meta.ProgressToken = tok
		}
	}
	id := p.tokens.Add(1)
	p.inflight.Store(id, ctx)
	defer p.inflight.Delete(id)
	if req.Params.Task != nil {
		return p.callTask(ctx, name, args, meta, req.Params.Task)
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	defer cancel()
	res, err := p.up.CallTool(cctx, name, args, meta)
	switch {
	case err == nil && res.IsError:
		return res, engine.OutcomeToolError, nil
	case err == nil:
		return res, engine.OutcomeExecuted, nil
	}
	o := failure(ctx, cctx, err)
	if !errors.Is(err, ErrUpstreamDown) && ctx.Err() != nil {
		err = fmt.Errorf("the caller cancelled the call: %w", ctx.Err())
	}
	return nil, o, err
}

// failure is the outcome of a request to the upstream that had no answer
// but an error. Only what proves the call was not run releases what its
// allow reserved (OutcomeRefused): a request never sent, or an answer that
// refuses it before any handler ran (notRunCodes). Every other error keeps
// it: a JSON-RPC error of another code (OutcomeErrorUnknown: an internal
// error, a server-defined or application code, a handler that threw after
// it paid), the call's time running out (OutcomeTimeout), the upstream
// going away, the connection breaking or the caller cancelling
// (OutcomeLost).
func failure(ctx, cctx context.Context, err error) engine.Outcome {
	switch {
	case errors.Is(err, ErrNotSent):
		return engine.OutcomeRefused
	case errors.Is(err, ErrUpstreamDown):
		return engine.OutcomeLost
	case ctx.Err() != nil:
		return engine.OutcomeLost
	case cctx.Err() != nil:
		return engine.OutcomeTimeout
	}
	var ue *UpstreamError
	if errors.As(err, &ue) {
		if provesNotRun(ue) {
			return engine.OutcomeRefused
		}
		return engine.OutcomeErrorUnknown
	}
	// Anything else went wrong on the way (the client's transport.Error, a
	// request that could not be written or whose answer never came).
	return engine.OutcomeLost
}

// notRunCodes are the JSON-RPC error codes with which a server refuses a
// request before any handler runs it: a request it could not parse or
// read, a method or tool it does not know (the official Go SDK answers an
// unknown tool -32602 "unknown tool", mcp-go -32602 "tool not found"),
// arguments its SDK refused before calling the handler. A server that
// answers one of these after its handler ran breaks JSON-RPC; that is the
// one answer the proxy takes on the upstream's word.
var notRunCodes = map[int]string{
	mcp.PARSE_ERROR:      "parse error",
	mcp.INVALID_REQUEST:  "invalid request",
	mcp.METHOD_NOT_FOUND: "method or tool not found",
	mcp.INVALID_PARAMS:   "invalid params",
}

// provesNotRun reports whether an upstream's JSON-RPC error answer proves
// it did not run the request.
func provesNotRun(ue *UpstreamError) bool {
	if ue.CodeUnread {
		return false
	}
	_, ok := notRunCodes[ue.Code]
	return ok
}

func describeFailure(o engine.Outcome, err error) string {
	switch o {
	case engine.OutcomeTimeout:
		return "the upstream did not answer in time; it may still carry the call out"
	case engine.OutcomeLost:
		var ne *NotExactError
		if errors.As(err, &ne) {
			return ne.Error() + "; whether it carried the call out is unknown"
		}
		if errors.Is(err, ErrUpstreamDown) {
			return "the upstream is not available (" + err.Error() + "); whether it carried the call out is unknown"
		}
		return "the call ended without an answer (" + err.Error() + "); whether the upstream carried it out is unknown"
	case engine.OutcomeRefused:
		if errors.Is(err, ErrNotSent) {
			return "it was not sent: " + err.Error()
		}
		return "the upstream refused it before running it: " + err.Error()
	case engine.OutcomeErrorUnknown:
		return "the upstream answered with an error (" + err.Error() + "); whether it carried the call out is unknown"
	}
	return err.Error()
}

func toolError(format string, a ...any) *mcp.CallToolResult {
	return mcp.NewToolResultError(fmt.Sprintf(format, a...))
}

func renderDecision(d Decision) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Not forwarded: the guard's decision on this %s call is %s", d.Tool, strings.ToUpper(d.Decision))
	if d.ReviewID != "" && d.Decision == guard.Review {
		fmt.Fprintf(&b, " (review %s waits for a human; once approved, the identical call goes through once — poll get_review_status)", d.ReviewID)
	}
	b.WriteString(".\n")
	for _, r := range d.Reasons {
		fmt.Fprintf(&b, "- %s: %s\n", r.Rule, r.Detail)
	}
	fmt.Fprintf(&b, "Recorded as signed receipt %s.\n", d.ReceiptID)
	return b.String()
}

// onNotification passes the upstream's notifications on: progress to the
// caller whose call it concerns, a changed tool list after checking the map
// again, and everything else to every client.
func (p *Proxy) onNotification(n mcp.JSONRPCNotification) {
	params := map[string]any{}
	for k, v := range n.Params.AdditionalFields {
		params[k] = v
	}
	if n.Params.Meta != nil {
		params["_meta"] = n.Params.Meta
	}
	srv := p.cfg.Server.MCP()
	switch n.Method {
	case string(mcp.MethodNotificationResourcesListChanged), string(mcp.MethodNotificationPromptsListChanged), string(mcp.MethodNotificationToolsListChanged):
		// A list changed while Attach reads the upstream (one that adds
		// tools once it knows its client, as server-everything does) is
		// read again by Attach itself.
		if !p.ready() {
			return
		}
	}
	switch n.Method {
	case string(mcp.MethodNotificationProgress):
		tok, _ := params["progressToken"].(string)
		v, ok := p.progress.Load(tok)
		if !ok {
			return
		}
		route := v.(*progressRoute)
		params["progressToken"] = route.token
		if p.cfg.Stdio != nil {
			if _, err := p.cfg.Stdio.notify(n.Method, params, true); err != nil {
				p.cfg.Logger.Debug("progress not passed on", "err", err)
			}
			return
		}
		if err := srv.SendNotificationToClient(route.ctx, n.Method, params); err != nil {
			p.cfg.Logger.Debug("progress not passed on", "err", err)
			return
		}
		route.sent.Add(1)
	case string(mcp.MethodNotificationResourcesListChanged):
		// The server tells its clients once the list is served again.
		p.resync(&p.resources, "resources", func(ctx context.Context) error {
			return errors.Join(p.syncResources(ctx), p.syncTemplates(ctx))
		})
	case string(mcp.MethodNotificationPromptsListChanged):
		p.resync(&p.prompts, "prompts", p.syncPrompts)
	case string(mcp.MethodNotificationToolsListChanged):
		p.tools.run(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := p.Sync(ctx); err != nil {
				p.cfg.Logger.Error("the upstream's changed tools do not match the guard map; every upstream call is refused until they do", "err", err)
			}
		})
	case mcp.MethodNotificationResourceUpdated:
		// On the listen streams that name the resource; below, to the
		// session-protocol clients as every other notification.
		p.updated(params)
		p.broadcast(n.Method, params)
	case mcp.MethodNotificationTasksStatus:
		// It names the upstream's task; the host knows only the proxy's,
		// whose own status notifications the proxy's server sends.
		return
	default:
		p.broadcast(n.Method, params)
	}
}

// broadcast passes a notification of the upstream to every client (a
// session with a listen stream open receives only what it opted in to).
func (p *Proxy) broadcast(method string, params map[string]any) {
	if p.cfg.Stdio != nil {
		// A client of protocol 2026-07-28 receives, outside its listen
		// streams, what the upstream sends while one of its calls is in
		// flight (over stdio there is one client; the session protocol
		// does not say which call a notification is for, so it is taken
		// for the call's), never a resource update it did not name on a
		// stream.
		inCall := p.cfg.Stdio.isModern() && p.InFlight() && method != mcp.MethodNotificationResourceUpdated
		if _, err := p.cfg.Stdio.notify(method, params, inCall); err != nil {
			p.cfg.Logger.Debug("notification not passed on", "method", method, "err", err)
		}
		return
	}
	// The server leaves out the listen streams that did not opt in.
	p.cfg.Server.MCP().SendNotificationToAllClients(method, params)
}
