package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/evmrpc"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/notify"
	"github.com/haia-trace-mcp/haia-trace-mcp/server"
)

// serveFlags are the flags of the default (serve) command.
type serveFlags struct {
	// progressTo, when set, shows a cold run index being read (on a
	// terminal only; see progress).
	progressTo   io.Writer
	dir          string
	templatesDir string
	logLevel     string
	indexMaxMB   int64
	guardConfig  string
	agentID      string
	signing      signingFlags
	reviewers    string
	notify       notify.Config
	tenantsDir   string
	store        string
	readOnly     bool
	payer        payerFlags
	chainRPC     listFlag
	tools        string
	// proxy serves the guard proxy's stack: no check_before_pay (the proxy
	// asks the engine before each paying call) and a tool list that follows
	// the upstream's.
	proxy bool
	// console serves the reviewer console beside the guard.
	console consoleFlags
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	dirFlagVar(fs, &f.dir)
	f.console.register(fs)
	templatesDirFlagVar(fs, &f.templatesDir)
	fs.StringVar(&f.logLevel, "log-level", "info", "log level on stderr: debug, info, warn, error")
	fs.Int64Var(&f.indexMaxMB, "index-max-mb", 768, "memory budget of the run index, in MiB")
	guardConfigFlagVar(fs, &f.guardConfig)
	fs.StringVar(&f.agentID, "agent-id", "local-agent", "who the caller is over stdio, for decision receipts (over HTTP the token's subject is used)")
	f.signing.register(fs)
	reviewersFlagVar(fs, &f.reviewers)
	fs.StringVar(&f.notify.Command, "notify-command", "", "run this program (no shell) for each opened review, the review as JSON on stdin; 10 s timeout")
	fs.Var((*listFlag)(&f.notify.Env), "notify-env", "NAME: pass this variable of the server's environment to --notify-command (repeatable); the hook otherwise gets only its own variables and PATH")
	fs.StringVar(&f.notify.URL, "notify-url", "", "POST each opened review to this http(s) URL (opt-in outbound network), signed with --notify-secret-file")
	fs.StringVar(&f.notify.SecretFile, "notify-secret-file", "", "the HMAC-SHA256 key of --notify-url (X-Haia-Signature)")
	storeFlagVar(fs, &f.store)
	fs.BoolVar(&f.readOnly, "read-only", false, "serve the tools that read the Trace alone (list_operations, get_receipt, explain): no guard, nothing signed or written")
	f.payer.register(fs)
	fs.Var(&f.chainRPC, "chain-rpc", "read an EVM network through a JSON-RPC endpoint, `NETWORK=URL` (eip155:8453=https://…; https, or http on loopback; repeatable): an authorization whose validBefore passed and whose nonce the asset contract says was never used stops being held; without one, an expired authorization is held for the policy's longest window")
	fs.StringVar(&f.tools, "tools", "", "serve only these tools, comma-separated (default: all); e.g. leave check_before_pay out so that an agent with authorize_payment has one way to pay")
	tenantsDirFlagVar(fs, &f.tenantsDir)
}

// saveDelayEnv is a test hook: HAIA_TEST_INDEX_SAVE_DELAY=D makes each
// save of the run index wait D before each run it encodes, so that a test
// can stop the server while it saves a small root, as a client stops it
// while it saves a big one. It is never needed in use.
const saveDelayEnv = "HAIA_TEST_INDEX_SAVE_DELAY"

// readDelayEnv is a test hook: HAIA_TEST_INDEX_READ_DELAY=D makes a
// refresh of the run index wait D after each run it reads, so that a test
// sees a small root read as slowly as a big one (readiness while the root
// is read at the start). It is never needed in use.
const readDelayEnv = "HAIA_TEST_INDEX_READ_DELAY"

