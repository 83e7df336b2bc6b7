//lint:file-ignore SA1019 server-everything asks its client for sampling, which passes through the proxy

package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var createdAt = regexp.MustCompile(`created at [0-9:]+ [AP]M`)

// everythingHost is the host side of the server-everything test: it
// answers sampling and elicitation, and collects what the server sends.
type everythingHost struct {
	mu      sync.Mutex
	samples int
	elicits int
}

func (h *everythingHost) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, r *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			h.mu.Lock()
			h.samples++
			h.mu.Unlock()
			return &mcp.CreateMessageResult{Model: "host-model", Role: "assistant", Content: &mcp.TextContent{Text: "the host answers"}}, nil
		},
		ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			h.mu.Lock()
			h.elicits++
			h.mu.Unlock()
			return &mcp.ElicitResult{Action: "decline"}, nil
		},
	}
}

func (h *everythingHost) read(fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fn()
}

// everythingExtras checks, through the proxy against the same server
// reached directly, with the official Go SDK client, what is not a tool:
// resources, templates, prompts, completions, and the server's sampling and
// elicitation requests to the host (everythingWire checks the rest).
func everythingExtras(t *testing.T, direct, proxied *mcp.ClientSession, host *everythingHost) {
	ctx := context.Background()
	same := func(what string, a, b any) {
		t.Helper()
		if x, y := mustJSON(a), mustJSON(b); !bytes.Equal(x, y) {
			t.Errorf("%s: direct %s\nproxied %s", what, x, y)
		}
	}
	// Resources and templates, every page.
	list := func(cs *mcp.ClientSession) []*mcp.Resource {
		var out []*mcp.Resource
		for r, err := range cs.Resources(ctx, nil) {
			if err != nil {
				t.Fatalf("resources/list: %v", err)
			}
			out = append(out, r)
		}
		return out
	}
	rd, rp := list(direct), list(proxied)
	if len(rd) == 0 {
		t.Fatal("server-everything lists no resources")
	}
	same("resources/list", rd, rp)
	td, err := direct.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := proxied.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatalf("resources/templates/list through the proxy: %v", err)
	}
	// The proxy's server lists templates and prompts by name.
	slices.SortFunc(td.ResourceTemplates, func(a, b *mcp.ResourceTemplate) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(tp.ResourceTemplates, func(a, b *mcp.ResourceTemplate) int { return strings.Compare(a.Name, b.Name) })
	same("resources/templates/list", td.ResourceTemplates, tp.ResourceTemplates)
	for _, uri := range []string{rd[0].URI, "demo://resource/dynamic/text/7"} {
		a, err := direct.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatal(err)
		}
		b, err := proxied.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("resources/read %s through the proxy: %v", uri, err)
		}
		// A dynamic resource says when it was made.
		same("resources/read "+uri, createdAt.ReplaceAllString(string(mustJSON(a.Contents)), ""), createdAt.ReplaceAllString(string(mustJSON(b.Contents)), ""))
	}

	// Prompts, a prompt with arguments, completion of an argument.
	pd, err := direct.ListPrompts(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pp, err := proxied.ListPrompts(ctx, nil)
	if err != nil {
		t.Fatalf("prompts/list through the proxy: %v", err)
	}
	slices.SortFunc(pd.Prompts, func(a, b *mcp.Prompt) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(pp.Prompts, func(a, b *mcp.Prompt) int { return strings.Compare(a.Name, b.Name) })
	same("prompts/list", pd.Prompts, pp.Prompts)
	args := &mcp.GetPromptParams{Name: "args-prompt", Arguments: map[string]string{"city": "Lisbon", "state": "Lisboa"}}
	gd, err := direct.GetPrompt(ctx, args)
	if err != nil {
		t.Fatal(err)
	}
	gp, err := proxied.GetPrompt(ctx, args)
	if err != nil {
		t.Fatalf("prompts/get through the proxy: %v", err)
	}
	same("prompts/get", gd.Messages, gp.Messages)
	comp := &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "completable-prompt"}, Argument: mcp.CompleteParamsArgument{Name: "department", Value: "E"}}
	cd, err := direct.Complete(ctx, comp)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := proxied.Complete(ctx, comp)
	if err != nil {
		t.Fatalf("completion/complete through the proxy: %v", err)
	}
	if len(cd.Completion.Values) == 0 {
		t.Fatal("server-everything completes nothing")
	}
	same("completion/complete", cd.Completion, cp.Completion)

	// Sampling and elicitation: the upstream asks, during the call, the
	// host whose call it is.
	call := func(name string, args map[string]any) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := proxied.CallTool(cctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("%s through the proxy: %v %s", name, err, string(mustJSON(res)))
		}
		return string(mustJSON(res.Content))
	}
	if out := call("trigger-sampling-request", map[string]any{"prompt": "hello", "maxTokens": 20}); !strings.Contains(out, "the host answers") {
		t.Fatalf("sampling: %s", out)
	}
	if out := call("trigger-elicitation-request", map[string]any{}); !strings.Contains(out, "decline") {
		t.Fatalf("elicitation: %s", out)
	}
	host.read(func() {
		if host.samples != 1 || host.elicits != 1 {
			t.Errorf("the host was asked %d sampling and %d elicitation requests, want one each", host.samples, host.elicits)
		}
	})

}

