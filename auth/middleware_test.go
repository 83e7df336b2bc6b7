package auth

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	listBody   = `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	payBody    = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"check_before_pay","arguments":{"counterparty":"0xabc","amount":"1.00"}}}`
	readBody1  = `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"list_operations","arguments":{}}}`
	batchBody  = `[` + readBody1 + `,` + payBody + `]`
	noChal     = `Bearer resource_metadata="` + testMetaURL + `"`
	readScopes = `Bearer resource_metadata="` + testMetaURL + `", error="insufficient_scope", scope="trace:read"`
	payScopes  = `Bearer resource_metadata="` + testMetaURL + `", error="insufficient_scope", scope="trace:read trace:write"`
)

func invalid(desc string) string {
	return `Bearer resource_metadata="` + testMetaURL + `", error="invalid_token", error_description="` + desc + `"`
}

// echo is the protected handler: it reports the subject it was given and
// the body it could still read, so the tests see both reach it intact.
func echo(w http.ResponseWriter, r *http.Request) {
	sub, ok := SubjectFrom(r.Context())
	if !ok {
		http.Error(w, "no subject in context", http.StatusInternalServerError)
		return
	}
	id, _ := IdentityFrom(r.Context())
	body, _ := io.ReadAll(r.Body)
	_, _ = io.WriteString(w, "sub="+sub+" scopes="+strings.Join(id.Scopes, ",")+" body="+string(body))
}