// appConfig turns the serve flags into the application's configuration:
// default key and reviewers paths resolved, the payer opened.
func (f *serveFlags) appConfig(ctx context.Context, notifier *notify.Group, logger *slog.Logger) (app.Config, error) {
	cfg := app.Config{
		Dir:           f.dir,
		TemplatesDir:  f.templatesDir,
		IndexMaxBytes: f.indexMaxMB << 20,
		ReadOnly:      f.readOnly,
		GuardConfig:   f.guardConfig,
		Store:         storeSpec(f.store),
		Notifier:      notifier,
		Replica:       replicaName(),
		Logger:        logger,
	}
	if v := os.Getenv(saveDelayEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Minute {
			return cfg, fmt.Errorf("%s=%q is not a duration from 0 to 1m (a test hook)", saveDelayEnv, v)
		}
		cfg.IndexSaveDelay = d
		logger.Warn("the run index's save waits before each run (a test hook)", "env", saveDelayEnv, "delay", d)
	}
	if cr := newColdRead(); cr != nil {
		cfg.Reading = cr.reading
	}
	if f.progressTo != nil {
		cfg.ProgressOf = func(tenant string) func(done, total int) {
			name := "index"
			if tenant != "" {
				name += " of tenant " + tenant
			}
			return newProgress(f.progressTo, name).runs
		}
	}
	if v := os.Getenv(readDelayEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Minute {
			return cfg, fmt.Errorf("%s=%q is not a duration from 0 to 1m (a test hook)", readDelayEnv, v)
		}
		progressOf := cfg.ProgressOf
		cfg.ProgressOf = func(tenant string) func(done, total int) {
			var p func(done, total int)
			if progressOf != nil {
				p = progressOf(tenant)
			}
			return func(done, total int) {
				time.Sleep(d)
				if p != nil {
					p(done, total)
				}
			}
		}
		logger.Warn("a refresh of the run index waits after each run it reads (a test hook)", "env", readDelayEnv, "delay", d)
	}
	if f.readOnly {
		return cfg, nil
	}
	var err error
	if cfg.Signing, err = f.signing.config(); err != nil {
		return cfg, err
	}
	if cfg.ReviewersPath, err = reviewersFile(f.reviewers); err != nil {
		return cfg, err
	}
	if cfg.Payer, err = f.payer.open(ctx); err != nil {
		return cfg, err
	}
	if cfg.ChainRPC, err = evmrpc.Parse(f.chainRPC); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// openApp opens the stack the serve flags describe and reports a Trace
// root that cannot be opened the way a person can act on.
func openApp(ctx context.Context, cfg app.Config) (*app.Stack, error) {
	st, err := app.Open(ctx, cfg)
	var re *app.RootError
	if errors.As(err, &re) {
		return nil, errors.New(rootOpenProblem(re.Dir, re.Err))
	}
	return st, err
}

// served is one stack with the MCP server that adapts it.
type served struct {
	st    *app.Stack
	srv   *server.Server
	close func()
}

// serveStack builds the MCP server of one stack (and its console): the
// read tools over the stack's catalog and, unless read-only, the guard's
// tools over its engine.
func serveStack(ctx context.Context, st *app.Stack, f *serveFlags, nm *notify.Metrics, logger *slog.Logger) (*served, error) {
	if t := st.Tenant(); t != "" {
		logger = logger.With("tenant", t)
	}
	srv, err := server.New(server.Config{
		Catalog: st.Catalog(),
		Version: versionString(),
		Logger:  logger,

		ToolsListChanged: f.proxy,
		Instructions:     proxyInstructions(f.proxy),
	})
	if err != nil {
		return nil, err
	}
	if st.Engine() == nil {
		// No guard: no policy, key, store or reviewers are opened, and
		// nothing is written; only the tools that read the Trace exist.
		if tools := parseTools(f.tools); tools != nil {
			if err := srv.KeepTools(tools); err != nil {
				return nil, err
			}
		}
		logger.Info("read-only: serving the Trace read tools alone; the guard is not started", "tools", strings.Join(srv.ToolNames(), ","))
		return &served{st: st, srv: srv, close: func() {}}, nil
	}
	stopConsole := func() {}
	if f.console.on {
		var reviewURL func(string) string
		if st.Tenant() != "" {
			if f.console.tenants == nil {
				return nil, errors.New("--console with --tenants-dir: the tenants' console is not set up")
			}
			stopConsole, reviewURL, err = addTenantConsole(ctx, f.console.tenants, st, logger)
		} else {
			stopConsole, reviewURL, err = startConsole(ctx, &f.console, st, logger)
		}
		if err != nil {
			return nil, err
		}
		st.SetReviewURL(reviewURL)
	}
	srv.AddMetrics(st.Metrics()...)
	if nm != nil {
		srv.AddMetrics(nm)
	}
	if err := srv.EnableGuard(&server.Guard{Engine: st.Engine(), AgentID: f.agentID, Payments: st.Payments(), NoCheckTool: f.proxy}); err != nil {
		stopConsole()
		return nil, err
	}
	if tools := parseTools(f.tools); tools != nil {
		if err := srv.KeepTools(tools); err != nil {
			stopConsole()
			return nil, err
		}
		logger.Info("serving only the tools --tools names", "tools", strings.Join(tools, ","))
	}
	return &served{st: st, srv: srv, close: stopConsole}, nil
}

// reloadOnHUP has every stack re-read its templates and guard policy on
// SIGHUP (see app.Stack.Reload).
func reloadOnHUP(ctx context.Context, stacks []*app.Stack) func() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				for _, st := range stacks {
					st.Reload(ctx)
				}
			}
		}
	}()
	return func() { signal.Stop(hup) }
}

