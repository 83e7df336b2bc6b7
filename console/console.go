// Package console is the reviewer console: a small server-rendered page
// set where a reviewer enrolled with a passkey reads the review queue and
// decides, each decision its own WebAuthn assertion over the decision hash
// of the review's signed terms. The server never writes the trusted
// reviewers file: enrolment hands the registered credential to the
// operator's command, which shows its fingerprint and adds it.
package console

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/protocol/webauthncose"
	"github.com/go-webauthn/webauthn/webauthn"
	"golang.org/x/time/rate"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/clientaddr"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

//go:embed assets templates
var files embed.FS

// Bounds.
const (
	// EnrolTTL is how long a one-time enrolment link is valid.
	EnrolTTL      = 10 * time.Minute
	sessionTTL    = 8 * time.Hour
	ceremonyTTL   = 5 * time.Minute
	maxBody       = 64 << 10
	maxPending    = 1024 // ceremonies and enrolments held in memory
	sessionCookie = "haia_console"
	csrfCookie    = "haia_console_csrf"
	csrfHeader    = "X-CSRF-Token"
	maxNoteBytes  = 4096
	tokenBytes    = 32
	signInPerIP   = 0.5 // sign-in and enrolment requests per second per client (or per reviewer)
	signInBurst   = 20
	collectPerSec = 2 // the operator's command polls collect with a link of its own
	collectBurst  = 20
	// MaxCollectWait is the longest a collect request is held waiting for
	// the registration (?wait=SECONDS): the operator's command asks about
	// three times a minute however long the reviewer takes, and the hold
	// stays under the console listener's 30 s write timeout.
	MaxCollectWait = 20 * time.Second
	maxLimited     = 4096 // rate-limit buckets held
	enrolTokenName = "t"
	// MinEnrolKey is the shortest key that signs enrolment links.
	MinEnrolKey = 32
)

// Config is what the console needs.
type Config struct {
	// URL is where people open the console, ending in "/console/"; its
	// host is the relying party id and its origin the one origin every
	// ceremony must name.
	URL *url.URL
	Log *reviewlog.Log
	// Decider records a passkey's decision (the server's chains).
	Decider engine.PasskeyDecider
	// SellerKeys lists the keys the policy in force pins for a JWS key
	// identifier, which a dossier carries (nil: none carried).
	SellerKeys func(kid string) []sellerkey.Key
	// Passkeys reads the trusted reviewers' passkeys at every use, so an
	// edit of the file (or a SIGHUP) is seen at once.
	Passkeys func() (reviewlog.Passkeys, error)
	// Explain is the paragraph that explains one evidence operation of a
	// review opened under template ("" when none).
	Explain func(template string, ref guard.Ref) string
	// AssetSymbol names an asset's symbol ("" when unknown).
	AssetSymbol func(asset string) string
	Now         func() time.Time
	Logger      *slog.Logger
	// Changes, when set, calls wake whenever the store says the review
	// log changed (PostgreSQL's NOTIFY), until ctx ends: the live queue
	// updates at once instead of at the next PollInterval.
	Changes func(ctx context.Context, wake func())
	// PollInterval is how often the live queue reads the log while a queue
	// page is open (DefaultPollInterval when 0).
	PollInterval time.Duration
	// History, when set, is the history the guard reads (its history
	// templates' operations and the reservations), for a review page's
	// timeline of recent payments; Assets names an asset's symbol and
	// decimals for it.
	History func(ctx context.Context) (guard.History, error)
	Assets  AssetInfo
	// PayeeName, when set, is the policy's name of a payee address (its
	// payees key; "" when none): shown beside the address, matched
	// against nothing.
	PayeeName func(address string) string
	// MandateApprovals, when set, is how many reviewers must sign a
	// mandate up to max atomic units of asset under the policy's quorum
	// (nil: one), for the mandate an approval may grant.
	MandateApprovals func(max *big.Int, asset string) int
	// Spend, when set, is the spend against the policy's limits, per
	// counterparty and in total (engine.Spend), for the queue's panel.
	Spend func(ctx context.Context) (engine.SpendView, error)
	// SessionKey MACs the session cookies and sign-in challenges (at
	// least 32 bytes): replicas given the same key share sessions. Random
	// when nil (one process).
	SessionKey []byte
	// Tenant, when set, is the one tenant of a --tenants-dir server this
	// console serves, under URL + "t/<tenant>/" (its own cookies and
	// pages). Passkeys must then list only the reviewers granted it.
	Tenant string
	// SignIns, when set, records the sign-in challenges used for every
	// replica that shares it (the PostgreSQL store), so an assertion signs
	// in once whichever replica it reaches; nil remembers them in this
	// process.
	SignIns SignIns
	// EnrolKey checks the one-time enrolment links: the operator's
	// command signs each with it (NewEnrolToken), and a link it did not
	// sign is refused before anything is held for it. At least
	// MinEnrolKey bytes; without one, enrolment is refused.
	EnrolKey []byte
	// Clients finds the client address of a request (the TCP peer unless
	// the operator named a trusted reverse proxy); the sign-in and
	// enrolment rate limits are per client address.
	Clients clientaddr.Resolver
}

// SignIns records used sign-in challenges where every replica reads them.
type SignIns interface {
	// UseSignIn records the sign-in challenge whose SHA-256 is id, kept
	// until expires, and reports whether it was new: false when any
	// replica recorded it before.
	UseSignIn(ctx context.Context, id []byte, expires time.Time) (bool, error)
}

// Console serves /console/.
type Console struct {
	cfg    Config
	wa     *webauthn.WebAuthn
	rpID   string
	origin string
	base   string
	secure bool
	pages  *template.Template

	mu         sync.Mutex
	signedOut  map[string]time.Time // session MACs signed out here → expiry
	sessionKey []byte
	logins     map[string]time.Time // login challenges used here (base64url) → expiry
	enrolments map[string]*enrolment
	// registered is closed, and replaced, when a passkey is registered:
	// it wakes the collect requests held waiting.
	registered chan struct{}
	limits     map[string]*rate.Limiter
	feed       feed
	streams    int
	done       chan struct{} // closed when Run ends
	// counts are the signature counters seen at sign-in and decisions,
	// per credential id (trusted credentials only, so bounded by the
	// reviewers file).
	counts map[string]uint32
}

// enrolment is one one-time link's state: begun, then registered, then
// collected by the operator's command.
type enrolment struct {
	reviewer   string
	expires    time.Time
	session    *webauthn.SessionData
	credential *passkey.Credential
	collected  bool
}

