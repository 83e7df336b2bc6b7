package auth

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCacheKeepsEveryRule checks that a remembered token is still refused
// once it expires, when the clock goes back before it was verified, and
// after a reload removes its key.
func TestCacheKeepsEveryRule(t *testing.T) {
	f := newFixture(t)
	clock := f.now
	cfg := f.config("jwks")
	cfg.Now = func() time.Time { return clock }
	v, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tok := f.rs256(f.with(func(c map[string]any) { c["nbf"] = f.now.Unix(); delete(c, "iat") })) // exp = now+10m

	if _, err := v.Verify(ctx, tok); err != nil {
		t.Fatalf("first Verify: %v", err)
	}
	if _, err := v.Verify(ctx, tok); err != nil {
		t.Fatalf("cached Verify: %v", err)
	}

	clock = f.now.Add(10*time.Minute + DefaultLeeway + time.Second)
	var te *TokenError
	if _, err := v.Verify(ctx, tok); !errors.As(err, &te) || te.Description != descExpired {
		t.Fatalf("expired cached token: err %v, want %q", err, descExpired)
	}

	clock = f.now
	if _, err := v.Verify(ctx, tok); err != nil {
		t.Fatalf("re-verify: %v", err)
	}
	clock = f.now.Add(-time.Hour) // before nbf, before it was remembered
	if _, err := v.Verify(ctx, tok); !errors.As(err, &te) || te.Description != descNotYetValid {
		t.Fatalf("clock moved back: err %v, want %q", err, descNotYetValid)
	}

	clock = f.now
	if _, err := v.Verify(ctx, tok); err != nil {
		t.Fatalf("re-verify: %v", err)
	}
	f.writeJWKS(f.jwksPath, map[string]any{"ec-1": &f.ec.PublicKey})
	if err := v.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(ctx, tok); !errors.As(err, &te) || te.Description != descKey {
		t.Fatalf("token of a removed key after reload: err %v, want %q", err, descKey)
	}
}

func TestCacheBound(t *testing.T) {
	c := newTokenCache(3)
	now := time.Unix(1_800_000_000, 0)
	for i := 0; i < 10; i++ {
		c.put([32]byte{byte(i)}, Identity{Subject: "s", ExpiresAt: now.Add(time.Hour)}, now)
		if len(c.entries) > 3 {
			t.Fatalf("cache holds %d entries, bound 3", len(c.entries))
		}
	}
	if _, ok := c.get([32]byte{9}, now, 0); !ok {
		t.Fatal("latest entry missing")
	}
	if newTokenCache(-1) != nil {
		t.Fatal("a negative size must turn the cache off")
	}
}
