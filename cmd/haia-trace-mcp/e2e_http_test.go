package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth/authtest"
)

// httpProc is the real binary serving Streamable HTTP.
type httpProc struct {
	cmd      *exec.Cmd
	base     string // http://127.0.0.1:PORT
	resource string
	mu       sync.Mutex
	log      strings.Builder
	exited   chan struct{}
	exitErr  error
}

func (p *httpProc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// startHTTPBinary starts the binary with --http 127.0.0.1:0 and the given
// flags, and waits for the log line that names the bound address.
func startHTTPBinary(t *testing.T, args ...string) *httpProc {
	t.Helper()
	return startHTTPCommand(t, append([]string{"--http", "127.0.0.1:0"}, args...)...)
}

// startHTTPCommand is startHTTPBinary with the whole command line given
// (a subcommand first, such as proxy).
func startHTTPCommand(t *testing.T, args ...string) *httpProc {
	t.Helper()
	return startHTTPCommandEnv(t, nil, args...)
}

// startHTTPCommandEnv is startHTTPCommand with variables added to the
// environment.
func startHTTPCommandEnv(t *testing.T, env []string, args ...string) *httpProc {
	t.Helper()
	return startHTTPBin(t, binPath, env, args...)
}

// startHTTPBin is startHTTPCommandEnv of the binary at bin (another build).
func startHTTPBin(t *testing.T, bin string, env []string, args ...string) *httpProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &httpProc{cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
			p.mu.Unlock()
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "serving MCP over Streamable HTTP" {
				addr <- rec.Addr
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.exitErr = cmd.Wait()
		close(p.exited)
	}()
	select {
	case a := <-addr:
		p.base = "http://" + a
		p.resource = p.base + "/mcp"
	case <-p.exited:
		t.Fatalf("server exited before serving: %v\n%s", p.exitErr, p.logs())
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("server did not start:\n%s", p.logs())
	}
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit code.
func (p *httpProc) stop(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Fatalf("no exit after SIGTERM:\n%s", p.logs())
	}
	return p.cmd.ProcessState.ExitCode()
}

// bearer adds a token to every request of the SDK client.
type bearer struct {
	token func() string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if tok := b.token(); tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	return b.next.RoundTrip(r)
}

// httpSession connects the official Go SDK client to url with token.
func httpSession(t *testing.T, url string, token func() string) (*mcp.ClientSession, error) {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-http", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := &mcp.StreamableClientTransport{
		Endpoint:   url,
		HTTPClient: &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}},
		MaxRetries: -1,
	}
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { cs.Close() })
	return cs, nil
}

// exerciseEveryTool lists the tools and calls each with arguments that
// must succeed on sampleRoot, failing on any tool it does not know, so a
// new tool cannot go untested over HTTP.
func exerciseEveryTool(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]map[string]any{
		"list_operations":  {},
		"get_receipt":      {"run_id": "run-1", "operation_id": "op-a"},
		"explain":          {"run_id": "run-1", "operation_id": "op-b"},
		"check_before_pay": {"counterparty": sellerB, "amount": "0.10"},
	}
	var reviewID string
	order := []string{"list_operations", "get_receipt", "explain", "check_before_pay", "get_review_status"}
	listed := map[string]bool{}
	for _, tool := range tools.Tools {
		listed[tool.Name] = true
		if _, ok := known[tool.Name]; !ok && tool.Name != "get_review_status" {
			t.Errorf("tool %s is not exercised over HTTP; add it to exerciseEveryTool", tool.Name)
		}
	}
	for _, name := range order {
		if !listed[name] {
			if name == "list_operations" || name == "get_receipt" || name == "explain" {
				t.Errorf("tool %s is not listed", name)
			}
			continue
		}
		args := known[name]
		if name == "get_review_status" {
			if reviewID == "" {
				t.Errorf("get_review_status: check_before_pay gave no review_id to look up")
				continue
			}
			args = map[string]any{"review_id": reviewID}
		}
		var out map[string]any
		decodeStructured(t, callTool(t, cs, name, args), &out)
		if name == "check_before_pay" {
			if out["decision"] != "review" {
				t.Errorf("check_before_pay for the seller who never settled: %v", out)
			}
			reviewID, _ = out["review_id"].(string)
		}
	}
}