func TestMiddlewareTokens(t *testing.T) {
	f := newFixture(t)
	jwksMW := f.verifier("jwks").Middleware(http.HandlerFunc(echo))
	hmacMW := f.verifier("hmac").Middleware(http.HandlerFunc(echo))
	bearer := func(tok string) []string { return []string{"Bearer " + tok} }
	longTok := strings.Repeat("a", 4000) + "." + strings.Repeat("b", 4000) + "." + strings.Repeat("c", 300)

	tests := []struct {
		name      string
		hmac      bool     // use the HS256 verifier instead of the JWKS one
		auth      []string // Authorization header values
		query     string
		body      string // default listBody
		status    int
		challenge string // exact WWW-Authenticate; "" means the header must be absent
	}{
		{name: "good RS256", auth: bearer(f.rs256(f.claims())), status: 200},
		{name: "good ES256", auth: bearer(f.es256(f.claims())), status: 200},
		{name: "good HS256", hmac: true, auth: bearer(f.hs256(f.claims())), status: 200},
		{name: "expired", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["exp"] = f.now.Add(-time.Hour).Unix() }))), status: 401, challenge: invalid("token expired")},
		{name: "expired inside the leeway", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["exp"] = f.now.Add(-10 * time.Second).Unix() }))), status: 200},
		{name: "no exp", auth: bearer(f.rs256(f.with(func(c map[string]any) { delete(c, "exp") }))), status: 401, challenge: invalid("token has no expiry")},
		{name: "exp not a number", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["exp"] = "tomorrow" }))), status: 401, challenge: invalid("token exp, nbf or iat is not a JSON number")},
		{name: "future nbf", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["nbf"] = f.now.Add(time.Hour).Unix() }))), status: 401, challenge: invalid("token not yet valid")},
		{name: "nbf inside the leeway", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["nbf"] = f.now.Add(10 * time.Second).Unix() }))), status: 200},
		{name: "iat in the future", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["iat"] = f.now.Add(time.Hour).Unix() }))), status: 401, challenge: invalid("token issued in the future")},
		{name: "wrong iss", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["iss"] = "https://evil.example" }))), status: 401, challenge: invalid("token issuer not accepted")},
		{name: "missing iss", auth: bearer(f.rs256(f.with(func(c map[string]any) { delete(c, "iss") }))), status: 401, challenge: invalid("token issuer not accepted")},
		{name: "wrong aud", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["aud"] = "http://127.0.0.1:3000/other" }))), status: 401, challenge: invalid("token audience does not include this resource")},
		{name: "missing aud", auth: bearer(f.rs256(f.with(func(c map[string]any) { delete(c, "aud") }))), status: 401, challenge: invalid("token audience does not include this resource")},
		{name: "aud list with the resource", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["aud"] = []string{"https://other.example", testResource} }))), status: 200},
		{name: "aud list without the resource", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["aud"] = []string{"https://other.example"} }))), status: 401, challenge: invalid("token audience does not include this resource")},
		{name: "missing scope", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["scope"] = "trace:other" }))), status: 403, challenge: readScopes},
		{name: "no scope claim", auth: bearer(f.rs256(f.with(func(c map[string]any) { delete(c, "scope") }))), status: 403, challenge: readScopes},
		{name: "scope as a list is refused", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["scope"] = []string{"trace:read"} }))), status: 401, challenge: invalid("token scope claim is not a string")},
		{name: "extra scopes are fine", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["scope"] = "openid  trace:read profile" }))), status: 200},
		{name: "no sub", auth: bearer(f.rs256(f.with(func(c map[string]any) { delete(c, "sub") }))), status: 401, challenge: invalid("token has no subject")},
		{name: "sub with a NUL", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["sub"] = "agent\x00admin" }))), status: 401, challenge: invalid("token subject holds control characters")},
		{name: "sub with a newline", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["sub"] = "agent-7\nrole: admin" }))), status: 401, challenge: invalid("token subject holds control characters")},
		{name: "sub with a carriage return", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["sub"] = "agent-7\r" }))), status: 401, challenge: invalid("token subject holds control characters")},
		{name: "sub with a tab", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["sub"] = "\tagent-7" }))), status: 401, challenge: invalid("token subject holds control characters")},
		{name: "sub with an escape", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["sub"] = "agent-7\x1b[2J" }))), status: 401, challenge: invalid("token subject holds control characters")},
		{name: "sub with DEL", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["sub"] = "agent-7\x7f" }))), status: 401, challenge: invalid("token subject holds control characters")},
		{name: "sub with a C1 character (NEL)", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["sub"] = "agent-7\u0085" }))), status: 401, challenge: invalid("token subject holds control characters")},
		{name: "sub with a C1 character (CSI)", hmac: true, auth: bearer(f.hs256(f.with(func(c map[string]any) { c["sub"] = "\u009bagent-7" }))), status: 401, challenge: invalid("token subject holds control characters")},
		{name: "sender-constrained token", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["cnf"] = map[string]any{"jkt": "abc"} }))), status: 401, challenge: invalid("sender-constrained tokens are not supported")},
		{name: "alg none", auth: bearer(f.sign(map[string]any{"alg": "none", "kid": "rsa-1"}, f.claims(), nil)), status: 401, challenge: invalid("token algorithm not accepted")},
		{name: "alg none to the HMAC verifier", hmac: true, auth: bearer(f.sign(map[string]any{"alg": "none"}, f.claims(), nil)), status: 401, challenge: invalid("token algorithm not accepted")},
		{name: "HS256 signed with the RSA public key", auth: bearer(f.sign(map[string]any{"alg": "HS256", "kid": "rsa-1"}, f.claims(), f.rsaPublicPEM())), status: 401, challenge: invalid("token algorithm not accepted")},
		{name: "RS256 to the HMAC verifier", hmac: true, auth: bearer(f.rs256(f.claims())), status: 401, challenge: invalid("token algorithm not accepted")},
		{name: "ES256 header on the RSA key", auth: bearer(f.sign(map[string]any{"alg": "ES256", "kid": "rsa-1"}, f.claims(), f.ec)), status: 401, challenge: invalid("token algorithm not accepted")},
		{name: "unknown kid", auth: bearer(f.sign(map[string]any{"alg": "RS256", "kid": "rsa-9"}, f.claims(), f.rsa)), status: 401, challenge: invalid("token key not recognised")},
		{name: "no kid", auth: bearer(f.sign(map[string]any{"alg": "RS256"}, f.claims(), f.rsa)), status: 401, challenge: invalid("token key not recognised")},
		{name: "key not in the JWKS under a known kid", auth: bearer(f.sign(map[string]any{"alg": "RS256", "kid": "rsa-1"}, f.claims(), f.otherRSA)), status: 401, challenge: invalid("token signature invalid")},
		{name: "HS256 with another secret", hmac: true, auth: bearer(f.sign(map[string]any{"alg": "HS256"}, f.claims(), []byte("another-secret-of-at-least-32-bytes!!"))), status: 401, challenge: invalid("token signature invalid")},
		{name: "broken signature", auth: bearer(breakSig(f.rs256(f.claims()))), status: 401, challenge: invalid("token signature invalid")},
		{name: "claims changed after signing", auth: bearer(swapClaims(f.rs256(f.claims()), f.rs256(f.with(func(c map[string]any) { c["sub"] = "admin" })))), status: 401, challenge: invalid("token signature invalid")},
		{name: "garbage", auth: bearer("not-a-jwt"), status: 401, challenge: invalid("malformed token")},
		{name: "garbage characters", auth: bearer("a.b.c\x01"), status: 401, challenge: invalid("malformed token")},
		{name: "five parts (JWE shape)", auth: bearer("a.b.c.d.e"), status: 401, challenge: invalid("malformed token")},
		{name: "crit header", auth: bearer(f.sign(map[string]any{"alg": "RS256", "kid": "rsa-1", "crit": []string{"exp"}, "exp": 1}, f.claims(), f.rsa)), status: 401, challenge: invalid("malformed token")},
		{name: "typ of another token kind", auth: bearer(f.sign(map[string]any{"alg": "RS256", "kid": "rsa-1", "typ": "dpop+jwt"}, f.claims(), f.rsa)), status: 401, challenge: invalid("malformed token")},
		{name: "oversized token", auth: bearer(longTok), status: 401, challenge: invalid("token too large")},
		{name: "no Authorization header", status: 401, challenge: noChal},
		{name: "Basic scheme", auth: []string{"Basic YWdlbnQ6c2VjcmV0"}, status: 401, challenge: noChal},
		{name: "token in the query string is ignored", query: "?access_token=" + f.rs256(f.claims()), status: 401, challenge: noChal},
		{name: "empty bearer", auth: []string{"Bearer "}, status: 401, challenge: invalid("empty bearer token")},
		{name: "bare Bearer", auth: []string{"Bearer"}, status: 401, challenge: invalid("empty bearer token")},
		{name: "lower-case bearer scheme is accepted", auth: []string{"bearer " + f.rs256(f.claims())}, status: 200},
		{name: "two Authorization headers", auth: []string{"Bearer " + f.rs256(f.claims()), "Bearer x"}, status: 400,
			challenge: `Bearer resource_metadata="` + testMetaURL + `", error="invalid_request", error_description="more than one Authorization header"`},
		{name: "tools/call needing a tool scope, lacking it", auth: bearer(f.rs256(f.claims())), body: payBody, status: 403, challenge: payScopes},
		{name: "tools/call needing a tool scope, having it", auth: bearer(f.rs256(f.with(func(c map[string]any) { c["scope"] = "trace:read trace:write" }))), body: payBody, status: 200},
		{name: "tools/call of a tool without extra scope", auth: bearer(f.rs256(f.claims())), body: readBody1, status: 200},
		{name: "batch with a tool needing a scope", auth: bearer(f.rs256(f.claims())), body: batchBody, status: 403, challenge: payScopes},
		{name: "tools/call without a tool name", auth: bearer(f.rs256(f.claims())), body: `{"jsonrpc":"2.0","id":2,"method":"tools/call"}`, status: 400,
			challenge: `Bearer resource_metadata="` + testMetaURL + `", error="invalid_request", error_description="tools/call request without a readable tool name in params.name"`},
		{name: "case-folded keys are read as mcp-go reads them", auth: bearer(f.rs256(f.claims())), body: `{"jsonrpc":"2.0","id":2,"METHOD":"tools/call","Params":{"NAME":"check_before_pay"}}`, status: 403, challenge: payScopes},
		{name: "non-JSON body passes to the MCP handler", auth: bearer(f.rs256(f.claims())), body: `not json`, status: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.body
			if body == "" {
				body = listBody
			}
			req := httptest.NewRequest(http.MethodPost, "/mcp"+tc.query, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			for _, a := range tc.auth {
				req.Header.Add("Authorization", a)
			}
			rec := httptest.NewRecorder()
			if tc.hmac {
				hmacMW.ServeHTTP(rec, req)
			} else {
				jwksMW.ServeHTTP(rec, req)
			}
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d (body %q)", rec.Code, tc.status, rec.Body.String())
			}
			got := rec.Header().Get("WWW-Authenticate")
			if got != tc.challenge {
				t.Errorf("WWW-Authenticate\n got %q\nwant %q", got, tc.challenge)
			}
			if tc.status == 200 {
				if !strings.HasPrefix(rec.Body.String(), "sub=agent-7 ") || !strings.HasSuffix(rec.Body.String(), " body="+body) {
					t.Errorf("handler saw %q; want subject agent-7 and the body intact", rec.Body.String())
				}
			} else if strings.Contains(rec.Body.String(), "sub=") {
				t.Errorf("protected handler ran on a refused request")
			}
		})
	}
}

