//lint:file-ignore SA1019 server-everything logs and asks its client for sampling and roots, which pass through the proxy

package main

import (
	"context"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
)

// httpHost is the host of the HTTP pass-through test: everythingHost's
// answers, and listenHost's record of what the server sends it.
type httpHost struct {
	everythingHost
	listenHost
}

func (h *httpHost) options() *mcp.ClientOptions {
	o, l := h.everythingHost.options(), h.listenHost.options()
	o.ProgressNotificationHandler, o.LoggingMessageHandler = l.ProgressNotificationHandler, l.LoggingMessageHandler
	o.ResourceUpdatedHandler, o.ResourceListChangedHandler = l.ResourceUpdatedHandler, l.ResourceListChangedHandler
	return o
}

// The proxy served over Streamable HTTP (--http, with the OAuth test
// issuer's tokens) in front of server-everything over stdio, against the
// same server reached directly: tools, resources, templates, prompts,
// completion, sampling and elicitation (everythingExtras), then progress,
// cancellation, the logging level and log messages, resource
// subscriptions and updates, a changed resource list, roots and pings, each
// with the official Go SDK on the session protocol over HTTP. A paying call
// over HTTP is TestProxyOverHTTPWithHTTPUpstream's.
func TestProxyEverythingOverHTTP(t *testing.T) {
	node, entry := everythingServer(t)
	ctx := context.Background()
	e := newProxyEnv(t, `{"tools": {}, "unmapped": "forward"}`, "")
	dir := t.TempDir()
	iss, err := authtest.NewIssuer(dir, "https://as.test.example", "")
	if err != nil {
		t.Fatal(err)
	}
	p := startHTTPCommand(t, "proxy", "--http", "127.0.0.1:0", "--dir", e.root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--guard-map", e.mapPath, "--auth-issuer", iss.Issuer, "--auth-jwks", iss.JWKSPath, "--auth-scope", "trace:read",
		"--", node, entry, "stdio")
	iss.Resource = p.resource
	tok, err := iss.Token("agent-http", []string{"trace:read"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if status, _ := rawInitialize(t, p.resource, ""); status != http.StatusUnauthorized {
		t.Fatalf("the proxy's /mcp without a token: %d", status)
	}

	var direct, proxied httpHost
	dclient := mcp.NewClient(&mcp.Implementation{Name: "e2e-everything", Version: "1"}, direct.options())
	pclient := mcp.NewClient(&mcp.Implementation{Name: "e2e-everything", Version: "1"}, proxied.options())
	for _, c := range []*mcp.Client{dclient, pclient} {
		c.AddRoots(&mcp.Root{URI: "file:///haia/http-root", Name: "haia"})
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dcmd := exec.Command(node, entry, "stdio")
	dcmd.Stderr = &lockedBuffer{}
	dcs, err := dclient.Connect(cctx, &mcp.CommandTransport{Command: dcmd}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dcs.Close() })
	pcs, err := pclient.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: p.resource, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{token: func() string { return tok }, next: http.DefaultTransport}}},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect over HTTP: %v\n%s", err, p.logs())
	}
	t.Cleanup(func() { pcs.Close() })

	// The upstream's tools beside the read tools, the same answers.
	want, err := dcs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pcs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tools) != len(want.Tools)+4 {
		t.Fatalf("%d tools over HTTP, want %d upstream + 4", len(got.Tools), len(want.Tools))
	}
	for _, name := range []string{"echo", "get-sum"} {
		args := map[string]any{"message": "over HTTP", "a": 2, "b": 40}
		if name == "echo" {
			delete(args, "a")
			delete(args, "b")
		} else {
			delete(args, "message")
		}
		a, err := dcs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		b, err := pcs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s over HTTP: %v", name, err)
		}
		if string(mustJSON(a.Content)) != string(mustJSON(b.Content)) {
			t.Errorf("%s: direct %s, over HTTP %s", name, mustJSON(a.Content), mustJSON(b.Content))
		}
	}
	everythingExtras(t, dcs, pcs, &proxied.everythingHost)

	// Progress: the caller's own token, every step.
	res, err := pcs.CallTool(ctx, &mcp.CallToolParams{Name: "trigger-long-running-operation",
		Arguments: map[string]any{"duration": 0.4, "steps": 4}, Meta: mcp.Meta{"progressToken": "http-progress"}})
	if err != nil || res.IsError {
		t.Fatalf("long-running operation over HTTP: %v %s", err, mustJSON(res))
	}
	proxied.waitFor(t, "four progress notifications", func() bool { return len(proxied.progress) >= 4 })
	proxied.listenHost.mu.Lock()
	for i, pr := range proxied.progress {
		if pr.ProgressToken != "http-progress" || pr.Progress != float64(i+1) {
			t.Errorf("progress %d over HTTP: %+v, want the caller's token in order", i, pr)
		}
	}
	proxied.listenHost.mu.Unlock()

	// Cancellation: the caller gives up on a 30 s operation; the call
	// ends at once, and the proxy keeps serving.
	cctx2, cancel2 := context.WithCancel(ctx)
	time.AfterFunc(time.Second, cancel2)
	start := time.Now()
	_, err = pcs.CallTool(cctx2, &mcp.CallToolParams{Name: "trigger-long-running-operation", Arguments: map[string]any{"duration": 30, "steps": 3}})
	if err == nil || !errors.Is(err, context.Canceled) || time.Since(start) > 10*time.Second {
		t.Fatalf("cancelled call over HTTP: %v after %s", err, time.Since(start))
	}
	if err := pcs.Ping(ctx, nil); err != nil {
		t.Fatalf("ping over HTTP after a cancelled call: %v", err)
	}

	// The logging level, a subscription and its updates.
	if err := pcs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	uri := "demo://resource/static/document/architecture.md"
	if err := pcs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	proxied.waitFor(t, "the upstream's log of the subscription at level debug", func() bool {
		return strings.Contains(strings.Join(proxied.logs, "\n"), "Received Subscribe")
	})
	toggle := func() {
		t.Helper()
		if res, err := pcs.CallTool(ctx, &mcp.CallToolParams{Name: "toggle-subscriber-updates", Arguments: map[string]any{}}); err != nil || res.IsError {
			t.Fatalf("toggle-subscriber-updates: %v %s", err, mustJSON(res))
		}
	}
	// A host on protocol 2026-07-28 over HTTP subscribes to another
	// resource through its listen stream.
	var modern listenHost
	mclient := mcp.NewClient(&mcp.Implementation{Name: "e2e-listen-http", Version: "1"}, modern.options())
	mcs, err := mclient.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: p.resource, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{token: func() string { return tok }, next: http.DefaultTransport}}},
		&mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatalf("connect a 2026-07-28 host over HTTP: %v\n%s", err, p.logs())
	}
	t.Cleanup(func() { mcs.Close() })
	const other = "demo://resource/static/document/instructions.md"
	if err := mcs.Subscribe(ctx, &mcp.SubscribeParams{URI: other}); err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "the upstream is subscribed")
	toggle()
	proxied.waitFor(t, "resources/updated over HTTP", func() bool { return len(proxied.updated) > 0 })
	modern.waitFor(t, "resources/updated on a 2026-07-28 listen stream over HTTP", func() bool { return len(modern.updated) > 0 })
	toggle()
	if err := pcs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	modern.mu.Lock()
	for _, u := range modern.updated {
		if u != other {
			t.Errorf("an update of %s reached the 2026-07-28 host, which subscribed to %s only", u, other)
		}
	}
	modern.mu.Unlock()
	if err := mcs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: other}); err != nil {
		t.Fatal(err)
	}

	// A changed resource list is told, and the new resource listed.
	if res, err := pcs.CallTool(ctx, &mcp.CallToolParams{Name: "gzip-file-as-resource", Arguments: map[string]any{
		"name": "http.txt.gz", "data": "data:text/plain;base64,aGVsbG8gZnJvbSB0aGUgaG9zdA=="}}); err != nil || res.IsError {
		t.Fatalf("gzip-file-as-resource: %v %s", err, mustJSON(res))
	}
	proxied.waitFor(t, "resources/list_changed over HTTP", func() bool { return proxied.listChanged > 0 })
	listed := false
	for deadline := time.Now().Add(10 * time.Second); !listed && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for r, err := range pcs.Resources(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			listed = listed || strings.HasSuffix(r.URI, "http.txt.gz")
		}
	}
	if !listed {
		t.Fatal("the new resource is not listed over HTTP")
	}

	// Roots: the upstream asks the host whose call is in flight.
	a, err := dcs.CallTool(ctx, &mcp.CallToolParams{Name: "get-roots-list", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := pcs.CallTool(ctx, &mcp.CallToolParams{Name: "get-roots-list", Arguments: map[string]any{}})
	if err != nil || b.IsError {
		t.Fatalf("get-roots-list over HTTP: %v %s", err, mustJSON(b))
	}
	if !strings.Contains(string(mustJSON(b.Content)), "file:///haia/http-root") || string(mustJSON(a.Content)) != string(mustJSON(b.Content)) {
		t.Errorf("roots: direct %s, over HTTP %s", mustJSON(a.Content), mustJSON(b.Content))
	}
	if err := pcs.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
