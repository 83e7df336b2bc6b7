package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/fairq"
)

// Defaults of the HTTP transport's bounds; all are stated in docs/http.md.
const (
	DefaultHTTPMaxBody      = 1 << 20
	DefaultHTTPMaxSessions  = 10000
	DefaultHTTPSessionIdle  = 30 * time.Minute
	DefaultHTTPMaxStreams   = 256
	DefaultHTTPStreamIdle   = 5 * time.Minute
	DefaultHTTPStreamPing   = 25 * time.Second
	DefaultHTTPMaxHeader    = 16 << 10
	DefaultReadHeaderTimout = 5 * time.Second
	DefaultReadTimeout      = 30 * time.Second
	DefaultWriteTimeout     = 60 * time.Second
	DefaultIdleTimeout      = 2 * time.Minute
	DefaultShutdownTimeout  = 20 * time.Second
)

// HTTPConfig describes the Streamable HTTP endpoint.
type HTTPConfig struct {
	// Resource is the URL clients call, e.g. http://127.0.0.1:3000/mcp; it
	// is the `aud` tokens must carry and the RFC 9728 `resource`.
	Resource string
	// Auth configures token verification; nil serves without
	// authentication (the caller allows that on loopback only). Its
	// Resource is set to Resource and its OnOutcome feeds the metrics.
	Auth *auth.Config
	// AllowedHosts and AllowedOrigins guard /mcp against DNS rebinding
	// (see auth.OriginGuard). Both must be set.
	AllowedHosts   []string
	AllowedOrigins []string
	// HostsHint tells, in a refusal for the Host or Origin, how the
	// operator allows another (e.g. the flag that sets the public name).
	HostsHint string
	// MaxBodyBytes bounds a request body; larger ones get 413.
	MaxBodyBytes int64
	// MaxSessions bounds the session ids this process holds state for
	// (mcp-go's registration and log level, the live stream, tombstones of
	// terminated sessions); past it the least recently active is dropped.
	MaxSessions int
	// SessionIdle is how long an idle session's state is kept.
	SessionIdle time.Duration
	// SessionKeyFile holds the key session ids are signed with. Empty
	// derives it from Resource (see sessionTable), which replicas share.
	SessionKeyFile string
	// MaxStreams bounds the live streams (GET /mcp, subscriptions/listen).
	MaxStreams int
	// StreamIdle closes a stream on which the server sent no message for
	// this long; StreamPing is the period of the keep-alive comments.
	StreamIdle time.Duration
	StreamPing time.Duration
	// RateLimit and RateBurst are the per-caller token bucket; zero takes
	// auth.DefaultRateLimit and auth.BurstFor(RateLimit).
	RateLimit float64
	RateBurst int
	// Ready reports whether the server can do its work; nil uses a probe
	// that lists events/.
	Ready func(context.Context) error
	// Tenants, when set, serves one Server per tenant on /mcp: the tenant
	// is the verified token's tenant claim (Auth.TenantClaim), and a token
	// that names no tenant, or one not here, is refused with 403. Each
	// tenant's Server has its own Trace root, index, review log and chain;
	// nothing of one reaches another. Needs Auth.
	Tenants map[string]*Server
	// FairShare shares the process's decision slots between Tenants (see
	// FairShare); nil serves each request as it comes. Ignored without
	// Tenants.
	FairShare *FairShare
	// Logger receives one line per request.
	Logger *slog.Logger
	// Console, when set, is the reviewer console, served under /console/
	// behind the same Host and Origin guard as /mcp; it authenticates its
	// own users (passkeys), never with the MCP endpoint's tokens.
	Console http.Handler
	// Ingest, when set, is the recorders' batch endpoint, served at
	// POST /v1/events:batch. It authenticates its callers with its own
	// keys (never the MCP endpoint's tokens) and answers machines, not
	// browsers, so neither the Host and Origin guard nor the token
	// verifier stands in front of it.
	Ingest http.Handler
}

