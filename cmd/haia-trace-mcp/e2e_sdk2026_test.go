package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// replicaHost is the public name both replicas answer to, as behind a
// load balancer: the token's audience is <public-url>/mcp for both.
const replicaHost = "mcp.replicas.test"

// replicaTransport spreads the client's requests over several server
// processes, one request each in turn (or a chosen one next), and records
// which replica answered which JSON-RPC method and any session header.
type replicaTransport struct {
	token    string
	backends []string // host:port of each replica

	mu       sync.Mutex
	next     int
	served   []servedRequest
	sessions []string // Mcp-Session-Id values seen, in either direction
}

type servedRequest struct {
	method  string
	replica int
}

// sendNextTo makes the next request go to replica i.
func (r *replicaTransport) sendNextTo(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next = i
}

func (r *replicaTransport) log() []servedRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]servedRequest(nil), r.served...)
}

func (r *replicaTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var method string
	if req.Body != nil {
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		var msg struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(body, &msg) == nil {
			method = msg.Method
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
	}
	r.mu.Lock()
	i := r.next
	r.next = (r.next + 1) % len(r.backends)
	r.served = append(r.served, servedRequest{method: method, replica: i})
	if id := req.Header.Get("Mcp-Session-Id"); id != "" {
		r.sessions = append(r.sessions, id)
	}
	r.mu.Unlock()

	out := req.Clone(req.Context())
	out.URL = &url.URL{Scheme: "http", Host: r.backends[i], Path: req.URL.Path, RawQuery: req.URL.RawQuery}
	out.Host = replicaHost
	out.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err == nil {
		if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
			r.mu.Lock()
			r.sessions = append(r.sessions, id)
			r.mu.Unlock()
		}
	}
	return resp, err
}

// TestHTTPProtocol20260728Replicas connects the official Go SDK as a
// 2026-07-28 client: server/discover instead of initialize, no session,
// and every request free to land on any of two server processes that share
// one Trace root (and one signing key, as replicas behind a signer would).
func TestHTTPProtocol20260728Replicas(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "hs256-secret")
	secret := []byte(strings.Repeat("r", 48))
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	const issuer = "http://127.0.0.1/local-as"
	publicURL := "http://" + replicaHost
	args := []string{"--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", issuer, "--auth-hmac-secret", secretFile, "--public-url", publicURL}
	// One after the other, so that the first creates the shared key.
	a := startHTTPBinary(t, args...)
	b := startHTTPBinary(t, args...)
	tok := signHS256(t, secret, map[string]any{"iss": issuer, "aud": publicURL + "/mcp", "sub": "replica-agent",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	rt := &replicaTransport{token: tok, backends: []string{
		strings.TrimPrefix(a.base, "http://"), strings.TrimPrefix(b.base, "http://")}}

	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-2026", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   publicURL + "/mcp",
		HTTPClient: &http.Client{Transport: rt},
		MaxRetries: -1,
	}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatalf("connect as a 2026-07-28 client: %v\nreplica A:\n%s\nreplica B:\n%s", err, a.logs(), b.logs())
	}
	defer cs.Close()
	init := cs.InitializeResult()
	if init.ProtocolVersion != "2026-07-28" {
		t.Fatalf("negotiated %q, want 2026-07-28", init.ProtocolVersion)
	}
	if init.ServerInfo == nil || init.ServerInfo.Name != "haia-trace-mcp" || !versionToken.MatchString(init.ServerInfo.Version) {
		t.Errorf("serverInfo from server/discover: %+v", init.ServerInfo)
	}

	// Every tool, the requests alternating between the replicas.
	exerciseEveryTool(t, cs)

	// A decision taken on one replica is read on the other.
	rt.sendNextTo(0)
	var answer checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.20"}), &answer)
	if answer.Decision != "review" || answer.ReviewID == "" {
		t.Fatalf("check_before_pay on replica A: %+v", answer)
	}
	rt.sendNextTo(1)
	var status struct {
		ReviewID string `json:"review_id"`
		Status   string `json:"status"`
	}
	decodeStructured(t, callTool(t, cs, "get_review_status", map[string]any{"review_id": answer.ReviewID}), &status)
	if status.ReviewID != answer.ReviewID || status.Status != "pending" {
		t.Errorf("replica B reads the review replica A opened as %+v", status)
	}

	log := rt.log()
	perReplica := map[int]map[string]bool{0: {}, 1: {}}
	for _, s := range log {
		perReplica[s.replica][s.method] = true
		if s.method == "initialize" || s.method == "notifications/initialized" {
			t.Errorf("a 2026-07-28 client sent %s", s.method)
		}
	}
	if !perReplica[0]["server/discover"] && !perReplica[1]["server/discover"] {
		t.Errorf("no server/discover was sent: %+v", log)
	}
	for i, m := range perReplica {
		if !m["tools/call"] {
			t.Errorf("replica %d answered no tools/call: %+v", i, log)
		}
	}
	if len(rt.sessions) != 0 {
		t.Errorf("Mcp-Session-Id seen in a stateless exchange: %v", rt.sessions)
	}
	// Both replicas wrote into the one decision chain, which verifies.
	chain, n := chainFile(t, root)
	if n < 2 {
		t.Errorf("the shared chain has %d receipts, want the decisions of both replicas", n)
	}
	if out, code := verifyChain(t, root, chain); code != 0 {
		t.Errorf("verify after two replicas: exit %d\n%s", code, out)
	}
	cs.Close()
	if code := a.stop(t); code != 0 {
		t.Errorf("replica A exit %d", code)
	}
	if code := b.stop(t); code != 0 {
		t.Errorf("replica B exit %d", code)
	}
}

// TestHTTPProtocol20251125Session: a client that asks for 2025-11-25
// still gets the initialize handshake and a session, beside the stateless
// revision above.
func TestHTTPProtocol20251125Session(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "hs256-secret")
	secret := []byte(strings.Repeat("s", 48))
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	const issuer = "http://127.0.0.1/local-as"
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"),
		"--auth-issuer", issuer, "--auth-hmac-secret", secretFile)
	tok := signHS256(t, secret, map[string]any{"iss": issuer, "aud": p.resource, "sub": "legacy-agent",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-2025", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   p.resource,
		HTTPClient: &http.Client{Transport: bearer{token: func() string { return tok }, next: http.DefaultTransport}},
		MaxRetries: -1,
	}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect as a 2025-11-25 client: %v\n%s", err, p.logs())
	}
	defer cs.Close()
	if v := cs.InitializeResult().ProtocolVersion; v != "2025-11-25" {
		t.Errorf("negotiated %q, want 2025-11-25", v)
	}
	if cs.ID() == "" {
		t.Error("no session id under 2025-11-25")
	}
	exerciseEveryTool(t, cs)
}
