package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReload(t *testing.T) {
	f := newFixture(t)
	v := f.verifier("jwks")
	ctx := context.Background()
	oldTok := f.rs256(f.claims())
	newTok := f.sign(map[string]any{"alg": "RS256", "kid": "rsa-2"}, f.claims(), f.otherRSA)

	if _, err := v.Verify(ctx, newTok); err == nil {
		t.Fatal("token of a key not yet in the JWKS was accepted")
	}

	// A good new file is used: the rotated-in key works, the removed one no longer does.
	f.writeJWKS(f.jwksPath, map[string]any{"rsa-2": &f.otherRSA.PublicKey})
	if err := v.Reload(); err != nil {
		t.Fatalf("Reload of a good JWKS: %v", err)
	}
	if _, err := v.Verify(ctx, newTok); err != nil {
		t.Fatalf("token of the new key refused after reload: %v", err)
	}
	if _, err := v.Verify(ctx, oldTok); err == nil {
		t.Fatal("token of a removed key still accepted after reload")
	}

	// A broken file keeps the old keys and says why.
	breakages := []struct {
		name    string
		content string
		want    string
	}{
		{"not JSON", "{not json", "not a valid JWK set"},
		{"no usable key", `{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}`, "no usable key"},
		{"empty file", "", "not a valid JWK set"},
	}
	for _, b := range breakages {
		t.Run(b.name, func(t *testing.T) {
			if err := os.WriteFile(f.jwksPath, []byte(b.content), 0o644); err != nil {
				t.Fatal(err)
			}
			err := v.Reload()
			if err == nil || !strings.Contains(err.Error(), b.want) || !strings.Contains(err.Error(), "previous keys kept") {
				t.Fatalf("Reload error %v; want one saying %q and that the previous keys are kept", err, b.want)
			}
			if _, err := v.Verify(ctx, newTok); err != nil {
				t.Fatalf("previous keys lost after a failed reload: %v", err)
			}
		})
	}

	t.Run("missing file", func(t *testing.T) {
		if err := os.Remove(f.jwksPath); err != nil {
			t.Fatal(err)
		}
		if err := v.Reload(); err == nil || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Reload of a missing file: %v; want a not-exist error", err)
		}
		if _, err := v.Verify(ctx, newTok); err != nil {
			t.Fatalf("previous keys lost after a failed reload: %v", err)
		}
	})
}

func TestReloadHMAC(t *testing.T) {
	f := newFixture(t)
	v := f.verifier("hmac")
	if err := os.WriteFile(f.secretPath, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := v.Reload(); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("Reload of a short secret: %v", err)
	}
	if _, err := v.Verify(context.Background(), f.hs256(f.claims())); err != nil {
		t.Fatalf("old secret lost after a failed reload: %v", err)
	}
}