// HTTP is the Streamable HTTP front of a Server: a router with /mcp, the
// protected-resource metadata, health, readiness and metrics.
type HTTP struct {
	handler    http.Handler
	mcp        mcpEndpoint
	verifier   *auth.Verifier
	limiter    *auth.RateLimiter
	sessions   *sessionTable
	streams    *streamSet
	streamIdle time.Duration
	streamPing time.Duration
	fair       *fairShare // nil without tenants or with the fair share off
	metrics    *httpMetrics
	logger     *slog.Logger
}

// NewHTTP builds the HTTP front. All state a tool needs lives in the Trace
// root; session ids carry a MAC (see sessionTable), so replicas of one
// resource accept each other's ids without affinity, and an id the
// server did not issue gets 404 and leaves no state. What a process keeps
// per session (mcp-go's registration and log level, a live stream) is
// bounded by MaxSessions and SessionIdle, streams by MaxStreams,
// StreamIdle and StreamPing, and every caller by RateLimit and RateBurst.
func (s *Server) NewHTTP(cfg HTTPConfig) (*HTTP, error) {
	if cfg.Resource == "" {
		return nil, errors.New("http: the resource URL is empty")
	}
	if len(cfg.AllowedHosts) == 0 {
		return nil, errors.New("http: no allowed Host values: the DNS-rebinding guard would refuse every request")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultHTTPMaxBody
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultHTTPMaxSessions
	}
	if cfg.SessionIdle <= 0 {
		cfg.SessionIdle = DefaultHTTPSessionIdle
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultHTTPMaxStreams
	}
	if cfg.StreamIdle <= 0 {
		cfg.StreamIdle = DefaultHTTPStreamIdle
	}
	if cfg.StreamPing <= 0 {
		cfg.StreamPing = DefaultHTTPStreamPing
	}
	if cfg.StreamPing >= cfg.StreamIdle {
		cfg.StreamPing = cfg.StreamIdle / 2 // a ping must go out before the stream counts as idle
	}
	if cfg.RateLimit == 0 {
		cfg.RateLimit = auth.DefaultRateLimit
	}
	if cfg.RateBurst == 0 {
		cfg.RateBurst = auth.BurstFor(cfg.RateLimit)
	}
	if cfg.Logger == nil {
		cfg.Logger = s.cfg.Logger
	}
	if cfg.Ready == nil {
		cfg.Ready = s.probeReady
		if len(cfg.Tenants) > 0 {
			cfg.Ready = tenantsReady(cfg.Tenants)
		}
	}
	h := &HTTP{logger: cfg.Logger, metrics: newHTTPMetrics(), streamIdle: cfg.StreamIdle, streamPing: cfg.StreamPing}
	for _, c := range s.collectors {
		if err := h.metrics.registry.Register(c); err != nil {
			return nil, fmt.Errorf("http: metrics: %w", err)
		}
	}
	if cfg.Auth != nil {
		if err := s.CheckToolScopes(cfg.Auth.ToolScopes); err != nil {
			return nil, fmt.Errorf("http: %w", err)
		}
		s.SetToolScopes(cfg.Auth.ToolScopes)
		for _, t := range cfg.Tenants {
			t.SetToolScopes(cfg.Auth.ToolScopes)
		}
	}
	limiter, err := auth.NewRateLimiter(auth.RateConfig{
		PerSecond: cfg.RateLimit, Burst: cfg.RateBurst,
		OnLimited: h.metrics.rateLimited.Inc,
	})
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	h.limiter = limiter
	key, err := loadSessionKey(cfg.SessionKeyFile, cfg.Resource)
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	h.sessions = newSessionTable(key, cfg.MaxSessions, cfg.SessionIdle, h.metrics.sessions, h.metrics.sessionsDropped)
	h.sessions.onDrop = h.dropMCPState
	h.streams = &streamSet{max: cfg.MaxStreams, gauge: h.metrics.streams, live: map[*streamHandle]struct{}{}}

	var metadata http.Handler
	if cfg.Auth != nil {
		ac := *cfg.Auth
		ac.Resource = cfg.Resource
		if ac.Logger == nil {
			ac.Logger = cfg.Logger
		}
		prev := ac.OnOutcome
		ac.OnOutcome = func(o auth.Outcome) {
			h.metrics.authOutcomes.WithLabelValues(string(o)).Inc()
			if prev != nil {
				prev(o)
			}
		}
		v, err := auth.New(ac)
		if err != nil {
			return nil, fmt.Errorf("http: %w", err)
		}
		h.verifier = v
		metadata = v.MetadataHandler()
	}

	streamable := func(srv *Server) *mcpserver.StreamableHTTPServer {
		return mcpserver.NewStreamableHTTPServer(srv.mcp,
			mcpserver.WithEndpointPath("/mcp"),
			// Session ids are minted and checked by the front's table, which
			// also bounds and expires their state; mcp-go's own idle sweeper
			// (WithSessionIdleTTL) stays off, so it keeps no per-id clock.
			mcpserver.WithSessionIdManagerResolver(sessionResolver{t: h.sessions}),
			// Our own OriginGuard checks Host and Origin for every listener,
			// not only loopback ones, so mcp-go's narrower check is off.
			mcpserver.WithDisableLocalhostProtection(true),
			mcpserver.WithStreamableHTTPLogger(cfg.Logger),
			mcpserver.WithHTTPContextFunc(carryIdentity),
		)
	}
	if len(cfg.Tenants) > 0 {
		if cfg.Auth == nil || cfg.Auth.TenantClaim == "" {
			return nil, errors.New("http: tenants need authentication with a tenant claim")
		}
		mux := &tenantMux{byName: map[string]*mcpserver.StreamableHTTPServer{}, claim: cfg.Auth.TenantClaim}
		for name, srv := range cfg.Tenants {
			mux.byName[name] = streamable(srv)
		}
		h.mcp = mux
		if cfg.FairShare != nil {
			if h.fair, err = newFairShare(*cfg.FairShare, tenantNames(cfg.Tenants), h.metrics.registry); err != nil {
				return nil, fmt.Errorf("http: %w", err)
			}
		}
	} else {
		h.mcp = streamable(s)
	}

	r := chi.NewRouter()
	r.Use(h.observe)
	payerLine := ""
	if payer := s.PayerAddress(); payer != "" {
		payerLine = "payer " + payer + "\n"
	}
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n"+payerLine)
	})
	r.Get("/readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := cfg.Ready(r.Context()); err != nil {
			cfg.Logger.WarnContext(r.Context(), "not ready", "err", err)
			w.WriteHeader(http.StatusServiceUnavailable)
			reason := "not ready"
			var nr *engine.NotReadyError
			if errors.As(err, &nr) {
				reason += ": " + nr.Reason
			}
			_, _ = io.WriteString(w, reason+"\n")
			return
		}
		_, _ = io.WriteString(w, "ready\n"+payerLine)
	})
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(h.metrics.registry, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}))
	if metadata != nil {
		path, err := auth.MetadataPath(cfg.Resource)
		if err != nil {
			return nil, fmt.Errorf("http: %w", err)
		}
		r.Handle(path, metadata)
		if path != auth.WellKnownPrefix {
			r.Handle(auth.WellKnownPrefix, metadata)
		}
	}

	var endpoint http.Handler = h.mcp
	endpoint = h.gate(endpoint)
	endpoint = noteSubject(endpoint)
	endpoint = h.limiter.Middleware(endpoint) // per token subject, or per address without auth
	if h.verifier != nil {
		endpoint = h.verifier.Middleware(endpoint)
	}
	endpoint = limitBody(cfg.MaxBodyBytes, endpoint)
	endpoint = auth.OriginGuard(cfg.AllowedHosts, cfg.AllowedOrigins, cfg.HostsHint, endpoint)
	r.Handle("/mcp", endpoint)
	if cfg.Console != nil {
		r.Handle("/console/*", auth.OriginGuard(cfg.AllowedHosts, cfg.AllowedOrigins, cfg.HostsHint, cfg.Console))
	}
	if cfg.Ingest != nil {
		r.Handle("/v1/events:batch", cfg.Ingest)
	}
	h.handler = r
	return h, nil
}

