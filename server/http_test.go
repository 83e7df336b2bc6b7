package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
)

const testIssuer = "https://auth.test.example"

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// httpFixture is a running HTTP front on a loopback port.
type httpFixture struct {
	base     string // http://127.0.0.1:PORT
	resource string
	issuer   *authtest.Issuer
	logs     *syncBuffer
	srv      *Server
	cancel   context.CancelFunc
	done     chan error
}

type fixtureOpts struct {
	noAuth      bool
	toolScopes  map[string]string
	maxBody     int64
	ready       func(context.Context) error
	extraTools  func(s *Server)
	maxSessions int
}

func startHTTP(t *testing.T, o fixtureOpts) *httpFixture {
	t.Helper()
	s := newTestServer(t, t.TempDir())
	if o.extraTools != nil {
		o.extraTools(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	f := &httpFixture{base: "http://127.0.0.1:" + port, logs: &syncBuffer{}, srv: s, done: make(chan error, 1)}
	f.resource = f.base + "/mcp"
	hosts := auth.LoopbackHosts(port)
	cfg := HTTPConfig{
		Resource:       f.resource,
		AllowedHosts:   hosts,
		AllowedOrigins: auth.OriginsFor(hosts),
		MaxBodyBytes:   o.maxBody,
		MaxSessions:    o.maxSessions,
		Ready:          o.ready,
		Logger:         slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if !o.noAuth {
		f.issuer, err = authtest.NewIssuer(t.TempDir(), testIssuer, f.resource)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Auth = &auth.Config{Issuer: testIssuer, JWKSFile: f.issuer.JWKSPath, Scopes: []string{"trace:read"}, ToolScopes: o.toolScopes}
	}
	h, err := s.NewHTTP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() { f.done <- h.Serve(ctx, ln, Timeouts{Shutdown: 10 * time.Second}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-f.done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return f
}

func (f *httpFixture) token(t *testing.T, sub string, scopes ...string) string {
	t.Helper()
	tok, err := f.issuer.Token(sub, scopes, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// do sends one request and returns the response with its body read.
func do(t *testing.T, method, url string, hdr map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func rpcHeaders(token, session string) map[string]string {
	h := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
	if token != "" {
		h["Authorization"] = "Bearer " + token
	}
	if session != "" {
		h["Mcp-Session-Id"] = session
	}
	return h
}

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`

// rpcResult extracts the JSON-RPC message of a JSON or single-event SSE body.
func rpcResult(t *testing.T, body string) map[string]any {
	t.Helper()
	if i := strings.Index(body, "data: "); i >= 0 {
		body = strings.TrimSpace(strings.SplitN(body[i+6:], "\n", 2)[0])
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("response %q: %v", body, err)
	}
	return m
}

// session runs initialize and returns the session id.
func (f *httpFixture) session(t *testing.T, token string) string {
	t.Helper()
	resp, body := do(t, http.MethodPost, f.resource, rpcHeaders(token, ""), initBody)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	sid := resp.Header.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatal("initialize: no Mcp-Session-Id")
	}
	resp, body = do(t, http.MethodPost, f.resource, rpcHeaders(token, sid), `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("initialized: %d %s", resp.StatusCode, body)
	}
	return sid
}

func callBody(tool string, args string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, tool, args)
}

func TestHTTPRoutes(t *testing.T) {
	notReady := errors.New("events gone")
	var ready error
	var mu sync.Mutex
	f := startHTTP(t, fixtureOpts{ready: func(context.Context) error { mu.Lock(); defer mu.Unlock(); return ready }})
	tests := []struct {
		name, path string
		status     int
		contains   string
	}{
		{"health", "/healthz", 200, "ok"},
		{"ready", "/readyz", 200, "ready"},
		{"metadata", "/.well-known/oauth-protected-resource/mcp", 200, `"resource": "` + f.resource + `"`},
		{"metadata root form", "/.well-known/oauth-protected-resource", 200, `"authorization_servers": [`},
		{"unknown", "/nope", 404, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, http.MethodGet, f.base+tc.path, nil, "")
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.contains) {
				t.Fatalf("GET %s: %d %q, want %d containing %q", tc.path, resp.StatusCode, body, tc.status, tc.contains)
			}
		})
	}
	var md auth.Metadata
	_, body := do(t, http.MethodGet, f.base+"/.well-known/oauth-protected-resource/mcp", nil, "")
	if err := json.Unmarshal([]byte(body), &md); err != nil {
		t.Fatal(err)
	}
	if md.Resource != f.resource || len(md.AuthorizationServers) != 1 || md.AuthorizationServers[0] != testIssuer ||
		len(md.ScopesSupported) != 1 || md.ScopesSupported[0] != "trace:read" {
		t.Fatalf("metadata %+v", md)
	}

	mu.Lock()
	ready = notReady
	mu.Unlock()
	resp, body := do(t, http.MethodGet, f.base+"/readyz", nil, "")
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(body, "events gone") {
		t.Fatalf("readyz when not ready: %d %q (the reason belongs in the log, not the body)", resp.StatusCode, body)
	}
	if !strings.Contains(f.logs.String(), "events gone") {
		t.Fatal("the readiness failure was not logged")
	}
}

func TestHTTPDefaultReadinessProbe(t *testing.T) {
	f := startHTTP(t, fixtureOpts{noAuth: true})
	resp, _ := do(t, http.MethodGet, f.base+"/readyz", nil, "")
	if resp.StatusCode != 200 {
		t.Fatalf("readyz: %d", resp.StatusCode)
	}
	// Without auth there is no protected-resource metadata to serve.
	resp, _ = do(t, http.MethodGet, f.base+"/.well-known/oauth-protected-resource/mcp", nil, "")
	if resp.StatusCode != 404 {
		t.Fatalf("metadata without auth: %d, want 404", resp.StatusCode)
	}
}

func TestHTTPAuthWiring(t *testing.T) {
	f := startHTTP(t, fixtureOpts{toolScopes: map[string]string{"explain": "trace:explain"}})
	mdURL := f.base + auth.WellKnownPrefix + "/mcp"
	good := f.token(t, "agent-7", "trace:read")
	other, err := f.issuer.Sign(map[string]any{"iss": testIssuer, "aud": "http://127.0.0.1:1/mcp", "sub": "x", "exp": time.Now().Add(time.Hour).Unix(), "scope": "trace:read"})
	if err != nil {
		t.Fatal(err)
	}
	sid := f.session(t, good)
	tests := []struct {
		name      string
		url       string
		hdr       map[string]string
		body      string
		status    int
		challenge string // substring of WWW-Authenticate; "" means header absent
	}{
		{"no token", f.resource, rpcHeaders("", ""), initBody, 401, `Bearer resource_metadata="` + mdURL + `"`},
		{"garbage token", f.resource, rpcHeaders("not.a.jwt", ""), initBody, 401, `error="invalid_token"`},
		{"other resource", f.resource, rpcHeaders(other, ""), initBody, 401, `error="invalid_token"`},
		{"missing base scope", f.resource, rpcHeaders(f.token(t, "a", "trace:other"), ""), initBody, 403, `error="insufficient_scope", scope="trace:read"`},
		{"token in query ignored", f.resource + "?access_token=" + good, rpcHeaders("", ""), initBody, 401, `resource_metadata=`},
		{"basic scheme", f.resource, map[string]string{"Authorization": "Basic dXNlcjpwYXNz", "Content-Type": "application/json"}, initBody, 401, `resource_metadata=`},
		{"tool needs step-up", f.resource, rpcHeaders(good, sid), callBody("explain", `{"operation_id":"x"}`), 403, `scope="trace:read trace:explain"`},
		{"tool with base scope", f.resource, rpcHeaders(good, sid), callBody("list_operations", `{}`), 200, ""},
		{"tool with step-up scope", f.resource, rpcHeaders(f.token(t, "a", "trace:read", "trace:explain"), sid), callBody("explain", `{"operation_id":"x"}`), 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, http.MethodPost, tc.url, tc.hdr, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tc.status, body)
			}
			got := resp.Header.Get("WWW-Authenticate")
			if tc.challenge == "" && got != "" || !strings.Contains(got, tc.challenge) {
				t.Fatalf("WWW-Authenticate %q, want it to contain %q", got, tc.challenge)
			}
		})
	}
	if strings.Contains(f.logs.String(), good) {
		t.Fatal("a bearer token reached the log")
	}
}