// TestHTTPEndToEnd drives the real binary over Streamable HTTP with the
// official SDK client, authenticated by ES256 (JWKS) tokens.
func TestHTTPEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	// The resource URL contains the port, which is known only after the
	// bind, so the issuer is told the audience afterwards.
	iss, err := authtest.NewIssuer(dir, "https://as.test.example", "")
	if err != nil {
		t.Fatal(err)
	}
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", iss.Issuer, "--auth-jwks", iss.JWKSPath, "--auth-scope", "trace:read",
		"--auth-tool-scope", "check_before_pay=trace:guard")
	iss.Resource = p.resource
	token := func(scopes ...string) func() string {
		tok, err := iss.Token("agent-http", scopes, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return func() string { return tok }
	}

	cs, err := httpSession(t, p.resource, token("trace:read", "trace:guard"))
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	exerciseEveryTool(t, cs)

	// The subject of the token is who asked: it reaches the request log.
	if !strings.Contains(p.logs(), `"sub":"agent-http"`) {
		t.Errorf("the token's subject is not in the request log")
	}

	// Without the step-up scope, check_before_pay is refused with a challenge.
	readOnly, err := httpSession(t, p.resource, token("trace:read"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readOnly.CallTool(context.Background(), &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": sellerA, "amount": "0.01"}}); err == nil {
		t.Error("check_before_pay without trace:guard succeeded")
	}

	// Raw HTTP: no token, a token for another resource.
	other, err := iss.Sign(map[string]any{"iss": iss.Issuer, "aud": "https://elsewhere.example/mcp", "sub": "x",
		"exp": time.Now().Add(time.Hour).Unix(), "scope": "trace:read trace:guard"})
	if err != nil {
		t.Fatal(err)
	}
	mdURL := p.base + "/.well-known/oauth-protected-resource/mcp"
	for _, c := range []struct {
		name, token, challenge string
	}{
		{"no token", "", `Bearer resource_metadata="` + mdURL + `"`},
		{"other resource", other, `error="invalid_token"`},
	} {
		status, hdr := rawInitialize(t, p.resource, c.token)
		if status != http.StatusUnauthorized || !strings.Contains(hdr, c.challenge) {
			t.Errorf("%s: %d %q, want 401 with %q", c.name, status, hdr, c.challenge)
		}
	}
	if _, err := httpSession(t, p.resource, func() string { return other }); err == nil {
		t.Error("the SDK client connected with a token for another resource")
	}

	// SIGHUP with a broken JWKS keeps the old keys.
	if err := os.WriteFile(iss.JWKSPath, []byte(`{"keys": [`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "key reload failed")
	cs2, err := httpSession(t, p.resource, token("trace:read"))
	if err != nil {
		t.Fatalf("connect after a bad reload: %v", err)
	}
	callTool(t, cs2, "list_operations", nil)

	// Health answers, and the healthcheck command agrees.
	if _, errOut, code := runCLI(t, "healthcheck", "--url", p.base+"/healthz"); code != 0 {
		t.Errorf("healthcheck: %d %s", code, errOut)
	}

	cs.Close()
	readOnly.Close()
	cs2.Close()
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d\n%s", code, p.logs())
	}
	if _, _, code := runCLI(t, "healthcheck", "--url", p.base+"/healthz", "--timeout", "2s"); code != 1 {
		t.Errorf("healthcheck of a stopped server: exit %d, want 1", code)
	}
}

// TestHTTPEndToEndHS256 runs the same tools with an HS256 secret file.
func TestHTTPEndToEndHS256(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("k", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile)
	tok := signHS256(t, secret, map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": "hs-agent",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	cs, err := httpSession(t, p.resource, func() string { return tok })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	exerciseEveryTool(t, cs)
	cs.Close()
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d", code)
	}
}

func TestHTTPBindingRules(t *testing.T) {
	root := sampleRoot(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"remote without opt-in", []string{"--http", "0.0.0.0:0", "--http-insecure-no-auth"}, "--http-allow-remote"},
		{"insecure off loopback", []string{"--http", "0.0.0.0:0", "--http-allow-remote", "--http-insecure-no-auth"}, "loopback only"},
		{"no auth flags", []string{"--http", "127.0.0.1:0"}, "--auth-issuer"},
		{"insecure with auth flags", []string{"--http", "127.0.0.1:0", "--http-insecure-no-auth", "--auth-issuer", "x"}, "cannot be combined"},
		{"bad tool scope", []string{"--http", "127.0.0.1:0", "--auth-issuer", "x", "--auth-hmac-secret", "s", "--auth-tool-scope", "explain"}, "TOOL=SCOPE"},
		{"not host:port", []string{"--http", "localhost"}, "HOST:PORT"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, code := runCLI(t, append([]string{"--dir", root}, c.args...)...)
			if code != exitUsage || !strings.Contains(errOut, c.want) {
				t.Fatalf("exit %d, stderr %q; want %d mentioning %q", code, errOut, exitUsage, c.want)
			}
		})
	}
}

