package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/haia-trace-mcp/haia-trace-mcp/proxy"
)

const proxyDetails = `Serves another MCP server's tools through the pre-payment guard: a tool the
guard map names as paying is forwarded only when the guard allows the
payment it would make. Stdio by default; --http serves Streamable HTTP with
the server's authentication, tenants and limits. The upstream is either a
command after -- or --upstream-url URL (with --upstream-token-file FILE).
`

func proxyInstructions(on bool) string {
	if !on {
		return ""
	}
	return "This server passes another MCP server's tools through a pre-payment guard. A paying tool runs only when the guard allows it; " +
		"otherwise the call answers with the decision, its reasons and, for a review, a review_id to poll with get_review_status. " +
		"Once a human approves, the identical call goes through once. Reviews are decided by a human; no tool can approve them."
}

type proxyFlags struct {
	guardMap    string
	url         string
	tokenFile   string
	restart     bool
	callTimeout time.Duration
}

// defineProxy is the guard proxy: another MCP server's tools through the
// pre-payment guard.
func defineProxy(fs *flag.FlagSet) runFunc {
	var f serveFlags
	f.register(fs)
	f.proxy = true
	var h httpFlags
	h.register(fs)
	var pf proxyFlags
	fs.StringVar(&pf.guardMap, "guard-map", "", "the guard map `FILE`: which upstream tools pay and where the payment is in their arguments (required)")
	fs.StringVar(&pf.url, "upstream-url", "", "a Streamable HTTP upstream `URL`, instead of a command after --")
	fs.StringVar(&pf.tokenFile, "upstream-token-file", "", "a `FILE` holding the bearer token sent to --upstream-url")
	fs.BoolVar(&pf.restart, "upstream-restart", true, "restart a stdio upstream that exits, with backoff (0.5 s doubling to 30 s)")
	fs.DurationVar(&pf.callTimeout, "upstream-timeout", proxy.DefaultCallTimeout, "how long a forwarded call may take")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		return runProxy(ctx, env, f, h, pf)
	}
}

