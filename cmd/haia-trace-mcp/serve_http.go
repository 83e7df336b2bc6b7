package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/server"
)

// httpFlags are the serve flags for Streamable HTTP.
type httpFlags struct {
	// console is the reviewer console to serve under /console/ (set when
	// --console is given without --console-addr).
	console   http.Handler
	addr      string
	publicURL string
	// allowedHosts are --http-allowed-host's values, lower-cased once
	// checked: more Host values /mcp answers to, not more audiences.
	allowedHosts listFlag
	issuer       string
	jwks         string
	hmacSecret   string
	scopes       listFlag
	toolScopes   listFlag
	allowRemote  bool
	insecure     bool
	maxBody      int64
	maxSessions  int
	sessionIdle  time.Duration
	sessionKey   string
	maxStreams   int
	streamIdle   time.Duration
	streamPing   time.Duration
	rateLimit    float64
	rateBurst    int
	burstSet     bool // --rate-burst was given; otherwise it follows --rate-limit
	maxLifetime  time.Duration
	readHeader   time.Duration
	readTimeout  time.Duration
	writeTimeout time.Duration
	idleTimeout  time.Duration
	shutdown     time.Duration
	tenantClaim  string
	fair         fairFlags
	// ingest is the recorders' batch endpoint (--ingest); reviewers is
	// the command's --reviewers, beside which its keys file is by default.
	ingest    ingestFlags
	reviewers *string
	store     *string
}

// fairFlags are the tenants' fair share (--tenant-*): slots and perTenant
// are zero until given, which takes the server's defaults.
type fairFlags struct {
	on        bool
	slots     optInt
	perTenant optInt
	queue     int
	wait      time.Duration
}

// optInt is an int flag that knows whether it was given.
type optInt struct {
	v   int
	set bool
}

func (o *optInt) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.Itoa(o.v)
}

func (o *optInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want a whole number, got %q", s)
	}
	o.v, o.set = n, true
	return nil
}