// ParseURL reads the address people open the console at: an absolute
// http(s) URL ending in /console/, without user, query or fragment, plain
// http only on a loopback host (browsers allow passkeys only on https or
// localhost).
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("console: the console URL %q cannot be read: %w", clip(raw), err)
	}
	if err := checkURL(u); err != nil {
		return nil, err
	}
	return u, nil
}

// IsConsolePath reports whether p is a console's path: one ending in
// /console/, or a tenant's console under it, /console/t/<tenant>/.
func IsConsolePath(p string) bool {
	if strings.HasSuffix(p, "/console/") {
		return true
	}
	rest, ok := strings.CutSuffix(p, "/")
	if !ok {
		return false
	}
	i := strings.LastIndex(rest, "/console/t/")
	return i >= 0 && reviewlog.CheckTenant(rest[i+len("/console/t/"):]) == nil
}

func checkURL(u *url.URL) error {
	if u == nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.HasSuffix(u.Path, "/console/") ||
		u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return errors.New("console: the console URL must be an absolute http(s) URL ending in /console/, without user, query or fragment")
	}
	if u.Scheme == "http" && !isLoopbackName(u.Hostname()) {
		return fmt.Errorf("console: %s://%s is plain http on a host that is not loopback; browsers allow passkeys only on https or localhost — serve it behind TLS", u.Scheme, u.Host)
	}
	return nil
}

// PageOf is the page of review id under the console at u.
func PageOf(u *url.URL, id string) string {
	return u.Scheme + "://" + u.Host + u.Path + "reviews/" + url.PathEscape(id)
}

// New checks cfg and builds the console.
func New(cfg Config) (*Console, error) {
	if err := checkURL(cfg.URL); err != nil {
		return nil, err
	}
	if cfg.Tenant != "" {
		if err := reviewlog.CheckTenant(cfg.Tenant); err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		u := *cfg.URL
		u.Path += "t/" + cfg.Tenant + "/"
		u.RawPath = ""
		cfg.URL = &u
	}
	if cfg.Log == nil || cfg.Passkeys == nil || cfg.Decider.Log == nil || cfg.Decider.Chains == nil {
		return nil, errors.New("console: a review log, the server's chains and the trusted passkeys are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Explain == nil {
		cfg.Explain = func(string, guard.Ref) string { return "" }
	}
	if cfg.AssetSymbol == nil {
		cfg.AssetSymbol = func(string) string { return "" }
	}
	if cfg.SessionKey != nil && len(cfg.SessionKey) < minSessionKey {
		return nil, fmt.Errorf("console: the session key must be at least %d bytes", minSessionKey)
	}
	if cfg.EnrolKey != nil && len(cfg.EnrolKey) < MinEnrolKey {
		return nil, fmt.Errorf("console: the enrolment link key must be at least %d bytes", MinEnrolKey)
	}
	if cfg.Assets == nil {
		cfg.Assets = func(string) (string, int, bool) { return "", 0, false }
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	host := cfg.URL.Hostname()
	origin := cfg.URL.Scheme + "://" + cfg.URL.Host
	wa, err := webauthn.New(&webauthn.Config{
		RPID: host, RPDisplayName: "haia-trace-mcp reviewers", RPOrigins: []string{origin},
		AttestationPreference: protocol.PreferNoAttestation,
		AuthenticatorSelection: protocol.AuthenticatorSelection{
			ResidentKey: protocol.ResidentKeyRequirementRequired, RequireResidentKey: protocol.ResidentKeyRequired(),
			UserVerification: protocol.VerificationRequired,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("console: relying party %s: %w", host, err)
	}
	pages, err := template.New("console").Funcs(template.FuncMap{"proof": proof, "t": termsafe.String}).ParseFS(files, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	c := &Console{cfg: cfg, wa: wa, rpID: host, origin: origin, base: cfg.URL.Path, secure: cfg.URL.Scheme == "https",
		pages: pages, signedOut: map[string]time.Time{}, logins: map[string]time.Time{}, enrolments: map[string]*enrolment{}, registered: make(chan struct{}),
		limits: map[string]*rate.Limiter{}, counts: map[string]uint32{},
		feed: feed{ch: make(chan struct{})}, done: make(chan struct{})}
	c.sessionKey = cfg.SessionKey
	if c.sessionKey == nil {
		c.sessionKey = make([]byte, minSessionKey)
		if _, err := rand.Read(c.sessionKey); err != nil {
			return nil, fmt.Errorf("console: session key: %w", err)
		}
	}
	if c.cfg.Decider.SeenCount == nil {
		c.cfg.Decider.SeenCount = c.seenCount
	}
	return c, nil
}

// seenCount is the highest signature counter this console saw from a
// credential.
func (c *Console) seenCount(credID string) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[credID]
}

// sawCount records a verified assertion's signature counter.
func (c *Console) sawCount(credID string, n uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n > c.counts[credID] {
		c.counts[credID] = n
	}
}

// checkCount refuses an assertion whose signature counter does not grow
// past the last this console saw or the chains record for the passkey.
func (c *Console) checkCount(ctx context.Context, who string, cred passkey.Credential, a passkey.Assertion) (uint32, error) {
	got, err := passkey.SignCount(a)
	if err != nil {
		return 0, fail(http.StatusBadRequest, "credential: %v", err)
	}
	last, err := c.cfg.Log.LastSignCount(ctx, nil, cred)
	if err != nil {
		return 0, fmt.Errorf("read the passkey's last signature counter: %w", err)
	}
	last = max(last, c.seenCount(cred.ID))
	if err := passkey.CheckSignCount(last, got); err != nil {
		c.cfg.Logger.Warn("console: passkey refused, its signature counter did not grow (a cloned authenticator?)", "reviewer", who, "credential", clip(cred.ID), "counter", got, "last", last)
		return 0, fail(http.StatusForbidden, "sign-in refused: %v. Ask the operator to remove this passkey and enrol a new one", err)
	}
	return got, nil
}

func isLoopbackName(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func proof(with string) string {
	switch with {
	case reviewlog.DecidedWithPasskey:
		return "passkey (WebAuthn assertion in the receipt)"
	case reviewlog.DecidedWithKey:
		return "reviewer key (CLI)"
	}
	return "—"
}

// RPID is the relying party id; Origin the one origin ceremonies name.
func (c *Console) RPID() string   { return c.rpID }
func (c *Console) Origin() string { return c.origin }

// ReviewURL is the page of one review.
func (c *Console) ReviewURL(id string) string {
	return PageOf(c.cfg.URL, id)
}

// Handler serves the console under its base path.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	b := c.base
	mux.HandleFunc("GET "+b+"{$}", c.page(c.queue))
	mux.HandleFunc("GET "+b+"reviews/{id}", c.page(c.review))
	mux.HandleFunc("GET "+b+"reviews/{id}/dossier/{nonce}", c.dossier)
	mux.HandleFunc("GET "+b+"findings/{nonce}", c.page(c.findingPage))
	mux.HandleFunc("GET "+b+"findings/{nonce}/dossier", c.findingDossier)
	mux.HandleFunc("GET "+b+"enrol", c.page(c.enrolPage))
	mux.HandleFunc("GET "+b+"assets/{name}", c.asset)
	mux.HandleFunc("GET "+b+"api/events", c.events)
	mux.HandleFunc("POST "+b+"api/login/begin", c.api(c.loginBegin))
	mux.HandleFunc("POST "+b+"api/login/finish", c.api(c.loginFinish))
	mux.HandleFunc("POST "+b+"api/logout", c.api(c.logout))
	mux.HandleFunc("POST "+b+"api/enrol/begin", c.api(c.enrolBegin))
	mux.HandleFunc("POST "+b+"api/enrol/finish", c.api(c.enrolFinish))
	mux.HandleFunc("POST "+b+"api/reviews/{id}/begin", c.api(c.decideBegin))
	mux.HandleFunc("POST "+b+"api/reviews/{id}/finish", c.api(c.decideFinish))
	// The operator's command collects a registration with the link's
	// secret; no cookie, no CSRF (no browser is involved), rate limited.
	mux.HandleFunc("POST "+b+"api/enrol/collect", c.collect)
	return c.secureHeaders(mux)
}

func (c *Console) secureHeaders(next http.Handler) http.Handler {
	return secureHeaders(next, "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'", c.secure)
}

// secureHeaders sets, on every answer of next, the content security
// policy csp, no sniffing, no referrer, no framing, no caching, and over
// https (secure) Strict-Transport-Security.
func secureHeaders(next http.Handler, csp string, secure bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-store")
		if secure {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		next.ServeHTTP(w, r)
	})
}

func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var ctype string
	switch name {
	case "console.js":
		ctype = "text/javascript; charset=utf-8"
	case "console.css":
		ctype = "text/css; charset=utf-8"
	case "favicon.svg":
		ctype = "image/svg+xml"
	default:
		http.NotFound(w, r)
		return
	}
	data, err := files.ReadFile("assets/" + name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", ctype)
	_, _ = w.Write(data)
}

// --- sessions, CSRF, rate limits ---

func randomToken() string {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("console: crypto/rand failed: %v", err)) // no safe way on
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func (c *Console) setCookie(w http.ResponseWriter, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: c.base, MaxAge: maxAge, HttpOnly: true,
		Secure: c.secure, SameSite: http.SameSiteStrictMode})
}

// reviewer is the signed-in reviewer ("" when none); the reviewer must
// still be in the trusted reviewers file.
func (c *Console) reviewer(r *http.Request) string {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	who, ok := c.openSession(ck.Value, c.cfg.Now())
	if !ok {
		return ""
	}
	pks, err := c.cfg.Passkeys()
	if err != nil || len(pks[who]) == 0 {
		return ""
	}
	return who
}

// csrfToken returns the request's CSRF token, setting a new one when it
// has none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == base64.RawURLEncoding.EncodedLen(tokenBytes) {
		return ck.Value
	}
	t := randomToken()
	c.setCookie(w, csrfCookie, t, 0)
	return t
}