// openServed opens what the serve flags describe: one stack, or one per
// tenant under --tenants-dir, each with its MCP server. ready asks every
// stack (naming the tenant that is not ready).
func openServed(ctx context.Context, f *serveFlags, notifier *notify.Group, nm *notify.Metrics, logger *slog.Logger) (servers map[string]*served, ready func(context.Context) error, closeAll func(), err error) {
	cfg, err := f.appConfig(ctx, notifier, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	servers = map[string]*served{}
	var stacks []*app.Stack
	var closeStacks func()
	if f.tenantsDir != "" {
		ts, err := app.OpenTenants(ctx, f.tenantsDir, cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		for _, name := range ts.Names() {
			stacks = append(stacks, ts.Stack(name))
		}
		ready, closeStacks = ts.Ready, ts.Close
	} else {
		st, err := openApp(ctx, cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		stacks = []*app.Stack{st}
		ready, closeStacks = st.Ready, st.Close
	}
	stopConsole := func() {}
	if f.tenantsDir != "" && f.console.on && len(stacks) > 0 && stacks[0].Engine() != nil {
		// One console for every tenant, each under /console/t/<tenant>/.
		site, err := f.console.site()
		if err != nil {
			closeStacks()
			return nil, nil, nil, err
		}
		f.console.tenants = &tenantConsoles{site: site, mux: http.NewServeMux(), clients: f.console.clients}
		// /console/ itself says where each tenant's console is.
		f.console.tenants.mux.Handle(site.u.Path, console.TenantsIndex(site.u))
		stopConsole = site.close
	}
	closeAll = func() {
		stopConsole()
		for _, s := range servers {
			s.close()
		}
		closeStacks()
	}
	for _, st := range stacks {
		s, err := serveStack(ctx, st, f, nm, logger)
		if err != nil {
			closeAll()
			if st.Tenant() != "" {
				return nil, nil, nil, fmt.Errorf("tenant %s: %w", st.Tenant(), err)
			}
			return nil, nil, nil, err
		}
		servers[st.Tenant()] = s
	}
	if tc := f.console.tenants; tc != nil {
		stopConsole = serveConsole(ctx, &f.console, tc.site, tc.mux, tc.rpID, func() {}, logger)
		logger.Info("the reviewer console serves each tenant under its own path", "url", tc.site.u.String()+"t/<tenant>/")
	}
	return servers, ready, closeAll, nil
}

// startServed puts the served stacks to work once the server serves (the
// listener is open, the upstream attached): each records its policy in
// its store and starts its outbox (app.Stack.Start), and SIGHUP reloads
// them from then on. Before it, a refused start has changed nothing in any
// store. stop ends the SIGHUP handling.
func startServed(ctx context.Context, servers map[string]*served) (stop func(), err error) {
	names := make([]string, 0, len(servers))
	for name := range servers {
		names = append(names, name)
	}
	sort.Strings(names)
	stacks := make([]*app.Stack, 0, len(names))
	for _, name := range names {
		st := servers[name].st
		if err := st.Start(ctx); err != nil {
			if name != "" {
				return nil, fmt.Errorf("tenant %s: %w", name, err)
			}
			return nil, err
		}
		stacks = append(stacks, st)
	}
	return reloadOnHUP(ctx, stacks), nil
}

func newLogger(stderr io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: l})), nil
}