// ServeHTTP routes one request.
func (h *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.handler.ServeHTTP(w, r) }

// ReloadKeys re-reads the JWKS or secret file. On error the old keys stay
// in use. Without authentication it does nothing.
func (h *HTTP) ReloadKeys() error {
	if h.verifier == nil {
		return nil
	}
	return h.verifier.Reload()
}

// mcpEndpoint is what serves /mcp: one MCP server, or one per tenant.
type mcpEndpoint interface {
	http.Handler
	Shutdown(ctx context.Context) error
}

// tenantMux sends each request to the MCP server of the verified token's
// tenant. The tenant comes from the token alone, never from the request: a
// session id or an argument cannot move a caller into another tenant.
type tenantMux struct {
	byName map[string]*mcpserver.StreamableHTTPServer
	claim  string
}

func (m *tenantMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Context().Value(internalKey{}) != nil {
		// The front dropping a session's state: each server forgets it.
		for _, srv := range m.byName {
			srv.ServeHTTP(w, r)
		}
		return
	}
	id, _ := auth.IdentityFrom(r.Context())
	srv, ok := m.byName[id.Tenant]
	if !ok || id.Tenant == "" {
		what := fmt.Sprintf("the token's %q claim names no tenant of this server", m.claim)
		if id.Tenant == "" {
			what = fmt.Sprintf("the token carries no %q claim naming its tenant", m.claim)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil,
			"error": map[string]any{"code": -32003, "message": "forbidden: " + what}})
		_, _ = w.Write(body)
		return
	}
	srv.ServeHTTP(w, r)
}