// checkState refuses a state change without the page's CSRF token (header
// equal to the cookie) or from another origin.
func (c *Console) checkState(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != c.origin {
		return fmt.Errorf("the request's Origin %q is not the console's %s", clip(o), c.origin)
	}
	ck, err := r.Cookie(csrfCookie)
	h := r.Header.Get(csrfHeader)
	if err != nil || h == "" || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(h)) != 1 {
		return errors.New("the CSRF token is missing or does not match; reload the page")
	}
	return nil
}

// The sign-in and enrolment rate limits. A request that proves whom it
// acts for — a link the operator's command signed, a sign-in assertion
// that verified — is charged to that reviewer's own bucket, so nobody
// else's requests (one stranger behind the same proxy or NAT) can use it
// up; every other request is charged to its client's address, as a
// configured trusted proxy reports it (Config.Clients).

// allowKey takes one request from the bucket key (rate perSec, burst).
func (c *Console) allowKey(key string, perSec rate.Limit, burst int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.limits[key]
	if !ok {
		if len(c.limits) >= maxLimited {
			clear(c.limits) // bounded memory; a flood resets everyone's budget, never grants more than a burst each
		}
		l = rate.NewLimiter(perSec, burst)
		c.limits[key] = l
	}
	return l.Allow()
}

// clientKey is the rate-limit key of r's client address.
func (c *Console) clientKey(r *http.Request) string {
	return "addr " + clientaddr.Key(c.cfg.Clients.Addr(r))
}

// allowClient charges a request that names no reviewer it can prove to
// its client address.
func (c *Console) allowClient(r *http.Request) bool {
	return c.allowKey(c.clientKey(r), signInPerIP, signInBurst)
}

// allowReviewer charges a request proven to act for reviewer who.
func (c *Console) allowReviewer(kind, who string) bool {
	if kind == "collect" {
		return c.allowKey("collect "+who, collectPerSec, collectBurst)
	}
	return c.allowKey(kind+" "+who, signInPerIP, signInBurst)
}

// limited is err, or the rate limit's refusal when the client's address
// had no budget left (byAddr false).
func limited(byAddr bool, err error) error {
	if !byAddr {
		return tooMany()
	}
	return err
}

func tooMany() error {
	return fail(http.StatusTooManyRequests, "too many sign-in or enrolment attempts from your address; wait a little")
}

// --- handlers ---

type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func fail(status int, format string, a ...any) error {
	return &apiError{status: status, msg: fmt.Sprintf(format, a...)}
}

// api wraps a JSON state-changing endpoint: Origin and CSRF checks, a
// bounded body. The sign-in and enrolment handlers charge their rate
// limits themselves, once they know whom a request acts for.
func (c *Console) api(fn func(w http.ResponseWriter, r *http.Request, body []byte) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := c.checkState(r); err != nil {
			writeJSON(w, http.StatusForbidden, map[string]string{"error": termsafe.String(err.Error())})
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("the request body is larger than %d bytes", maxBody)})
			return
		}
		out, err := fn(w, r, body)
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) {
				writeJSON(w, ae.status, map[string]string{"error": termsafe.String(ae.msg)})
				return
			}
			c.cfg.Logger.Error("console request failed", "path", r.URL.Path, "err", err)
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "the server could not complete this; see its log"})
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fail(http.StatusBadRequest, "the request is not the JSON this endpoint takes: %s", plainJSON(err))
	}
	if dec.More() {
		return fail(http.StatusBadRequest, "the request has data after its JSON object")
	}
	return nil
}

