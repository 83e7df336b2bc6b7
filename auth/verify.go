package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/strictjson"
)

// Identity is what a verified access token says about the caller.
type Identity struct {
	Subject   string    // `sub`: who asked; recorded in the review log and receipts
	Scopes    []string  // the space-separated `scope` claim, split
	ClientID  string    // `client_id` (RFC 9068) or `azp`, when present
	Issuer    string    // `iss`
	ExpiresAt time.Time // `exp`
	// Tenant is the string value of the configured tenant claim ("" when
	// none is configured, or the token does not carry it as a string).
	Tenant string
}

// HasScope reports whether the token grants scope s.
func (id Identity) HasScope(s string) bool { return slices.Contains(id.Scopes, s) }

// TokenError says a presented token cannot be accepted (RFC 6750
// invalid_token). Description is fixed text safe to send to the client; Err
// carries the detail for the server's log only.
type TokenError struct {
	Description string
	Err         error
}

func (e *TokenError) Error() string {
	if e.Err == nil {
		return "invalid token: " + e.Description
	}
	return "invalid token: " + e.Description + ": " + e.Err.Error()
}

func (e *TokenError) Unwrap() error { return e.Err }

// ScopeError says a valid token lacks scopes (RFC 6750 insufficient_scope).
// Required is every scope the request needs, which is what the challenge
// advertises so that a client can ask for all of them at once.
type ScopeError struct {
	Required []string
	Missing  []string
}

func (e *ScopeError) Error() string {
	return "insufficient scope: missing " + strings.Join(e.Missing, " ")
}

// Client-facing descriptions. They name the failed rule, never key material,
// expected values or library errors.
const (
	descEmpty       = "empty bearer token"
	descTooLarge    = "token too large"
	descMalformed   = "malformed token"
	descAlg         = "token algorithm not accepted"
	descKey         = "token key not recognised"
	descSignature   = "token signature invalid"
	descExpired     = "token expired"
	descNotYetValid = "token not yet valid"
	descIssuedAt    = "token issued in the future"
	descIssuer      = "token issuer not accepted"
	descAudience    = "token audience does not include this resource"
	descClaims      = "token claims invalid"
	descSubject     = "token has no subject"
	descSubjectCtl  = "token subject holds control characters"
	descNoExpiry    = "token has no expiry"
	descScopeClaim  = "token scope claim is not a string"
	descBound       = "sender-constrained tokens are not supported"
	descTimeClaim   = "token exp, nbf or iat is not a JSON number"
	descBadExpiry   = "token expiry is not later than the Unix epoch"
	descLifetime    = "token lifetime exceeds this server's limit"
	descDuplicate   = "token claims repeat a name"
)

// Verifier checks access tokens for one resource. It is safe for concurrent
// use; Reload swaps its keys atomically.
type Verifier struct {
	cfg         Config
	metadataURL string
	keys        atomic.Pointer[keySet]
}

// New loads the keys and returns a Verifier, or the reason the configuration
// cannot work.
func New(cfg Config) (*Verifier, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	murl, err := metadataURL(cfg.Resource)
	if err != nil {
		return nil, err
	}
	v := &Verifier{cfg: cfg, metadataURL: murl}
	ks, err := v.load()
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	v.keys.Store(ks)
	return v, nil
}

func (v *Verifier) load() (*keySet, error) {
	var ks *keySet
	var err error
	if v.cfg.HMACSecretFile != "" {
		ks, err = loadHMAC(v.cfg.HMACSecretFile, v.cfg.Logger)
	} else {
		ks, err = loadJWKS(v.cfg.JWKSFile, v.cfg.Logger)
	}
	if err != nil {
		return nil, err
	}
	ks.cache = newTokenCache(v.cfg.CacheSize)
	return ks, nil
}

// Reload re-reads the key file (on SIGHUP). When the new file cannot be
// used, the old keys stay in force and the reason is returned.
func (v *Verifier) Reload() error {
	ks, err := v.load()
	if err != nil {
		v.cfg.Logger.Error("auth key reload failed; keeping the previous keys", "err", err)
		return fmt.Errorf("auth reload (previous keys kept): %w", err)
	}
	v.keys.Store(ks)
	v.cfg.Logger.Info("auth keys reloaded", "keys", ks.count())
	return nil
}

func (ks *keySet) count() int {
	if ks.hmac != nil {
		return 1
	}
	return len(ks.byKID)
}

// Config returns the effective configuration (defaults filled in).
func (v *Verifier) Config() Config { return v.cfg }

// MetadataURL is the resource_metadata address used in challenges.
func (v *Verifier) MetadataURL() string { return v.metadataURL }

// compactByte reports whether b may appear in a compact JWS: unpadded
// base64url and the dots (RFC 7515 §2, §7.1). This is narrower than RFC
// 6750's b64token on purpose, so that one signature has one spelling.
func compactByte(b byte) bool {
	return b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z' || b >= '0' && b <= '9' ||
		b == '-' || b == '_' || b == '.'
}

