package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/clientaddr"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// consoleFlags are the serve flags of the reviewer console.
type consoleFlags struct {
	on          bool
	addr        string
	url         string
	allowRemote *bool // --http-allow-remote, shared with the MCP endpoint
	// http is the --http flags: without --console-addr, the console is
	// served on the --http listener (its handler handed to runHTTP).
	http *httpFlags
	// tenants is the console of a --tenants-dir server, which each
	// tenant's stack joins.
	tenants *tenantConsoles
	// trustedProxies and proxyHeader name the reverse proxies whose
	// forwarding header says who the client is; clients is them, checked.
	trustedProxies listFlag
	proxyHeader    string
	clients        clientaddr.Resolver
}

// defaultConsoleAddr is the console's own listener without --http.
const defaultConsoleAddr = "127.0.0.1:8787"

func (c *consoleFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.on, "console", false, "serve the reviewer console (passkey sign-in and decisions): on the --http listener, or on --console-addr")
	fs.StringVar(&c.addr, "console-addr", "", "the console's own listen address (loopback unless --http-allow-remote); default: the --http listener, else "+defaultConsoleAddr)
	fs.StringVar(&c.url, "console-url", "", "the console's address as people open it, ending in /console/ (default http://localhost:PORT/console/; https behind TLS off loopback)")
	fs.Var(&c.trustedProxies, "console-trusted-proxy", "the `ADDR` or CIDR of a reverse proxy in front of the console whose forwarding header names the client (repeatable, or comma-separated); the sign-in and enrolment limits are then per client behind it")
	fs.StringVar(&c.proxyHeader, "console-proxy-header", clientaddr.HeaderXForwardedFor, "the `HEADER` the --console-trusted-proxy writes the client into: X-Forwarded-For or Forwarded (the other is never read)")
}

// check resolves the trusted proxies (refuseIdleFlags refuses them
// without --console, and the header without a proxy).
func (c *consoleFlags) check() error {
	if !c.on {
		return nil
	}
	var list []string
	for _, v := range c.trustedProxies {
		list = append(list, strings.Split(v, ",")...)
	}
	r, err := clientaddr.New(list, c.proxyHeader)
	if err != nil {
		return usageErrorf("--console-trusted-proxy, --console-proxy-header: %v", err)
	}
	c.clients = r
	return nil
}

// consoleSite is where the console is served: its URL and its own
// listener (nil when mounted on the --http listener).
type consoleSite struct {
	u  *url.URL
	ln net.Listener
}

func (s *consoleSite) close() {
	if s.ln != nil {
		s.ln.Close()
	}
}