func plainJSON(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("member %q has the wrong type", te.Field)
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ")
	}
	return "malformed"
}

// requestOptions are the PublicKeyCredentialRequestOptions of an
// assertion over challenge, user verification required.
func (c *Console) requestOptions(challenge []byte, creds []passkey.Credential) map[string]any {
	allow := []map[string]any{}
	for _, cr := range creds {
		allow = append(allow, map[string]any{"type": "public-key", "id": cr.ID})
	}
	return map[string]any{"publicKey": map[string]any{
		"challenge": base64.RawURLEncoding.EncodeToString(challenge), "rpId": c.rpID, "timeout": int(ceremonyTTL / time.Millisecond),
		"userVerification": "required", "allowCredentials": allow,
	}}
}

// readAssertion reads a browser's PublicKeyCredential (assertion) JSON.
func readAssertion(raw json.RawMessage) (passkey.Assertion, error) {
	if len(raw) == 0 {
		return passkey.Assertion{}, fail(http.StatusBadRequest, "credential: no assertion given")
	}
	var car protocol.CredentialAssertionResponse
	if err := json.Unmarshal(raw, &car); err != nil {
		return passkey.Assertion{}, fail(http.StatusBadRequest, "credential: not a WebAuthn assertion (%s)", plainJSON(err))
	}
	enc := base64.RawURLEncoding.EncodeToString
	return passkey.Assertion{CredentialID: enc(car.RawID), AuthenticatorData: enc(car.AssertionResponse.AuthenticatorData),
		ClientDataJSON: enc(car.AssertionResponse.ClientDataJSON), Signature: enc(car.AssertionResponse.Signature)}, nil
}

func (c *Console) loginBegin(_ http.ResponseWriter, _ *http.Request, _ []byte) (any, error) {
	return c.requestOptions(c.newChallenge(c.cfg.Now()), nil), nil
}

// sweep drops expired ceremonies, sessions and enrolments; c.mu is held.
func (c *Console) sweep(now time.Time) {
	for k, exp := range c.logins {
		if !now.Before(exp) {
			delete(c.logins, k)
		}
	}
	for k, exp := range c.signedOut {
		if !now.Before(exp) {
			delete(c.signedOut, k)
		}
	}
	for k, e := range c.enrolments {
		if !now.Before(e.expires) {
			delete(c.enrolments, k)
		}
	}
}