// joseHeader holds the protected-header members this server looks at.
type joseHeader struct {
	Alg  string          `json:"alg"`
	Kid  string          `json:"kid"`
	Typ  string          `json:"typ"`
	Cty  string          `json:"cty"`
	Crit json.RawMessage `json:"crit"`
	B64  json.RawMessage `json:"b64"`
}

var b64url = base64.RawURLEncoding.Strict()

// joseNames are the registered JOSE header parameter names (RFC 7515
// §4.1, RFC 7516 §4.1 and §4.6, RFC 7518 §4.8, RFC 7797 §3).
var joseNames = []string{"alg", "jku", "jwk", "kid", "x5u", "x5c", "x5t", "x5t#S256", "typ", "cty", "crit",
	"enc", "zip", "epk", "apu", "apv", "iv", "tag", "p2s", "p2c", "b64"}

// readHeader reads a token's protected header exactly, as the review log is
// read: a member named twice (at any depth, escapes decoded) is refused,
// and so is a member spelled like a registered header parameter in another
// case ("Alg", "KID"), which encoding/json would take for it and the JWS
// library for another member. Other members (x5t, nonce, private ones) are
// allowed and not looked at.
func readHeader(b []byte) (joseHeader, error) {
	if !bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		return joseHeader{}, errors.New("header is not a JSON object")
	}
	var members map[string]json.RawMessage
	if err := strictjson.Check(b, &members); err != nil {
		return joseHeader{}, fmt.Errorf("header is not exact: %w", err)
	}
	if err := json.Unmarshal(b, &members); err != nil {
		return joseHeader{}, errors.New("header is not a JSON object")
	}
	for name := range members {
		for _, known := range joseNames {
			if name != known && strings.EqualFold(name, known) {
				return joseHeader{}, fmt.Errorf("header member %q is %q in another case", name, known)
			}
		}
	}
	var hdr joseHeader
	if err := json.Unmarshal(b, &hdr); err != nil {
		return joseHeader{}, fmt.Errorf("header: %w", err)
	}
	return hdr, nil
}

// Verify checks a compact JWS access token: key and algorithm, issuer,
// audience, lifetime and the base scopes. It returns a *TokenError for a
// token that cannot be accepted and a *ScopeError for a valid token that
// lacks a base scope.
//
// A token that verified once is remembered (keyed by its SHA-256, bounded,
// dropped on Reload) until it expires, so that a client reusing its token
// pays for the signature check once; lifetime is still checked on every call.
func (v *Verifier) Verify(ctx context.Context, token string) (Identity, error) {
	_ = ctx // reserved: verification is local and quick, there is nothing to cancel
	if token == "" {
		return Identity{}, &TokenError{Description: descEmpty}
	}
	if len(token) > v.cfg.MaxTokenBytes {
		return Identity{}, &TokenError{Description: descTooLarge, Err: fmt.Errorf("%d bytes > limit %d", len(token), v.cfg.MaxTokenBytes)}
	}
	for i := 0; i < len(token); i++ {
		if !compactByte(token[i]) {
			return Identity{}, &TokenError{Description: descMalformed, Err: fmt.Errorf("byte %d is not base64url or a dot", i)}
		}
	}
	ks := v.keys.Load()
	now := v.cfg.Now()
	digest := sha256.Sum256([]byte(token))
	id, ok := ks.cache.get(digest, now, v.cfg.Leeway)
	if !ok {
		var err error
		if id, err = v.verifyToken(ks, token, now); err != nil {
			return Identity{}, err
		}
		ks.cache.put(digest, id, now)
	}
	if missing := missingScopes(id, v.cfg.Scopes); len(missing) > 0 {
		return id, &ScopeError{Required: v.cfg.Scopes, Missing: missing}
	}
	return id, nil
}