func TestHTTPRebindingAndBodyLimit(t *testing.T) {
	f := startHTTP(t, fixtureOpts{noAuth: true, maxBody: 2048})
	sid := f.session(t, "")
	big := callBody("list_operations", `{"pad":"`+strings.Repeat("x", 4096)+`"}`)
	tests := []struct {
		name   string
		hdr    map[string]string
		body   string
		status int
	}{
		{"rebound host", map[string]string{"Host": "evil.example:80", "Content-Type": "application/json"}, initBody, 403},
		{"foreign origin", map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json"}, initBody, 403},
		{"own origin", map[string]string{"Origin": f.base, "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}, initBody, 200},
		{"body over the limit", rpcHeaders("", sid), big, 413},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, http.MethodPost, f.resource, tc.hdr, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tc.status, body)
			}
		})
	}
	// A chunked body (no Content-Length) over the limit is caught while reading.
	req, _ := http.NewRequest(http.MethodPost, f.resource, io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1
	for k, v := range rpcHeaders("", sid) {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("chunked oversized body: %d, want 413", resp.StatusCode)
	}
}

func TestHTTPSubjectReachesToolHandler(t *testing.T) {
	f := startHTTP(t, fixtureOpts{extraTools: func(s *Server) {
		// Test-only tool: answers with the subject its context carries.
		s.MCP().AddTool(mcp.NewTool("whoami"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			sub, ok := auth.SubjectFrom(ctx)
			if !ok {
				return mcp.NewToolResultError("no subject"), nil
			}
			return mcp.NewToolResultText("sub=" + sub), nil
		})
	}})
	tok := f.token(t, "agent-42", "trace:read")
	sid := f.session(t, tok)
	resp, body := do(t, http.MethodPost, f.resource, rpcHeaders(tok, sid), callBody("whoami", `{}`))
	if resp.StatusCode != 200 || !strings.Contains(body, "sub=agent-42") {
		t.Fatalf("whoami: %d %s", resp.StatusCode, body)
	}
	resp, body = do(t, http.MethodPost, f.resource, rpcHeaders(tok, sid), callBody("list_operations", `{}`))
	if resp.StatusCode != 200 {
		t.Fatalf("list_operations: %d %s", resp.StatusCode, body)
	}
	if m := rpcResult(t, body); m["result"] == nil {
		t.Fatalf("list_operations: %s", body)
	}
	// The request log names the subject on /mcp lines.
	found := false
	for _, line := range strings.Split(f.logs.String(), "\n") {
		if strings.Contains(line, `"msg":"http request"`) && strings.Contains(line, `"sub":"agent-42"`) && strings.Contains(line, `"path":"/mcp"`) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no request log line with the subject:\n%s", f.logs.String())
	}
}

