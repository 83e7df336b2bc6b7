package proxy

import (
	"context"
	"slices"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// A host on protocol 2026-07-28 opts in to notifications through its own
// subscriptions/listen stream (SEP-2575): list changes, and updates of the
// resources it names there. The proxy's server serves the stream and sends
// the list changes it makes when it serves the upstream's changed lists;
// the bridge here subscribes the upstream (which speaks the session
// protocol) to the resources a stream names, for as long as one stream
// names them, and delivers the upstream's notifications/resources/updated
// on the streams that name the resource, tagged with the stream's id. A
// session with a stream open receives nothing else of the upstream's
// outside a call: opting in is absolute on that protocol.

// listener is one host's open subscriptions/listen stream.
type listener struct {
	session mcpserver.ClientSession
	id      any
	uris    []string
}

// listens is the bridge's state.
type listens struct {
	open map[*listener]bool
	// upstream counts, per resource, the streams it is subscribed for;
	// legacy are the resources a session-protocol client subscribed to
	// (resources/subscribe, forwarded as is).
	upstream map[string]int
	legacy   map[string]bool
}

// listen is the before-hook of subscriptions/listen: the resources the
// stream names are subscribed upstream before the stream is acknowledged,
// and unsubscribed when the last stream naming them ends.
func (p *Proxy) listen(ctx context.Context, id any, uris []string) {
	s := mcpserver.ClientSessionFromContext(ctx)
	if s == nil || id == nil || len(uris) == 0 {
		return
	}
	l := &listener{session: s, id: id, uris: slices.Compact(slices.Sorted(slices.Values(uris)))}
	p.listenMu.Lock()
	if p.listens.open == nil {
		p.listens.open, p.listens.upstream, p.listens.legacy = map[*listener]bool{}, map[string]int{}, map[string]bool{}
	}
	p.listens.open[l] = true
	var first []string
	for _, uri := range l.uris {
		if p.listens.upstream[uri] == 0 && !p.listens.legacy[uri] {
			first = append(first, uri)
		}
		p.listens.upstream[uri]++
	}
	p.listenMu.Unlock()
	for _, uri := range first {
		p.cfg.Logger.Info("a listen stream names a resource: the upstream is subscribed", "method", string(mcp.MethodResourcesSubscribe), "uri", uri)
		p.forwardAside(ctx, string(mcp.MethodResourcesSubscribe), map[string]any{"uri": uri})
	}
	context.AfterFunc(ctx, func() {
		p.listenMu.Lock()
		delete(p.listens.open, l)
		var last []string
		for _, uri := range l.uris {
			p.listens.upstream[uri]--
			if p.listens.upstream[uri] == 0 {
				delete(p.listens.upstream, uri)
				if !p.listens.legacy[uri] {
					last = append(last, uri)
				}
			}
		}
		p.listenMu.Unlock()
		for _, uri := range last {
			p.cfg.Logger.Info("no listen stream names the resource any more: the upstream is unsubscribed", "method", string(mcp.MethodResourcesUnsubscribe), "uri", uri)
			p.forwardAside(context.WithoutCancel(ctx), string(mcp.MethodResourcesUnsubscribe), map[string]any{"uri": uri})
		}
	})
}

// legacySubscribe forwards a session-protocol client's resources/subscribe
// or resources/unsubscribe; an unsubscribe leaves the upstream subscribed
// while a listen stream names the resource.
func (p *Proxy) legacySubscribe(ctx context.Context, uri string, on bool) {
	p.listenMu.Lock()
	if p.listens.legacy == nil {
		p.listens.open, p.listens.upstream, p.listens.legacy = map[*listener]bool{}, map[string]int{}, map[string]bool{}
	}
	held := p.listens.upstream[uri] > 0
	if on {
		p.listens.legacy[uri] = true
	} else {
		delete(p.listens.legacy, uri)
	}
	p.listenMu.Unlock()
	method := mcp.MethodResourcesSubscribe
	if !on {
		if held {
			return
		}
		method = mcp.MethodResourcesUnsubscribe
	}
	p.forwardAside(ctx, string(method), map[string]any{"uri": uri})
}

// updated delivers the upstream's notifications/resources/updated on every
// listen stream that names the resource.
func (p *Proxy) updated(params map[string]any) {
	uri, _ := params["uri"].(string)
	if uri == "" {
		return
	}
	p.listenMu.Lock()
	var to []*listener
	for l := range p.listens.open {
		if slices.Contains(l.uris, uri) {
			to = append(to, l)
		}
	}
	p.listenMu.Unlock()
	for _, l := range to {
		fields := map[string]any{}
		meta := map[string]any{}
		for k, v := range params {
			if k == "_meta" {
				if m, ok := v.(map[string]any); ok {
					for mk, mv := range m {
						meta[mk] = mv
					}
				}
				continue
			}
			fields[k] = v
		}
		meta[mcp.MetaKeySubscriptionID] = l.id
		n := mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{
			Method: mcp.MethodNotificationResourceUpdated, Params: mcp.NotificationParams{Meta: meta, AdditionalFields: fields}}}
		select {
		case l.session.NotificationChannel() <- n:
		default:
			p.cfg.Logger.Warn("a resource update was not delivered: the listen stream's queue is full", "uri", uri, "session", l.session.SessionID())
		}
	}
}

// listening reports whether a session has a subscriptions/listen stream
// open, so that it receives only what it opted in to.
func listening(s mcpserver.ClientSession) bool {
	f, ok := s.(mcpserver.SessionWithSubscriptionFilter)
	if !ok {
		return false
	}
	_, active := f.SubscriptionFilter()
	return active
}