// verifyToken does the full check of a token that passed the cheap
// syntactic ones: header, pinned key, signature, then the claims.
func (v *Verifier) verifyToken(ks *keySet, token string, now time.Time) (Identity, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return Identity{}, &TokenError{Description: descMalformed, Err: fmt.Errorf("a compact JWS has 3 non-empty dot-separated parts, got %d", len(parts))}
	}
	hdrBytes, err := b64url.DecodeString(parts[0])
	if err != nil {
		return Identity{}, &TokenError{Description: descMalformed, Err: fmt.Errorf("header is not base64url: %w", err)}
	}
	hdr, err := readHeader(hdrBytes)
	if err != nil {
		return Identity{}, &TokenError{Description: descMalformed, Err: err}
	}
	if hdr.Crit != nil || hdr.B64 != nil || hdr.Cty != "" {
		// No JWS extension is understood here, so none may be critical (RFC 7515 §4.1.11),
		// and nested or unencoded payloads are not access tokens.
		return Identity{}, &TokenError{Description: descMalformed, Err: errors.New("header uses crit, b64 or cty")}
	}
	switch strings.ToLower(hdr.Typ) {
	case "", "jwt", "at+jwt", "application/at+jwt":
	default:
		return Identity{}, &TokenError{Description: descMalformed, Err: fmt.Errorf("typ %q is not an access token type", hdr.Typ)}
	}

	pk, err := ks.keyFor(hdr)
	if err != nil {
		return Identity{}, err
	}

	payload, err := jws.Verify([]byte(token), jws.WithKey(pk.alg, pk.key), jws.WithCompact())
	if err != nil {
		return Identity{}, &TokenError{Description: descSignature, Err: err}
	}
	if !bytes.HasPrefix(bytes.TrimSpace(payload), []byte("{")) {
		return Identity{}, &TokenError{Description: descMalformed, Err: errors.New("payload is not a JSON object")}
	}
	if err := v.checkTimeClaims(payload, now); err != nil {
		return Identity{}, err
	}
	tok, err := jwt.Parse(payload,
		jwt.WithVerify(false), // the signature was checked just above, with the pinned key
		jwt.WithValidate(true),
		jwt.WithClock(jwt.ClockFunc(func() time.Time { return now })),
		jwt.WithAcceptableSkew(v.cfg.Leeway),
		jwt.WithIssuer(v.cfg.Issuer),
		jwt.WithAudience(v.cfg.Resource),
		jwt.WithRequiredClaim(jwt.ExpirationKey),
	)
	if err != nil {
		return Identity{}, classifyClaimError(err)
	}
	if tok.Subject() == "" {
		return Identity{}, &TokenError{Description: descSubject}
	}
	if i := strings.IndexFunc(tok.Subject(), unicode.IsControl); i >= 0 {
		// The subject becomes the caller in the review log and in signed
		// receipts; a NUL, newline or other C0/C1/DEL character there could
		// split or forge a line. Agent ids refuse them the same way.
		return Identity{}, &TokenError{Description: descSubjectCtl, Err: fmt.Errorf("byte %d of sub is a control character", i)}
	}
	if _, bound := tok.Get("cnf"); bound {
		// A DPoP- or mTLS-bound token must not be usable as a plain bearer token.
		return Identity{}, &TokenError{Description: descBound}
	}
	id := Identity{Subject: tok.Subject(), Issuer: tok.Issuer(), ExpiresAt: tok.Expiration()}
	if raw, ok := tok.Get("scope"); ok {
		s, isString := raw.(string)
		if !isString {
			return Identity{}, &TokenError{Description: descScopeClaim, Err: fmt.Errorf("scope is %T", raw)}
		}
		id.Scopes = splitScope(s)
	}
	for _, name := range []string{"client_id", "azp"} {
		if raw, ok := tok.Get(name); ok {
			if s, isString := raw.(string); isString && s != "" {
				id.ClientID = s
				break
			}
		}
	}
	if v.cfg.TenantClaim != "" {
		if raw, ok := tok.Get(v.cfg.TenantClaim); ok {
			if s, isString := raw.(string); isString {
				id.Tenant = s
			}
		}
	}
	return id, nil
}

// splitScope splits a scope claim on spaces only (RFC 6749 §3.3:
// scope-token *( SP scope-token )). Tabs, commas and other separators stay
// inside a token, so "a,b" grants neither "a" nor "b". Empty tokens from
// repeated spaces are dropped.
func splitScope(s string) []string {
	var out []string
	for _, tok := range strings.Split(s, " ") {
		if tok != "" {
			out = append(out, tok)
		}
	}
	return out
}

// timeClaims are the NumericDate claims (RFC 7519 §2) read from the raw
// payload, so that their JSON type is seen before any library converts it.
type timeClaims struct {
	exp, nbf, iat          float64
	hasExp, hasNbf, hasIat bool
}

// readTimeClaims walks the top level of the claims object. A repeated
// member name is refused (RFC 7519 §4 allows refusing, and two parsers
// that pick different duplicates would disagree about the token); exp, nbf
// and iat must be JSON numbers — not strings, digit strings, RFC 3339
// text, null, booleans or objects.
func readTimeClaims(payload []byte) (timeClaims, error) {
	var tc timeClaims
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return tc, &TokenError{Description: descMalformed, Err: errors.New("payload is not a JSON object")}
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return tc, &TokenError{Description: descMalformed, Err: fmt.Errorf("payload: %w", err)}
		}
		name, _ := t.(string)
		if seen[name] {
			return tc, &TokenError{Description: descDuplicate, Err: fmt.Errorf("claim %q appears more than once", name)}
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return tc, &TokenError{Description: descMalformed, Err: fmt.Errorf("claim %q: %w", name, err)}
		}
		var dst *float64
		var has *bool
		switch name {
		case "exp":
			dst, has = &tc.exp, &tc.hasExp
		case "nbf":
			dst, has = &tc.nbf, &tc.hasNbf
		case "iat":
			dst, has = &tc.iat, &tc.hasIat
		default:
			continue
		}
		f, err := numericDate(raw)
		if err != nil {
			return tc, &TokenError{Description: descTimeClaim, Err: fmt.Errorf("claim %s: %w", name, err)}
		}
		*dst, *has = f, true
	}
	return tc, nil
}