func TestHTTPMetricsExposition(t *testing.T) {
	f := startHTTP(t, fixtureOpts{})
	do(t, http.MethodPost, f.resource, rpcHeaders("", ""), initBody) // one no_token outcome
	do(t, http.MethodGet, f.base+"/healthz", nil, "")
	_, body := do(t, http.MethodGet, f.base+"/metrics", nil, "")
	for _, want := range []string{
		`haia_auth_outcomes_total{outcome="no_token"} 1`,
		`haia_auth_outcomes_total{outcome="ok"} 0`,
		`haia_http_requests_total{code="401",method="POST",route="/mcp"} 1`,
		`haia_http_requests_total{code="200",method="GET",route="/healthz"} 1`,
		`haia_http_request_duration_seconds_bucket{route="/healthz"`,
		`haia_http_in_flight_requests 1`, // the /metrics request itself
		`haia_mcp_live_streams 0`,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestHTTPSessionStreamLimit(t *testing.T) {
	f := startHTTP(t, fixtureOpts{noAuth: true, maxSessions: 1})
	sid := f.session(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.resource, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("first stream: %d", resp.StatusCode)
	}
	resp2, body := do(t, http.MethodGet, f.resource, map[string]string{"Accept": "text/event-stream", "Mcp-Session-Id": sid}, "")
	if resp2.StatusCode != http.StatusServiceUnavailable || resp2.Header.Get("Retry-After") == "" {
		t.Fatalf("second stream: %d %s, want 503 with Retry-After", resp2.StatusCode, body)
	}
}

func TestHTTPGracefulShutdownFinishesInFlight(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	f := startHTTP(t, fixtureOpts{noAuth: true, extraTools: func(s *Server) {
		s.MCP().AddTool(mcp.NewTool("slow"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			close(started)
			<-release
			return mcp.NewToolResultText("finished"), nil
		})
	}})
	sid := f.session(t, "")
	type result struct {
		status int
		body   string
	}
	got := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, f.resource, strings.NewReader(callBody("slow", `{}`)))
		for k, v := range rpcHeaders("", sid) {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- result{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, string(b)}
	}()
	<-started
	f.cancel()
	// Wait until the listener is closed: shutdown has begun while the call runs.
	for {
		c, err := net.Dial("tcp", strings.TrimPrefix(f.base, "http://"))
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	r := <-got
	if r.status != 200 || !strings.Contains(r.body, "finished") {
		t.Fatalf("in-flight call during shutdown: %d %s", r.status, r.body)
	}
}