// site resolves --console-url and opens --console-addr's listener (none on
// the --http listener).
func (cf *consoleFlags) site() (*consoleSite, error) {
	mounted := cf.addr == "" && cf.http != nil && cf.http.addr != ""
	var ln net.Listener
	raw := cf.url
	var err error
	if mounted {
		// On the --http listener: its loopback and --http-allow-remote rules
		// were checked with it; the console's address is the MCP server's.
		if raw == "" {
			if raw, err = consoleURLOfHTTP(cf.http); err != nil {
				return nil, err
			}
		}
	} else {
		addr := cf.addr
		if addr == "" {
			addr = defaultConsoleAddr
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("--console-addr %q: want HOST:PORT such as %s: %w", addr, defaultConsoleAddr, err)
		}
		if !isLoopbackHost(host) && (cf.allowRemote == nil || !*cf.allowRemote) {
			return nil, fmt.Errorf("--console-addr %q is not a loopback address: add --http-allow-remote to listen beyond this machine (and serve it behind TLS, --console-url https://…)", addr)
		}
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, fmt.Errorf("console: listen on %s: %w", addr, err)
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		if raw == "" {
			raw = "http://localhost:" + port + "/console/"
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("--console-url %q: %w", raw, err)
	}
	return &consoleSite{u: u, ln: ln}, nil
}

// startConsole listens on --console-addr and serves the console of one
// guard until ctx ends. The server never writes the reviewers file; it
// reads it at every use, so an edit (or the operator's passkey add) takes
// effect at once.
func startConsole(ctx context.Context, cf *consoleFlags, st *app.Stack, logger *slog.Logger) (stop func(), reviewURL func(string) string, err error) {
	site, err := cf.site()
	if err != nil {
		return nil, nil, err
	}
	passkeys := func() (reviewlog.Passkeys, error) { return noneWhenMissing(reviewlog.LoadPasskeys(st.ReviewersPath())) }
	c, err := newGuardConsole(ctx, site.u, passkeys, cf.clients, st, logger)
	if err != nil {
		site.close()
		return nil, nil, err
	}
	cctx, cancelRun := context.WithCancel(ctx)
	go c.Run(cctx)
	stop = serveConsole(ctx, cf, site, c.Handler(), c.RPID(), cancelRun, logger)
	return stop, c.ReviewURL, nil
}

// tenantConsoles is the console of a --tenants-dir server: one console per
// tenant under /console/t/<tenant>/, on one listener.
type tenantConsoles struct {
	site    *consoleSite
	mux     *http.ServeMux
	rpID    string
	clients clientaddr.Resolver
}

// addTenantConsole builds tenant's console on tc's mux. It trusts only
// the passkeys of the reviewers the trusted reviewers file grants tenant,
// so a reviewer not granted it can neither sign in there, nor read, nor
// decide; its sessions are MACed under a key of its own.
func addTenantConsole(ctx context.Context, tc *tenantConsoles, st *app.Stack, logger *slog.Logger) (stop func(), reviewURL func(string) string, err error) {
	tenant := st.Tenant()
	passkeys := func() (reviewlog.Passkeys, error) {
		return noneWhenMissing(reviewlog.LoadTenantPasskeys(st.ReviewersPath(), tenant))
	}
	c, err := newGuardConsole(ctx, tc.site.u, passkeys, tc.clients, st, logger)
	if err != nil {
		return nil, nil, err
	}
	cctx, cancelRun := context.WithCancel(ctx)
	go c.Run(cctx)
	tc.mux.Handle(tc.site.u.Path+"t/"+tenant+"/", c.Handler())
	tc.rpID = c.RPID()
	return cancelRun, c.ReviewURL, nil
}

// newGuardConsole builds the console of one stack (of its tenant, when
// it has one).
func newGuardConsole(ctx context.Context, u *url.URL, passkeys func() (reviewlog.Passkeys, error), clients clientaddr.Resolver, st *app.Stack, logger *slog.Logger) (*console.Console, error) {
	// A store every replica shares (PostgreSQL) records the sign-ins used,
	// so one assertion signs in once on any replica; the file store is one
	// host's, and the console remembers them itself.
	signIns, _ := st.Store().(console.SignIns)
	c, err := console.New(console.Config{
		URL: u, Log: st.Log(), Passkeys: passkeys, Tenant: st.Tenant(), SignIns: signIns,
		Decider: engine.PasskeyDecider{Log: st.Log(), Chains: st.Chains(), Passkeys: passkeys},
		Explain: func(template string, ref guard.Ref) string { return explainRef(ctx, st.Catalog(), template, ref) },
		Logger:  logger,
		Changes: app.LogChanges(st.Store(), console.DefaultPollInterval*5, logger),
		// Replicas of one guard share its params key, so they share the
		// console's sessions and sign-in challenges.
		SessionKey: consoleSessionKey(st.ParamsKey(), st.Tenant()),
		// The operator's command signs enrolment links with a key derived
		// from the same params key (reviewer passkey add --key-file).
		EnrolKey: consoleEnrolKey(st.ParamsKey()),
		Clients:  clients,
		History:  st.Engine().History,
		Spend:    st.Engine().Spend,
		// The names of the policy in force, as SIGHUP last set it.
		PayeeName: func(a string) string { return st.Engine().Policy().PayeeName(a) },
		// A dossier carries the key the policy pins for a did:web seller.
		SellerKeys: func(kid string) []sellerkey.Key { return st.Engine().Policy().SellerKeysPinned(kid) },
		// A mandate an approval grants needs the signatures the policy's
		// quorum asks for its most per payment, as mandate grant's does.
		MandateApprovals: func(max *big.Int, asset string) int {
			pol := st.Engine().Policy()
			return pol.ApprovalsFor(max, asset == pol.DefaultAsset.Key)
		},
		Assets: func(asset string) (string, int, bool) {
			a, ok := st.Engine().Policy().Assets.Lookup(asset) // as SIGHUP last set it
			return a.Symbol, a.Decimals, ok
		},
	})
	if err != nil {
		return nil, fmt.Errorf("--console-url: %w", err)
	}
	if _, err := passkeys(); err != nil {
		logger.Warn("console: the trusted reviewers file's passkeys cannot be read; nobody can sign in until it is fixed", "reviewers", st.ReviewersPath(), "err", err)
	}
	return c, nil
}

// noneWhenMissing reads a trusted reviewers file that does not exist yet
// (before the first enrolment) as one that lists no passkey.
func noneWhenMissing(pks reviewlog.Passkeys, err error) (reviewlog.Passkeys, error) {
	if errors.Is(err, os.ErrNotExist) {
		return reviewlog.Passkeys{}, nil
	}
	return pks, err
}

// serveConsole serves h on site: mounted on the --http listener, or on
// its own until ctx ends or stop. cancelRun ends the consoles' live
// queues.
func serveConsole(ctx context.Context, cf *consoleFlags, site *consoleSite, h http.Handler, rpID string, cancelRun func(), logger *slog.Logger) (stop func()) {
	u := site.u
	if cf.clients.Trusts() {
		logger.Info("the console reads the client's address from trusted proxies", "trusted_proxies", strings.Join(cf.clients.Trusted(), ","), "header", cf.clients.Header())
	}
	if site.ln == nil {
		cf.http.console = h
		logger.Info("serving the reviewer console on the --http listener", "url", strings.TrimSuffix(u.String(), "/")+"/", "rp_id", rpID)
		return cancelRun
	}
	ln := site.ln
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 32 << 10}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("console stopped", "err", err)
		}
	}()
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
		}
		cancelRun() // ends the live queue's event streams
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	logger.Info("serving the reviewer console", "addr", ln.Addr().String(), "url", strings.TrimSuffix(u.String(), "/")+"/", "rp_id", rpID)
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// consoleURLOfHTTP is the console's address on the --http listener: under
// --public-url when given, else http://localhost:PORT/console/.
func consoleURLOfHTTP(h *httpFlags) (string, error) {
	if h.publicURL != "" {
		u, err := url.Parse(h.publicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("--public-url %q: want an absolute http(s) URL such as https://mcp.example.com", h.publicURL)
		}
		return u.Scheme + "://" + u.Host + strings.TrimSuffix(u.Path, "/") + "/console/", nil
	}
	_, port, err := net.SplitHostPort(h.addr)
	if err != nil || port == "" || port == "0" {
		return "", fmt.Errorf("--console on the --http listener %q needs its port, or --console-url (or --console-addr for a listener of its own)", h.addr)
	}
	return "http://localhost:" + port + "/console/", nil
}