// breakSig flips one bit of the signature's first byte.
func breakSig(tok string) string {
	i := strings.LastIndexByte(tok, '.') + 1
	b := []byte(tok)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// swapClaims puts the payload of b under the header and signature of a.
func swapClaims(a, b string) string {
	pa := strings.Split(a, ".")
	pb := strings.Split(b, ".")
	return pa[0] + "." + pb[1] + "." + pa[2]
}

func TestMiddlewareBodyBound(t *testing.T) {
	f := newFixture(t)
	cfg := f.config("jwks")
	cfg.MaxBodyBytes = 64
	var outcomes []Outcome
	cfg.OnOutcome = func(o Outcome) { outcomes = append(outcomes, o) }
	v, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mw := v.Middleware(http.HandlerFunc(echo))
	req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(payBody))
	req.Header.Set("Authorization", "Bearer "+f.rs256(f.claims()))
	rec := httptest.NewRecorder()
	mw.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", rec.Code)
	}
	// A token that holds every tool scope is not made to wait for its body.
	req = httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(payBody))
	req.Header.Set("Authorization", "Bearer "+f.rs256(f.with(func(c map[string]any) { c["scope"] = "trace:read trace:write" })))
	rec = httptest.NewRecorder()
	mw.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("status %d, want 200", rec.Code)
	}
	if want := []Outcome{OutcomeBadRequest, OutcomeOK}; !slices.Equal(outcomes, want) {
		t.Fatalf("outcomes %v, want %v", outcomes, want)
	}
}

func TestPaddedSignatureRefused(t *testing.T) {
	f := newFixture(t)
	v := f.verifier("jwks")
	tok := f.rs256(f.claims())
	for _, alt := range []string{tok + "==", strings.ReplaceAll(tok, "-", "+"), strings.ReplaceAll(tok, "_", "/")} {
		if alt == tok {
			continue
		}
		var te *TokenError
		if _, err := v.Verify(t.Context(), alt); !errors.As(err, &te) {
			t.Errorf("respelled token %q accepted (err %v)", alt, err)
		}
	}
}
