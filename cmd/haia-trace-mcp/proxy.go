package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/haia-trace-mcp/haia-trace-mcp/proxy"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/notify"
	"github.com/haia-trace-mcp/haia-trace-mcp/server"
)

const proxyUsage = `usage:
  haia-trace-mcp proxy --guard-map FILE [--dir .trace] [--guard-config FILE] [flags] -- UPSTREAM_COMMAND [ARGS…]
  haia-trace-mcp proxy --guard-map FILE --upstream-url URL [--upstream-token-file FILE] [flags]

Serves another MCP server's tools through the pre-payment guard: a tool the
guard map names as paying is forwarded only when the guard allows the
payment it would make. Stdio by default; --http serves Streamable HTTP with
the server's authentication, tenants and limits.
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

func runProxy(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := newCommand("proxy", proxyUsage, stdout, stderr)
	var f serveFlags
	f.register(c.fs)
	f.proxy = true
	var h httpFlags
	h.register(c.fs)
	var pf proxyFlags
	c.fs.StringVar(&pf.guardMap, "guard-map", "", "the guard map: which upstream tools pay and where the payment is in their arguments (required)")
	c.fs.StringVar(&pf.url, "upstream-url", "", "a Streamable HTTP upstream, instead of a command after --")
	c.fs.StringVar(&pf.tokenFile, "upstream-token-file", "", "a file holding the bearer token sent to --upstream-url")
	c.fs.BoolVar(&pf.restart, "upstream-restart", true, "restart a stdio upstream that exits, with backoff (0.5 s doubling to 30 s)")
	c.fs.DurationVar(&pf.callTimeout, "upstream-timeout", proxy.DefaultCallTimeout, "how long a forwarded call may take")
	// Everything after the first -- is the upstream's command line, never
	// this command's flags.
	var upstreamCmd []string
	for i, a := range args {
		if a == "--" {
			args, upstreamCmd = args[:i], args[i+1:]
			break
		}
	}
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return c.failf("unexpected argument %q (the upstream command goes after --)", pos[0])
	}
	pos = upstreamCmd
	if pf.guardMap == "" {
		return c.failf("--guard-map is required")
	}
	if f.readOnly {
		return c.failf("--read-only serves no guard, and the proxy is the guard in front of another server")
	}
	if (len(pos) == 0) == (pf.url == "") {
		return c.failf("name the upstream: either a command after -- or --upstream-url, not both")
	}
	if pf.tokenFile != "" && pf.url == "" {
		return c.failf("--upstream-token-file goes with --upstream-url")
	}
	if pf.callTimeout <= 0 {
		return c.failf("--upstream-timeout must be positive")
	}
	logger, err := newLogger(stderr, f.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitUsage
	}
	gmap, err := proxy.LoadMap(pf.guardMap)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: --guard-map: %v\n", err)
		return exitUsage
	}
	uc := proxy.UpstreamConfig{URL: pf.url, Restart: pf.restart, Stderr: stderr, Version: versionString(), Logger: logger.With("upstream", true)}
	if len(pos) > 0 {
		uc.Command, uc.Args = pos[0], pos[1:]
	}
	if pf.tokenFile != "" {
		tok, err := os.ReadFile(pf.tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: --upstream-token-file: %v\n", err)
			return exitUsage
		}
		uc.Token = strings.TrimSpace(string(tok))
		if uc.Token == "" || strings.ContainsAny(uc.Token, "\r\n\t ") {
			fmt.Fprintf(stderr, "haia-trace-mcp: --upstream-token-file %s holds no single token\n", pf.tokenFile)
			return exitUsage
		}
	}

	notifyMetrics := notify.NewMetrics()
	notifier, err := notify.New(f.notify, notify.Options{Logger: logger, Metrics: notifyMetrics})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitUsage
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = notifier.Close(ctx)
	}()

	// One stack per tenant (or one), each with its own proxy over the one
	// upstream.
	servers := map[string]*server.Server{}
	var proxies []*proxy.Proxy
	var out *proxy.StdioOut
	if h.addr == "" {
		out = proxy.NewStdioOut(stdout)
	}
	addProxy := func(srv *server.Server, st *stack) error {
		p, err := proxy.New(proxy.Config{Server: srv, Engine: st.eng, Map: gmap, CallTimeout: pf.callTimeout, Logger: logger, Stdio: out})
		if err != nil {
			return err
		}
		proxies = append(proxies, p)
		return nil
	}
	if f.tenantsDir != "" {
		if h.addr == "" || h.insecure || h.tenantClaim == "" {
			return c.failf("--tenants-dir serves tenants over --http with authentication, the tenant named by --tenant-claim")
		}
		stacks, closeAll, err := openTenantStacks(ctx, &f, notifier, notifyMetrics, logger)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
			return exitFail
		}
		defer closeAll()
		for name, st := range stacks {
			servers[name] = st.srv
			if err := addProxy(st.srv, st); err != nil {
				fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
				return exitFail
			}
		}
	} else {
		st, err := openStack(ctx, f.dir, "", &f, notifier, notifyMetrics, newIntegrityCounter(), logger)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
			return exitFail
		}
		defer st.close()
		servers[""] = st.srv
		if err := addProxy(st.srv, st); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
			return exitFail
		}
	}
	// Every proxy hears the upstream; each routes only its own progress.
	uc.OnNotification = func(n mcp.JSONRPCNotification) {
		for _, p := range proxies {
			p.Notify(n)
		}
	}
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
		return exitFail
	}
	defer up.Close()
	for _, p := range proxies {
		if err := p.Attach(ctx, up); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: the upstream does not match the guard map, refusing to start: %v\n", err)
			return exitFail
		}
	}
	if h.addr != "" {
		return runHTTP(ctx, servers, &h, logger, stderr)
	}
	srv := servers[""]
	logger.Info("serving the guard proxy over stdio", "upstream", upstreamName(uc))
	stdio := mcpserver.NewStdioServer(srv.MCP())
	stdio.SetErrorLogger(log.New(stderr, "mcp: ", log.LstdFlags))
	stdio.SetContextFunc(out.Session)
	if err := stdio.Listen(ctx, stdin, out); err != nil && !errors.Is(err, context.Canceled) && !isEOF(err) {
		logger.Error("stdio transport stopped", "err", err)
		return exitFail
	}
	logger.Info("stdin closed; stopping")
	return exitOK
}

func upstreamName(uc proxy.UpstreamConfig) string {
	if uc.URL != "" {
		return uc.URL
	}
	return uc.Command
}