// everythingWire checks, with a client of the session protocol (the one
// the proxy speaks to its upstream) read on the wire, what that protocol
// carries beyond requests and answers: the logging level, resource
// subscriptions and their updates, a changed resource list, and roots —
// the upstream asking the host for them, and the host saying they changed.
func everythingWire(t *testing.T, w *wireClient) {
	roots := []any{map[string]any{"uri": "file:///haia/root", "name": "haia"}}
	w.answer = func(method string, _ map[string]any) any {
		if method == "roots/list" {
			return map[string]any{"roots": roots}
		}
		return map[string]any{}
	}
	w.request(t, "logging/setLevel", map[string]any{"level": "debug"})
	uri := "demo://resource/static/document/architecture.md"
	before, _ := w.request(t, "resources/subscribe", map[string]any{"uri": uri})
	if logs := notificationsOf(before, "notifications/message"); len(logs) != 1 || !strings.Contains(fmt.Sprint(logs[0]["params"]), "Received Subscribe") {
		t.Fatalf("the upstream's log message about the subscription (level debug set through the proxy): %v", before)
	}
	w.request(t, "tools/call", map[string]any{"name": "toggle-subscriber-updates", "arguments": map[string]any{}})
	if n := w.waitFor(t, "notifications/resources/updated", 15*time.Second); fmt.Sprint(n["params"]) != fmt.Sprint(map[string]any{"uri": uri}) {
		t.Fatalf("resources/updated: %v", n)
	}
	w.request(t, "tools/call", map[string]any{"name": "toggle-subscriber-updates", "arguments": map[string]any{}})
	w.request(t, "resources/unsubscribe", map[string]any{"uri": uri})

	// The upstream's resource list changes: the proxy reads it again and
	// tells the client, which then lists the new resource.
	w.request(t, "tools/call", map[string]any{"name": "gzip-file-as-resource", "arguments": map[string]any{"name": "haia.txt.gz", "data": "data:text/plain;base64,aGVsbG8gZnJvbSB0aGUgaG9zdA=="}})
	w.waitFor(t, "notifications/resources/list_changed", 15*time.Second)
	listed := false
	for deadline := time.Now().Add(10 * time.Second); !listed && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, res := w.request(t, "resources/list", map[string]any{})
		listed = strings.Contains(string(mustJSON(res)), "demo://resource/session/haia.txt.gz")
	}
	if !listed {
		t.Fatal("the new session resource is not listed through the proxy")
	}

	// Roots: the client says its roots changed; the upstream asks for them
	// through the proxy and reports what it was told.
	w.send(t, map[string]any{"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
	got := false
	for deadline := time.Now().Add(15 * time.Second); !got && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		_, res := w.request(t, "tools/call", map[string]any{"name": "get-roots-list", "arguments": map[string]any{}})
		got = strings.Contains(string(mustJSON(res)), "file:///haia/root")
	}
	if !got {
		t.Fatal("the upstream never had the client's roots through the proxy")
	}
}