func TestLoadJWKS(t *testing.T) {
	f := newFixture(t)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaJWK := func(kid string, extra map[string]any) map[string]any {
		m := jwkJSON(kid, &f.rsa.PublicKey)
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name    string
		keys    []map[string]any
		wantErr string   // "" means the file loads
		kids    []string // usable kids when it loads
	}{
		{name: "rsa and ec", keys: []map[string]any{jwkJSON("r", &f.rsa.PublicKey), jwkJSON("e", &f.ec.PublicKey)}, kids: []string{"r", "e"}},
		{name: "rsa key with alg RS256", keys: []map[string]any{rsaJWK("r", map[string]any{"alg": "RS256"})}, kids: []string{"r"}},
		{name: "encryption key skipped", keys: []map[string]any{rsaJWK("enc", map[string]any{"use": "enc"}), jwkJSON("e", &f.ec.PublicKey)}, kids: []string{"e"}},
		{name: "key_ops without verify skipped", keys: []map[string]any{rsaJWK("w", map[string]any{"key_ops": []string{"encrypt"}}), jwkJSON("e", &f.ec.PublicKey)}, kids: []string{"e"}},
		{name: "other RSA alg skipped", keys: []map[string]any{rsaJWK("ps", map[string]any{"alg": "PS256"}), jwkJSON("e", &f.ec.PublicKey)}, kids: []string{"e"}},
		{name: "small RSA skipped", keys: []map[string]any{jwkJSON("small", &small.PublicKey), jwkJSON("e", &f.ec.PublicKey)}, kids: []string{"e"}},
		{name: "P-384 skipped", keys: []map[string]any{jwkJSON("r", &f.rsa.PublicKey), {"kty": "EC", "kid": "p384", "crv": "P-384", "x": b64(padded(p384.X, 48)), "y": b64(padded(p384.Y, 48))}}, kids: []string{"r"}},
		{name: "no kid skipped", keys: []map[string]any{rsaJWK("", nil), jwkJSON("e", &f.ec.PublicKey)}, kids: []string{"e"}},
		{name: "symmetric key skipped", keys: []map[string]any{{"kty": "oct", "kid": "s", "k": b64([]byte("0123456789abcdef0123456789abcdef"))}, jwkJSON("e", &f.ec.PublicKey)}, kids: []string{"e"}},
		{name: "duplicate kid refused", keys: []map[string]any{jwkJSON("k", &f.rsa.PublicKey), jwkJSON("k", &f.ec.PublicKey)}, wantErr: `two usable keys with kid "k"`},
		{name: "nothing usable refused", keys: []map[string]any{jwkJSON("small", &small.PublicKey)}, wantErr: "no usable key"},
		{name: "empty set refused", keys: []map[string]any{}, wantErr: "no usable key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "jwks.json")
			writeJSON(t, path, map[string]any{"keys": tc.keys})
			ks, err := loadJWKS(path, slog.New(slog.DiscardHandler))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v; want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("loadJWKS: %v", err)
			}
			if len(ks.byKID) != len(tc.kids) {
				t.Fatalf("usable keys %d, want %d", len(ks.byKID), len(tc.kids))
			}
			for _, kid := range tc.kids {
				if _, ok := ks.byKID[kid]; !ok {
					t.Errorf("kid %q not usable", kid)
				}
			}
		})
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no issuer", func(c *Config) { c.Issuer = "" }, "issuer is empty"},
		{"relative resource", func(c *Config) { c.Resource = "/mcp" }, "absolute http(s) URL"},
		{"resource with query", func(c *Config) { c.Resource = testResource + "?x=1" }, "must not carry a query"},
		{"no keys", func(c *Config) { c.JWKSFile = "" }, "exactly one of"},
		{"both keys", func(c *Config) { c.HMACSecretFile = f.secretPath }, "both --auth-jwks and --auth-hmac-secret"},
		{"scope with a space", func(c *Config) { c.Scopes = []string{"trace read"} }, "not a valid OAuth scope token"},
		{"scope with a quote", func(c *Config) { c.ToolScopes = map[string]string{"x": `a"b`} }, "not a valid OAuth scope token"},
		{"tool scope without tool", func(c *Config) { c.ToolScopes = map[string]string{"": "trace:write"} }, "names no tool"},
		{"negative leeway", func(c *Config) { c.Leeway = -1 }, "leeway"},
		{"huge leeway", func(c *Config) { c.Leeway = MaxLeeway + 1 }, "leeway"},
		{"tiny token bound", func(c *Config) { c.MaxTokenBytes = 10 }, "max token size"},
		{"missing JWKS file", func(c *Config) { c.JWKSFile = filepath.Join(f.dir, "absent.json") }, "no such file"},
		{"JWKS path is a directory", func(c *Config) { c.JWKSFile = f.dir }, "not a regular file"},
		{"short HMAC secret", func(c *Config) {
			p := filepath.Join(f.dir, "short")
			_ = os.WriteFile(p, []byte("0123456789"), 0o600)
			c.JWKSFile, c.HMACSecretFile = "", p
		}, "at least 32"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config("jwks")
			tc.edit(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error %v; want one containing %q", err, tc.want)
			}
		})
	}
}

// TestReloadConcurrent verifies while keys are swapped; run with -race.
func TestReloadConcurrent(t *testing.T) {
	f := newFixture(t)
	v := f.verifier("jwks")
	tok := f.es256(f.claims())
	done := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			if _, err := v.Verify(context.Background(), tok); err != nil {
				errs <- err
				return
			}
		}
	}()
	for i := 0; i < 20; i++ {
		if err := v.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
	}
	<-done
	select {
	case err := <-errs:
		t.Fatalf("Verify during reload: %v", err)
	default:
	}
}

// TestExampleJWKS keeps the documented example file loadable.
func TestExampleJWKS(t *testing.T) {
	ks, err := loadJWKS(filepath.Join("..", "testdata", "auth", "jwks.example.json"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("example JWKS: %v", err)
	}
	if ks.byKID["example-rs256"].alg != "RS256" || ks.byKID["example-es256"].alg != "ES256" {
		t.Fatalf("example keys pinned to %v", ks.byKID)
	}
}