// runProxy runs the proxy; everything after the first -- (env.tail) is
// the upstream's command line, never this command's flags.
func runProxy(ctx context.Context, env *cmdEnv, f serveFlags, h httpFlags, pf proxyFlags) error {
	stdin, stdout, stderr := env.stdin, env.stdout, env.stderr
	pos := env.tail
	h.reviewers = &f.reviewers
	h.store = &f.store
	if pf.guardMap == "" {
		return usageErrorf("--guard-map is required")
	}
	if f.readOnly {
		return usageErrorf("--read-only serves no guard, and the proxy is the guard in front of another server")
	}
	if (len(pos) == 0) == (pf.url == "") {
		return usageErrorf("name the upstream: either a command after -- or --upstream-url, not both")
	}
	if pf.tokenFile != "" && pf.url == "" {
		return usageErrorf("--upstream-token-file goes with --upstream-url")
	}
	if pf.callTimeout <= 0 {
		return usageErrorf("--upstream-timeout must be positive")
	}
	if err := refuseIdleFlags(env.fs, &f, &h); err != nil {
		return err
	}
	if err := f.console.check(); err != nil {
		return err
	}
	logger, err := newLogger(stderr, f.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitCode(exitUsage)
	}
	gmap, err := proxy.LoadMap(pf.guardMap)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: --guard-map: %v\n", err)
		return exitCode(exitUsage)
	}
	uc := proxy.UpstreamConfig{URL: pf.url, Restart: pf.restart, Stderr: stderr, Version: versionString(), Logger: logger.With("upstream", true)}
	if len(pos) > 0 {
		uc.Command, uc.Args = pos[0], pos[1:]
	}
	if pf.tokenFile != "" {
		tok, err := os.ReadFile(pf.tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: --upstream-token-file: %v\n", err)
			return exitCode(exitUsage)
		}
		uc.Token = strings.TrimSpace(string(tok))
		if uc.Token == "" || strings.ContainsAny(uc.Token, "\r\n\t ") {
			fmt.Fprintf(stderr, "haia-trace-mcp: --upstream-token-file %s holds no single token\n", pf.tokenFile)
			return exitCode(exitUsage)
		}
	}

	// One stack per tenant (or one), each with its own proxy over the one
	// upstream.
	var out *proxy.StdioOut
	if h.addr == "" {
		out = proxy.NewStdioOut(stdout)
	}
	servers, ready, closeAll, err := openFront(ctx, &f, &h, logger, stderr)
	if err != nil {
		return err
	}
	defer closeAll()
	var proxies []*proxy.Proxy
	for _, s := range servers {
		var after func(context.Context)
		if pay := s.st.Payments(); pay != nil {
			after = func(ctx context.Context) {
				if _, err := pay.SettleFromTraceSeen(ctx); err != nil {
					logger.Warn("the Trace's settlements could not be read", "err", err)
				}
			}
		}
		p, err := proxy.New(proxy.Config{Server: s.srv, Engine: s.st.Engine(), Map: gmap, MapFile: pf.guardMap, Upstream: upstreamName(uc),
			StateDir: s.st.Root().Dir(), CallTimeout: pf.callTimeout, Logger: logger, Stdio: out, AfterDecision: after})
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
			return exitCode(exitFail)
		}
		proxies = append(proxies, p)
	}
	// Runs before closeAll: the outcomes of calls already answered are
	// signed while the store is open.
	defer func() {
		for _, p := range proxies {
			p.Drain()
		}
	}()
	// Every proxy hears the upstream; each routes only its own progress.
	// The upstream's requests go to the host of the calls in flight.
	uc.OnNotification = proxy.Group(proxies).Notify
	uc.Asks = proxy.Group(proxies)
	uc.OnDisconnect = func(why error) {
		for _, p := range proxies {
			p.Disconnected(why)
		}
	}
	uc.OnConnect = func() {
		for _, p := range proxies {
			p.Reconnected()
		}
	}
	up, err := proxy.StartUpstream(ctx, uc)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitCode(exitFail)
	}
	defer up.Close()
	for _, p := range proxies {
		if err := p.Attach(ctx, up); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: the upstream does not match the guard map, refusing to start: %v\n", err)
			return exitCode(exitFail)
		}
	}
	defer rereadMapOnHUP(ctx, pf.guardMap, proxies, logger)()
	if h.addr != "" {
		return exitCode(runHTTP(ctx, servers, ready, &h, logger, stderr))
	}
	stopHUP, err := startServed(ctx, servers)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitCode(exitFail)
	}
	defer stopHUP()
	srv := servers[""].srv
	logger.Info("serving the guard proxy over stdio", "upstream", upstreamName(uc))
	stdio := mcpserver.NewStdioServer(srv.MCP())
	stdio.SetErrorLogger(log.New(stderr, "mcp: ", log.LstdFlags))
	stdio.SetContextFunc(out.Session)
	if err := stdio.Listen(ctx, stdin, out); err != nil && !errors.Is(err, context.Canceled) && !isEOF(err) {
		logger.Error("stdio transport stopped", "err", err)
		return exitCode(exitFail)
	}
	logger.Info("stdin closed; stopping")
	return nil
}

func upstreamName(uc proxy.UpstreamConfig) string {
	if uc.URL != "" {
		return uc.URL
	}
	return uc.Command
}

// rereadMapOnHUP re-reads the guard map on SIGHUP and puts it in force in
// every proxy (proxy.Proxy.Reload): a tool the upstream added since the
// map was last read is then known to it. A map that cannot be read, or that
// does not match the upstream, leaves the running one in force.
func rereadMapOnHUP(ctx context.Context, path string, proxies []*proxy.Proxy, logger *slog.Logger) func() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				m, err := proxy.LoadMap(path)
				if err != nil {
					logger.Error("SIGHUP: the guard map was not re-read; the running map stays in force", "err", err)
					continue
				}
				for _, p := range proxies {
					rctx, cancel := context.WithTimeout(ctx, time.Minute)
					if err := p.Reload(rctx, m); err != nil {
						logger.Error("SIGHUP: the re-read guard map does not match the upstream's tools; the running map stays in force", "map", path, "err", err)
					}
					cancel()
				}
			}
		}
	}()
	return func() { signal.Stop(hup) }
}
