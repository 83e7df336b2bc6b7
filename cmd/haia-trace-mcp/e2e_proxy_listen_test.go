package main

import (
	"context"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// listenHost is a host that keeps what the server sends it outside the
// answers to its requests.
type listenHost struct {
	mu          sync.Mutex
	updated     []string
	listChanged int
	logs        []string
	progress    []*mcp.ProgressNotificationParams
}

func (h *listenHost) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
			h.mu.Lock()
			h.updated = append(h.updated, r.Params.URI)
			h.mu.Unlock()
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			h.mu.Lock()
			h.listChanged++
			h.mu.Unlock()
		},
		//lint:ignore SA1019 a log message must not reach a 2026-07-28 host that did not opt in
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			h.mu.Lock()
			h.logs = append(h.logs, string(mustJSON(r.Params.Data)))
			h.mu.Unlock()
		},
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			h.mu.Lock()
			h.progress = append(h.progress, r.Params)
			h.mu.Unlock()
		},
	}
}

func (h *listenHost) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		h.mu.Lock()
		done := ok()
		h.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 20 s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A host on protocol 2026-07-28 (the official Go SDK: server/discover, then
// subscriptions/listen) in front of server-everything through the proxy
// over stdio, beside a session-protocol host connected to server-everything
// directly: the resource it subscribes to through its listen stream is
// subscribed upstream and its updates reach it; the upstream's changed
// resource list reaches it; nothing it did not opt in to (the upstream's
// log messages outside its calls) reaches it; and closing the stream
// unsubscribes upstream.
func TestProxyEverythingListen20260728(t *testing.T) {
	node, entry := everythingServer(t)
	ctx := context.Background()
	const uri = "demo://resource/static/document/architecture.md"
	connect := func(cmd *exec.Cmd, h *listenHost, version string) *mcp.ClientSession {
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-listen", Version: "1"}, h.options())
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		var opts *mcp.ClientSessionOptions
		if version != "" {
			opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
		}
		cs, err := client.Connect(cctx, &mcp.CommandTransport{Command: cmd}, opts)
		if err != nil {
			t.Fatalf("connect %v: %v (stderr: %v)", cmd.Args, err, cmd.Stderr)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	var direct, proxied listenHost
	dcmd := exec.Command(node, entry, "stdio")
	dcmd.Stderr = &lockedBuffer{}
	dcs := connect(dcmd, &direct, "")
	e := newProxyEnv(t, `{"tools": {}, "unmapped": "forward"}`, "")
	pcmd := exec.Command(binPath, append(e.args(), "--", node, entry, "stdio")...)
	pcmd.Stderr = e.stderr
	pcs := connect(pcmd, &proxied, "2026-07-28")
	if v := pcs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Fatalf("the proxy's host speaks %q, want 2026-07-28", v)
	}

	for _, cs := range []*mcp.ClientSession{dcs, pcs} {
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
			t.Fatalf("subscribe: %v (stderr %s)", err, e.stderr)
		}
	}
	// The stream is open once the proxy subscribed the upstream (which
	// logs that it was asked, outside any call: a 2026-07-28 host that
	// did not opt in must not see it).
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(e.stderr.String(), "the upstream is subscribed") {
		if time.Now().After(deadline) {
			t.Fatalf("the upstream was not subscribed for the listen stream; stderr %s", e.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	toggle := func(cs *mcp.ClientSession) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "toggle-subscriber-updates", Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("toggle-subscriber-updates: %v %s", err, mustJSON(res))
		}
	}
	toggle(dcs)
	toggle(pcs)
	for name, h := range map[string]*listenHost{"direct": &direct, "proxied (2026-07-28)": &proxied} {
		h.waitFor(t, name+" resources/updated of "+uri, func() bool { return len(h.updated) >= 2 })
	}
	toggle(dcs)
	toggle(pcs)
	proxied.mu.Lock()
	for _, u := range proxied.updated {
		if u != uri {
			t.Errorf("an update of %s reached the host, which subscribed to %s only", u, uri)
		}
	}
	proxied.mu.Unlock()

	// The upstream's resource list changes: the host is told on its
	// listen stream and lists the new resource.
	res, err := pcs.CallTool(ctx, &mcp.CallToolParams{Name: "gzip-file-as-resource", Arguments: map[string]any{
		"name": "listen.txt.gz", "data": "data:text/plain;base64,aGVsbG8gZnJvbSB0aGUgaG9zdA=="}})
	if err != nil || res.IsError {
		t.Fatalf("gzip-file-as-resource: %v %s", err, mustJSON(res))
	}
	proxied.waitFor(t, "resources/list_changed on the listen stream", func() bool { return proxied.listChanged > 0 })
	listed := false
	for r, err := range pcs.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		listed = listed || strings.HasSuffix(r.URI, "listen.txt.gz")
	}
	if !listed {
		t.Fatal("the new resource is not listed to the 2026-07-28 host")
	}

	// Closing the stream unsubscribes the upstream (the proxy's log says
	// what it forwarded), and nothing of the upstream's log reached the
	// host, which did not opt in to it.
	if err := pcs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(15 * time.Second)
	for !strings.Contains(e.stderr.String(), `"resources/unsubscribe"`) {
		if time.Now().After(deadline) {
			t.Fatalf("the upstream was not unsubscribed when the listen stream closed; stderr %s", e.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	proxied.mu.Lock()
	defer proxied.mu.Unlock()
	if len(proxied.logs) != 0 {
		t.Errorf("log messages reached a 2026-07-28 host that did not opt in to them: %v", proxied.logs)
	}
}