// share is the server's fair share of these flags; nil when it is off.
func (f fairFlags) share() *server.FairShare {
	if !f.on {
		return nil
	}
	return &server.FairShare{Slots: f.slots.v, PerTenant: f.perTenant.v, Queue: f.queue, Wait: f.wait}
}

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func (h *httpFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.addr, "http", "", "serve Streamable HTTP on HOST:PORT instead of stdio (loopback unless --http-allow-remote)")
	fs.StringVar(&h.publicURL, "public-url", "", "the public base URL behind a TLS proxy, e.g. https://mcp.example.com; the resource is <public-url>/mcp")
	fs.Var(&h.allowedHosts, "http-allowed-host", "a `HOST[:PORT]` clients may send as Host besides the listen address and --public-url's host, such as the published port of a container (podman run -p 8080:3000 → localhost:8080); repeatable; the token audience stays the resource URL")
	fs.StringVar(&h.issuer, "auth-issuer", "", "the authorization server's issuer; tokens must carry it as iss")
	fs.StringVar(&h.jwks, "auth-jwks", "", "JWKS file with the authorization server's public keys (RS256, ES256); reloaded on SIGHUP")
	fs.StringVar(&h.hmacSecret, "auth-hmac-secret", "", "HS256 secret file, for a local authorization server only")
	fs.Var(&h.scopes, "auth-scope", "a scope every request needs (repeatable)")
	fs.Var(&h.toolScopes, "auth-tool-scope", "TOOL=SCOPE: an extra scope a call of TOOL needs (repeatable)")
	fs.StringVar(&h.tenantClaim, "tenant-claim", "", "with --tenants-dir: the token claim whose string value names the caller's tenant")
	fs.BoolVar(&h.fair.on, "tenant-fair-share", true, "with --tenants-dir: share the decision slots between the tenants in turn, so one tenant's flood does not slow another's decisions (false: serve requests as they come)")
	fs.Var(&h.fair.slots, "tenant-slots", "with --tenants-dir: requests of all tenants answered at once (default: 4 × the cores Go uses)")
	fs.Var(&h.fair.perTenant, "tenant-max-in-flight", "with --tenants-dir: of --tenant-slots, how many one tenant may hold (default: all of them)")
	fs.IntVar(&h.fair.queue, "tenant-queue", server.DefaultFairQueue, "with --tenants-dir: a tenant's requests that may wait for a slot; one more is refused with 429")
	fs.DurationVar(&h.fair.wait, "tenant-wait", server.DefaultFairWait, "with --tenants-dir: how long a request waits for a slot before it is refused with 429")
	fs.BoolVar(&h.allowRemote, "http-allow-remote", false, "allow listening on a non-loopback address")
	fs.BoolVar(&h.insecure, "http-insecure-no-auth", false, "serve without authentication (loopback only, e.g. for the MCP Inspector)")
	fs.Int64Var(&h.maxBody, "http-max-body", server.DefaultHTTPMaxBody, "largest request body in bytes")
	fs.IntVar(&h.maxSessions, "http-max-sessions", server.DefaultHTTPMaxSessions, "most sessions whose state is held; past it the least recently active is dropped")
	fs.DurationVar(&h.sessionIdle, "http-session-idle", server.DefaultHTTPSessionIdle, "how long idle session state is kept")
	fs.StringVar(&h.sessionKey, "http-session-key", "", "file with the key (32+ bytes) that makes session ids unforgeable; replicas share it (default: derived from the resource URL)")
	fs.IntVar(&h.maxStreams, "http-max-streams", server.DefaultHTTPMaxStreams, "most live server-to-client streams (GET /mcp, subscriptions/listen)")
	fs.DurationVar(&h.streamIdle, "http-stream-idle", server.DefaultHTTPStreamIdle, "close a stream on which no message was sent for this long")
	fs.DurationVar(&h.streamPing, "http-stream-ping", server.DefaultHTTPStreamPing, "period of keep-alive comments on a stream (at most half of --http-stream-idle)")
	fs.Float64Var(&h.rateLimit, "rate-limit", auth.DefaultRateLimit, "requests per second per caller (token issuer, tenant and subject; remote address without auth)")
	fs.Func("rate-burst", "requests a caller may send at once before --rate-limit applies (default: --rate-limit rounded up)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("want a whole number of requests, got %q", v)
		}
		h.rateBurst, h.burstSet = n, true
		return nil
	})
	fs.DurationVar(&h.maxLifetime, "auth-max-token-lifetime", auth.DefaultMaxTokenLifetime, "refuse tokens whose exp - iat (exp - now without iat) is longer")
	fs.DurationVar(&h.readHeader, "http-read-header-timeout", server.DefaultReadHeaderTimout, "time allowed to read request headers")
	fs.DurationVar(&h.readTimeout, "http-read-timeout", server.DefaultReadTimeout, "time allowed to read a whole request")
	fs.DurationVar(&h.writeTimeout, "http-write-timeout", server.DefaultWriteTimeout, "time allowed to write a response (bounds SSE streams too)")
	fs.DurationVar(&h.idleTimeout, "http-idle-timeout", server.DefaultIdleTimeout, "keep-alive idle time")
	fs.DurationVar(&h.shutdown, "http-shutdown-timeout", server.DefaultShutdownTimeout, "time in-flight requests get to finish on SIGTERM")
	h.ingest.register(fs)
}

// isLoopbackHost reports whether a listen host only reaches this machine.
// An empty host (":3000") listens everywhere, so it is not loopback.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// httpPlan is everything runHTTP decides from the flags before listening.
type httpPlan struct {
	host     string
	loopback bool
	auth     *auth.Config
}