// consoleSessionKey derives the console's session key from the guard's
// params key (nil without one: the console makes a random key); a
// tenant's console has a key of its own, so no session of one tenant's
// console is one of another's.
func consoleSessionKey(paramsKey []byte, tenant string) []byte {
	if len(paramsKey) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, paramsKey)
	m.Write([]byte("haia-trace-mcp console session key v1"))
	if tenant != "" {
		m.Write([]byte("\x00tenant\x00" + tenant))
	}
	return m.Sum(nil)
}

// consoleEnrolKey is the key enrolment links are signed with, derived
// from the guard's params key (nil without one: no link verifies).
func consoleEnrolKey(paramsKey []byte) []byte {
	if len(paramsKey) == 0 {
		return nil
	}
	return console.EnrolKey(paramsKey)
}

// serverParamsKey reads the guard's params key as the server derives it,
// creating nothing: from paramsKeyFile when given (a server that signs
// through --signer), else from the seed of keyFile; with neither, from
// the server's default files, the signing key first.
func serverParamsKey(keyFile, paramsKeyFile string) ([]byte, error) {
	load := func(flagName, path string) ([]byte, error) {
		key, err := noa.LoadKeyFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName, err)
		}
		return engine.ParamsKeyFrom(key.Seed()), nil
	}
	switch {
	case paramsKeyFile != "":
		return load("--params-key-file", paramsKeyFile)
	case keyFile != "":
		return load("--key-file", keyFile)
	}
	for _, d := range []struct{ flag, name string }{{"--key-file", "signing-key.pem"}, {"--params-key-file", "params-key.pem"}} {
		path, err := defaultConfigPath(d.name)
		if err != nil {
			continue
		}
		if _, err := os.Lstat(path); err == nil {
			return load(d.flag+" (default "+path+")", path)
		}
	}
	return nil, errors.New("no --key-file or --params-key-file given, and neither default file exists: give the server's --key-file (or, when it signs through --signer, its --params-key-file)")
}
