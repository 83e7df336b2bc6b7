package auth

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"sort"
	"strings"
	"time"
)

// Defaults and bounds for the tunable limits. They are stated in docs/http.md.
const (
	DefaultLeeway        = 30 * time.Second
	MaxLeeway            = 5 * time.Minute
	DefaultMaxTokenBytes = 8 << 10
	minMaxTokenBytes     = 1 << 10
	maxMaxTokenBytes     = 64 << 10
	DefaultMaxBodyBytes  = 4 << 20
	DefaultCacheSize     = 1024
	// DefaultMaxTokenLifetime bounds exp − iat (or exp − now without iat).
	DefaultMaxTokenLifetime = 24 * time.Hour
	maxKeyFileBytes         = 1 << 20
	maxSecretFileBytes      = 4 << 10
	minSecretBytes          = 32 // RFC 7518 §3.2: an HS256 key has at least 256 bits
	minRSABits              = 2048
)

// Config describes one protected resource and where its keys come from.
type Config struct {
	Issuer     string            // required value of the `iss` claim (--auth-issuer)
	Resource   string            // the resource URL that `aud` must contain, e.g. http://127.0.0.1:3000/mcp
	Scopes     []string          // scopes every request needs (--auth-scope)
	ToolScopes map[string]string // extra scope a tools/call of TOOL needs (--auth-tool-scope TOOL=SCOPE)

	JWKSFile       string // JWKS with RS256 / ES256 public keys (--auth-jwks)
	HMACSecretFile string // HS256 shared secret, for a local authorization server (--auth-hmac-secret)

	Leeway        time.Duration // clock skew allowed on exp/nbf/iat; 0 means DefaultLeeway
	MaxTokenBytes int           // longest bearer token accepted; 0 means DefaultMaxTokenBytes
	MaxBodyBytes  int64         // largest body the per-tool scope check reads; 0 means DefaultMaxBodyBytes
	CacheSize     int           // verified tokens remembered; 0 means DefaultCacheSize, negative turns the cache off
	// MaxTokenLifetime refuses a token whose exp − iat (exp − now without
	// iat) is longer (--auth-max-token-lifetime); 0 means DefaultMaxTokenLifetime.
	MaxTokenLifetime time.Duration
	// TenantClaim names the claim that names the caller's tenant
	// (--tenant-claim); its string value lands in Identity.Tenant.
	TenantClaim string

	Now    func() time.Time // clock; nil means time.Now
	Logger *slog.Logger     // nil means discard
	// OnOutcome, when set, is called once per request the middleware
	// decides, with a fixed label (see the Outcome constants); a metrics
	// counter hooks in here without this package importing Prometheus.
	OnOutcome func(Outcome)
}

