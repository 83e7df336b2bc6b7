package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/notify"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/server"
)

// maxTemplateBytes bounds what one operator template file may cost.
const maxTemplateBytes = 1 << 20

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
	fs.Int64Var(&f.indexMaxMB, "index-max-mb", 256, "memory budget of the run index, in MiB")
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
	fs.StringVar(&f.tools, "tools", "", "serve only these tools, comma-separated (default: all); e.g. leave check_before_pay out so that an agent with authorize_payment has one way to pay")
	tenantsDirFlagVar(fs, &f.tenantsDir)
}

// guardSetup is what the guard is built from, loaded once at start.
type guardSetup struct {
	// reviewURL is the console's page of a review (nil without --console).
	reviewURL func(id string) string
	policy    *guard.Config
	rules     *policy.Policy
	log       *reviewlog.Log
	chains    *reviewlog.Chains
	paramsKey []byte
	// reviewersPath is the trusted reviewers file (read, never written).
	reviewersPath string
	notifier      *notify.Group
	notifyMetrics *notify.Metrics
	// integrity counts integrity warnings, one counter for every tenant.
	integrity prometheus.Counter
	// tenant names the tenant this guard serves ("" without tenants).
	tenant string
	// store holds the review log and the chains; closed with the stack.
	store reviewlog.Store
	// payer signs the x402 payments the engine allows (nil: none).
	payer x402.Signer
	// tools are the tools to serve (nil: all).
	tools []string
	// engine is the guard's engine once started (the console, started
	// before it, reads its history through it).
	engine atomic.Pointer[engine.Engine]
}

// openGuard loads the policy, its custom rules and the signing setup once.
func openGuard(ctx context.Context, root *confined.Dir, f *serveFlags, logger *slog.Logger) (*guardSetup, error) {
	cfg, err := loadServerPolicy(f.guardConfig, root.Path(), logger)
	if err != nil {
		return nil, err
	}
	rules, err := loadRules(cfg, "refusing to start", logger)
	if err != nil {
		return nil, err
	}
	signer, paramsKey, err := f.signing.open(logger)
	if err != nil {
		return nil, err
	}
	chains := &reviewlog.Chains{Signer: signer, Tenant: f.signing.tenant}
	reviewersPath, err := reviewersFile(f.reviewers)
	if err != nil {
		return nil, err
	}
	store, err := openStore(ctx, root, storeSpec(f.store))
	if err != nil {
		return nil, err
	}
	logger.Info("guard store", "store", store.Describe())
	if err := recordPolicy(ctx, store, cfg, time.Now(), logger); err != nil {
		store.Close()
		return nil, err
	}
	noteRotation(ctx, store, chains, logger)
	if _, err := reviewlog.LoadReviewers(reviewersPath); err != nil {
		// Not fatal: a root from nothing has no reviewer yet. Every human
		// decision reads unverified until one is trusted.
		logger.Warn("no trusted reviewers: human decisions will read unverified until one is added (haia-trace-mcp reviewer init)", "reviewers", reviewersPath, "err", err)
	} else {
		logger.Info("trusted reviewers file", "reviewers", reviewersPath)
	}
	payer, err := f.payer.open(ctx)
	if err != nil {
		store.Close()
		return nil, err
	}
	if payer != nil {
		logger.Info("x402 payments are signed here (authorize_payment)", "payer", payer.Address().Hex(), "max_authorization_seconds", cfg.MaxAuthorizationSeconds)
	}
	log := reviewlog.OpenStore(store, reviewlog.Options{ReviewTTL: cfg.ReviewTTL,
		Reviewers: func() (reviewlog.Reviewers, error) { return reviewlog.LoadReviewers(reviewersPath) },
		Passkeys:  func() (reviewlog.Passkeys, error) { return reviewlog.LoadPasskeys(reviewersPath) }})
	return &guardSetup{policy: cfg, rules: rules, log: log, chains: chains, paramsKey: paramsKey, reviewersPath: reviewersPath, store: store,
		payer: payer, tools: parseTools(f.tools)}, nil
}

// DefaultPolicyName is the policy file init writes beside a Trace root,
// where the server and the review commands look when --guard-config is not
// given.
const DefaultPolicyName = "haia-guard.config.json"