func (c *Console) loginFinish(w http.ResponseWriter, r *http.Request, body []byte) (any, error) {
	// Charged to the client's address; once that is spent, only an
	// assertion by a trusted passkey is still read, and then charged to
	// its reviewer only if it verifies: a stranger at the reviewer's
	// address (or behind the same proxy) cannot lock the reviewer out, and
	// cannot spend the reviewer's own budget with assertions that fail.
	byAddr := c.allowClient(r)
	var req struct {
		Credential json.RawMessage `json:"credential"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, limited(byAddr, err)
	}
	a, err := readAssertion(req.Credential)
	if err != nil {
		return nil, limited(byAddr, err)
	}
	pks, err := c.cfg.Passkeys()
	if err != nil {
		return nil, fmt.Errorf("read the trusted reviewers file: %w", err)
	}
	who, cred, ok := pks.Owner(a.CredentialID)
	if !ok {
		return nil, limited(byAddr, fail(http.StatusForbidden, "this passkey is not in the trusted reviewers file; ask the operator to enrol it"))
	}
	cd, err := clientChallenge(a)
	if err != nil {
		return nil, limited(byAddr, err)
	}
	now := c.cfg.Now()
	ch, err := base64.RawURLEncoding.DecodeString(cd)
	exp, ok := c.checkChallenge(ch, now)
	if err != nil || !ok {
		return nil, limited(byAddr, fail(http.StatusForbidden, "this sign-in's challenge was not issued by this console, or expired"))
	}
	if err := passkey.Verify(cred, a, ch); err != nil {
		return nil, limited(byAddr, fail(http.StatusForbidden, "sign-in refused: %v", err))
	}
	if !byAddr && !c.allowReviewer("sign-in", who) {
		return nil, tooMany()
	}
	// Used once, on every replica: recorded only for an assertion that
	// holds, so a stranger's guesses write nothing.
	if fresh, err := c.useChallenge(r.Context(), ch, exp, now); err != nil {
		c.cfg.Logger.Error("console: a sign-in could not be recorded as used; refused", "reviewer", who, "err", err)
		return nil, fail(http.StatusServiceUnavailable, "sign-in refused: it could not be recorded as used; try again")
	} else if !fresh {
		return nil, fail(http.StatusForbidden, "this sign-in was used already; sign in again")
	}
	n, err := c.checkCount(r.Context(), who, cred, a)
	if err != nil {
		return nil, err
	}
	c.sawCount(cred.ID, n)
	c.setCookie(w, sessionCookie, c.newSession(who, now.Add(sessionTTL)), int(sessionTTL/time.Second))
	c.cfg.Logger.Info("console: reviewer signed in", "reviewer", who)
	return map[string]string{"reviewer": who}, nil
}

// clientChallenge is the challenge the assertion's client data names.
func clientChallenge(a passkey.Assertion) (string, error) {
	cdj, err := base64.RawURLEncoding.DecodeString(a.ClientDataJSON)
	if err != nil {
		return "", fail(http.StatusBadRequest, "credential: clientDataJSON is not base64url")
	}
	var cd struct {
		Challenge string `json:"challenge"`
	}
	if err := json.Unmarshal(cdj, &cd); err != nil || cd.Challenge == "" {
		return "", fail(http.StatusBadRequest, "credential: clientDataJSON names no challenge")
	}
	return cd.Challenge, nil
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, _ []byte) (any, error) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.signOut(ck.Value, c.cfg.Now())
	}
	c.setCookie(w, sessionCookie, "", -1)
	return map[string]string{}, nil
}

type decideRequest struct {
	Decision   string          `json:"decision"`
	Note       string          `json:"note"`
	Credential json.RawMessage `json:"credential,omitempty"`
	// Mandate (begin) are the bounds of a mandate to grant with an
	// approval; Grant (finish) the grant record begin proposed for them.
	Mandate *mandateTerms   `json:"mandate,omitempty"`
	Grant   *mandate.Record `json:"grant,omitempty"`
}

func (d decideRequest) check() error {
	if d.Decision != reviewlog.Approved && d.Decision != reviewlog.Rejected {
		return fail(http.StatusBadRequest, "decision must be %q or %q", reviewlog.Approved, reviewlog.Rejected)
	}
	if (d.Mandate != nil || d.Grant != nil) && d.Decision != reviewlog.Approved {
		return fail(http.StatusBadRequest, "a mandate is granted with an approval only")
	}
	if len(d.Note) > maxNoteBytes {
		return fail(http.StatusBadRequest, "the note is longer than %d bytes", maxNoteBytes)
	}
	return nil
}

// decideBegin answers the request options of a decision: the challenge is
// the decision hash of the review's signed terms, the decision and note.
func (c *Console) decideBegin(_ http.ResponseWriter, r *http.Request, body []byte) (any, error) {
	who := c.reviewer(r)
	if who == "" {
		return nil, fail(http.StatusUnauthorized, "sign in with a passkey first")
	}
	var req decideRequest
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if err := req.check(); err != nil {
		return nil, err
	}
	rv, _, err := c.cfg.Log.Verified(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, reviewError(err)
	}
	if rv.Status != reviewlog.Pending || rv.Tampered || rv.TermsHash == "" {
		return nil, fail(http.StatusConflict, "review %s cannot be decided: it is %s%s", rv.ID, rv.Status, tamperedNote(rv))
	}
	dh, err := reviewlog.DecisionHash(rv.TermsHash, req.Decision, req.Note)
	if err != nil {
		return nil, fail(http.StatusBadRequest, "%v", err)
	}
	ch, err := passkey.Challenge(dh)
	if err != nil {
		return nil, err
	}
	var grant *mandate.Record
	if req.Mandate != nil {
		// One gesture signs the approval and the grant: the challenge
		// binds the decision hash and the grant's digest.
		g, err := c.proposeGrant(r.Context(), rv, who, dh, *req.Mandate)
		if err != nil {
			return nil, err
		}
		if ch, _, err = g.PasskeyChallenge(); err != nil {
			return nil, err
		}
		grant = &g
	}
	pks, err := c.cfg.Passkeys()
	if err != nil {
		return nil, fmt.Errorf("read the trusted reviewers file: %w", err)
	}
	out := c.requestOptions(ch, pks[who])
	out["decision_hash"] = dh
	out["terms_hash"] = rv.TermsHash
	if grant != nil {
		out["grant"] = grant
	}
	return out, nil
}

func tamperedNote(rv reviewlog.Review) string {
	if rv.Tampered {
		return " and TAMPERED"
	}
	if rv.TermsHash == "" {
		return " without terms the server signed"
	}
	return ""
}

func reviewError(err error) error {
	switch {
	case errors.Is(err, reviewlog.ErrUnknownReview), errors.Is(err, reviewlog.ErrBadID):
		return fail(http.StatusNotFound, "no such review")
	case errors.Is(err, reviewlog.ErrAlreadyDecided):
		return fail(http.StatusConflict, "%s", firstLine(err))
	case errors.Is(err, reviewlog.ErrUntrusted), errors.Is(err, reviewlog.ErrTampered):
		return fail(http.StatusForbidden, "%s", firstLine(err))
	case errors.Is(err, reviewlog.ErrBadInput), errors.Is(err, reviewlog.ErrExpired):
		return fail(http.StatusBadRequest, "%s", firstLine(err))
	case errors.Is(err, engine.ErrMandateMoved), errors.Is(err, engine.ErrMandateRecords):
		return fail(http.StatusConflict, "%s", firstLine(err))
	}
	return err
}

// finishGranting records an approval and the mandate granted with it, on
// the strength of one assertion.
func (c *Console) finishGranting(r *http.Request, who string, req decideRequest, a passkey.Assertion) (any, error) {
	rv, _, err := c.cfg.Log.Verified(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, reviewError(err)
	}
	if rv.Status != reviewlog.Pending || rv.Tampered || rv.TermsHash == "" {
		return nil, fail(http.StatusConflict, "review %s cannot be decided: it is %s%s", rv.ID, rv.Status, tamperedNote(rv))
	}
	dh, err := reviewlog.DecisionHash(rv.TermsHash, req.Decision, req.Note)
	if err != nil {
		return nil, fail(http.StatusBadRequest, "%v", err)
	}
	if err := c.checkGrant(rv, who, dh, *req.Grant); err != nil {
		return nil, err
	}
	rv, g, err := c.cfg.Decider.DecideGranting(r.Context(), rv.ID, req.Note, a, *req.Grant)
	if err != nil {
		return nil, reviewError(err)
	}
	if n, err := passkey.SignCount(a); err == nil {
		c.sawCount(a.CredentialID, n)
	}
	m := &mandate.Mandate{Grant: g, Signers: []string{who}}
	c.cfg.Logger.Info("console: approval recorded with a mandate", "review", rv.ID, "status", rv.Status, "reviewer", rv.DecidedBy, "mandate", g.ID, "signatures_needed", m.Needs())
	out := map[string]any{"review_id": rv.ID, "status": rv.Status, "decided_by": rv.DecidedBy, "review_url": c.ReviewURL(rv.ID),
		"mandate_id": g.ID, "mandate": c.grantText(&g)}
	if more := m.Needs() - 1; more > 0 {
		out["mandate_needs"] = fmt.Sprintf("it needs %s from other trusted reviewers before it can be used: each runs haia-trace-mcp mandate sign %s", plural(more, "more signature", "more signatures"), g.ID)
	}
	return out, nil
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// decideFinish records the decision on the strength of the assertion: the
// session's reviewer must own the passkey; the decider verifies the
// assertion against the terms inside the log's lock.
func (c *Console) decideFinish(_ http.ResponseWriter, r *http.Request, body []byte) (any, error) {
	who := c.reviewer(r)
	if who == "" {
		return nil, fail(http.StatusUnauthorized, "sign in with a passkey first")
	}
	var req decideRequest
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if err := req.check(); err != nil {
		return nil, err
	}
	a, err := readAssertion(req.Credential)
	if err != nil {
		return nil, err
	}
	pks, err := c.cfg.Passkeys()
	if err != nil {
		return nil, fmt.Errorf("read the trusted reviewers file: %w", err)
	}
	if _, ok := pks.Find(who, a.CredentialID); !ok {
		return nil, fail(http.StatusForbidden, "this passkey is not one of %s's in the trusted reviewers file; nothing was written", who)
	}
	if req.Mandate != nil {
		return nil, fail(http.StatusBadRequest, "finish takes the grant begin proposed, not the mandate's bounds")
	}
	if req.Grant != nil {
		return c.finishGranting(r, who, req, a)
	}
	rv, err := c.cfg.Decider.Decide(r.Context(), r.PathValue("id"), req.Decision, req.Note, a)
	if err != nil {
		return nil, reviewError(err)
	}
	if n, err := passkey.SignCount(a); err == nil {
		c.sawCount(a.CredentialID, n)
	}
	c.cfg.Logger.Info("console: decision recorded", "review", rv.ID, "status", rv.Status, "reviewer", rv.DecidedBy)
	return map[string]string{"review_id": rv.ID, "status": rv.Status, "decided_by": rv.DecidedBy, "review_url": c.ReviewURL(rv.ID)}, nil
}

// --- enrolment ---

// EnrolLink is the one-time link the operator's command prints: a secret
// token that only it and the reviewer know, valid until expires.
func (c *Console) EnrolLink(token string) string {
	return c.origin + c.base + "enrol?" + enrolTokenName + "=" + url.QueryEscape(token)
}

// An enrolment link's token is "<reviewer>.<unix expiry>.<nonce>.<MAC>":
// the reviewer's id (base64url), when the link expires, 24 random bytes
// and the HMAC-SHA256 of the three under the enrolment key
// (Config.EnrolKey), which the server and the operator's command derive
// alike from the guard's key. Only the operator's command can make one;
// the console checks it before it holds anything for the link.

// enrolToken reads a token, refusing one the enrolment key did not sign,
// or whose expiry is past or further than EnrolTTL away.
func (c *Console) enrolToken(tok string) (reviewer string, expires time.Time, err error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 4 || len(tok) > 512 {
		return "", time.Time{}, fail(http.StatusBadRequest, "the enrolment link is malformed; ask the operator for a new one")
	}
	if c.cfg.EnrolKey == nil {
		return "", time.Time{}, fail(http.StatusServiceUnavailable, "this console has no key to check enrolment links, so it enrols no passkey; the operator's server log says why")
	}
	sum, err := base64.RawURLEncoding.DecodeString(parts[3])
	if err != nil || !hmac.Equal(sum, enrolMAC(c.cfg.EnrolKey, parts[0], parts[1], parts[2])) {
		return "", time.Time{}, fail(http.StatusForbidden, "this enrolment link was not made by the operator of this server (its signature does not verify); ask the operator for a new one")
	}
	idb, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || reviewlog.CheckReviewerID(string(idb)) != nil {
		return "", time.Time{}, fail(http.StatusBadRequest, "the enrolment link names no valid reviewer id")
	}
	var unix int64
	if _, err := fmt.Sscanf(parts[1], "%d", &unix); err != nil || fmt.Sprint(unix) != parts[1] {
		return "", time.Time{}, fail(http.StatusBadRequest, "the enrolment link's expiry is malformed")
	}
	exp := time.Unix(unix, 0)
	now := c.cfg.Now()
	if !now.Before(exp) || exp.After(now.Add(EnrolTTL+time.Minute)) {
		return "", time.Time{}, fail(http.StatusGone, "the enrolment link has expired (links are valid %s); ask the operator for a new one", EnrolTTL)
	}
	return string(idb), exp, nil
}

func enrolMAC(key []byte, reviewer, expiry, nonce string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("haia-trace-mcp console enrolment link v1\x00" + reviewer + "." + expiry + "." + nonce))
	return m.Sum(nil)
}

// NewEnrolToken makes a one-time enrolment token for reviewer, valid
// EnrolTTL from now, signed with the enrolment key (at least MinEnrolKey
// bytes: the one the console is given).
func NewEnrolToken(key []byte, reviewer string, now time.Time) (string, error) {
	if len(key) < MinEnrolKey {
		return "", fmt.Errorf("the enrolment link key must be at least %d bytes", MinEnrolKey)
	}
	if err := reviewlog.CheckReviewerID(reviewer); err != nil {
		return "", err
	}
	nonce := make([]byte, 24)
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("make an enrolment link: %w", err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	id, exp, n := enc([]byte(reviewer)), fmt.Sprint(now.Add(EnrolTTL).Unix()), enc(nonce)
	return id + "." + exp + "." + n + "." + enc(enrolMAC(key, id, exp, n)), nil
}

// EnrolKey derives the key that signs enrolment links from a secret the
// server and the operator's command both hold (the guard's params key).
func EnrolKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("haia-trace-mcp console enrolment link key v1"))
	return m.Sum(nil)
}

type enrolUser struct {
	id    string
	creds []webauthn.Credential
}

func (u enrolUser) WebAuthnID() []byte                         { return []byte(u.id) }
func (u enrolUser) WebAuthnName() string                       { return u.id }
func (u enrolUser) WebAuthnDisplayName() string                { return u.id }
func (u enrolUser) WebAuthnCredentials() []webauthn.Credential { return u.creds }

func (c *Console) enrolBegin(_ http.ResponseWriter, r *http.Request, body []byte) (any, error) {
	var req struct {
		Token string `json:"token"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, limited(c.allowClient(r), err)
	}
	who, exp, err := c.enrolLink(r, req.Token)
	if err != nil {
		return nil, err
	}
	var exclude []protocol.CredentialDescriptor
	if pks, err := c.cfg.Passkeys(); err == nil {
		for _, cr := range pks[who] {
			if id, err := base64.RawURLEncoding.DecodeString(cr.ID); err == nil {
				exclude = append(exclude, protocol.CredentialDescriptor{Type: protocol.PublicKeyCredentialType, CredentialID: id})
			}
		}
	}
	creation, sess, err := c.wa.BeginRegistration(enrolUser{id: who}, webauthn.WithExclusions(exclude),
		webauthn.WithCredentialParameters(credentialParameters()))
	if err != nil {
		return nil, fmt.Errorf("begin registration: %w", err)
	}
	key := enrolKey(req.Token)
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweep(now)
	if e, ok := c.enrolments[key]; ok && e.credential != nil {
		return nil, fail(http.StatusConflict, "this enrolment link was used already; ask the operator for a new one")
	}
	if len(c.enrolments) >= maxPending {
		return nil, fail(http.StatusServiceUnavailable, "too many enrolments in progress; try again later")
	}
	c.enrolments[key] = &enrolment{reviewer: who, expires: exp, session: sess}
	return creation, nil
}

