package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// hostAs sends every request with another Host header, as a client that
// reaches the server through a port mapping (podman run -p 8080:3000)
// does: it dials the real address and names the published one.
type hostAs struct {
	host string
	next http.RoundTripper
}

func (h hostAs) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	return h.next.RoundTrip(r)
}

// --http-allowed-host lets the server answer to the name a port mapping
// sends, checked as the listen address is (other names and origins are
// still 403, naming the flag), and leaves the token audience alone: a
// token for the resource URL works through the mapped name, one for the
// mapped name does not. Values that are no Host header are refused at
// start with the value and why.
func TestHTTPAllowedHostForAPortMapping(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("k", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	const iss = "http://127.0.0.1/local-as"
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", iss, "--auth-hmac-secret", secretFile,
		"--http-allowed-host", "localhost:8080", "--http-allowed-host", "MCP.Internal")
	token := func(aud string) string {
		return signHS256(t, secret, map[string]any{"iss": iss, "aud": aud, "sub": "mapped-agent",
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	}
	good := token(p.resource)

	// The official SDK client through the mapped name: every tool answers.
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-mapped", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.resource, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: hostAs{host: "localhost:8080", next: bearer{token: func() string { return good }, next: http.DefaultTransport}}}}, nil)
	if err != nil {
		t.Fatalf("connect through Host localhost:8080: %v\n%s", err, p.logs())
	}
	exerciseEveryTool(t, cs)
	cs.Close()

	do := func(host, origin, tok string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, p.resource, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	for _, tc := range []struct {
		host, origin, tok string
		want              int
	}{
		{"mcp.internal", "", good, http.StatusOK},                                           // compared without case
		{"localhost:8080", "http://localhost:8080", good, http.StatusOK},                    // its browser origin too
		{"localhost:8080", "", token("http://localhost:8080/mcp"), http.StatusUnauthorized}, // the audience did not change
		{"localhost:8081", "", good, http.StatusForbidden},
		{"evil.example", "", good, http.StatusForbidden},
		{"localhost:8080", "http://evil.example", good, http.StatusForbidden},
	} {
		code, body := do(tc.host, tc.origin, tc.tok)
		if code != tc.want {
			t.Errorf("Host %q Origin %q: %d %s, want %d", tc.host, tc.origin, code, body, tc.want)
		}
		if code == http.StatusForbidden && (!strings.Contains(body, "--http-allowed-host") || !strings.Contains(body, "localhost:8080") || !strings.Contains(body, "mcp.internal")) {
			t.Errorf("Host %q: the refusal %q does not name the flag and the names it added", tc.host, body)
		}
	}
	// The protected resource metadata still names the listen address's
	// resource.
	code, md := httpGet(t, p.base+"/.well-known/oauth-protected-resource/mcp")
	var meta struct {
		Resource string `json:"resource"`
	}
	if json.Unmarshal([]byte(md), &meta); code != 200 || meta.Resource != p.resource {
		t.Errorf("resource metadata: %d %s, want resource %s", code, md, p.resource)
	}

	for _, tc := range []struct{ value, why string }{
		{"", "empty"},
		{"http://localhost:8080", "scheme"},
		{"*.example.com", "wildcard"},
		{"localhost:0", "1 to 65535"},
		{"localhost:http", "1 to 65535"},
		{"localhost:", "port after the colon is missing"},
		{"::1", "brackets"},
		{"[127.0.0.1]:80", "only an IPv6 address"},
		{"exa mple.com", "not a DNS name"},
		{"-bad.example", "not a DNS name"},
		{"host/path", "path"},
	} {
		_, errOut, code := runCLI(t, "--dir", root, "--http", "127.0.0.1:0", "--http-insecure-no-auth", "--http-allowed-host", tc.value)
		if code != exitUsage || !strings.Contains(errOut, "--http-allowed-host \""+tc.value+"\"") || !strings.Contains(errOut, tc.why) {
			t.Errorf("--http-allowed-host %q: exit %d %q, want %d naming it and %q", tc.value, code, errOut, exitUsage, tc.why)
		}
	}
	for _, ok := range []string{"[::1]:8080", "[::1]", "10.0.0.7:3000", "mcp_1.internal"} {
		if _, err := checkAllowedHost(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}