// defineServe is serving MCP: what an agent host launches, the command
// with no name.
func defineServe(fs *flag.FlagSet) runFunc {
	var f serveFlags
	f.register(fs)
	var h httpFlags
	h.register(fs)
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		if len(pos) != 0 {
			if near := nearest(pos[0], commandTable().subNames()); near != "" {
				return usageErrorf("unknown command %q; did you mean %q?", pos[0], near)
			}
			return usageErrorf("unknown command %q", pos[0])
		}
		return runServe(ctx, env, f, h)
	}
}

func runServe(ctx context.Context, env *cmdEnv, f serveFlags, h httpFlags) error {
	stdin, stdout, stderr := env.stdin, env.stdout, env.stderr
	f.console.allowRemote = &h.allowRemote
	f.console.http = &h
	h.reviewers = &f.reviewers
	h.store = &f.store
	logger, err := newLogger(stderr, f.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitCode(exitUsage)
	}
	f.progressTo = stderr
	if lim, ok := memoryLimit(os.Getenv("GOMEMLIMIT"), f.indexMaxMB, f.tenantsDir != ""); ok {
		// The index keeps what it needs within its budget; without a soft
		// limit the collector lets the heap reach twice what is live.
		debug.SetMemoryLimit(lim)
		logger.Debug("soft memory limit set from the index budget", "bytes", lim)
	}
	if f.readOnly {
		var guardFlags []string
		env.fs.Visit(func(fl *flag.Flag) {
			switch fl.Name {
			case "guard-config", "agent-id", "reviewers", "notify-command", "notify-env", "notify-url", "notify-secret-file", "store", "key-file", "signer", "params-key-file",
				"payer-key", "payer-key-password-file", "payer-signer", "chain-rpc", "console", "console-addr", "console-url", "console-trusted-proxy", "console-proxy-header":
				guardFlags = append(guardFlags, "--"+fl.Name)
			}
		})
		if h.ingest.on {
			return usageErrorf("--read-only writes nothing, so it cannot take recorders' events (--ingest); drop one of them")
		}
		if len(guardFlags) > 0 {
			return usageErrorf("--read-only serves no guard, so %s would do nothing; drop them or --read-only", strings.Join(guardFlags, ", "))
		}
	}
	if err := refuseIdleFlags(env.fs, &f, &h); err != nil {
		return err
	}
	if err := f.console.check(); err != nil {
		return err
	}
	servers, ready, closeAll, err := openFront(ctx, &f, &h, logger, stderr)
	if err != nil {
		return err
	}
	defer closeAll()
	if h.addr != "" {
		return exitCode(runHTTP(ctx, servers, ready, &h, logger, stderr))
	}
	stopHUP, err := startServed(ctx, servers)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	defer stopHUP()
	srv := servers[""].srv
	logger.Info("serving MCP over stdio", "root", servers[""].st.Root().Path())
	stdio := mcpserver.NewStdioServer(srv.MCP())
	stdio.SetErrorLogger(log.New(stderr, "mcp: ", log.LstdFlags))
	if err := stdio.Listen(ctx, stdin, stdout); err != nil && !errors.Is(err, context.Canceled) && !isEOF(err) {
		logger.Error("stdio transport stopped", "err", err)
		return exitCode(exitFail)
	}
	logger.Info("stdin closed; stopping")
	return nil
}

