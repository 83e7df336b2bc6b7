package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// What the upstream offers besides tools passes through unchanged: its
// resources, resource templates and prompts are served as it lists them and
// read from it on every request; completions, the logging level and
// resource subscriptions are forwarded; its requests to the client
// (sampling, elicitation, roots) are put to the host whose call is in
// flight. None of these moves money: only tools can be mapped as paying.

// attachExtras declares, on the proxy's server, what the upstream declared
// besides tools (once), and reads its resources, templates and prompts.
func (p *Proxy) attachExtras(ctx context.Context) error {
	caps, err := p.up.Capabilities()
	if err != nil {
		return err
	}
	p.extrasOnce.Do(func() { p.declare(caps) })
	return p.syncExtras(ctx, caps)
}

// declare sets the server's capabilities and hooks for what the upstream
// offers. It runs before the server serves anyone.
func (p *Proxy) declare(caps mcp.ServerCapabilities) {
	srv := p.cfg.Server.MCP()
	p.caps = caps
	if caps.Resources != nil {
		mcpserver.WithResourceCapabilities(caps.Resources.Subscribe, true)(srv)
	}
	if caps.Prompts != nil {
		mcpserver.WithPromptCapabilities(true)(srv)
	}
	if caps.Completions != nil {
		mcpserver.WithCompletions()(srv)
		mcpserver.WithPromptCompletionProvider(completer{p})(srv)
		mcpserver.WithResourceCompletionProvider(completer{p})(srv)
	}
	taskHooks := false
	if t := caps.Tasks; t != nil && t.Requests != nil && t.Requests.Tools != nil && t.Requests.Tools.Call != nil {
		// A task-augmented call of an upstream tool that declares task
		// support runs as a task of the proxy's server (tasks.go); tasks
		// are listed and cancelled there.
		mcpserver.WithTaskCapabilities(true, true, true)(srv)
		taskHooks = true
	}
	// The upstream's requests to its client are sent to the host as
	// requests of the server, as the session protocol has them.
	//lint:ignore SA1019 the upstream speaks the session protocol; its requests reach the host the same way
	mcpserver.WithLegacyServerInitiatedRequests()(srv)
	hooks := srv.GetHooks()
	if hooks == nil {
		hooks = &mcpserver.Hooks{}
		mcpserver.WithHooks(hooks)(srv)
	}
	if taskHooks {
		hooks.AddAfterCallTool(func(_ context.Context, _ any, m *mcp.CallToolRequest, result any) {
			if cr, ok := result.(*mcp.CreateTaskResult); ok && m.Params.Task != nil {
				p.taskCreated(m.Params.Task, cr.Task.TaskId)
			}
		})
		hooks.AddAfterCancelTask(func(_ context.Context, _ any, m *mcp.CancelTaskRequest, _ *mcp.CancelTaskResult) {
			p.taskCancelled(m.Params.TaskId)
		})
	}
	if caps.Logging != nil {
		// The upstream has one level: the last client to set one sets it.
		hooks.AddAfterSetLevel(func(ctx context.Context, _ any, m *mcp.SetLevelRequest, _ *mcp.EmptyResult) {
			p.forwardAside(ctx, "logging/setLevel", map[string]any{"level": m.Params.Level})
		})
	}
	if caps.Resources != nil && caps.Resources.Subscribe {
		hooks.AddAfterSubscribe(func(ctx context.Context, _ any, m *mcp.SubscribeRequest, _ *mcp.EmptyResult) {
			p.legacySubscribe(ctx, m.Params.URI, true)
		})
		hooks.AddAfterUnsubscribe(func(ctx context.Context, _ any, m *mcp.UnsubscribeRequest, _ *mcp.EmptyResult) {
			p.legacySubscribe(ctx, m.Params.URI, false)
		})
		// Protocol 2026-07-28: the resources a listen stream names.
		hooks.AddBeforeSubscriptionsListen(func(ctx context.Context, id any, m *mcp.SubscriptionsListenRequest) {
			p.listen(ctx, id, m.Params.Notifications.ResourceSubscriptions)
		})
	}
	if p.cfg.Stdio != nil {
		srv.AddNotificationHandler(string(mcp.MethodNotificationInitialized), p.cfg.Stdio.initialized)
		hooks.AddBeforeAny(p.cfg.Stdio.request)
	}
	srv.AddNotificationHandler(string(mcp.MethodNotificationRootsListChanged), func(ctx context.Context, _ mcp.JSONRPCNotification) {
		if err := p.up.Notify(context.WithoutCancel(ctx), string(mcp.MethodNotificationRootsListChanged), nil); err != nil {
			p.cfg.Logger.Warn("the client's roots/list_changed did not reach the upstream", "err", err)
		}
	})
}