// plan applies the binding rules and builds the auth configuration.
func (h *httpFlags) plan() (httpPlan, error) {
	host, _, err := net.SplitHostPort(h.addr)
	if err != nil {
		return httpPlan{}, fmt.Errorf("--http %q: want HOST:PORT such as 127.0.0.1:3000: %w", h.addr, err)
	}
	p := httpPlan{host: host, loopback: isLoopbackHost(host)}
	if err := h.checkBounds(); err != nil {
		return p, err
	}
	for i, v := range h.allowedHosts {
		norm, err := checkAllowedHost(v)
		if err != nil {
			return p, err
		}
		h.allowedHosts[i] = norm
	}
	if !p.loopback && !h.allowRemote {
		return p, fmt.Errorf("--http %q is not a loopback address: add --http-allow-remote to listen beyond this machine", h.addr)
	}
	authGiven := h.issuer != "" || h.jwks != "" || h.hmacSecret != "" || len(h.scopes) > 0 || len(h.toolScopes) > 0
	if h.insecure {
		if !p.loopback {
			return p, fmt.Errorf("--http-insecure-no-auth is refused on %q: it is allowed on loopback only", h.addr)
		}
		if authGiven {
			return p, errors.New("--http-insecure-no-auth cannot be combined with --auth-* flags")
		}
		return p, nil
	}
	if h.issuer == "" || (h.jwks == "" && h.hmacSecret == "") {
		return p, errors.New("--http needs --auth-issuer and one of --auth-jwks or --auth-hmac-secret (or --http-insecure-no-auth on loopback)")
	}
	tools := map[string]string{}
	for _, ts := range h.toolScopes {
		tool, scope, ok := strings.Cut(ts, "=")
		if !ok || tool == "" || scope == "" {
			return p, fmt.Errorf("--auth-tool-scope %q: want TOOL=SCOPE", ts)
		}
		tools[tool] = scope
	}
	p.auth = &auth.Config{
		Issuer:           h.issuer,
		Scopes:           append([]string(nil), h.scopes...),
		ToolScopes:       tools,
		JWKSFile:         h.jwks,
		HMACSecretFile:   h.hmacSecret,
		MaxTokenLifetime: h.maxLifetime,
		TenantClaim:      h.tenantClaim,
	}
	return p, nil
}

// checkBounds refuses bounds that would be no bound: zero or negative
// values, which the server would otherwise replace by its defaults.
func (h *httpFlags) checkBounds() error {
	var errs []error
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"--http-max-sessions", h.maxSessions > 0},
		{"--http-max-streams", h.maxStreams > 0},
		{"--http-session-idle", h.sessionIdle > 0},
		{"--http-stream-idle", h.streamIdle > 0},
		{"--http-stream-ping", h.streamPing > 0},
		{"--rate-limit", h.rateLimit > 0},
		{"--rate-burst", !h.burstSet || h.rateBurst > 0},
		{"--auth-max-token-lifetime", h.maxLifetime > 0},
		{"--tenant-slots", !h.fair.slots.set || h.fair.slots.v > 0},
		{"--tenant-max-in-flight", !h.fair.perTenant.set || h.fair.perTenant.v > 0},
		{"--tenant-queue", h.fair.queue > 0},
		{"--tenant-wait", h.fair.wait > 0},
	} {
		if !c.ok {
			errs = append(errs, fmt.Errorf("%s must be above zero", c.name))
		}
	}
	return errors.Join(errs...)
}

// burst is --rate-burst, or without it --rate-limit rounded up.
func (h *httpFlags) burst() int {
	if h.burstSet {
		return h.rateBurst
	}
	return auth.BurstFor(h.rateLimit)
}