// enrolLink reads the enrolment link of a request from the reviewer's
// page and charges the rate limit: a link the operator signed to the
// reviewer it names (so no flood from anyone else delays a real
// enrolment), anything else to the client's address.
func (c *Console) enrolLink(r *http.Request, tok string) (string, time.Time, error) {
	return c.enrolLinkAs(r, "enrol", tok)
}

// enrolLinkAs is enrolLink for kind ("enrol", or "collect": the
// operator's command polling, with a bucket of its own).
func (c *Console) enrolLinkAs(r *http.Request, kind, tok string) (string, time.Time, error) {
	who, exp, err := c.enrolToken(tok)
	if err != nil {
		return "", time.Time{}, limited(c.allowClient(r), err)
	}
	if !c.allowReviewer(kind, who) {
		return "", time.Time{}, fail(http.StatusTooManyRequests, "too many requests with this enrolment link; wait a little")
	}
	return who, exp, nil
}

// credentialParameters offers every algorithm the server verifies, in
// its order of preference.
func credentialParameters() []protocol.CredentialParameter {
	var out []protocol.CredentialParameter
	for _, a := range passkey.Algorithms() {
		out = append(out, protocol.CredentialParameter{Type: protocol.PublicKeyCredentialType, Algorithm: webauthncose.COSEAlgorithmIdentifier(a.ID)})
	}
	return out
}