// forwardAside sends the upstream a request whose answer the client has
// already had from the proxy's server (a level set, a subscription); a
// failure is logged.
func (p *Proxy) forwardAside(ctx context.Context, method string, params map[string]any) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := p.up.Request(ctx, method, params); err != nil {
		p.cfg.Logger.Warn("forwarded to the upstream, which refused", "method", method, "err", err)
	}
}

// syncExtras serves the upstream's resources, templates and prompts as it
// lists them now.
func (p *Proxy) syncExtras(ctx context.Context, caps mcp.ServerCapabilities) error {
	var errs []error
	if caps.Resources != nil {
		errs = append(errs, p.syncResources(ctx), p.syncTemplates(ctx))
	}
	if caps.Prompts != nil {
		errs = append(errs, p.syncPrompts(ctx))
	}
	return errors.Join(errs...)
}

func (p *Proxy) syncResources(ctx context.Context) error {
	raws, err := p.up.ListAll(ctx, string(mcp.MethodResourcesList), "resources")
	if err != nil {
		return err
	}
	var list []mcpserver.ServerResource
	for i, raw := range raws {
		var r mcp.Resource
		if err := json.Unmarshal(raw, &r); err != nil || r.URI == "" {
			return fmt.Errorf("upstream resource #%d is not a resource", i)
		}
		list = append(list, mcpserver.ServerResource{Resource: r, Handler: p.readResource})
	}
	p.cfg.Server.MCP().SetResources(list...)
	return nil
}

func (p *Proxy) syncTemplates(ctx context.Context) error {
	raws, err := p.up.ListAll(ctx, string(mcp.MethodResourcesTemplatesList), "resourceTemplates")
	if err != nil {
		return err
	}
	var list []mcpserver.ServerResourceTemplate
	for i, raw := range raws {
		var t mcp.ResourceTemplate
		if err := json.Unmarshal(raw, &t); err != nil || t.URITemplate == nil {
			return fmt.Errorf("upstream resource template #%d is not a template", i)
		}
		list = append(list, mcpserver.ServerResourceTemplate{Template: t, Handler: p.readResource})
	}
	p.cfg.Server.MCP().SetResourceTemplates(list...)
	return nil
}

func (p *Proxy) syncPrompts(ctx context.Context) error {
	raws, err := p.up.ListAll(ctx, string(mcp.MethodPromptsList), "prompts")
	if err != nil {
		return err
	}
	var list []mcpserver.ServerPrompt
	for i, raw := range raws {
		var pr mcp.Prompt
		if err := json.Unmarshal(raw, &pr); err != nil || pr.Name == "" {
			return fmt.Errorf("upstream prompt #%d is not a prompt", i)
		}
		list = append(list, mcpserver.ServerPrompt{Prompt: pr, Handler: p.getPrompt})
	}
	p.cfg.Server.MCP().SetPrompts(list...)
	return nil
}

// resync reads a changed list again (a list_changed of the upstream).
func (p *Proxy) resync(r *rereads, what string, fn func(context.Context) error) {
	r.run(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := fn(ctx); err != nil {
			p.cfg.Logger.Error("the upstream's changed list could not be read", "list", what, "err", err)
		}
	})
}

// rereads runs a list's re-read on a goroutine of its own, one at a time:
// a notification that comes while one runs has it run once more after,
// so an upstream that sends a flood of list_changed costs one goroutine
// and at most one read behind the last notification, not one each.
type rereads struct {
	mu      sync.Mutex
	running bool
	again   bool
}

func (r *rereads) run(read func()) {
	r.mu.Lock()
	if r.running {
		r.again = true
		r.mu.Unlock()
		return
	}
	r.running = true
	r.mu.Unlock()
	go func() {
		for {
			read()
			r.mu.Lock()
			if !r.again {
				r.running = false
				r.mu.Unlock()
				return
			}
			r.again = false
			r.mu.Unlock()
		}
	}()
}

func (p *Proxy) readResource(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	p.cfg.Stdio.markReady()
	raw, err := p.up.Request(ctx, string(mcp.MethodResourcesRead), map[string]any{"uri": req.Params.URI})
	if err != nil {
		return nil, err
	}
	res, err := mcp.ParseReadResourceResult(&raw)
	if err != nil {
		return nil, fmt.Errorf("the upstream's resources/read answer cannot be read: %w", err)
	}
	return res.Contents, nil
}

func (p *Proxy) getPrompt(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	p.cfg.Stdio.markReady()
	params := map[string]any{"name": req.Params.Name}
	if req.Params.Arguments != nil {
		params["arguments"] = req.Params.Arguments
	}
	raw, err := p.up.Request(ctx, string(mcp.MethodPromptsGet), params)
	if err != nil {
		return nil, err
	}
	res, err := mcp.ParseGetPromptResult(&raw)
	if err != nil {
		return nil, fmt.Errorf("the upstream's prompts/get answer cannot be read: %w", err)
	}
	return res, nil
}