// numericDate accepts a JSON number token only.
func numericDate(raw json.RawMessage) (float64, error) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 || (b[0] != '-' && (b[0] < '0' || b[0] > '9')) {
		return 0, fmt.Errorf("%.40q is not a JSON number", b)
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("%.40q is not a finite number", b)
	}
	return f, nil
}

// checkTimeClaims applies the rules jwx does not: exp present, a number
// and after the epoch (jwx reads 0 as "unset"), nbf and iat numbers, and
// the lifetime (exp − iat, or exp − now without iat) within
// MaxTokenLifetime. jwx still checks exp, nbf and iat against the clock.
func (v *Verifier) checkTimeClaims(payload []byte, now time.Time) error {
	tc, err := readTimeClaims(payload)
	if err != nil {
		return err
	}
	if !tc.hasExp {
		return &TokenError{Description: descNoExpiry, Err: errors.New("no exp claim")}
	}
	if tc.exp <= 0 {
		return &TokenError{Description: descBadExpiry, Err: fmt.Errorf("exp %v is not after 1970-01-01T00:00:00Z", tc.exp)}
	}
	nowSec := float64(now.UnixNano()) / 1e9
	if tc.exp+v.cfg.Leeway.Seconds() <= nowSec {
		return &TokenError{Description: descExpired, Err: fmt.Errorf("exp %v is %.0fs before now (leeway %s)", tc.exp, nowSec-tc.exp, v.cfg.Leeway)}
	}
	start, from := nowSec, "now"
	if tc.hasIat {
		start, from = tc.iat, "iat"
	}
	if life := tc.exp - start; life > v.cfg.MaxTokenLifetime.Seconds() {
		return &TokenError{Description: descLifetime, Err: fmt.Errorf("lifetime exp − %s = %.0fs is over --auth-max-token-lifetime %s", from, life, v.cfg.MaxTokenLifetime)}
	}
	return nil
}

// keyFor picks the key a token names and refuses any algorithm but the
// key's own. This is where alg=none and algorithm confusion stop.
func (ks *keySet) keyFor(hdr joseHeader) (pinnedKey, error) {
	if ks.hmac != nil {
		if hdr.Alg != string(ks.hmac.alg) {
			return pinnedKey{}, &TokenError{Description: descAlg, Err: fmt.Errorf("alg %q, want %s", hdr.Alg, ks.hmac.alg)}
		}
		return *ks.hmac, nil
	}
	if hdr.Kid == "" {
		return pinnedKey{}, &TokenError{Description: descKey, Err: errors.New("no kid in the token header")}
	}
	pk, ok := ks.byKID[hdr.Kid]
	if !ok {
		return pinnedKey{}, &TokenError{Description: descKey, Err: fmt.Errorf("kid %q is not in the JWKS", hdr.Kid)}
	}
	if hdr.Alg != string(pk.alg) {
		return pinnedKey{}, &TokenError{Description: descAlg, Err: fmt.Errorf("alg %q, but key %q is pinned to %s", hdr.Alg, hdr.Kid, pk.alg)}
	}
	return pk, nil
}

func classifyClaimError(err error) *TokenError {
	switch {
	case errors.Is(err, jwt.ErrTokenExpired()):
		return &TokenError{Description: descExpired, Err: err}
	case errors.Is(err, jwt.ErrTokenNotYetValid()):
		return &TokenError{Description: descNotYetValid, Err: err}
	case errors.Is(err, jwt.ErrInvalidIssuedAt()):
		return &TokenError{Description: descIssuedAt, Err: err}
	case errors.Is(err, jwt.ErrInvalidIssuer()):
		return &TokenError{Description: descIssuer, Err: err}
	case errors.Is(err, jwt.ErrInvalidAudience()):
		return &TokenError{Description: descAudience, Err: err}
	case errors.Is(err, jwt.ErrRequiredClaim()):
		return &TokenError{Description: descNoExpiry, Err: err} // exp is the only claim required through jwx
	default:
		return &TokenError{Description: descClaims, Err: err}
	}
}

func missingScopes(id Identity, need []string) []string {
	var missing []string
	for _, s := range need {
		if !id.HasScope(s) {
			missing = append(missing, s)
		}
	}
	return missing
}