// resourceAndHosts derives the resource URL and the Host values /mcp
// answers to from the bound port and --public-url.
func (h *httpFlags) resourceAndHosts(p httpPlan, port string) (string, []string, error) {
	hosts := []string{net.JoinHostPort(p.host, port)}
	if p.loopback || p.host == "" || p.host == "0.0.0.0" || p.host == "::" {
		hosts = append(hosts, auth.LoopbackHosts(port)...)
	}
	resource := "http://" + net.JoinHostPort(p.host, port) + "/mcp"
	if p.host == "" {
		resource = "http://" + net.JoinHostPort("127.0.0.1", port) + "/mcp"
	}
	if h.publicURL != "" {
		u, err := url.Parse(h.publicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return "", nil, fmt.Errorf("--public-url %q: want an absolute http(s) URL without query, such as https://mcp.example.com", h.publicURL)
		}
		resource = strings.TrimSuffix(u.String(), "/") + "/mcp"
		hosts = append(hosts, u.Host)
		if u.Port() == "" { // some clients send the default port explicitly
			def := "80"
			if u.Scheme == "https" {
				def = "443"
			}
			hosts = append(hosts, net.JoinHostPort(u.Hostname(), def))
		}
	}
	for _, a := range h.allowedHosts {
		if !slices.Contains(hosts, a) {
			hosts = append(hosts, a)
		}
	}
	return resource, hosts, nil
}

// checkAllowedHost reads one --http-allowed-host: a DNS name or an IP
// address (IPv6 in brackets), with an optional port, exactly as a client
// writes it in the Host header. A wildcard, a scheme or a path is refused:
// the value is compared whole, so that the check still refuses the names a
// DNS-rebinding page would send.
func checkAllowedHost(v string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("--http-allowed-host %q: %s; want HOST or HOST:PORT as a client sends it in the Host header, such as localhost:8080 or mcp.internal", v, why)
	}
	switch {
	case v == "":
		return bad("empty")
	case strings.Contains(v, "*"):
		return bad("a wildcard would answer to any name, which the Host check exists to refuse")
	case strings.Contains(v, "://") || strings.ContainsAny(v, "/?#@"):
		return bad("a scheme, path, query or user is no part of a Host header")
	}
	host, port := v, ""
	if h, p, err := net.SplitHostPort(v); err == nil {
		host, port = h, p
		if port == "" {
			return bad("the port after the colon is missing")
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
			return bad("the port must be a number from 1 to 65535")
		}
	} else if b, ok := strings.CutPrefix(v, "["); ok && strings.HasSuffix(b, "]") {
		host = strings.TrimSuffix(b, "]")
	} else if strings.Contains(v, ":") {
		return bad("an IPv6 address goes in brackets ([::1]:8080), and a port after one colon")
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.To4() == nil && !strings.HasPrefix(v, "[") {
			return bad("an IPv6 address goes in brackets")
		}
		if ip.To4() != nil && strings.HasPrefix(v, "[") {
			return bad("only an IPv6 address goes in brackets")
		}
		return strings.ToLower(v), nil
	}
	if strings.HasPrefix(v, "[") {
		return bad("not an IPv6 address in the brackets")
	}
	if len(host) > 253 {
		return bad("the name is longer than 253 characters")
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return bad("not a DNS name: each dot-separated label is 1 to 63 letters, digits, underscores or inner hyphens")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return bad("not a DNS name: each dot-separated label is 1 to 63 letters, digits, underscores or inner hyphens (an international name in its xn-- form)")
			}
		}
	}
	return strings.ToLower(v), nil
}

// warmWait is how long a server or proxy over HTTP waits for its roots to
// be read before it serves; after it, /readyz says how far the reading
// went.
const warmWait = 2 * time.Second