// A request refused for its Host (or Origin) says which are allowed and
// which flags set them, so the operator behind a proxy knows what to pass.
func TestHTTPHostRefusalNamesTheFlag(t *testing.T) {
	p := startHTTPBinary(t, "--dir", sampleRoot(t), "--http-insecure-no-auth", "--public-url", "https://mcp.example.com")
	_, port, _ := strings.Cut(strings.TrimPrefix(p.base, "http://"), ":")
	for _, tc := range []struct{ host, origin string }{{"evil.example", ""}, {"", "https://evil.example"}} {
		req, _ := http.NewRequest(http.MethodPost, p.resource, strings.NewReader(`{}`))
		if tc.host != "" {
			req.Host = tc.host
		}
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("Host %q Origin %q: %d %s, want 403", tc.host, tc.origin, resp.StatusCode, body)
		}
		for _, want := range []string{"evil.example", "127.0.0.1:" + port, "mcp.example.com", "--public-url", "--http"} {
			if !strings.Contains(string(body), want) {
				t.Errorf("Host %q Origin %q: the refusal %q does not name %q", tc.host, tc.origin, body, want)
			}
		}
	}
}

func rawInitialize(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

func waitLog(t *testing.T, p *httpProc, substr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.logs(), substr) {
		if time.Now().After(deadline) {
			t.Fatalf("log never said %q:\n%s", substr, p.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func signHS256(t *testing.T, secret []byte, claims map[string]any) string {
	t.Helper()
	tok, err := hs256(secret, claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// hs256 signs claims as a compact HS256 JWT, the way a local authorization
// server sharing --auth-hmac-secret would.
func hs256(secret []byte, claims map[string]any) (string, error) {
	enc := base64.RawURLEncoding.EncodeToString
	body, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("encode claims: %w", err)
	}
	input := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc(body)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(input))
	return input + "." + enc(mac.Sum(nil)), nil
}

// TestOIDCAuthorizationServer runs against a real authorization server:
// oidc-provider (tools/oidc) on loopback issues JWT access tokens by client
// credentials with a resource indicator; the SDK client calls every tool
// with one; a token it issued for another resource is refused.
func TestOIDCAuthorizationServer(t *testing.T) {
	node := os.Getenv("HAIA_NODE")
	if node == "" {
		t.Skip("HAIA_NODE not set: the oidc-provider end-to-end test needs a Node 22 binary (tools/ci-node.sh sets it)")
	}
	asDir, err := filepath.Abs(filepath.Join("..", "..", "tools", "oidc"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(asDir, "node_modules", "oidc-provider")); err != nil {
		t.Skipf("tools/oidc/node_modules is missing (run npm ci in %s): %v", asDir, err)
	}
	dir := t.TempDir()
	jwks := filepath.Join(dir, "as-jwks.json")
	as := exec.Command(node, filepath.Join(asDir, "server.mjs"), "--jwks-out", jwks)
	as.Dir = asDir
	out, err := as.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var asErr strings.Builder
	as.Stderr = &asErr
	if err := as.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = as.Process.Signal(syscall.SIGTERM); _ = as.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("authorization server did not start: %v\n%s", err, asErr.String())
	}
	var info struct {
		Issuer        string `json:"issuer"`
		TokenEndpoint string `json:"token_endpoint"`
	}
	if err := json.Unmarshal([]byte(line), &info); err != nil {
		t.Fatalf("authorization server said %q: %v", line, err)
	}

	root := sampleRoot(t)
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", info.Issuer, "--auth-jwks", jwks, "--auth-scope", "trace:read",
		"--auth-tool-scope", "check_before_pay=trace:guard")

	token := clientCredentials(t, info.TokenEndpoint, p.resource)
	cs, err := httpSession(t, p.resource, func() string { return token })
	if err != nil {
		t.Fatalf("connect with the authorization server's token: %v\n%s", err, p.logs())
	}
	exerciseEveryTool(t, cs)
	if !strings.Contains(p.logs(), `"sub":"haia-agent"`) {
		t.Error("the client's subject is not in the request log")
	}

	other := clientCredentials(t, info.TokenEndpoint, "http://127.0.0.1:1/mcp")
	if status, hdr := rawInitialize(t, p.resource, other); status != http.StatusUnauthorized || !strings.Contains(hdr, `error="invalid_token"`) {
		t.Errorf("token for another resource: %d %q, want 401 invalid_token", status, hdr)
	}
	cs.Close()
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit after SIGTERM: %d", code)
	}
}

// clientCredentials obtains an access token for resource by a plain
// client-credentials POST (RFC 6749 §4.4, RFC 8707).
func clientCredentials(t *testing.T, endpoint, resource string) string {
	t.Helper()
	form := url.Values{
		"grant_type":    {"client_credentials"},
		"client_id":     {"haia-agent"},
		"client_secret": {"haia-agent-secret-for-tests-only"},
		"scope":         {"trace:read trace:guard"},
		"resource":      {resource},
	}
	resp, err := http.PostForm(endpoint, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tok struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil || tok.AccessToken == "" {
		t.Fatalf("token endpoint: HTTP %d %v %s %s", resp.StatusCode, err, tok.Error, tok.Description)
	}
	return tok.AccessToken
}

// TestHTTPBoundsEndToEnd runs the real binary with short stream bounds and
// a tight rate limit: tokens with bad time claims are refused, an unknown
// session id is 404, an idle stream is closed after --http-stream-idle
// with keep-alive comments before it, the SDK client keeps working across
// that, and a caller past its burst gets 429 while another is served.
func TestHTTPBoundsEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	iss, err := authtest.NewIssuer(dir, "https://as.test.example", "")
	if err != nil {
		t.Fatal(err)
	}
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", iss.Issuer, "--auth-jwks", iss.JWKSPath, "--auth-scope", "trace:read",
		"--auth-max-token-lifetime", "2h",
		"--http-stream-idle", "1500ms", "--http-stream-ping", "200ms",
		"--rate-limit", "1", "--rate-burst", "20")
	iss.Resource = p.resource
	now := time.Now()
	claims := func(edit func(map[string]any)) string {
		c := map[string]any{"iss": iss.Issuer, "aud": p.resource, "sub": "agent-b", "scope": "trace:read",
			"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		edit(c)
		tok, err := iss.Sign(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	for _, c := range []struct{ name, token, reason string }{
		{"exp 0", claims(func(c map[string]any) { c["exp"] = 0 }), "not later than the Unix epoch"},
		{"exp as a digit string", claims(func(c map[string]any) { c["exp"] = fmt.Sprint(now.Add(time.Hour).Unix()) }), "not a JSON number"},
		{"exp as RFC 3339", claims(func(c map[string]any) { c["exp"] = now.Add(time.Hour).Format(time.RFC3339) }), "not a JSON number"},
		{"lifetime over --auth-max-token-lifetime", claims(func(c map[string]any) { c["exp"] = now.Add(3 * time.Hour).Unix() }), "lifetime exceeds"},
	} {
		status, hdr := rawInitialize(t, p.resource, c.token)
		if status != http.StatusUnauthorized || !strings.Contains(hdr, `error="invalid_token"`) || !strings.Contains(hdr, c.reason) {
			t.Errorf("%s: %d %q, want 401 invalid_token mentioning %q", c.name, status, hdr, c.reason)
		}
	}

	good := claims(func(map[string]any) {})
	hdr := map[string]string{"Authorization": "Bearer " + good, "Accept": "text/event-stream",
		"Mcp-Session-Id": "s1.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA"}
	if status := rawRequest(t, http.MethodGet, p.resource, hdr); status != http.StatusNotFound {
		t.Errorf("GET with an unknown session id: %d, want 404", status)
	}

	// A raw GET stream on a real session: keep-alive comments, then the
	// server closes it after --http-stream-idle; the session still answers.
	cs, err := httpSession(t, p.resource, func() string { return good })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	sid := rawSession(t, p.resource, good)
	hdr["Mcp-Session-Id"] = sid
	start := time.Now()
	req, _ := http.NewRequest(http.MethodGet, p.resource, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	lasted := time.Since(start)
	if resp.StatusCode != 200 || err != nil || lasted < 1500*time.Millisecond || lasted > 5*time.Second || strings.Count(string(body), ": ping") < 3 {
		t.Errorf("idle stream: %d after %s (err %v) with %d pings; want 200, closed after 1.5s, pings every 200ms",
			resp.StatusCode, lasted, err, strings.Count(string(body), ": ping"))
	}
	callTool(t, cs, "list_operations", nil)
	_, metrics := httpGet(t, p.base+"/metrics")
	if !strings.Contains(metrics, `haia_mcp_streams_closed_total{reason="idle"} 1`) {
		t.Errorf("idle stream close not counted:\n%s", grepLines(metrics, "haia_mcp_streams"))
	}

	// Rate limit: agent-b has used some of its 20; burn the rest.
	limited := 0
	for range 25 {
		if status, _ := rawInitialize(t, p.resource, good); status == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited == 0 {
		t.Fatal("25 quick requests past a burst of 20 were never refused with 429")
	}
	other := claims(func(c map[string]any) { c["sub"] = "agent-c" })
	if status, _ := rawInitialize(t, p.resource, other); status != http.StatusOK {
		t.Fatalf("another caller while agent-b is limited: %d, want 200", status)
	}
	cs.Close()
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d\n%s", code, p.logs())
	}
}

// TestHTTPStartRefusals: a per-tool scope naming no tool, and a signing
// key file owned by another user, stop the server before it listens.
func TestHTTPStartRefusals(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("k", 48)), 0o600); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "signing.pem")
	_, errOut, code := runCLI(t, "--dir", root, "--key-file", key, "--http", "127.0.0.1:0",
		"--auth-issuer", "http://127.0.0.1/as", "--auth-hmac-secret", secret,
		"--auth-tool-scope", "check-before-pay=trace:guard")
	if code != exitUsage || !strings.Contains(errOut, "check-before-pay") || !strings.Contains(errOut, "check_before_pay") || !strings.Contains(errOut, "list_operations") {
		t.Fatalf("tool-scope typo: exit %d, stderr %q; want %d naming the typo and the tools", code, errOut, exitUsage)
	}
	for _, bad := range [][]string{{"--rate-limit", "0"}, {"--http-max-sessions", "-1"}, {"--http-stream-idle", "0s"}} {
		_, errOut, code := runCLI(t, append([]string{"--dir", root, "--http", "127.0.0.1:0", "--http-insecure-no-auth"}, bad...)...)
		if code != exitUsage || !strings.Contains(errOut, bad[0]+" must be above zero") {
			t.Errorf("%v: exit %d, stderr %q", bad, code, errOut)
		}
	}
	// The tenants' bounds are refused with --tenants-dir, before any
	// tenant's store is opened.
	tenants := tenantRoots(t)
	for _, bad := range [][]string{{"--tenant-slots", "0"}, {"--tenant-max-in-flight", "-2"}, {"--tenant-queue", "0"}, {"--tenant-wait", "0s"}} {
		_, errOut, code := runCLI(t, append([]string{"--tenants-dir", tenants, "--tenant-claim", "org", "--key-file", key, "--http", "127.0.0.1:0",
			"--auth-issuer", "http://127.0.0.1/as", "--auth-hmac-secret", secret}, bad...)...)
		if code != exitUsage || !strings.Contains(errOut, bad[0]+" must be above zero") {
			t.Errorf("%v: exit %d, stderr %q", bad, code, errOut)
		}
	}

	if os.Geteuid() != 0 {
		t.Skip("a key file owned by another user needs root to set up")
	}
	// Let the server create the key, then hand it to another uid.
	p := startHTTPBinary(t, "--dir", root, "--key-file", key, "--http-insecure-no-auth")
	if code := p.stop(t); code != 0 {
		t.Fatalf("first start: exit %d\n%s", code, p.logs())
	}
	if err := os.Chown(key, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runCLI(t, "--dir", root, "--key-file", key, "--http", "127.0.0.1:0", "--http-insecure-no-auth")
	if code == exitOK || !strings.Contains(errOut, key) || !strings.Contains(errOut, "uid 4242") {
		t.Fatalf("foreign-owned key: exit %d, stderr %q; want a refusal naming %s and uid 4242", code, errOut, key)
	}
}

// rawSession initializes a session by hand and returns its id.
func rawSession(t *testing.T, url, token string) string {
	t.Helper()
	post := func(body, sid string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`, "")
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || sid == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, sid)
	}
	if resp := post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, sid); resp.StatusCode/100 != 2 {
		t.Fatalf("initialized: %d", resp.StatusCode)
	}
	return sid
}

func rawRequest(t *testing.T, method, url string, hdr map[string]string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
