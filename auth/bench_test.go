package auth

import (
	"context"
	"testing"
)

func BenchmarkVerify(b *testing.B) {
	f := newFixture(b)
	jwksV := f.verifier("jwks")
	hmacV := f.verifier("hmac")
	cases := []struct {
		name  string
		v     *Verifier
		token string
	}{
		{"RS256", jwksV, f.rs256(f.claims())},
		{"ES256", jwksV, f.es256(f.claims())},
		{"HS256", hmacV, f.hs256(f.claims())},
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
