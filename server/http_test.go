package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/prometheus/client_golang/prometheus"

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
	h        *HTTP
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
	edit        func(*HTTPConfig) // last changes to the configuration
	timeouts    Timeouts
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
	if o.edit != nil {
		o.edit(&cfg)
	}
	h, err := s.NewHTTP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	to := o.timeouts
	to.Shutdown = 10 * time.Second
	go func() { f.done <- h.Serve(ctx, ln, to) }()
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
		{"health names the payer", "/healthz", 200, "ok\npayer 0x2c7536E3605D9C16a7a3D7b1898e529396a65c23\n"},
		{"ready names the payer", "/readyz", 200, "ready\npayer 0x2c7536E3605D9C16a7a3D7b1898e529396a65c23\n"},
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
		{"tool with step-up scope", f.resource, rpcHeaders(f.token(t, "agent-7", "trace:read", "trace:explain"), sid), callBody("explain", `{"operation_id":"x"}`), 200, ""},
		{"session of another subject", f.resource, rpcHeaders(f.token(t, "agent-8", "trace:read"), sid), callBody("list_operations", `{}`), 404, ""},
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
	f := startHTTP(t, fixtureOpts{noAuth: true, edit: func(c *HTTPConfig) { c.MaxStreams = 1 }})
	sid := f.session(t, "")
	sid2 := f.session(t, "")
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
	resp2, body := do(t, http.MethodGet, f.resource, map[string]string{"Accept": "text/event-stream", "Mcp-Session-Id": sid2}, "")
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

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// randomSessionID is well formed (either this server's shape or mcp-go's
// own) but was never issued.
func randomSessionID(i int) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	if i%2 == 0 {
		return "mcp-session-" + fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	}
	enc := base64.RawURLEncoding.EncodeToString
	return "s1." + enc(b[:16]) + "." + enc(b[16:])
}

