package auth

import (
	"context"
	"testing"
)

func BenchmarkVerify(b *testing.B) {
	f := newFixture(b)
	mk := func(keys string, cacheSize int) *Verifier {
		cfg := f.config(keys)
		cfg.CacheSize = cacheSize
		v, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	cases := []struct {
		name  string
		v     *Verifier
		token string
	}{
		// Uncached: the full cost of a token seen for the first time.
		{"RS256", mk("jwks", -1), f.rs256(f.claims())},
		{"ES256", mk("jwks", -1), f.es256(f.claims())},
		{"HS256", mk("hmac", -1), f.hs256(f.claims())},
		// Cached: a client reusing its token.
		{"RS256-cached", mk("jwks", 0), f.rs256(f.claims())},
	}
	ctx := context.Background()
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.v.Verify(ctx, c.token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
