package auth

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// signRawRS256 signs a payload given as raw JSON text, so that a test can
// put in what a map cannot hold (a repeated member name, 0.0).
func (f *fixture) signRawRS256(payload string) string {
	f.t.Helper()
	h, err := json.Marshal(map[string]any{"alg": "RS256", "kid": "rsa-1", "typ": "at+jwt"})
	if err != nil {
		f.t.Fatal(err)
	}
	input := b64(h) + "." + b64([]byte(payload))
	digest := sha256.Sum256([]byte(input))
	sig, err := rsa.SignPKCS1v15(rand.Reader, f.rsa, crypto.SHA256, digest[:])
	if err != nil {
		f.t.Fatal(err)
	}
	return input + "." + b64(sig)
}

func jsonInt(n int64) string { return strconv.FormatInt(n, 10) }

func mustNew(t *testing.T, cfg Config) *Verifier {
	t.Helper()
	v, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestTokenTimeClaimsAndLifetime(t *testing.T) {
	f := newFixture(t)
	v := f.verifier("jwks")
	now := f.now
	at := func(d time.Duration) int64 { return now.Add(d).Unix() }
	edit := func(fn func(c map[string]any)) string { return f.rs256(f.with(fn)) }
	tests := []struct {
		name  string
		token string
		want  string // "" accepted, else the client-facing description
	}{
		{"valid", f.rs256(f.claims()), ""},
		{"exp 0 (jwx reads it as unset)", edit(func(c map[string]any) { c["exp"] = 0 }), descBadExpiry},
		{"exp negative", edit(func(c map[string]any) { c["exp"] = -1 }), descBadExpiry},
		{"exp 0.0", f.signRawRS256(`{"iss":"` + testIssuer + `","sub":"agent-7","aud":"` + testResource + `","exp":0.0,"scope":"trace:read"}`), descBadExpiry},
		{"exp as a digit string", edit(func(c map[string]any) { c["exp"] = "1785000000" }), descTimeClaim},
		{"exp as RFC 3339", edit(func(c map[string]any) { c["exp"] = now.Add(time.Hour).Format(time.RFC3339) }), descTimeClaim},
		{"exp null", edit(func(c map[string]any) { c["exp"] = nil }), descTimeClaim},
		{"exp true", edit(func(c map[string]any) { c["exp"] = true }), descTimeClaim},
		{"exp an object", edit(func(c map[string]any) { c["exp"] = map[string]any{"t": at(time.Hour)} }), descTimeClaim},
		{"exp a list", edit(func(c map[string]any) { c["exp"] = []int64{at(time.Hour)} }), descTimeClaim},
		{"exp missing", edit(func(c map[string]any) { delete(c, "exp") }), descNoExpiry},
		{"exp in the past", edit(func(c map[string]any) { c["exp"] = at(-time.Hour) }), descExpired},
		{"exp inside the leeway", edit(func(c map[string]any) { c["exp"] = at(-10 * time.Second) }), ""},
		{"exp with a fraction", edit(func(c map[string]any) { c["exp"] = float64(at(time.Hour)) + 0.5 }), ""},
		{"nbf as a string", edit(func(c map[string]any) { c["nbf"] = "0" }), descTimeClaim},
		{"nbf as a number", edit(func(c map[string]any) { c["nbf"] = at(-time.Minute) }), ""},
		{"iat as a string", edit(func(c map[string]any) { c["iat"] = now.Format(time.RFC3339) }), descTimeClaim},
		{"iat null", edit(func(c map[string]any) { c["iat"] = nil }), descTimeClaim},
		{"repeated exp", f.signRawRS256(`{"iss":"` + testIssuer + `","sub":"agent-7","aud":"` + testResource + `","exp":0,"exp":` + jsonInt(at(time.Hour)) + `,"scope":"trace:read"}`), descDuplicate},
		{"repeated sub", f.signRawRS256(`{"iss":"` + testIssuer + `","sub":"agent-7","sub":"admin","aud":"` + testResource + `","exp":` + jsonInt(at(time.Hour)) + `,"scope":"trace:read"}`), descDuplicate},
		{"lifetime exactly 24h by iat", edit(func(c map[string]any) { c["iat"] = at(-time.Hour); c["exp"] = at(23 * time.Hour) }), ""},
		{"lifetime 24h+1s by iat", edit(func(c map[string]any) { c["iat"] = at(-time.Hour); c["exp"] = at(23*time.Hour + time.Second) }), descLifetime},
		{"old iat, near exp", edit(func(c map[string]any) { c["iat"] = at(-30 * 24 * time.Hour); c["exp"] = at(10 * time.Minute) }), descLifetime},
		{"no iat, exp in 23h", edit(func(c map[string]any) { delete(c, "iat"); c["exp"] = at(23 * time.Hour) }), ""},
		{"no iat, exp in 25h", edit(func(c map[string]any) { delete(c, "iat"); c["exp"] = at(25 * time.Hour) }), descLifetime},
		{"exp in the year 2286", edit(func(c map[string]any) { c["exp"] = 1e10 }), descLifetime},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(t.Context(), tc.token)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var te *TokenError
			if !errors.As(err, &te) || te.Description != tc.want {
				t.Fatalf("err = %v, want a TokenError %q", err, tc.want)
			}
			if te.Err == nil {
				t.Fatalf("no detail for the log in %v", err)
			}
		})
	}

	// Over HTTP these are 401 invalid_token with the reason in the log.
	var logs strings.Builder
	cfg := f.config("jwks")
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	mw := mustNew(t, cfg).Middleware(http.HandlerFunc(echo))
	req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(listBody))
	req.Header.Set("Authorization", "Bearer "+edit(func(c map[string]any) { c["exp"] = 0 }))
	rec := httptest.NewRecorder()
	mw.ServeHTTP(rec, req)
	if rec.Code != 401 || !strings.Contains(rec.Header().Get("WWW-Authenticate"), `error="invalid_token"`) {
		t.Fatalf("exp 0 over HTTP: %d %q", rec.Code, rec.Header().Get("WWW-Authenticate"))
	}
	if !strings.Contains(logs.String(), "exp 0 is not after 1970-01-01") {
		t.Fatalf("log lacks the precise reason:\n%s", logs.String())
	}
}