func (m *tenantMux) Shutdown(ctx context.Context) error {
	var errs []error
	for _, srv := range m.byName {
		errs = append(errs, srv.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// Registry is the Prometheus registry behind /metrics.
func (h *HTTP) Registry() *prometheus.Registry { return h.metrics.registry }

// Close ends the live streams.
func (h *HTTP) Close(ctx context.Context) error {
	h.streams.closeAll(errShuttingDown)
	return h.mcp.Shutdown(ctx)
}

// ToolNames lists the tools this server serves, sorted.
func (s *Server) ToolNames() []string {
	return slices.Sorted(maps.Keys(s.mcp.ListTools()))
}

// CheckToolScopes refuses a per-tool scope for a tool the server does not
// have: a typo (check-before-pay) would otherwise leave the real tool
// callable with the base scope.
func (s *Server) CheckToolScopes(scopes map[string]string) error {
	tools := s.mcp.ListTools()
	var unknown []string
	for name := range scopes {
		if _, ok := tools[name]; !ok {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	names := make([]string, 0, len(tools))
	for name := range tools {
		names = append(names, name)
	}
	slices.Sort(unknown)
	slices.Sort(names)
	return fmt.Errorf("--auth-tool-scope names no tool of this server: %s (the tools are: %s)",
		strings.Join(unknown, ", "), strings.Join(names, ", "))
}

// Timeouts bound the life of a connection; zero fields take the defaults.
type Timeouts struct {
	ReadHeader time.Duration
	Read       time.Duration
	Write      time.Duration
	Idle       time.Duration
	Shutdown   time.Duration // how long in-flight requests may take to finish
	MaxHeader  int           // bytes of request headers
}

func (t Timeouts) withDefaults() Timeouts {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&t.ReadHeader, DefaultReadHeaderTimout)
	def(&t.Read, DefaultReadTimeout)
	def(&t.Write, DefaultWriteTimeout)
	def(&t.Idle, DefaultIdleTimeout)
	def(&t.Shutdown, DefaultShutdownTimeout)
	if t.MaxHeader <= 0 {
		t.MaxHeader = DefaultHTTPMaxHeader
	}
	return t
}

// Serve answers on ln until ctx is cancelled, then stops accepting, ends
// the SSE streams and lets in-flight requests finish within t.Shutdown.
// It returns nil after a clean shutdown.
func (h *HTTP) Serve(ctx context.Context, ln net.Listener, t Timeouts) error {
	t = t.withDefaults()
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    t.MaxHeader,
		ErrorLog:          slog.NewLogLogger(h.logger.Handler(), slog.LevelWarn),
		// Requests outlive ctx so that Shutdown can let them finish.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		_ = h.Close(context.Background())
		return fmt.Errorf("http server on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	h.logger.Info("shutting down: finishing in-flight requests", "bound", t.Shutdown)
	sctx, cancel := context.WithTimeout(context.Background(), t.Shutdown)
	defer cancel()
	// Long-lived SSE streams would hold Shutdown until its bound.
	_ = h.Close(sctx)
	err := hs.Shutdown(sctx)
	<-errc
	if err != nil {
		_ = hs.Close()
		return fmt.Errorf("graceful shutdown did not finish within %s: %w", t.Shutdown, err)
	}
	return nil
}

// carryIdentity copies the verified identity onto the context mcp-go gives
// tool handlers, so that auth.SubjectFrom works there whatever context
// mcp-go starts from.
func carryIdentity(ctx context.Context, r *http.Request) context.Context {
	if r == nil {
		return ctx
	}
	if id, ok := auth.IdentityFrom(r.Context()); ok {
		return auth.WithIdentity(ctx, id)
	}
	return ctx
}

// probeReady lists events/ (a root that cannot be read serves nothing) and,
// with the guard on, asks the guard's engine: its signer, the store in use
// (guard/ on the file store, the database on PostgreSQL — nothing else, so
// a read-only Trace root serves on PostgreSQL) and the trusted reviewers;
// with payments on, the payer signer too.
func (s *Server) probeReady(ctx context.Context) error {
	if _, err := s.cfg.Catalog.Events().ReadDir(); err != nil {
		return &engine.NotReadyError{Reason: "the events directory cannot be listed", Err: err}
	}
	if s.guard == nil {
		return nil
	}
	if err := s.guard.Engine.Ready(ctx); err != nil {
		return err
	}
	if s.guard.Payments != nil {
		if err := s.guard.Payments.Ready(ctx); err != nil {
			return &engine.NotReadyError{Reason: "the payer signer does not answer, so no payment can be authorized", Err: err}
		}
	}
	return nil
}

// tenantsReady probes every tenant, in name order, and names the first that
// is not ready: one tenant that cannot record a decision takes the process
// out of service, since its callers would otherwise get only errors.
func tenantsReady(tenants map[string]*Server) func(context.Context) error {
	names := slices.Sorted(maps.Keys(tenants))
	return func(ctx context.Context) error {
		for _, name := range names {
			err := tenants[name].probeReady(ctx)
			if err == nil {
				continue
			}
			return engine.TenantNotReady(name, err)
		}
		return nil
	}
}

// limitBody answers 413 to a body over max, before authentication reads
// it, and hands later handlers a body that is already in memory.
func limitBody(max int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			http.Error(w, "request body larger than "+strconv.FormatInt(max, 10)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
			_ = r.Body.Close()
			if err != nil {
				http.Error(w, "request body could not be read", http.StatusBadRequest)
				return
			}
			if int64(len(body)) > max {
				http.Error(w, "request body larger than "+strconv.FormatInt(max, 10)+" bytes", http.StatusRequestEntityTooLarge)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if n, ok := r.Context().Value(reqNoteKey{}).(*reqNote); ok {
				n.body = body
			}
		}
		next.ServeHTTP(w, r)
	})
}

// httpMetrics are the transport's Prometheus collectors, in a registry of
// their own so that two servers in one process never collide.
type httpMetrics struct {
	registry     *prometheus.Registry
	requests     *prometheus.CounterVec
	durations    *prometheus.HistogramVec
	inFlight     prometheus.Gauge
	streams      prometheus.Gauge
	authOutcomes *prometheus.CounterVec

	sessions        prometheus.Gauge
	sessionsDropped *prometheus.CounterVec
	streamsClosed   *prometheus.CounterVec
	rateLimited     prometheus.Counter
}

func newHTTPMetrics() *httpMetrics {
	m := &httpMetrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "haia_http_requests_total", Help: "HTTP requests answered, by route, method and status code.",
		}, []string{"route", "method", "code"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "haia_http_request_duration_seconds", Help: "Time to answer an HTTP request, by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "haia_http_in_flight_requests", Help: "HTTP requests being answered.",
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "haia_mcp_live_streams", Help: "Open GET /mcp server-to-client streams.",
		}),
		authOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "haia_auth_outcomes_total", Help: "Bearer token decisions, by outcome.",
		}, []string{"outcome"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "haia_mcp_sessions", Help: "Session ids this process holds state for (tombstones included).",
		}),
		sessionsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "haia_mcp_sessions_evicted_total", Help: "Session state dropped, by reason (capacity: the table was full; idle).",
		}, []string{"reason"}),
		streamsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "haia_mcp_streams_closed_total", Help: "Streams ended, by reason.",
		}, []string{"reason"}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "haia_http_rate_limited_total", Help: "Requests refused with 429 by the per-caller rate limit.",
		}),
	}
	for _, o := range []auth.Outcome{auth.OutcomeOK, auth.OutcomeNoToken, auth.OutcomeInvalidToken, auth.OutcomeInsufficientScope, auth.OutcomeBadRequest} {
		m.authOutcomes.WithLabelValues(string(o)) // expose every outcome from the start, at zero
	}
	for _, r := range []dropReason{dropCapacity, dropIdle} {
		m.sessionsDropped.WithLabelValues(string(r))
	}
	m.streamsClosed.WithLabelValues("idle")
	m.registry.MustRegister(m.requests, m.durations, m.inFlight, m.streams, m.authOutcomes,
		m.sessions, m.sessionsDropped, m.streamsClosed, m.rateLimited,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// reqNote is filled in by inner handlers for the outer request log line.
type reqNote struct {
	subject string
	tenant  string      // the tenant whose decision slot the request took
	turn    *fairq.Turn // how it was admitted to the slot (nil: refused or no fair share)
	body    []byte      // the request body, read by limitBody
	// writer is the response's, whose progress counter the session's
	// replaces once the session is known (sessionStream).
	writer *statusWriter
}

type reqNoteKey struct{}

// noteSubject records the verified subject for the request log; it runs
// after the auth middleware, whose context the outer layer cannot see.
func noteSubject(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, ok := r.Context().Value(reqNoteKey{}).(*reqNote); ok {
			if sub, ok := auth.SubjectFrom(r.Context()); ok {
				n.subject = sub
			}
		}
		next.ServeHTTP(w, r)
	})
}

