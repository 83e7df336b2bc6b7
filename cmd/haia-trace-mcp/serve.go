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
	"strings"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"

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
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "dir", ".trace", "the Trace root (events/, templates/, guard/)")
	fs.StringVar(&f.templatesDir, "templates-dir", "", "the operator's templates directory (default: <dir>/templates)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level on stderr: debug, info, warn, error")
	fs.Int64Var(&f.indexMaxMB, "index-max-mb", 256, "memory budget of the run index, in MiB")
	fs.StringVar(&f.guardConfig, "guard-config", "", "the guard policy (haia-guard.config.json); default: built-in defaults")
	fs.StringVar(&f.agentID, "agent-id", "local-agent", "who the caller is over stdio, for decision receipts (over HTTP the token's subject is used)")
	f.signing.register(fs)
}

// openGuard loads the policy, its custom rules and the signing setup once.
func openGuard(root *confined.Dir, f *serveFlags, logger *slog.Logger) (*server.Guard, error) {
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
	return &server.Guard{
		Policy:    cfg,
		Rules:     rules,
		Log:       reviewlog.Open(root, reviewlog.Options{}),
		Chains:    chains,
		ParamsKey: paramsKey,
		AgentID:   f.agentID,
	}, nil
}

func newLogger(stderr io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: l})), nil
}

// openTrace opens the Trace root, its events/ directory and the template
// resolver, all confined to real paths resolved once.
func openTrace(dir, templatesDir string) (root, events *confined.Dir, res receipt.Resolver, err error) {
	root, err = confined.OpenRoot(dir)
	if err != nil {
		return nil, nil, res, fmt.Errorf("trace root: %w", err)
	}
	events, err = root.OpenDir("events")
	if err != nil {
		root.Close()
		return nil, nil, res, fmt.Errorf("trace root %s: events directory: %w", root.Path(), err)
	}
	var tdir *confined.Dir
	if templatesDir != "" {
		tdir, err = confined.OpenRoot(templatesDir)
		if err != nil {
			root.Close()
			events.Close()
			return nil, nil, res, fmt.Errorf("--templates-dir: %w", err)
		}
	} else if tdir, err = root.OpenDir("templates"); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			root.Close()
			events.Close()
			return nil, nil, res, fmt.Errorf("trace root %s: templates directory: %w", root.Path(), err)
		}
		tdir, err = nil, nil
	}
	if tdir != nil {
		res.Dir = tdir.FS(maxTemplateBytes)
	}
	return root, events, res, nil
}

func runServe(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("haia-trace-mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	f.register(fs)
	var h httpFlags
	h.register(fs)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "haia-trace-mcp: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	logger, err := newLogger(stderr, f.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitUsage
	}
	root, events, resolver, err := openTrace(f.dir, f.templatesDir)
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
	srv, err := server.New(server.Config{
		Guard:         g,
		Root:          root,
		Events:        events,
		Templates:     resolver,
		Limits:        receipt.DefaultLimits(),
		IndexMaxBytes: f.indexMaxMB << 20,
		Version:       versionString(),
		Logger:        logger,
	})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp: %v\n", err)
		return exitFail
	}
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
