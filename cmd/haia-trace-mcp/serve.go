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
	"strings"
	"syscall"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/notify"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/server"
)

// maxTemplateBytes bounds what one operator template file may cost.
const maxTemplateBytes = 1 << 20

// serveFlags are the flags of the default (serve) command.
type serveFlags struct {
	dir          string
	templatesDir string
	logLevel     string
	indexMaxMB   int64
	guardConfig  string
	agentID      string
	signing      signingFlags
	reviewers    string
	notify       notify.Config
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "dir", ".trace", "the Trace root (events/, templates/, guard/)")
	fs.StringVar(&f.templatesDir, "templates-dir", "", "the operator's templates directory (default: <dir>/templates)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level on stderr: debug, info, warn, error")
	fs.Int64Var(&f.indexMaxMB, "index-max-mb", 256, "memory budget of the run index, in MiB")
	fs.StringVar(&f.guardConfig, "guard-config", "", "the guard policy (haia-guard.config.json); default: built-in defaults")
	fs.StringVar(&f.agentID, "agent-id", "local-agent", "who the caller is over stdio, for decision receipts (over HTTP the token's subject is used)")
	f.signing.register(fs)
	fs.StringVar(&f.reviewers, "reviewers", "", "the trusted reviewers file; the server only reads it (default: reviewers.json in the user configuration directory)")
	fs.StringVar(&f.notify.Command, "notify-command", "", "run this program (no shell) for each opened review, the review as JSON on stdin; 10 s timeout")
	fs.StringVar(&f.notify.URL, "notify-url", "", "POST each opened review to this http(s) URL (opt-in outbound network), signed with --notify-secret-file")
	fs.StringVar(&f.notify.SecretFile, "notify-secret-file", "", "the HMAC-SHA256 key of --notify-url (X-Haia-Signature)")
}

// guardSetup is what the guard is built from, loaded once at start.
type guardSetup struct {
	policy    *guard.Config
	rules     *policy.Policy
	log       *reviewlog.Log
	chains    *reviewlog.Chains
	paramsKey []byte
	// reviewersPath is the trusted reviewers file (read, never written).
	reviewersPath string
	notifier      *notify.Group
	notifyMetrics *notify.Metrics
}

// openGuard loads the policy, its custom rules and the signing setup once.
func openGuard(root *confined.Dir, f *serveFlags, logger *slog.Logger) (*guardSetup, error) {
	cfg, err := guard.LoadConfig(f.guardConfig)
	if err != nil {
		return nil, fmt.Errorf("--guard-config: %w", err)
	}
	var rules *policy.Policy
	if cfg.PolicyFile != "" {
		data, err := os.ReadFile(cfg.PolicyFile)
		if err != nil {
			return nil, fmt.Errorf("custom rules: %w", err)
		}
		if rules, err = policy.Parse(data); err != nil {
			return nil, fmt.Errorf("custom rules %s are invalid, refusing to start: %w", cfg.PolicyFile, err)
		}
		logger.Info("custom rules loaded", "policy", rules.ID(), "policy_hash", rules.Hash())
	}
	signer, paramsKey, err := f.signing.open(logger)
	if err != nil {
		return nil, err
	}
	chains := &reviewlog.Chains{Signer: signer, Tenant: f.signing.tenant}
	noteRotation(root, chains, logger)
	reviewersPath, err := reviewersFile(f.reviewers)
	if err != nil {
		return nil, err
	}
	if _, err := reviewlog.LoadReviewers(reviewersPath); err != nil {
		// Not fatal: a root from nothing has no reviewer yet. Every human
		// decision reads unverified until one is trusted.
		logger.Warn("no trusted reviewers: human decisions will read unverified until one is added (haia-trace-mcp reviewer init)", "reviewers", reviewersPath, "err", err)
	} else {
		logger.Info("trusted reviewers file", "reviewers", reviewersPath)
	}
	log := reviewlog.Open(root, reviewlog.Options{ReviewTTL: cfg.ReviewTTL,
		Reviewers: func() (reviewlog.Reviewers, error) { return reviewlog.LoadReviewers(reviewersPath) }})
	return &guardSetup{policy: cfg, rules: rules, log: log, chains: chains, paramsKey: paramsKey, reviewersPath: reviewersPath}, nil
}