// defaultPolicyFile is init's policy file for the Trace root at rootPath.
func defaultPolicyFile(rootPath string) string {
	return filepath.Join(filepath.Dir(rootPath), DefaultPolicyName)
}

// loadServerPolicy reads --guard-config, else the policy init wrote beside
// the root when there is one, else takes the built-in defaults; it says
// which in the log.
func loadServerPolicy(flagPath, rootPath string, logger *slog.Logger) (*guard.Config, error) {
	path := flagPath
	if path == "" {
		if _, err := os.Lstat(defaultPolicyFile(rootPath)); err == nil {
			path = defaultPolicyFile(rootPath)
			logger.Info("guard policy: no --guard-config, using the one beside the Trace root", "path", path)
		}
	}
	cfg, err := guard.LoadConfig(path)
	if err != nil {
		if flagPath == "" {
			return nil, fmt.Errorf("the guard policy beside the Trace root: %w", err)
		}
		return nil, fmt.Errorf("--guard-config: %w", err)
	}
	return cfg, nil
}

// loadRules reads the custom rules the policy names ("policy"), or none.
// outcome says what a bad file means ("refusing to start").
func loadRules(cfg *guard.Config, outcome string, logger *slog.Logger) (*policy.Policy, error) {
	if cfg.PolicyFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(cfg.PolicyFile)
	if err != nil {
		return nil, fmt.Errorf("custom rules: %w", err)
	}
	rules, err := policy.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("custom rules %s are invalid, %s: %w", cfg.PolicyFile, outcome, err)
	}
	logger.Info("custom rules loaded", "policy", rules.ID(), "policy_hash", rules.Hash())
	return rules, nil
}

// guardReload re-reads one stack's guard policy on SIGHUP, the way the
// server read it at start (--guard-config, else the file beside the root,
// else the built-in defaults; the tenant's layers; its custom rules).
type guardReload struct {
	eng            *engine.Engine
	log            *reviewlog.Log
	store          reviewlog.Store
	flag, rootPath string
	tenant         string
	logger         *slog.Logger
}

// reload validates the new policy completely before anything changes: a
// file that does not load, custom rules that do not parse, or a history
// template that does not exist keep the running policy, and the log says
// why. A valid one is recorded in the store, then put in force.
func (r *guardReload) reload(ctx context.Context) {
	fail := func(err error) {
		r.logger.Error("SIGHUP: guard policy not reloaded; the running policy stays in force", "running_source", r.eng.Policy().Source, "running_sha256", r.eng.Policy().Hash, "err", err)
	}
	cfg, err := loadServerPolicy(r.flag, r.rootPath, r.logger)
	if err != nil {
		fail(err)
		return
	}
	rules, err := loadRules(cfg, "keeping the running policy", r.logger)
	if err != nil {
		fail(err)
		return
	}
	if r.tenant != "" {
		cfg = cfg.ForTenant(r.tenant)
	}
	if err := r.eng.CheckPolicy(cfg); err != nil {
		fail(err)
		return
	}
	if err := recordPolicy(ctx, r.store, cfg, time.Now(), r.logger); err != nil {
		fail(err)
		return
	}
	if err := r.eng.SetPolicy(cfg, rules); err != nil {
		fail(err) // checked above; kept for safety
		return
	}
	r.log.SetReviewTTL(cfg.ReviewTTL)
	r.logger.Info("SIGHUP: guard policy reloaded", "source", cfg.Source, "sha256", cfg.Hash, "review_ttl", cfg.ReviewTTL.String())
}

// recordPolicy records the policy this server runs with in its store, for
// the review commands to decide under the same one. Another policy recorded
// there (another replica's, or this server's before a change) is replaced,
// and the log says so.
func recordPolicy(ctx context.Context, store reviewlog.Store, cfg *guard.Config, now time.Time, logger *slog.Logger) error {
	rec := policyToRecord(cfg, now)
	err := store.Locked(ctx, 30*time.Second, func(w reviewlog.Writer) error {
		prev, ok, err := w.Policy(ctx)
		if err != nil {
			logger.Warn("the policy recorded in the store cannot be read; recording this one", "err", err)
		} else if ok && prev.SHA256 != rec.SHA256 {
			logger.Warn("the store recorded another policy in effect; this server's replaces it (every replica should run the same one)",
				"previous_source", prev.Source, "previous_sha256", prev.SHA256, "previous_at", prev.At, "source", rec.Source, "sha256", rec.SHA256)
		}
		return w.SetPolicy(ctx, rec)
	})
	if err != nil {
		return fmt.Errorf("record the guard policy in effect in %s: %w", store.Describe(), err)
	}
	logger.Info("guard policy recorded in the store", "source", rec.Source, "sha256", rec.SHA256)
	return nil
}

func newIntegrityCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "haia_review_integrity_warnings_total",
		Help: "Times a review's log lines and its signed receipts disagreed (an unverified decision, a contradicting line)."})
}

// startGuard builds the decision engine over the server's run index and
// registers the guard's tools.
func startGuard(ctx context.Context, srv *server.Server, cat *catalog.Catalog, g *guardSetup, templates *receipt.TemplateSet, agentID string, noCheckTool bool, logger *slog.Logger) (*engine.Engine, error) {
	var onOpen func(reviewlog.Review)
	if g.notifier != nil && g.notifier.Len() > 0 {
		onOpen = func(r reviewlog.Review) {
			// The reviewer must know which tenant's queue the review is in.
			m, err := notify.NewMessage(notify.EventOpened, struct {
				reviewlog.Review
				Tenant string `json:"tenant,omitempty"`
			}{r, g.tenant})
			if err != nil {
				logger.Error("notification not sent", "review_id", r.ID, "err", err)
				return
			}
			g.notifier.Notify(m)
		}
		if pg, ok := g.store.(*pgstore.Store); ok {
			// Replicas share the store: the outbox, not the replica that
			// opened a review, decides who notifies it (once across the
			// fleet, and still after that replica died).
			deliver := onOpen
			go pg.DispatchOpened(ctx, replicaName(), func(ctx context.Context, id string) error {
				r, err := g.log.Get(ctx, id)
				if err != nil {
					return err
				}
				if a, ok := g.policy.Assets.Lookup(r.Asset); ok {
					r.AssetSymbol = a.Symbol
				}
				if g.reviewURL != nil {
					r.ReviewURL = g.reviewURL(r.ID)
				}
				deliver(r)
				return nil
			}, logger)
			onOpen = nil
		}
	}
	integrity := g.integrity
	if integrity == nil {
		integrity = newIntegrityCounter()
	}
	srv.AddMetrics(integrity)
	if g.notifyMetrics != nil {
		srv.AddMetrics(g.notifyMetrics)
	}
	eng, err := engine.New(engine.Config{
		Notify:      onOpen,
		ReviewURL:   g.reviewURL,
		OnIntegrity: integrity.Inc,
		Policy:      g.policy,
		Rules:       g.rules,
		Templates:   templates,
		History:     cat,
		Log:         g.log,
		Chains:      g.chains,
		ParamsKey:   g.paramsKey,
		Logger:      logger,
	})
	if err != nil {
		return nil, err
	}
	logger.Info("guard policy loaded", "source", g.policy.Source, "history_templates", strings.Join(g.policy.HistoryTemplates, ","),
		"unreadable_history", g.policy.UnreadableHistory, "unattributable_history", g.policy.UnattributableHistory)
	gd := &server.Guard{Engine: eng, AgentID: agentID, NoCheckTool: noCheckTool}
	if g.payer != nil {
		if gd.Payments, err = payment.New(payment.Config{Engine: eng, Signer: g.payer}); err != nil {
			return nil, err
		}
	}
	if err := srv.EnableGuard(gd); err != nil {
		return nil, err
	}
	if g.tools != nil {
		if err := srv.KeepTools(g.tools); err != nil {
			return nil, err
		}
		logger.Info("serving only the tools --tools names", "tools", strings.Join(g.tools, ","))
	}
	return eng, nil
}

func newLogger(stderr io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: l})), nil
}

