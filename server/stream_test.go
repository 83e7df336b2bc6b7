package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// A tool that sends progress right before its result, served by mcp-go's
// streamable HTTP server behind the front's statusWriter: the Stream counts
// exactly the progress events mcp-go wrote on the response, in the form
// mcp-go writes them. (Without a wait, mcp-go drops some of them: the
// count says how many; TestHTTPProgressCountedOnEveryStreamOfTheSession
// waits for them.)
func TestStreamCountsProgressAsMCPGoWritesIt(t *testing.T) {
	const steps, calls = 3, 40
	srv := mcpserver.NewMCPServer("stream-test", "1")
	srv.AddTool(mcp.NewTool("steps"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		for i := 1; i <= steps; i++ {
			if err := srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
				"progressToken": req.Params.Meta.ProgressToken, "progress": i, "total": steps}); err != nil {
				return nil, err
			}
		}
		return mcp.NewToolResultText("done"), nil
	})
	streamable := mcpserver.NewStreamableHTTPServer(srv, mcpserver.WithEndpointPath("/mcp"))
	var streams []*Stream
	var mu sync.Mutex
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, stream: &Stream{}}
		mu.Lock()
		streams = append(streams, sw.stream)
		mu.Unlock()
		streamable.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), streamKey{}, sw.stream)))
	}))
	defer ts.Close()

	post := func(session string, body any) (string, string) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/mcp", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		out, _ := io.ReadAll(res.Body)
		return res.Header.Get("Mcp-Session-Id"), string(out)
	}
	session, _ := post("", map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
		"protocolVersion": "2025-11-25", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "t", "version": "1"}}})
	if session == "" {
		t.Fatal("no session id from initialize")
	}
	post(session, map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})

	written := 0
	for i := 0; i < calls; i++ {
		_, body := post(session, map[string]any{"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": map[string]any{
			"name": "steps", "_meta": map[string]any{"progressToken": fmt.Sprintf("p%d", i)}}})
		got := strings.Count(body, `"method":"notifications/progress"`)
		if in := strings.Count(body, string(progressEvent)); got != in {
			t.Fatalf("call %d: %d progress notifications, %d in the form Stream counts:\n%s", i, got, in, body)
		}
		written += got
	}
	counted := int64(0)
	mu.Lock()
	for _, st := range streams {
		counted += st.Progress()
	}
	mu.Unlock()
	if counted != int64(written) || written == 0 {
		t.Fatalf("the streams counted %d progress notifications; the responses held %d", counted, written)
	}
	t.Logf("%d of %d progress notifications written by mcp-go without a wait", written, steps*calls)
}

// Behind the whole HTTP front, with the session's GET stream open: mcp-go
// hands each progress notification to that stream or to the call's own
// response, whichever takes it first, and the session's counter sees them
// on both, so a handler's wait ends once its progress is written wherever
// it went — not at its bound.
func TestHTTPProgressCountedOnEveryStreamOfTheSession(t *testing.T) {
	const steps, calls = 3, 20
	f := startHTTP(t, fixtureOpts{extraTools: func(s *Server) {
		s.MCP().AddTool(mcp.NewTool("steps"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			st := StreamFrom(ctx)
			if st == nil {
				return mcp.NewToolResultError("no stream in the handler's context"), nil
			}
			from := st.Progress()
			for i := 1; i <= steps; i++ {
				if err := s.MCP().SendNotificationToClient(ctx, "notifications/progress", map[string]any{
					"progressToken": req.Params.Meta.ProgressToken, "progress": i, "total": steps}); err != nil {
					return nil, err
				}
			}
			if !st.WaitProgress(ctx, from+steps, 5*time.Second) {
				return mcp.NewToolResultError(fmt.Sprintf("not written within 5 s: %d of %d", st.Progress()-from, steps)), nil
			}
			return mcp.NewToolResultText("written"), nil
		})
	}})
	tok := f.token(t, "agent-progress", "trace:read")
	sid := f.session(t, tok)
	stream := openStream(t, f, tok, sid)
	if stream.StatusCode != http.StatusOK {
		t.Fatalf("GET stream: %d", stream.StatusCode)
	}
	onStream := make(chan int, 1)
	go func() {
		b, _ := io.ReadAll(stream.Body)
		onStream <- strings.Count(string(b), `"method":"notifications/progress"`)
	}()

	onPosts := 0
	for i := 0; i < calls; i++ {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"steps","arguments":{},"_meta":{"progressToken":"p%d"}}}`, 10+i, i)
		resp, out := do(t, http.MethodPost, f.resource, rpcHeaders(tok, sid), body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(out, "written") || strings.Contains(out, "not written") {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, out)
		}
		onPosts += strings.Count(out, `"method":"notifications/progress"`)
	}
	// Ending the session ends its stream, which has written all it took.
	if resp, out := do(t, http.MethodDelete, f.resource, rpcHeaders(tok, sid), ""); resp.StatusCode/100 != 2 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, out)
	}
	got := onPosts + <-onStream
	if got != steps*calls {
		t.Fatalf("%d progress notifications reached the client (%d on the calls' responses), want %d", got, onPosts, steps*calls)
	}
	t.Logf("%d on the calls' responses, %d on the session's stream", onPosts, got-onPosts)
}