// startGuard builds the decision engine over the server's run index and
// registers the guard's tools.
func startGuard(srv *server.Server, g *guardSetup, templates *receipt.TemplateSet, agentID string, logger *slog.Logger) error {
	var onOpen func(reviewlog.Review)
	if g.notifier != nil && g.notifier.Len() > 0 {
		onOpen = func(r reviewlog.Review) {
			m, err := notify.NewMessage(notify.EventOpened, r)
			if err != nil {
				logger.Error("notification not sent", "review_id", r.ID, "err", err)
				return
			}
			g.notifier.Notify(m)
		}
	}
	integrity := prometheus.NewCounter(prometheus.CounterOpts{Name: "haia_review_integrity_warnings_total",
		Help: "Times a review's log lines and its signed receipts disagreed (an unverified decision, a contradicting line)."})
	srv.AddMetrics(integrity)
	if g.notifier != nil {
		srv.AddMetrics(g.notifyMetrics)
	}
	eng, err := engine.New(engine.Config{
		Notify:      onOpen,
		OnIntegrity: integrity.Inc,
		Policy:      g.policy,
		Rules:       g.rules,
		Templates:   templates,
		History:     srv.History(),
		Log:         g.log,
		Chains:      g.chains,
		ParamsKey:   g.paramsKey,
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	logger.Info("guard policy loaded", "source", g.policy.Source, "history_templates", strings.Join(g.policy.HistoryTemplates, ","),
		"unreadable_history", g.policy.UnreadableHistory, "unattributable_history", g.policy.UnattributableHistory)
	return srv.EnableGuard(&server.Guard{Engine: eng, AgentID: agentID})
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
		return nil, nil, nil, fmt.Errorf("trace root: %w", err)
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
func reloadTemplatesOnHUP(ctx context.Context, set *receipt.TemplateSet, historyTemplates []string, logger *slog.Logger) func() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
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
					continue
				}
				logTemplates(r, errs, logger, "SIGHUP: templates reloaded")
			}
		}
	}()
	return func() { signal.Stop(hup) }
}

// serveCommand is the grammar of serving: the top-level usage (every
// command) and the server's own flags.
func serveCommand(stdout, stderr io.Writer) *command {
	return newCommand("", usage, stdout, stderr)
}

func runServe(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := serveCommand(stdout, stderr)
	var f serveFlags
	f.register(c.fs)
	var h httpFlags
	h.register(c.fs)
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if len(pos) != 0 {
		return c.failf("unknown command %q", pos[0])
	}
	logger, err := newLogger(stderr, f.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitUsage
	}
	root, events, templates, err := openTrace(f.dir, f.templatesDir, logger)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitFail
	}
	defer root.Close()
	defer events.Close()
	g, err := openGuard(root, &f, logger)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitFail
	}
	g.notifyMetrics = notify.NewMetrics()
	if g.notifier, err = notify.New(f.notify, notify.Options{Logger: logger, Metrics: g.notifyMetrics}); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitUsage
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.notifier.Close(ctx)
	}()
	srv, err := server.New(server.Config{
		Root:          root,
		Events:        events,
		Templates:     templates,
		Limits:        receipt.DefaultLimits(),
		IndexMaxBytes: f.indexMaxMB << 20,
		Version:       versionString(),
		Logger:        logger,
	})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitFail
	}
	if err := startGuard(srv, g, templates, f.agentID, logger); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitFail
	}
	defer reloadTemplatesOnHUP(ctx, templates, g.policy.HistoryTemplates, logger)()
	if h.addr != "" {
		return runHTTP(ctx, srv, &h, logger, stderr)
	}
	logger.Info("serving MCP over stdio", "root", root.Path())
	stdio := mcpserver.NewStdioServer(srv.MCP())
	stdio.SetErrorLogger(log.New(stderr, "mcp: ", log.LstdFlags))
	if err := stdio.Listen(ctx, stdin, stdout); err != nil && !errors.Is(err, context.Canceled) && !isEOF(err) {
		logger.Error("stdio transport stopped", "err", err)
		return exitFail
	}
	logger.Info("stdin closed; stopping")
	return exitOK
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || strings.Contains(err.Error(), "EOF")
}