// openTrace opens the Trace root, its events/ directory and the templates,
// all confined to real paths resolved once. The templates are loaded now and
// stay fixed until SIGHUP.
func openTrace(dir, templatesDir string, logger *slog.Logger) (root, events *confined.Dir, set *receipt.TemplateSet, err error) {
	root, err = confined.OpenRoot(dir)
	if err != nil {
		return nil, nil, nil, errors.New(rootOpenProblem(dir, err))
	}
	// A root from nothing has no events/ until a recorder first writes:
	// the server lists nothing until then and picks the runs up after.
	events, err = root.OpenDirLazy("events")
	if err != nil {
		root.Close()
		return nil, nil, nil, fmt.Errorf("trace root %s: events directory: %w", root.Path(), err)
	}
	if !events.Exists() {
		logger.Info("events/ does not exist yet: nothing to list until a recorder creates it", "root", root.Path())
	}
	set, err = openTemplates(root, templatesDir, logger)
	if err != nil {
		root.Close()
		events.Close()
		return nil, nil, nil, err
	}
	return root, events, set, nil
}

// openTemplates loads the operator's templates and the bundled ones, and
// logs each with its SHA-256; an operator file that replaces a bundled
// template is allowed (it is the operator's choice) and logged as such.
func openTemplates(root *confined.Dir, templatesDir string, logger *slog.Logger) (*receipt.TemplateSet, error) {
	var tdir *confined.Dir
	var err error
	name := "templates"
	if templatesDir != "" {
		if tdir, err = confined.OpenRoot(templatesDir); err != nil {
			return nil, fmt.Errorf("--templates-dir: %w", err)
		}
		name = tdir.Path()
	} else if tdir, err = root.OpenDir("templates"); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("trace root %s: templates directory: %w", root.Path(), err)
		}
		tdir = nil
	}
	load := func() (*receipt.Registry, []error) {
		if tdir == nil {
			return receipt.LoadRegistry(nil, "", nil)
		}
		entries, err := tdir.ReadDir()
		if err != nil {
			return nil, []error{fmt.Errorf("templates directory: %w", err)}
		}
		var names []string
		for _, e := range entries {
			if e.Regular() {
				names = append(names, e.Name)
			}
		}
		return receipt.LoadRegistry(tdir.FS(maxTemplateBytes), name, names)
	}
	set, errs := receipt.NewTemplateSet(load)
	if set == nil {
		return nil, errors.Join(errs...)
	}
	logTemplates(set.Current(), errs, logger, "templates loaded")
	return set, nil
}

func logTemplates(r *receipt.Registry, errs []error, logger *slog.Logger, msg string) {
	for _, l := range r.Loaded() {
		if l.Overrides {
			logger.Warn(msg+": an operator template replaces the bundled one", "template", l.Name, "source", l.Source, "sha256", l.SHA256)
			continue
		}
		logger.Info(msg, "template", l.Name, "source", l.Source, "sha256", l.SHA256)
	}
	for _, err := range errs {
		logger.Error(msg+": a template could not be loaded and cannot be used until it is fixed and the server reloaded (SIGHUP)", "err", err)
	}
}

// reloadTemplatesOnHUP re-reads the templates on SIGHUP. A set in which a
// template the policy reads history under cannot be used is refused, and
// the previous set stays in force.
func reloadTemplatesOnHUP(ctx context.Context, set *receipt.TemplateSet, g *guardReload, logger *slog.Logger) func() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				var historyTemplates []string
				if g != nil {
					historyTemplates = g.eng.Policy().HistoryTemplates
				}
				r, errs := set.Reload(func(r *receipt.Registry) error {
					for _, n := range historyTemplates {
						if _, err := r.Resolve(n); err != nil {
							return fmt.Errorf("history template %s: %w", n, err)
						}
					}
					return nil
				})
				if r == nil {
					logger.Error("SIGHUP: templates not reloaded", "err", errors.Join(errs...))
				} else {
					logTemplates(r, errs, logger, "SIGHUP: templates reloaded")
				}
				// Then the policy, checked against the templates now in force.
				if g != nil {
					g.reload(ctx)
				}
			}
		}
	}()
	return func() { signal.Stop(hup) }
}

// stack is one Trace root served: its directories, templates, guard and
// server.
type stack struct {
	root, events *confined.Dir
	srv          *server.Server
	eng          *engine.Engine
	close        func()
}

