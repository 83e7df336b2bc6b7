package authtest

import (
	"context"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
)

func TestIssuerTokensVerify(t *testing.T) {
	now := time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)
	iss, err := NewIssuer(t.TempDir(), "https://auth.example", "http://127.0.0.1:3000/mcp")
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.New(auth.Config{
		Issuer: iss.Issuer, Resource: iss.Resource, JWKSFile: iss.JWKSPath,
		Scopes: []string{"trace:read"}, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := iss.Token("agent-1", []string{"trace:read", "trace:write"}, now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.Verify(context.Background(), tok)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if id.Subject != "agent-1" || !id.HasScope("trace:write") {
		t.Fatalf("identity %+v", id)
	}
	expired, err := iss.Token("agent-1", []string{"trace:read"}, now.Add(-time.Hour), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), expired); err == nil {
		t.Fatal("expired token accepted")
	}
}