// statusWriter remembers the status code; it passes Flush through because
// SSE responses need it.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	stream *Stream
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	if err == nil && n == len(b) {
		w.stream.wrote(b)
	}
	return n, err
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// observe logs one line per request and updates the metrics. The path is
// logged without its query, so a token someone put there is not recorded.
func (h *HTTP) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h.metrics.inFlight.Inc()
		defer h.metrics.inFlight.Dec()
		sw := &statusWriter{ResponseWriter: w, stream: &Stream{}}
		note := &reqNote{writer: sw}
		ctx := context.WithValue(context.WithValue(r.Context(), reqNoteKey{}, note), streamKey{}, sw.stream)
		next.ServeHTTP(sw, r.WithContext(ctx))
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		elapsed := time.Since(start)
		route := "other"
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			route = rc.RoutePattern()
		}
		h.metrics.requests.WithLabelValues(route, r.Method, strconv.Itoa(sw.status)).Inc()
		h.metrics.durations.WithLabelValues(route).Observe(elapsed.Seconds())
		attrs := []slog.Attr{
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", sw.status),
			slog.Duration("duration", elapsed),
			slog.Int64("bytes", sw.bytes),
			slog.String("remote", r.RemoteAddr),
		}
		if note.subject != "" {
			attrs = append(attrs, slog.String("sub", note.subject))
		}
		if note.tenant != "" {
			attrs = append(attrs, slog.String("tenant", note.tenant))
		}
		if t := note.turn; t != nil {
			attrs = append(attrs, slog.Group("admission", slog.Uint64("seq", t.Seq), slog.Bool("queued", t.Queued),
				slog.Duration("waited", t.Waited), slog.Int("ahead", t.Ahead), slog.Int("others_first", t.OthersFirst)))
		}
		level := slog.LevelInfo
		if r.URL.Path == "/healthz" || r.URL.Path == "/metrics" || r.URL.Path == "/readyz" {
			level = slog.LevelDebug // probes every few seconds would drown the log
		}
		h.logger.LogAttrs(r.Context(), level, "http request", attrs...)
	})
}