// openStack opens dir as a Trace root and builds its server and guard;
// tenant, when set, names the tenant (its policy overrides, scope.tenant).
func openStack(ctx context.Context, dir, tenant string, f *serveFlags, notifier *notify.Group, nm *notify.Metrics, integrity prometheus.Counter, logger *slog.Logger) (*stack, error) {
	if tenant != "" {
		logger = logger.With("tenant", tenant)
	}
	root, events, templates, err := openTrace(dir, f.templatesDir, logger)
	if err != nil {
		return nil, err
	}
	closeDirs := func() { events.Close(); root.Close() }
	// One catalog per root: the read tools, the engine's history and the
	// console's explanations all read runs through it.
	var progress func(done, total int)
	if f.progressTo != nil {
		name := "index"
		if tenant != "" {
			name += " of tenant " + tenant
		}
		progress = newProgress(f.progressTo, name).runs
	}
	cat, err := catalog.New(catalog.Config{Root: root, Events: events, Templates: templates,
		Limits: receipt.DefaultLimits(), MaxBytes: f.indexMaxMB << 20, Logger: logger, Progress: progress})
	if err != nil {
		closeDirs()
		return nil, err
	}
	srv, err := server.New(server.Config{
		Catalog: cat,
		Version: versionString(),
		Logger:  logger,

		ToolsListChanged: f.proxy,
		Instructions:     proxyInstructions(f.proxy),
	})
	if err != nil {
		closeDirs()
		return nil, err
	}
	if f.readOnly {
		// No guard: no policy, key, store or reviewers are opened, and
		// nothing is written; only the tools that read the Trace exist.
		if tools := parseTools(f.tools); tools != nil {
			if err := srv.KeepTools(tools); err != nil {
				closeDirs()
				return nil, err
			}
		}
		logger.Info("read-only: serving the Trace read tools alone; the guard is not started", "tools", strings.Join(srv.ToolNames(), ","))
		stopHUP := reloadTemplatesOnHUP(ctx, templates, nil, logger)
		return &stack{root: root, events: events, srv: srv, close: func() { stopHUP(); closeDirs() }}, nil
	}
	g, err := openGuard(ctx, root, f, logger)
	if err != nil {
		closeDirs()
		return nil, err
	}
	closeDirs = func() { g.store.Close(); events.Close(); root.Close() }
	if tenant != "" {
		g.policy = g.policy.ForTenant(tenant)
		g.chains.Tenant = tenant
	}
	g.notifier, g.notifyMetrics, g.integrity, g.tenant = notifier, nm, integrity, tenant
	stopConsole := func() {}
	if f.console.on {
		if tenant != "" {
			closeDirs()
			return nil, errors.New("--console serves one guard; with --tenants-dir it is not supported yet")
		}
		if stopConsole, g.reviewURL, err = startConsole(ctx, &f.console, cat, g, logger); err != nil {
			closeDirs()
			return nil, err
		}
	}
	eng, err := startGuard(ctx, srv, cat, g, templates, f.agentID, f.proxy, logger)
	if err != nil {
		stopConsole()
		closeDirs()
		return nil, err
	}
	g.engine.Store(eng)
	reload := &guardReload{eng: eng, log: g.log, store: g.store, flag: f.guardConfig, rootPath: root.Path(), tenant: tenant, logger: logger}
	stopHUP := reloadTemplatesOnHUP(ctx, templates, reload, logger)
	return &stack{root: root, events: events, srv: srv, eng: eng, close: func() { stopConsole(); stopHUP(); closeDirs() }}, nil
}

// openTenants serves every tenant under --tenants-dir: each subdirectory
// named by a bare slug is a tenant's Trace root, with its own index, review
// log and decision chain. The set is read at start.
func openTenants(ctx context.Context, f *serveFlags, notifier *notify.Group, nm *notify.Metrics, logger *slog.Logger) (map[string]*server.Server, func(), error) {
	stacks, closeAll, err := openTenantStacks(ctx, f, notifier, nm, logger)
	if err != nil {
		return nil, nil, err
	}
	out := map[string]*server.Server{}
	for name, st := range stacks {
		out[name] = st.srv
	}
	return out, closeAll, nil
}