// idleFlagRules are the serving flags that act only beside another: given
// without it, each would silently do nothing, so it is refused by name.
var idleFlagRules = []struct {
	flags []string
	// needs names what they act with, for the message.
	needs  string
	active func(f *serveFlags, h *httpFlags) bool
}{
	{[]string{"tenant-claim", "tenant-fair-share", "tenant-slots", "tenant-max-in-flight", "tenant-queue", "tenant-wait"},
		"--tenants-dir (they set how the tenants are told apart and share the decision slots)",
		func(f *serveFlags, _ *httpFlags) bool { return f.tenantsDir != "" }},
	{[]string{"public-url", "auth-issuer", "auth-jwks", "auth-hmac-secret", "auth-scope", "auth-tool-scope", "auth-max-token-lifetime",
		"http-insecure-no-auth", "http-max-body", "http-max-sessions", "http-session-idle", "http-session-key", "http-max-streams",
		"http-stream-idle", "http-stream-ping", "rate-limit", "rate-burst", "http-read-header-timeout", "http-read-timeout",
		"http-write-timeout", "http-idle-timeout", "http-shutdown-timeout"},
		"--http (they set the Streamable HTTP endpoint; over stdio there is none)",
		func(_ *serveFlags, h *httpFlags) bool { return h.addr != "" }},
	{[]string{"ingest"}, "--http (the recorders' batch endpoint is served over HTTP)",
		func(_ *serveFlags, h *httpFlags) bool { return h.addr != "" }},
	{[]string{"ingest-keys", "ingest-max-body"}, "--ingest (they set the recorders' batch endpoint)",
		func(_ *serveFlags, h *httpFlags) bool { return h.ingest.on }},
	{[]string{"http-allow-remote"}, "--http or --console (it lets their listener leave loopback)",
		func(f *serveFlags, h *httpFlags) bool { return h.addr != "" || f.console.on }},
	{[]string{"console-addr", "console-url", "console-trusted-proxy"}, "--console (they place the reviewer console and name the proxy in front of it)",
		func(f *serveFlags, _ *httpFlags) bool { return f.console.on }},
	{[]string{"console-proxy-header"}, "--console --console-trusted-proxy (a forwarding header is read only from a proxy you name)",
		func(f *serveFlags, _ *httpFlags) bool { return f.console.on && len(f.console.trustedProxies) > 0 }},
}

// refuseIdleFlags refuses, by name, each flag given (on fs) that would do
// nothing beside the others given.
func refuseIdleFlags(fs *flag.FlagSet, f *serveFlags, h *httpFlags) error {
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	var msgs []string
	for _, r := range idleFlagRules {
		if r.active(f, h) {
			continue
		}
		var idle []string
		for _, name := range r.flags {
			if given[name] {
				idle = append(idle, "--"+name)
			}
		}
		switch len(idle) {
		case 0:
		case 1:
			msgs = append(msgs, fmt.Sprintf("%s does nothing without %s", idle[0], r.needs))
		default:
			msgs = append(msgs, fmt.Sprintf("%s do nothing without %s", orList(idle), r.needs))
		}
	}
	if len(msgs) > 0 {
		return usageErrorf("%s; drop them or add what they need", strings.Join(msgs, "; "))
	}
	return nil
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || strings.Contains(err.Error(), "EOF")
}

// openFront opens what serve and proxy both put in front of their callers:
// the notifier, the check that tenants are served only over authenticated
// HTTP, and the stacks (openServed). closeAll closes the stacks, then the
// notifier. Its error already carries the exit code (and was printed).
func openFront(ctx context.Context, f *serveFlags, h *httpFlags, logger *slog.Logger, stderr io.Writer) (servers map[string]*served, ready func(context.Context) error, closeAll func(), err error) {
	notifyMetrics := notify.NewMetrics()
	notifier, err := notify.New(f.notify, notify.Options{Logger: logger, Metrics: notifyMetrics})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return nil, nil, nil, exitCode(exitUsage)
	}
	closeNotifier := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = notifier.Close(ctx)
	}
	if f.tenantsDir != "" && (h.addr == "" || h.insecure || h.tenantClaim == "") {
		closeNotifier()
		return nil, nil, nil, usageErrorf("--tenants-dir serves tenants over --http with authentication, the tenant named by --tenant-claim")
	}
	if h.addr != "" {
		// What the flags refuse is refused before a store is opened.
		if _, err := h.plan(); err != nil {
			closeNotifier()
			return nil, nil, nil, usageErrorf("%v", err)
		}
	}
	servers, ready, closeServed, err := openServed(ctx, f, notifier, notifyMetrics, logger)
	if err != nil {
		closeNotifier()
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return nil, nil, nil, exitCode(exitFail)
	}
	return servers, ready, func() { closeServed(); closeNotifier() }, nil
}

// memoryLimitHeadroom is what the soft memory limit allows beyond the run
// index's budget: the guard, the requests, a run being read.
const memoryLimitHeadroom = 128 << 20

// memoryLimit is the soft memory limit a server sets for itself: the run
// index's budget plus headroom, unless the operator set GOMEMLIMIT or the
// server serves several tenants (an index each).
func memoryLimit(env string, indexMaxMB int64, tenants bool) (int64, bool) {
	if env != "" || tenants || indexMaxMB <= 0 {
		return 0, false
	}
	return indexMaxMB<<20 + memoryLimitHeadroom, true
}