func TestMaxTokenLifetimeConfig(t *testing.T) {
	f := newFixture(t)
	cfg := f.config("jwks")
	cfg.MaxTokenLifetime = time.Hour
	v := mustNew(t, cfg)
	tok := f.rs256(f.with(func(c map[string]any) { c["exp"] = f.now.Add(2 * time.Hour).Unix() }))
	var te *TokenError
	if _, err := v.Verify(t.Context(), tok); !errors.As(err, &te) || te.Description != descLifetime {
		t.Fatalf("2h token under a 1h limit: %v", err)
	}
	for _, bad := range []time.Duration{-time.Hour, time.Second} {
		cfg.MaxTokenLifetime = bad
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "max token lifetime") {
			t.Errorf("MaxTokenLifetime %s: err = %v", bad, err)
		}
	}
}

func TestScopeSplitsOnSpacesOnly(t *testing.T) {
	f := newFixture(t)
	v := f.verifier("jwks")
	tests := []struct {
		scope  string
		scopes []string
		ok     bool // holds the base scope trace:read
	}{
		{"trace:read", []string{"trace:read"}, true},
		{"trace:write trace:read", []string{"trace:write", "trace:read"}, true},
		{"openid  trace:read ", []string{"openid", "trace:read"}, true},
		{"trace:read,trace:write", []string{"trace:read,trace:write"}, false},
		{"trace:write,trace:read", []string{"trace:write,trace:read"}, false},
		{"trace:read\ttrace:write", []string{"trace:read\ttrace:write"}, false},
		{"trace:write\ntrace:read", []string{"trace:write\ntrace:read"}, false},
		{"", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.scope, func(t *testing.T) {
			id, err := v.Verify(t.Context(), f.rs256(f.with(func(c map[string]any) { c["scope"] = tc.scope })))
			var se *ScopeError
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.ok && !errors.As(err, &se):
				t.Fatalf("err = %v, want a ScopeError", err)
			}
			if !slices.Equal(id.Scopes, tc.scopes) {
				t.Fatalf("scopes %q, want %q", id.Scopes, tc.scopes)
			}
		})
	}
}
