package proxy

import (
	"context"
	"errors"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

type fakeSession struct{ id string }

func (f fakeSession) SessionID() string { return f.id }
func (f fakeSession) Initialize()       {}
func (f fakeSession) Initialized() bool { return true }
func (f fakeSession) NotificationChannel() chan<- mcp.JSONRPCNotification {
	return make(chan mcp.JSONRPCNotification, 1)
}

// An upstream's request to the client goes to the one client whose calls
// are in flight; with calls of several clients in flight, or none, no
// client is asked.
func TestHostOfAnUpstreamRequest(t *testing.T) {
	srv := mcpserver.NewMCPServer("t", "1")
	in := func(id string) context.Context { return srv.WithContext(context.Background(), fakeSession{id}) }
	for _, tc := range []struct {
		name     string
		inflight []string
		want     string // "" for no host
	}{
		{"none", nil, ""},
		{"one call", []string{"a"}, "a"},
		{"two calls of one client", []string{"a", "a"}, "a"},
		{"calls of two clients", []string{"a", "b"}, ""},
		{"calls of three clients", []string{"a", "b", "a", "c"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Proxy{}
			for i, id := range tc.inflight {
				p.inflight.Store(int64(i), in(id))
			}
			ctx, done, ok := p.host(context.Background())
			if ok != (tc.want != "") {
				t.Fatalf("host found %v, want %q", ok, tc.want)
			}
			if !ok {
				if p.InFlight() != (len(tc.inflight) > 0) {
					t.Fatal("InFlight")
				}
				return
			}
			defer done()
			if s := mcpserver.ClientSessionFromContext(ctx); s == nil || s.SessionID() != tc.want {
				t.Fatalf("host %v, want %s", s, tc.want)
			}
		})
	}
	// Over tenants: the one proxy with calls in flight, or none.
	a, b := &Proxy{}, &Proxy{}
	if _, err := (Group{a, b}).pick(); !errors.Is(err, errNoHost) {
		t.Fatalf("no proxy with calls: %v", err)
	}
	a.inflight.Store(int64(1), in("a"))
	if p, err := (Group{a, b}).pick(); err != nil || p != a {
		t.Fatalf("one proxy with calls: %v %v", p, err)
	}
	b.inflight.Store(int64(1), in("b"))
	if _, err := (Group{a, b}).pick(); !errors.Is(err, errNoHost) {
		t.Fatalf("two proxies with calls: %v", err)
	}
	if p, err := (Group{a}).pick(); err != nil || p != a {
		t.Fatalf("the only proxy: %v %v", p, err)
	}
	// With no host, the request is refused and nobody is asked.
	if _, err := (&Proxy{}).CreateMessage(context.Background(), mcp.CreateMessageRequest{}); !errors.Is(err, errNoHost) {
		t.Fatalf("sampling without a host: %v", err)
	}
}