// TestHTTPUnknownSessionFloodLeavesNoState sends thousands of random,
// well-formed session ids on POST, GET and DELETE: every one is 404 and
// the session table does not grow; the live heap stays within 4 MiB.
func TestHTTPUnknownSessionFloodLeavesNoState(t *testing.T) {
	f := startHTTP(t, fixtureOpts{noAuth: true, edit: func(c *HTTPConfig) { c.RateLimit = 1e6; c.RateBurst = 1e6 }})
	sid := f.session(t, "")
	if n := f.h.sessions.len(); n != 1 {
		t.Fatalf("%d sessions after one initialize", n)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	defer client.CloseIdleConnections()
	send := func(method, id, body string) int {
		req, _ := http.NewRequest(method, f.resource, strings.NewReader(body))
		for k, v := range rpcHeaders("", id) {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Warm up the connection pool and the code paths before measuring.
	for i := range 50 {
		send(http.MethodPost, randomSessionID(i), callBody("list_operations", `{}`))
	}
	before := heapInUse()
	const flood = 6000
	for i := range flood {
		method := []string{http.MethodPost, http.MethodGet, http.MethodDelete}[i%3]
		if code := send(method, randomSessionID(i), callBody("list_operations", `{}`)); code != http.StatusNotFound {
			t.Fatalf("%s with an unknown session id: %d, want 404", method, code)
		}
	}
	after := heapInUse()
	if n := f.h.sessions.len(); n != 1 {
		t.Fatalf("%d sessions after a flood of unknown ids, want the 1 real one", n)
	}
	if growth := int64(after) - int64(before); growth > 4<<20 {
		t.Fatalf("live heap grew by %d KiB over %d unknown ids, bound 4096 KiB", growth>>10, flood)
	}
	// The real session still works.
	if code := send(http.MethodPost, sid, callBody("list_operations", `{}`)); code != 200 {
		t.Fatalf("the real session after the flood: %d", code)
	}
}

// TestHTTPSessionTableBounded opens more sessions than the bound: the
// table holds the bound, the oldest-idle were dropped (and counted), and
// mcp-go's state for them went with them (the heap does not keep it).
func TestHTTPSessionTableBounded(t *testing.T) {
	const max = 50
	f := startHTTP(t, fixtureOpts{noAuth: true, maxSessions: max, edit: func(c *HTTPConfig) { c.RateLimit = 1e6; c.RateBurst = 1e6 }})
	first := f.session(t, "")
	keep := f.session(t, "")
	for range 2 * max {
		f.session(t, "")
		// keep stays the most recently active, so it is never the oldest idle.
		if resp, _ := do(t, http.MethodPost, f.resource, rpcHeaders("", keep), `{"jsonrpc":"2.0","id":3,"method":"ping"}`); resp.StatusCode != 200 {
			t.Fatalf("ping on the kept session: %d", resp.StatusCode)
		}
	}
	if n := f.h.sessions.len(); n != max {
		t.Fatalf("%d sessions held, want the bound %d", n, max)
	}
	f.h.sessions.mu.Lock()
	_, firstHeld := f.h.sessions.byID[first]
	_, keepHeld := f.h.sessions.byID[keep]
	f.h.sessions.mu.Unlock()
	if firstHeld || !keepHeld {
		t.Fatalf("first held=%v (want dropped), kept held=%v (want kept)", firstHeld, keepHeld)
	}
	_, body := do(t, http.MethodGet, f.base+"/metrics", nil, "")
	for _, want := range []string{
		fmt.Sprintf(`haia_mcp_sessions_evicted_total{reason="capacity"} %d`, 2*max+2-max),
		fmt.Sprintf(`haia_mcp_sessions %d`, max),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// A dropped session's id is still one this server issued: it is taken
	// back (its per-process state, like its log level, is gone).
	if resp, body := do(t, http.MethodPost, f.resource, rpcHeaders("", first), callBody("list_operations", `{}`)); resp.StatusCode != 200 {
		t.Fatalf("evicted but valid session: %d %s", resp.StatusCode, body)
	}

	// Memory: many more initialized sessions than the bound hold no more
	// than the bound's worth of mcp-go session state.
	before := heapInUse()
	for range 2000 {
		f.session(t, "")
	}
	growth := int64(heapInUse()) - int64(before)
	t.Logf("live heap growth over 2000 sessions with a bound of %d: %d KiB", max, growth>>10)
	if growth > 4<<20 {
		t.Fatalf("live heap grew by %d KiB, bound 4096 KiB: dropped sessions kept their state", growth>>10)
	}
}

func TestHTTPSessionLifecycle(t *testing.T) {
	f := startHTTP(t, fixtureOpts{})
	tok := f.token(t, "agent-7", "trace:read")
	other := f.token(t, "agent-8", "trace:read")
	sid := f.session(t, tok)
	tests := []struct {
		name, method, token, sid string
		status                   int
	}{
		{"GET without a session id", http.MethodGet, tok, "", 400},
		{"DELETE without a session id", http.MethodDelete, tok, "", 400},
		{"GET with another subject's session", http.MethodGet, other, sid, 404},
		{"DELETE with another subject's session", http.MethodDelete, other, sid, 404},
		{"POST with another subject's session", http.MethodPost, other, sid, 404},
		{"POST with the owner's session", http.MethodPost, tok, sid, 200},
		{"DELETE by the owner", http.MethodDelete, tok, sid, 200},
		{"POST after DELETE", http.MethodPost, tok, sid, 404},
		{"GET after DELETE", http.MethodGet, tok, sid, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hdr := rpcHeaders(tc.token, tc.sid)
			body := ""
			if tc.method == http.MethodPost {
				body = callBody("list_operations", `{}`)
			}
			resp, got := do(t, tc.method, f.resource, hdr, body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tc.status, got)
			}
		})
	}
}

// openStream starts GET /mcp for sid and returns the response whose body
// is the stream.
func openStream(t *testing.T, f *httpFixture, token, sid string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.resource, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestHTTPIdleStreamClosedOnTime opens a stream that carries no message:
// keep-alive comments arrive every StreamPing, the server's own 300 ms
// read and write timeouts do not cut it, and it ends after StreamIdle.
func TestHTTPIdleStreamClosedOnTime(t *testing.T) {
	const idle, ping = 1500 * time.Millisecond, 100 * time.Millisecond
	f := startHTTP(t, fixtureOpts{noAuth: true,
		timeouts: Timeouts{Read: 300 * time.Millisecond, Write: 300 * time.Millisecond},
		edit:     func(c *HTTPConfig) { c.StreamIdle = idle; c.StreamPing = ping }})
	sid := f.session(t, "")
	start := time.Now()
	resp := openStream(t, f, "", sid)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(resp.Body) // returns when the server ends the stream
	lasted := time.Since(start)
	if err != nil {
		t.Fatalf("stream ended with %v after %s, want a clean end", err, lasted)
	}
	pings := strings.Count(string(body), ": ping\n\n")
	t.Logf("idle stream lasted %s with %d pings", lasted, pings)
	if lasted < idle {
		t.Fatalf("stream ended after %s, before the idle bound %s", lasted, idle)
	}
	if lasted > idle+2*time.Second {
		t.Fatalf("stream ended after %s, long after the idle bound %s", lasted, idle)
	}
	if pings < 5 {
		t.Fatalf("%d keep-alive comments in %s at one per %s", pings, lasted, ping)
	}
	_, m := do(t, http.MethodGet, f.base+"/metrics", nil, "")
	if !strings.Contains(m, `haia_mcp_streams_closed_total{reason="idle"} 1`) {
		t.Fatalf("idle close not counted:\n%s", m)
	}
}

// TestHTTPIdleStreamsCannotLockOut fills the stream limit with idle
// streams: a new stream is refused while they live and served once the
// idle bound has closed them.
func TestHTTPIdleStreamsCannotLockOut(t *testing.T) {
	const idle = 800 * time.Millisecond
	f := startHTTP(t, fixtureOpts{noAuth: true, edit: func(c *HTTPConfig) { c.MaxStreams = 2; c.StreamIdle = idle; c.StreamPing = 200 * time.Millisecond }})
	a, b, c := f.session(t, ""), f.session(t, ""), f.session(t, "")
	sa, sb := openStream(t, f, "", a), openStream(t, f, "", b)
	if sa.StatusCode != 200 || sb.StatusCode != 200 {
		t.Fatalf("streams: %d %d", sa.StatusCode, sb.StatusCode)
	}
	if resp := openStream(t, f, "", c); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third stream while two live: %d, want 503 with Retry-After", resp.StatusCode)
	}
	if resp := openStream(t, f, "", a); resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusConflict {
		t.Fatalf("second stream of a session: %d", resp.StatusCode)
	}
	// The idle streams end by themselves (the clients never close them).
	_, _ = io.Copy(io.Discard, sa.Body)
	_, _ = io.Copy(io.Discard, sb.Body)
	resp := openStream(t, f, "", c)
	if resp.StatusCode != 200 {
		t.Fatalf("stream after the idle ones closed: %d, want 200", resp.StatusCode)
	}
}

func TestHTTPOneStreamPerSession(t *testing.T) {
	f := startHTTP(t, fixtureOpts{noAuth: true})
	sid := f.session(t, "")
	if resp := openStream(t, f, "", sid); resp.StatusCode != 200 {
		t.Fatalf("first stream: %d", resp.StatusCode)
	}
	if resp := openStream(t, f, "", sid); resp.StatusCode != http.StatusConflict {
		t.Fatalf("second stream of the same session: %d, want 409", resp.StatusCode)
	}
}

// TestHTTPRateLimitPerCaller: one caller past its burst gets 429 with
// Retry-After while another caller is served.
func TestHTTPRateLimitPerCaller(t *testing.T) {
	f := startHTTP(t, fixtureOpts{edit: func(c *HTTPConfig) { c.RateLimit = 0.5; c.RateBurst = 3 }})
	greedy := f.token(t, "greedy", "trace:read")
	calm := f.token(t, "calm", "trace:read")
	sid := f.session(t, greedy) // initialize + initialized: 2 of the 3 tokens
	resp, _ := do(t, http.MethodPost, f.resource, rpcHeaders(greedy, sid), callBody("list_operations", `{}`))
	if resp.StatusCode != 200 {
		t.Fatalf("third request within the burst: %d", resp.StatusCode)
	}
	resp, body := do(t, http.MethodPost, f.resource, rpcHeaders(greedy, sid), callBody("list_operations", `{}`))
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("past the burst: %d Retry-After %q, want 429 and 2", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if m := rpcResult(t, body); m["error"] == nil || m["jsonrpc"] != "2.0" {
		t.Fatalf("429 body is not a JSON-RPC error: %s", body)
	}
	calmSID := f.session(t, calm)
	if resp, body := do(t, http.MethodPost, f.resource, rpcHeaders(calm, calmSID), callBody("list_operations", `{}`)); resp.StatusCode != 200 {
		t.Fatalf("another caller: %d %s", resp.StatusCode, body)
	}
	_, m := do(t, http.MethodGet, f.base+"/metrics", nil, "")
	for _, want := range []string{`haia_http_rate_limited_total 1`, `haia_http_requests_total{code="429",method="POST",route="/mcp"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestHTTPToolScopeMustNameATool(t *testing.T) {
	s := newTestServer(t, t.TempDir())
	iss, err := authtest.NewIssuer(t.TempDir(), testIssuer, "http://127.0.0.1:1/mcp")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.NewHTTP(HTTPConfig{
		Resource: "http://127.0.0.1:1/mcp", AllowedHosts: []string{"127.0.0.1:1"},
		Auth: &auth.Config{Issuer: testIssuer, JWKSFile: iss.JWKSPath, ToolScopes: map[string]string{"list-operations": "trace:x", "explain": "trace:y"}},
	})
	if err == nil || !strings.Contains(err.Error(), "no tool of this server: list-operations (the tools are: ") || !strings.Contains(err.Error(), "list_operations") {
		t.Fatalf("err = %v; want the unknown name and the list of tools", err)
	}
}

func TestSessionKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, path, err string
	}{
		{"derived when unset", "", ""},
		{"long enough", write("ok", strings.Repeat("k", 32)+"\n"), ""},
		{"too short", write("short", "abc\n"), "at least 32"},
		{"too long", write("long", strings.Repeat("k", 5000)), "larger than"},
		{"missing", filepath.Join(dir, "nope"), "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key, err := loadSessionKey(tc.path, "https://mcp.example/mcp")
			if tc.err == "" {
				if err != nil || len(key) < 32 {
					t.Fatalf("key %d bytes, err %v", len(key), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
	// Two tables with one key accept each other's ids; another key does
	// not. Without a key file, replicas of one resource derive one key.
	k1, _ := loadSessionKey("", "https://mcp.example/mcp")
	k2, _ := loadSessionKey("", "https://mcp.example/mcp")
	k3, _ := loadSessionKey("", "https://other.example/mcp")
	if !bytes.Equal(k1, k2) || bytes.Equal(k1, k3) {
		t.Fatal("derived keys do not follow the resource")
	}
	key := []byte(strings.Repeat("s", 32))
	m := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	d := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "y"}, []string{"reason"})
	a, b := newSessionTable(key, 10, time.Hour, m, d), newSessionTable(key, 10, time.Hour, m, d)
	c := newSessionTable([]byte(strings.Repeat("t", 32)), 10, time.Hour, m, d)
	id := a.mint("agent")
	if b.admit("agent", id) != admitted || c.admit("agent", id) != admitUnknown || b.admit("other", id) != admitUnknown {
		t.Fatal("session ids are not checked by key and subject")
	}
}
