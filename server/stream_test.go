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
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// A tool that sends progress right before its result, served by mcp-go's
// streamable HTTP server behind the front's statusWriter: the Stream counts
// the progress events exactly as mcp-go writes them, and a handler that
// waits for them before returning loses none, where mcp-go alone drops the
// last one about one call in three (Stream's doc comment).
func TestStreamCountsProgressAsMCPGoWritesIt(t *testing.T) {
	const steps, calls = 3, 40
	for _, wait := range []bool{true, false} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			srv := mcpserver.NewMCPServer("stream-test", "1")
			srv.AddTool(mcp.NewTool("steps"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				st := StreamFrom(ctx)
				if st == nil {
					return mcp.NewToolResultError("no stream in the handler's context"), nil
				}
				from := st.Progress()
				for i := 1; i <= steps; i++ {
					if err := srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
						"progressToken": req.Params.Meta.ProgressToken, "progress": i, "total": steps}); err != nil {
						return nil, err
					}
				}
				if wait && !st.WaitProgress(ctx, from+steps, 5*time.Second) {
					return mcp.NewToolResultError("the progress was not written within 5 s"), nil
				}
				return mcp.NewToolResultText("done"), nil
			})
			streamable := mcpserver.NewStreamableHTTPServer(srv, mcpserver.WithEndpointPath("/mcp"))
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sw := &statusWriter{ResponseWriter: w, stream: &Stream{}}
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

			lost := 0
			for i := 0; i < calls; i++ {
				_, body := post(session, map[string]any{"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": map[string]any{
					"name": "steps", "_meta": map[string]any{"progressToken": fmt.Sprintf("p%d", i)}}})
				if strings.Contains(body, "not written") || strings.Contains(body, "no stream") {
					t.Fatalf("call %d: %s", i, body)
				}
				got := strings.Count(body, `"method":"notifications/progress"`)
				if got != strings.Count(body, string(progressEvent)) {
					t.Fatalf("call %d: %d progress notifications, %d in the form Stream counts:\n%s", i, got, strings.Count(body, string(progressEvent)), body)
				}
				lost += steps - got
			}
			if wait && lost != 0 {
				t.Fatalf("%d progress notifications of %d lost although the handler waited for them", lost, steps*calls)
			}
			t.Logf("wait=%v: %d of %d progress notifications lost", wait, lost, steps*calls)
		})
	}
}