func enrolKey(token string) string {
	// The secret is the key of the in-memory entry; keep only its hash.
	return base64.RawURLEncoding.EncodeToString(sha256Sum([]byte(token)))
}

func (c *Console) enrolFinish(_ http.ResponseWriter, r *http.Request, body []byte) (any, error) {
	var req struct {
		Token      string          `json:"token"`
		Credential json.RawMessage `json:"credential"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, limited(c.allowClient(r), err)
	}
	who, _, err := c.enrolLink(r, req.Token)
	if err != nil {
		return nil, err
	}
	key := enrolKey(req.Token)
	c.mu.Lock()
	e, ok := c.enrolments[key]
	var sess *webauthn.SessionData
	if ok && e.credential == nil && e.session != nil {
		sess, e.session = e.session, nil // one ceremony per begin
	}
	c.mu.Unlock()
	if sess == nil {
		return nil, fail(http.StatusConflict, "no registration was begun with this link, or it was finished already")
	}
	parsed, err := protocol.ParseCredentialCreationResponseBytes(req.Credential)
	if err != nil {
		return nil, fail(http.StatusBadRequest, "credential: not a WebAuthn registration")
	}
	// A key this server cannot verify would make a passkey that signs in
	// and decides nothing: refused here, naming the algorithms it verifies.
	if err := passkey.CheckAlgorithm(parsed.Response.AttestationObject.AuthData.AttData.CredentialPublicKey); err != nil {
		c.cfg.Logger.Info("console: a registration with a passkey algorithm this server does not verify was refused", "reviewer", who, "err", err)
		return nil, fail(http.StatusBadRequest, "registration refused: %s. Register a passkey on an authenticator that offers one of them", strings.TrimPrefix(err.Error(), passkey.ErrUnsupportedAlgorithm.Error()+": "))
	}
	cred, err := c.wa.CreateCredential(enrolUser{id: who}, *sess, parsed)
	if err != nil {
		return nil, fail(http.StatusBadRequest, "registration refused: %s", webauthnDetail(err))
	}
	if !cred.Flags.UserVerified {
		return nil, fail(http.StatusBadRequest, "registration refused: the authenticator did not verify the user")
	}
	pc := passkey.Credential{ID: base64.RawURLEncoding.EncodeToString(cred.ID), PublicKey: base64.RawURLEncoding.EncodeToString(cred.PublicKey),
		RPID: c.rpID, Origin: c.origin}
	if err := pc.Check(); err != nil {
		return nil, fail(http.StatusBadRequest, "registration refused: %v", err)
	}
	fp, err := passkey.Fingerprint(pc.PublicKey)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	e.credential = &pc
	close(c.registered) // wake the collect requests held waiting
	c.registered = make(chan struct{})
	c.mu.Unlock()
	c.cfg.Logger.Info("console: passkey registered, waiting for the operator's confirmation", "reviewer", who, "fingerprint", fp, "remote", r.RemoteAddr)
	return map[string]string{"reviewer": who, "fingerprint": fp}, nil
}

func webauthnDetail(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Details != "" {
		return pe.Details
	}
	return "the registration does not verify"
}

// collect hands the registered credential to the operator's command
// holding the link's secret, once. With ?wait=SECONDS (at most
// MaxCollectWait) a request made before the registration is held until it
// arrives or the wait ends, so the command need not ask again and again
// while the reviewer takes their time. Its "waiting" answer names the
// console's origin and relying party, which the command checks before it
// shows the link.
func (c *Console) collect(w http.ResponseWriter, r *http.Request) {
	wait, werr := collectWait(r.URL.Query().Get("wait"))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4096))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": "request too large"})
		return
	}
	var req struct {
		Token string `json:"token"`
	}
	err = decodeStrict(body, &req)
	if err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		err = limited(c.allowClient(r), err)
	} else {
		_, _, err = c.enrolLinkAs(r, "collect", req.Token)
	}
	if err != nil {
		var ae *apiError
		errors.As(err, &ae)
		writeJSON(w, ae.status, map[string]string{"error": termsafe.String(ae.msg)})
		return
	}
	key := enrolKey(req.Token)
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		c.mu.Lock()
		e, ok := c.enrolments[key]
		var cred *passkey.Credential
		if ok && e.credential != nil && !e.collected {
			cred, e.collected = e.credential, true
		}
		collected := ok && e.collected && cred == nil
		registered := c.registered
		c.mu.Unlock()
		switch {
		case cred != nil:
			writeJSON(w, http.StatusOK, map[string]any{"reviewer": e.reviewer, "credential": cred})
			return
		case collected:
			writeJSON(w, http.StatusGone, map[string]string{"error": "this registration was collected already"})
			return
		}
		if timeout != nil {
			select {
			case <-registered:
				continue // a registration: this link's, or another's
			case <-timeout:
			case <-c.done:
			case <-r.Context().Done():
				return // the command gave up or the server stops
			}
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "waiting for the reviewer to register", "origin": c.origin, "rp_id": c.rpID})
		return
	}
}

// collectWait reads collect's ?wait=SECONDS: whole seconds from 0 to
// MaxCollectWait; none is 0 (answer at once).
func collectWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || time.Duration(n)*time.Second > MaxCollectWait {
		return 0, fail(http.StatusBadRequest, "wait %q: want whole seconds from 0 to %d", clip(v), int(MaxCollectWait/time.Second))
	}
	return time.Duration(n) * time.Second, nil
}

// --- pages ---

type pageData struct {
	Title    string
	Base     string
	CSRF     string
	Reviewer string
	Pending  []questionView
	Decided  []questionView
	Review   *reviewlog.Review
	// Question is the review as a question; Known what the Trace knows
	// beside its payee (hosts) or host (payees), KnownProblem why that
	// cannot be read.
	Question     *questionView
	Known        []string
	KnownProblem string
	Reasons      []reasonView
	// Read is what the guard read (the history line), apart from the
	// reasons: it is no rule.
	Read  string
	Enrol *enrolView
	// Chart is the review's timeline of recent payments (nil: none);
	// ChartProblem says why the history could not be read.
	Chart        *chartView
	ChartProblem string
	// Offer is the mandate an approval of the review may grant (nil:
	// none), OfferProblem why none; Granted the mandates granted with its
	// approval, GrantedProblem why they cannot be read.
	Offer          *grantOffer
	OfferProblem   string
	Granted        []grantedView
	GrantedProblem string
	// Dossiers are the signed authorizations that used the review's
	// approval, each a link to its dossier; DossierProblem says why they
	// cannot be read.
	Dossiers       []dossierView
	DossierProblem string
	// Spend is the spend against the limits (the queue page; nil: not
	// configured), SpendProblem why it could not be read.
	Spend        *spendView
	SpendProblem string
	// Findings are the settlements whose seller's answer disagrees with
	// the authorization they settle (the queue page), newest first;
	// FindingsProblem says why they cannot be read.
	Findings        []findingView
	FindingsMore    int
	FindingsProblem string
	// Ambiguities are the Trace's settlements bound to no one
	// authorization (the queue page), newest first.
	Ambiguities []ambiguityView
	// Finding is the settlement the finding page shows.
	Finding *findingView
}

type reasonView struct {
	Rule     ruleView
	Detail   string
	Evidence []evidenceView
}

type evidenceView struct {
	RunID, OperationID, Explain string
}

type enrolView struct {
	Reviewer, Token string
	Expires         timeView
	// Algorithms names the passkey algorithms the server verifies.
	Algorithms string
}

func (c *Console) page(fn func(r *http.Request, d *pageData) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d := &pageData{Base: c.base, CSRF: c.csrfToken(w, r)}
		name, err := fn(r, d)
		if err != nil {
			var ae *apiError
			status, msg := http.StatusInternalServerError, "the server could not show this page; see its log"
			if errors.As(err, &ae) {
				status, msg = ae.status, ae.msg
			} else {
				c.cfg.Logger.Error("console page failed", "path", r.URL.Path, "err", err)
			}
			http.Error(w, termsafe.String(msg), status)
			return
		}
		var buf bytes.Buffer
		if err := c.pages.ExecuteTemplate(&buf, name, d); err != nil {
			c.cfg.Logger.Error("console template failed", "page", name, "err", err)
			http.Error(w, "the server could not show this page; see its log", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// Every value went through termsafe.String ("t" in the templates);
		// HTML is the net under the whole page: no bidi control or
		// invisible character reaches the reviewer's screen.
		_, _ = w.Write(termsafe.HTML(buf.Bytes()))
	}
}

func (c *Console) queue(r *http.Request, d *pageData) (string, error) {
	d.Reviewer = c.reviewer(r)
	if d.Reviewer == "" {
		d.Title = "Sign in"
		return "signin", nil
	}
	d.Title = "Review queue"
	if err := c.queueData(r.Context(), d); err != nil {
		return "", err
	}
	c.spendData(r.Context(), d)
	c.findingsData(r.Context(), d)
	return "queue", nil
}

func (c *Console) review(r *http.Request, d *pageData) (string, error) {
	d.Reviewer = c.reviewer(r)
	if d.Reviewer == "" {
		d.Title = "Sign in"
		return "signin", nil
	}
	rv, _, err := c.cfg.Log.Verified(r.Context(), r.PathValue("id"))
	if err != nil {
		return "", reviewError(err)
	}
	rv.AssetSymbol = c.symbol(rv.Asset)
	q := c.question(rv, c.cfg.Now())
	d.Title = q.Headline + "?"
	d.Review, d.Question = &rv, &q
	for _, rs := range rv.Reasons {
		if rs.Rule == guard.RuleHistory {
			d.Read = rs.Detail
			continue
		}
		v := reasonView{Rule: describeRule(rs.Rule), Detail: rs.Detail}
		for _, ref := range rs.Evidence {
			v.Evidence = append(v.Evidence, evidenceView{RunID: ref.RunID, OperationID: ref.OperationID, Explain: c.cfg.Explain(rv.Template, ref)})
		}
		d.Reasons = append(d.Reasons, v)
	}
	if rv.Status == reviewlog.Pending && !rv.Tampered && rv.Terms != nil {
		if o, err := c.offerFor(rv); err != nil {
			d.OfferProblem = err.Error()
		} else {
			d.Offer = o
		}
	}
	if d.Granted, err = c.grantedWith(r.Context(), rv.ID); err != nil {
		c.cfg.Logger.Warn("console: the mandate records could not be read for a review page", "review", rv.ID, "err", err)
		d.GrantedProblem = "The mandate records cannot be read or do not verify now; the server's log says why (haia-trace-mcp audit)."
	}
	if rv.Status == reviewlog.Approved {
		if d.Dossiers, err = c.dossiersOf(r.Context(), rv.ID); err != nil {
			c.cfg.Logger.Warn("console: the authorizations could not be read for a review page", "review", rv.ID, "err", err)
			d.DossierProblem = "The signed authorizations cannot be read now; the server's log says why."
		}
	}
	if c.cfg.History != nil {
		h, err := c.cfg.History(r.Context())
		if err != nil {
			c.cfg.Logger.Warn("console: the guard's history could not be read for the timeline", "review", rv.ID, "err", err)
			d.ChartProblem = "The guard's history cannot be read now; the server's log says why."
			d.KnownProblem = d.ChartProblem
		} else {
			d.Chart = buildChart(h, rv, c.cfg.Assets)
			d.Known = knownFor(h, q)
		}
	}
	return "review", nil
}

// findingPage shows one settlement with findings whole: the
// authorization it settles, where the settlement came from, each finding,
// and a link to the authorization's dossier.
func (c *Console) findingPage(r *http.Request, d *pageData) (string, error) {
	d.Reviewer = c.reviewer(r)
	if d.Reviewer == "" {
		d.Title = "Sign in"
		return "signin", nil
	}
	f, _, ok, err := c.findingFor(r.Context(), r.PathValue("nonce"))
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fail(http.StatusNotFound, "no seller finding for this authorization")
	}
	d.Title = "Seller finding on authorization " + f.Short
	d.Finding = &f
	return "finding", nil
}

func (c *Console) enrolPage(r *http.Request, d *pageData) (string, error) {
	tok := r.URL.Query().Get(enrolTokenName)
	who, exp, err := c.enrolToken(tok)
	if err != nil {
		return "", err
	}
	d.Title = "Register a passkey"
	d.Enrol = &enrolView{Reviewer: who, Expires: newTime(exp.UTC().Format(time.RFC3339), c.cfg.Now()), Token: tok, Algorithms: passkey.AlgorithmNames()}
	return "enrol", nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
