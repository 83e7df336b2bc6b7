package auth

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
)

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOriginGuard(t *testing.T) {
	hosts := LoopbackHosts("3000")
	g := OriginGuard(hosts, OriginsFor(hosts), "set them with --flag", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	tests := []struct {
		name    string
		host    string
		origins []string
		status  int
	}{
		{"allowed host, no Origin", "127.0.0.1:3000", nil, 200},
		{"allowed host in other case", "LOCALHOST:3000", nil, 200},
		{"IPv6 loopback", "[::1]:3000", nil, 200},
		{"allowed host and Origin", "localhost:3000", []string{"http://localhost:3000"}, 200},
		{"rebinding host", "evil.example:3000", nil, 403},
		{"right name, wrong port", "127.0.0.1:3001", nil, 403},
		{"host without port", "localhost", nil, 403},
		{"bad Origin", "127.0.0.1:3000", []string{"http://evil.example"}, 403},
		{"null Origin", "127.0.0.1:3000", []string{"null"}, 403},
		{"Origin on another port", "127.0.0.1:3000", []string{"http://127.0.0.1:8080"}, 403},
		{"two Origins", "127.0.0.1:3000", []string{"http://127.0.0.1:3000", "http://evil.example"}, 403},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
			req.Host = tc.host
			for _, o := range tc.origins {
				req.Header.Add("Origin", o)
			}
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d", rec.Code, tc.status)
			}
			if (rec.Body.String() == "ok") != (tc.status == 200) {
				t.Fatalf("next handler ran=%v for status %d", rec.Body.String() == "ok", tc.status)
			}
			// A refusal for the Host or an Origin names what is allowed
			// and how the operator changes it.
			if tc.status == 403 && len(tc.origins) < 2 {
				body := rec.Body.String()
				for _, want := range []string{"127.0.0.1:3000", "localhost:3000", "[::1]:3000", "set them with --flag"} {
					if !strings.Contains(body, want) {
						t.Errorf("403 body %q does not name %q", body, want)
					}
				}
			}
		})
	}
}

func TestMetadata(t *testing.T) {
	f := newFixture(t)
	v := f.verifier("jwks")
	path, err := MetadataPath(testResource)
	if err != nil || path != "/.well-known/oauth-protected-resource/mcp" {
		t.Fatalf("MetadataPath = %q, %v", path, err)
	}
	if v.MetadataURL() != testMetaURL {
		t.Fatalf("MetadataURL = %q", v.MetadataURL())
	}
	rec := httptest.NewRecorder()
	v.MetadataHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var got map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"resource":                 testResource,
		"authorization_servers":    []any{testIssuer},
		"scopes_supported":         []any{"trace:read", "trace:write"},
		"bearer_methods_supported": []any{"header"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("metadata\n got %v\nwant %v", got, want)
	}

	rec = httptest.NewRecorder()
	v.MetadataHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST to metadata: status %d", rec.Code)
	}

	cases := map[string]string{
		"https://mcp.example.com/mcp":  "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
		"https://mcp.example.com/":     "https://mcp.example.com/.well-known/oauth-protected-resource",
		"https://mcp.example.com":      "https://mcp.example.com/.well-known/oauth-protected-resource",
		"http://[::1]:3000/tenant/mcp": "http://[::1]:3000/.well-known/oauth-protected-resource/tenant/mcp",
	}
	for res, want := range cases {
		if got, err := MetadataURL(res); err != nil || got != want {
			t.Errorf("MetadataURL(%q) = %q, %v; want %q", res, got, err, want)
		}
	}
	if _, err := MetadataHandler(Config{Resource: testResource}); err == nil {
		t.Error("metadata without an issuer was accepted")
	}
}