// completer forwards completion/complete.
type completer struct{ p *Proxy }

func (c completer) CompletePromptArgument(ctx context.Context, name string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	return c.p.complete(ctx, map[string]any{"type": "ref/prompt", "name": name}, arg, cc)
}

func (c completer) CompleteResourceArgument(ctx context.Context, uri string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	return c.p.complete(ctx, map[string]any{"type": "ref/resource", "uri": uri}, arg, cc)
}

func (p *Proxy) complete(ctx context.Context, ref map[string]any, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	params := map[string]any{"ref": ref, "argument": arg}
	if len(cc.Arguments) > 0 {
		params["context"] = cc
	}
	raw, err := p.up.Request(ctx, string(mcp.MethodCompletionComplete), params)
	if err != nil {
		return nil, err
	}
	var res struct {
		Completion mcp.Completion `json:"completion"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("the upstream's completion answer cannot be read: %w", err)
	}
	return &res.Completion, nil
}

// The upstream's requests to its client are put to a host: the one whose
// call is in flight — over stdio, the one client.

// errNoHost is the answer to an upstream that asks when no single host can
// be told apart as the one its request is for.
var errNoHost = errors.New("the guard proxy cannot tell which client this request is for (no call of one client is in flight), so it asks none")

// host is a context that reaches the client the upstream's request is for:
// the client of the calls in flight when they are all one client's, else
// (over stdio) the one client; ok is false when there is none or several.
func (p *Proxy) host(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	var found context.Context
	id, several := "", false
	p.inflight.Range(func(_, v any) bool {
		c := v.(context.Context)
		s := mcpserver.ClientSessionFromContext(c)
		if s == nil {
			return true
		}
		if found != nil && s.SessionID() != id {
			several = true
			return false
		}
		found, id = c, s.SessionID()
		return true
	})
	if several {
		return nil, nil, false
	}
	if found == nil && p.cfg.Stdio != nil {
		if s := p.cfg.Stdio.client(); s != nil {
			found = p.cfg.Server.MCP().WithContext(context.Background(), s)
		}
	}
	if found == nil {
		return nil, nil, false
	}
	// The host's session, for as long as the upstream waits.
	hctx, cancel := context.WithCancel(context.WithoutCancel(found))
	stop := context.AfterFunc(ctx, cancel)
	return hctx, func() { stop(); cancel() }, true
}

// InFlight reports whether a forwarded call is waiting for the upstream.
func (p *Proxy) InFlight() bool {
	waiting := false
	p.inflight.Range(func(_, _ any) bool { waiting = true; return false })
	return waiting
}

// CreateMessage puts the upstream's sampling request to the host.
func (p *Proxy) CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	hctx, done, ok := p.host(ctx)
	if !ok {
		return nil, errNoHost
	}
	defer done()
	//lint:ignore SA1019 the upstream speaks the session protocol, whose sampling passes through
	return p.cfg.Server.MCP().RequestSampling(hctx, req)
}

// Elicit puts the upstream's elicitation request to the host.
func (p *Proxy) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	hctx, done, ok := p.host(ctx)
	if !ok {
		return nil, errNoHost
	}
	defer done()
	return p.cfg.Server.MCP().RequestElicitation(hctx, req)
}

// ListRoots puts the upstream's roots/list request to the host.
func (p *Proxy) ListRoots(ctx context.Context, req mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
	hctx, done, ok := p.host(ctx)
	if !ok {
		return nil, errNoHost
	}
	defer done()
	return p.cfg.Server.MCP().RequestRoots(hctx, req)
}

// Group is the proxies (one per tenant) in front of one upstream: it hears
// the upstream for all of them.
type Group []*Proxy

// Notify passes a notification of the upstream to every proxy.
func (g Group) Notify(n mcp.JSONRPCNotification) {
	for _, p := range g {
		p.Notify(n)
	}
}

// pick is the proxy an upstream's request is for: the one with calls in
// flight, or the only one.
func (g Group) pick() (*Proxy, error) {
	var with []*Proxy
	for _, p := range g {
		if p.InFlight() {
			with = append(with, p)
		}
	}
	switch {
	case len(with) == 1:
		return with[0], nil
	case len(with) == 0 && len(g) == 1:
		return g[0], nil
	}
	return nil, errNoHost
}

// CreateMessage puts a sampling request to the host it is for.
func (g Group) CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	p, err := g.pick()
	if err != nil {
		return nil, err
	}
	return p.CreateMessage(ctx, req)
}

// Elicit puts an elicitation request to the host it is for.
func (g Group) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	p, err := g.pick()
	if err != nil {
		return nil, err
	}
	return p.Elicit(ctx, req)
}

// ListRoots puts a roots/list request to the host it is for.
func (g Group) ListRoots(ctx context.Context, req mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
	p, err := g.pick()
	if err != nil {
		return nil, err
	}
	return p.ListRoots(ctx, req)
}