// withDefaults fills the zero values and refuses a configuration that cannot
// work, naming the field and the reason.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	if strings.TrimSpace(c.Issuer) == "" {
		errs = append(errs, errors.New("auth issuer is empty: set --auth-issuer to the authorization server's issuer identifier"))
	}
	if _, err := metadataURL(c.Resource); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.JWKSFile == "" && c.HMACSecretFile == "":
		errs = append(errs, errors.New("no token keys: give exactly one of --auth-jwks or --auth-hmac-secret"))
	case c.JWKSFile != "" && c.HMACSecretFile != "":
		errs = append(errs, errors.New("both --auth-jwks and --auth-hmac-secret given: give exactly one"))
	}
	for _, s := range c.Scopes {
		if !validScope(s) {
			errs = append(errs, fmt.Errorf("auth scope %q is not a valid OAuth scope token (RFC 6749 §3.3: printable ASCII, no space, quote or backslash)", s))
		}
	}
	for tool, s := range c.ToolScopes {
		if tool == "" {
			errs = append(errs, errors.New("a per-tool scope names no tool: use TOOL=SCOPE"))
		}
		if !validScope(s) {
			errs = append(errs, fmt.Errorf("scope %q for tool %q is not a valid OAuth scope token", s, tool))
		}
	}
	switch {
	case c.Leeway == 0:
		c.Leeway = DefaultLeeway
	case c.Leeway < 0 || c.Leeway > MaxLeeway:
		errs = append(errs, fmt.Errorf("auth leeway %s is outside 0..%s", c.Leeway, MaxLeeway))
	}
	switch {
	case c.MaxTokenBytes == 0:
		c.MaxTokenBytes = DefaultMaxTokenBytes
	case c.MaxTokenBytes < minMaxTokenBytes || c.MaxTokenBytes > maxMaxTokenBytes:
		errs = append(errs, fmt.Errorf("max token size %d bytes is outside %d..%d", c.MaxTokenBytes, minMaxTokenBytes, maxMaxTokenBytes))
	}
	switch {
	case c.MaxBodyBytes == 0:
		c.MaxBodyBytes = DefaultMaxBodyBytes
	case c.MaxBodyBytes < 0:
		errs = append(errs, fmt.Errorf("max body size %d bytes is negative", c.MaxBodyBytes))
	}
	switch {
	case c.MaxTokenLifetime == 0:
		c.MaxTokenLifetime = DefaultMaxTokenLifetime
	case c.MaxTokenLifetime < time.Minute:
		errs = append(errs, fmt.Errorf("max token lifetime %s is under one minute (or negative): tokens could never be accepted", c.MaxTokenLifetime))
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Scopes = dedupe(c.Scopes) // dedupe copies, so the caller's slice is not shared
	c.ToolScopes = maps.Clone(c.ToolScopes)
	if len(errs) > 0 {
		return c, fmt.Errorf("auth config: %w", errors.Join(errs...))
	}
	return c, nil
}

// validScope reports whether s is an RFC 6749 scope-token. The check also
// keeps scopes safe to quote inside a WWW-Authenticate header.
func validScope(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b < 0x21 || b > 0x7e || b == '"' || b == '\\' {
			return false
		}
	}
	return true
}

// dedupe keeps the first occurrence of every string, in order.
func dedupe(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	seen := make(map[string]bool, len(in))
	out := make([]string, 0, len(in))
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// scopesSupported lists the base scopes, then the per-tool scopes sorted.
func (c Config) scopesSupported() []string {
	extra := make([]string, 0, len(c.ToolScopes))
	for _, s := range c.ToolScopes {
		extra = append(extra, s)
	}
	sort.Strings(extra)
	return dedupe(append(append([]string{}, c.Scopes...), extra...))
}

// metadataURL derives the RFC 9728 metadata URL of a resource: the
// well-known segment goes between the host and the resource's path.
func metadataURL(resource string) (string, error) {
	u, err := url.Parse(resource)
	if err != nil {
		return "", fmt.Errorf("resource URL %q cannot be parsed: %w", resource, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("resource URL %q must be an absolute http(s) URL such as http://127.0.0.1:3000/mcp", resource)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("resource URL %q must not carry a query, a fragment or user info (RFC 9728 §1.2)", resource)
	}
	path := strings.TrimSuffix(u.EscapedPath(), "/")
	return u.Scheme + "://" + u.Host + WellKnownPrefix + path, nil
}

// WellKnownPrefix is the RFC 9728 well-known path segment.
const WellKnownPrefix = "/.well-known/oauth-protected-resource"

// MetadataURL is the address of the protected-resource metadata for a
// resource URL, the value of every challenge's resource_metadata.
func MetadataURL(resource string) (string, error) { return metadataURL(resource) }

// MetadataPath is the path (without scheme and host) at which the router
// should serve the metadata of resource, e.g. /.well-known/oauth-protected-resource/mcp.
func MetadataPath(resource string) (string, error) {
	m, err := metadataURL(resource)
	if err != nil {
		return "", err
	}
	u, _ := url.Parse(m)
	return u.EscapedPath(), nil
}