// openTenantStacks opens one stack per tenant under --tenants-dir.
func openTenantStacks(ctx context.Context, f *serveFlags, notifier *notify.Group, nm *notify.Metrics, logger *slog.Logger) (map[string]*stack, func(), error) {
	if !isFileStore(storeSpec(f.store)) {
		// One database would mix the tenants' reviews and chains.
		return nil, nil, errors.New("--tenants-dir keeps each tenant's guard state under its own root: it needs the file store (--store file:); a PostgreSQL store per tenant is not supported yet")
	}
	integrity := newIntegrityCounter()
	dir, err := confined.OpenRoot(f.tenantsDir)
	if err != nil {
		return nil, nil, fmt.Errorf("--tenants-dir: %w", err)
	}
	entries, err := dir.ReadDir()
	dir.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("--tenants-dir: %w", err)
	}
	out := map[string]*stack{}
	var stacks []*stack
	closeAll := func() {
		for _, s := range stacks {
			s.close()
		}
	}
	for _, e := range entries {
		if e.Type&fs.ModeDir == 0 || !receipt.IsSlug(e.Name) {
			if e.Type&fs.ModeSymlink != 0 {
				logger.Warn("--tenants-dir: a symbolic link is no tenant root; skipped", "name", e.Name)
			}
			continue
		}
		st, err := openStack(ctx, filepath.Join(dir.Path(), e.Name), e.Name, f, notifier, nm, integrity, logger)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("tenant %s: %w", e.Name, err)
		}
		stacks = append(stacks, st)
		out[e.Name] = st
		logger.Info("tenant served", "tenant", e.Name, "root", st.root.Path())
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("--tenants-dir %s holds no tenant (a subdirectory named by [A-Za-z0-9_-] per tenant)", f.tenantsDir)
	}
	return out, closeAll, nil
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
			return usageErrorf("unknown command %q", pos[0])
		}
		return runServe(ctx, env, f, h)
	}
}

func runServe(ctx context.Context, env *cmdEnv, f serveFlags, h httpFlags) error {
	stdin, stdout, stderr := env.stdin, env.stdout, env.stderr
	f.console.allowRemote = &h.allowRemote
	f.console.http = &h
	logger, err := newLogger(stderr, f.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitCode(exitUsage)
	}
	f.progressTo = stderr
	if f.readOnly {
		var guardFlags []string
		env.fs.Visit(func(fl *flag.Flag) {
			switch fl.Name {
			case "guard-config", "agent-id", "reviewers", "notify-command", "notify-env", "notify-url", "notify-secret-file", "store", "key-file", "signer", "params-key-file",
				"payer-key", "payer-key-password-file", "payer-signer", "console", "console-addr", "console-url":
				guardFlags = append(guardFlags, "--"+fl.Name)
			}
		})
		if len(guardFlags) > 0 {
			return usageErrorf("--read-only serves no guard, so %s would do nothing; drop them or --read-only", strings.Join(guardFlags, ", "))
		}
	}
	notifyMetrics := notify.NewMetrics()
	notifier, err := notify.New(f.notify, notify.Options{Logger: logger, Metrics: notifyMetrics})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitCode(exitUsage)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = notifier.Close(ctx)
	}()
	if f.tenantsDir != "" {
		if h.addr == "" || h.insecure || h.tenantClaim == "" {
			return usageErrorf("--tenants-dir serves tenants over --http with authentication, the tenant named by --tenant-claim")
		}
		tenants, closeAll, err := openTenants(ctx, &f, notifier, notifyMetrics, logger)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
			return exitCode(exitFail)
		}
		defer closeAll()
		return exitCode(runHTTP(ctx, tenants, &h, logger, stderr))
	}
	st, err := openStack(ctx, f.dir, "", &f, notifier, notifyMetrics, newIntegrityCounter(), logger)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitCode(exitFail)
	}
	defer st.close()
	srv := st.srv
	if h.addr != "" {
		return exitCode(runHTTP(ctx, map[string]*server.Server{"": srv}, &h, logger, stderr))
	}
	logger.Info("serving MCP over stdio", "root", st.root.Path())
	stdio := mcpserver.NewStdioServer(srv.MCP())
	stdio.SetErrorLogger(log.New(stderr, "mcp: ", log.LstdFlags))
	if err := stdio.Listen(ctx, stdin, stdout); err != nil && !errors.Is(err, context.Canceled) && !isEOF(err) {
		logger.Error("stdio transport stopped", "err", err)
		return exitCode(exitFail)
	}
	logger.Info("stdin closed; stopping")
	return nil
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || strings.Contains(err.Error(), "EOF")
}