// warmRoots starts reading every served Trace root at once (app.Stack.Warm:
// /readyz says not ready until it has), so that an orchestrator sends no
// traffic to a replica still reading a large root for the first time, and
// waits up to wait for them all: roots read within it are read before
// anything is served. runHTTP calls it for the server and the guard proxy
// alike.
func warmRoots(ctx context.Context, servers map[string]*served, wait time.Duration) {
	done := make([]<-chan struct{}, 0, len(servers))
	for _, s := range servers {
		done = append(done, s.st.Warm(ctx))
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for _, d := range done {
		select {
		case <-d:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// runHTTP serves servers over Streamable HTTP: one server under the key
// "", or one per tenant. ready is the stacks' readiness (/readyz).
func runHTTP(ctx context.Context, servers map[string]*served, ready func(context.Context) error, h *httpFlags, logger *slog.Logger, stderr io.Writer) int {
	var srv *server.Server
	var tenants map[string]*server.Server
	if s := servers[""]; s != nil {
		srv = s.srv
	} else {
		tenants = map[string]*server.Server{}
		names := make([]string, 0, len(servers))
		for name, s := range servers {
			names = append(names, name)
			tenants[name] = s.srv
		}
		sort.Strings(names)
		srv = tenants[names[0]]
	}
	p, err := h.plan()
	if err == nil && p.auth != nil {
		err = srv.CheckToolScopes(p.auth.ToolScopes)
	}
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitUsage
	}
	ln, err := net.Listen("tcp", h.addr)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: listen on %s: %v\n", h.addr, err)
		return exitFail
	}
	var ingestEndpoint http.Handler
	if h.ingest.on {
		reviewers, store := "", ""
		if h.reviewers != nil {
			reviewers = *h.reviewers
		}
		if h.store != nil {
			store = *h.store
		}
		var closeIngest func()
		ingestEndpoint, closeIngest, err = ingestHandler(ctx, &h.ingest, reviewers, store, servers, logger)
		if err != nil {
			ln.Close()
			fmt.Fprintf(stderr, "haia-trace-mcp: %s\n", termsafe.String(err.Error()))
			return exitFail
		}
		defer closeIngest()
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	resource, hosts, err := h.resourceAndHosts(p, port)
	if err != nil {
		ln.Close()
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitUsage
	}
	front, err := srv.NewHTTP(server.HTTPConfig{
		Resource:       resource,
		Auth:           p.auth,
		AllowedHosts:   hosts,
		AllowedOrigins: auth.OriginsFor(hosts),
		HostsHint:      "--http sets the listen address's host:port, --public-url the public name behind a proxy, --http-allowed-host more names (a port mapping's, a proxy's)",
		MaxBodyBytes:   h.maxBody,
		MaxSessions:    h.maxSessions,
		SessionIdle:    h.sessionIdle,
		SessionKeyFile: h.sessionKey,
		MaxStreams:     h.maxStreams,
		StreamIdle:     h.streamIdle,
		StreamPing:     h.streamPing,
		RateLimit:      h.rateLimit,
		RateBurst:      h.burst(),
		Tenants:        tenants,
		FairShare:      h.fair.share(),
		Ready:          ready,
		Logger:         logger,
		Console:        h.console,
		Ingest:         ingestEndpoint,
	})
	if err != nil {
		ln.Close()
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitFail
	}
	stopHUP, err := startServed(ctx, servers)
	if err != nil {
		ln.Close()
		fmt.Fprintf(stderr, "haia-trace-mcp: %s\n", termsafe.String(err.Error()))
		return exitFail
	}
	defer stopHUP()
	warmRoots(ctx, servers, warmWait)
	if p.auth == nil {
		logger.Warn("serving WITHOUT authentication (--http-insecure-no-auth); loopback only")
	}
	logger.Info("serving MCP over Streamable HTTP", "addr", ln.Addr().String(), "resource", resource, "auth", p.auth != nil)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := front.ReloadKeys(); err != nil {
					logger.Error("SIGHUP: key reload failed; the previous keys stay in use", "err", err)
				} else {
					logger.Info("SIGHUP: keys reloaded")
				}
			}
		}
	}()

	err = front.Serve(ctx, ln, server.Timeouts{
		ReadHeader: h.readHeader,
		Read:       h.readTimeout,
		Write:      h.writeTimeout,
		Idle:       h.idleTimeout,
		Shutdown:   h.shutdown,
	})
	if err != nil {
		logger.Error("HTTP transport stopped", "err", err)
		return exitFail
	}
	logger.Info("HTTP transport stopped cleanly")
	return exitOK
}
