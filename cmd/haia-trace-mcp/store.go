package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// storeEnv names the store when --store is not given.
const storeEnv = "HAIA_STORE"

// storeSpec is --store, else $HAIA_STORE, else file:.
func storeSpec(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if v := os.Getenv(storeEnv); v != "" {
		return v
	}
	return "file:"
}

// stackFlags are the flags of the commands that open the guard's stack
// beside the server (review, status, audit, authorization show, review
// watch): the Trace root, the store, the trusted reviewers, the policy and
// the tenant. open turns them into the app.Config the server serves the
// same root with, so that every command reads the review log with the
// server's options.
type stackFlags struct {
	dir, store, reviewers, guardConfig, templatesDir, tenantsDir, tenant string
	// tenantScope: --tenant without --tenants-dir is the scope.tenant of
	// the decisions written (review), not a usage error.
	tenantScope bool
}

// register declares the flags every such command takes: --dir, --store,
// --reviewers, --tenants-dir (and --tenant, unless the command declares
// its own).
func (f *stackFlags) register(fs *flag.FlagSet, tenant bool) {
	dirFlagVar(fs, &f.dir)
	storeFlagVar(fs, &f.store)
	reviewersFlagVar(fs, &f.reviewers)
	tenantsDirFlagVar(fs, &f.tenantsDir)
	if tenant {
		tenantFlagVar(fs, &f.tenant)
	}
}

// open opens the guard's stack as a command uses it (app.Config.Tool):
// the same store as the server's, its review log with the server's
// options — the trusted reviewers' keys, passkeys and grants, the tenant,
// the policy the server recorded — and nothing written. tune, when set,
// adjusts the configuration (lock wait, keys). Its error carries the exit
// code and what to print.
func (f *stackFlags) open(ctx context.Context, tune func(*app.Config)) (*app.Stack, error) {
	dir, tenant := f.dir, ""
	switch {
	case f.tenantsDir != "":
		if !receipt.IsSlug(f.tenant) {
			return nil, usageErrorf("--tenants-dir needs --tenant naming one tenant (a bare slug), got %q", f.tenant)
		}
		dir, tenant = filepath.Join(f.tenantsDir, f.tenant), f.tenant
	case f.tenant != "" && !f.tenantScope:
		return nil, usageErrorf("--tenant %q names a tenant of --tenants-dir, which is not given (a tenant's own root, --dir DIR/NAME, is read as its server records it)", f.tenant)
	}
	spec := storeSpec(f.store)
	if err := app.CheckStoreSpec(spec); err != nil {
		return nil, usageErrorf("%v", err)
	}
	// The tenant's own database, where --store names one per tenant.
	if _, err := app.TenantStore(spec, tenant); err != nil {
		return nil, usageErrorf("%v", err)
	}
	reviewers, err := reviewersFile(f.reviewers)
	if err != nil {
		return nil, err
	}
	cfg := app.Config{Dir: dir, Tenant: tenant, Store: spec, ReviewersPath: reviewers, GuardConfig: f.guardConfig,
		TemplatesDir: f.templatesDir, Tool: true, Logger: slog.New(slog.DiscardHandler)}
	if tune != nil {
		tune(&cfg)
	}
	st, err := app.Open(ctx, cfg)
	if err == nil {
		return st, nil
	}
	var re *app.RootError
	var ce *app.CheckError
	var cfgErr *app.ConfigError
	switch {
	case errors.As(err, &re):
		return nil, &exitError{code: exitUsage, err: errors.New(rootOpenProblemRaw(re.Dir, re.Err))}
	case errors.Is(err, app.ErrNotTraceRoot):
		abs, _ := filepath.Abs(dir)
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("%s is not a Trace root: it holds neither events/ nor guard/ "+
			"(a Trace root holds events/<run_id>.ndjson from the recorders and guard/ with the review log); pass --dir with the Trace root", abs)}
	case errors.As(err, &ce):
		abs, _ := filepath.Abs(dir)
		return nil, fmt.Errorf("%s/%s: %w", abs, ce.Name, ce.Err)
	case errors.As(err, &cfgErr):
		return nil, &exitError{code: exitUsage, err: err}
	}
	return nil, err
}

// errPolicyUnknown is why a command that decides refuses to when the
// server's policy cannot be known.
const errPolicyUnknown = "the policy the server runs with is not recorded in the guard's store (a server records it once it serves), and no --guard-config was given: a decision could be taken under another reviewTtlMinutes than the server's. Start the server once on this store, or pass --guard-config with the file it runs with; nothing was written"

const storeDetails = `migrate applies the schema migrations this binary carries (safe to run from
every replica at once: they take turns) and refuses a schema ahead of the
binary. With --grant ROLE it then gives ROLE, the role the server runs
as, what a server needs and nothing more (run it as the tables' owner). import copies the file store under the Trace root's guard/ into an
empty PostgreSQL store; every chain is verified before and after, and the
copy is byte for byte. export writes the PostgreSQL store back out as the
file layout under OUT/guard/ (which must be empty or absent).
--store defaults to $HAIA_STORE. Exit codes: 0 done, 1 error, 2 usage,
3 a chain does not verify (nothing was copied)
`

// defineStore is `store migrate|import|export` (verb).
func defineStore(verb string) func(fs *flag.FlagSet) runFunc {
	return func(fs *flag.FlagSet) runFunc {
		storeFlag := storeFlag(fs)
		var dir, grant *string
		switch verb {
		case "migrate":
			grant = fs.String("grant", "", "after migrating, give `ROLE` (the role the server runs as, not the one migrating) what a server needs and nothing more: read and append the signed records, update the working tables; it then owns nothing (docs/store.md, Roles)")
		case "import":
			dir = fs.String("dir", "", "the Trace root `DIR` whose guard/ is copied from (required)")
		case "export":
			dir = fs.String("dir", "", "the `DIR` whose guard/ the store is written to, as the file layout (required)")
		}
		return func(ctx context.Context, env *cmdEnv, _ []string) error {
			return runStore(ctx, env.stdout, env.stderr, verb, storeFlag, dir, grant)
		}
	}
}

func runStore(ctx context.Context, stdout, stderr io.Writer, verb string, storeFlag, dir, grant *string) error {
	spec := storeSpec(*storeFlag)
	if !pgstore.IsURL(spec) {
		return usageErrorf("--store (or $%s) must be a postgres:// URL", storeEnv)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if verb == "migrate" {
		before, after, err := pgstore.Migrate(ctx, spec, logger)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp store migrate: %s\n", termsafe.String(err.Error()))
			return exitCode(exitFail)
		}
		switch {
		case before.Database == after.Database && len(after.Applied) > 0:
			// An earlier migration the database lacked: applied, the
			// version unchanged.
			applied := make([]string, len(after.Applied))
			for i, v := range after.Applied {
				applied[i] = strconv.FormatInt(v, 10)
			}
			fmt.Fprintf(stdout, "%s: schema version %d, with the earlier migrations it lacked applied: %s\n", pgstore.Redact(spec), after.Database, strings.Join(applied, ", "))
		case before.Database == after.Database:
			fmt.Fprintf(stdout, "%s: schema version %d, already this binary's\n", pgstore.Redact(spec), after.Database)
		default:
			fmt.Fprintf(stdout, "%s: schema version %d → %d\n", pgstore.Redact(spec), before.Database, after.Database)
		}
		if *grant != "" {
			stmts, err := pgstore.Grant(ctx, spec, *grant)
			if err != nil {
				fmt.Fprintf(stderr, "haia-trace-mcp store migrate: %s\n", termsafe.String(err.Error()))
				return exitCode(exitFail)
			}
			fmt.Fprintf(stdout, "granted %s what a server needs, and nothing more:\n", *grant)
			for _, s := range stmts {
				fmt.Fprintf(stdout, "  %s\n", s)
			}
		}
		return nil
	}
	if *dir == "" {
		return usageErrorf("--dir names the Trace root to %s", map[string]string{"import": "import from", "export": "export to"}[verb])
	}
	pg, err := pgstore.Open(ctx, spec)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp store %s: %s\n", verb, termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	defer pg.Close()
	var root *confined.Dir
	if verb == "import" {
		r, code := openCLIRoot("store import", *dir, stderr)
		if r == nil {
			return exitCode(code)
		}
		root = r
	} else {
		if err := os.MkdirAll(*dir, 0o755); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp store export: --dir: %v\n", err)
			return exitCode(exitFail)
		}
		if root, err = confined.OpenRoot(*dir); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp store export: --dir: %v\n", err)
			return exitCode(exitFail)
		}
	}
	defer root.Close()
	files := filestore.New(root)
	src, dst := reviewlog.Store(files), reviewlog.Store(pg)
	if verb == "export" {
		src, dst = pg, files
	}
	var rep reviewlog.CopyReport
	err = newProgress(stderr, "store "+verb).during("copying "+src.Describe()+" → "+dst.Describe()+", verifying every chain before and after", func() (err error) {
		rep, err = reviewlog.CopyStore(ctx, src, dst)
		return err
	})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp store %s: %s\n", verb, termsafe.String(err.Error()))
		if errors.Is(err, reviewlog.ErrChainInvalid) {
			return exitCode(3)
		}
		return exitCode(exitFail)
	}
	fmt.Fprintf(stdout, "%s %s → %s: %d review log lines, %d archives, %d chains (%d receipts, every one VALID before and after), %d keys, %d ledger entries, %d mandate records\n",
		verb, src.Describe(), dst.Describe(), rep.LogLines, rep.Archives, rep.Chains, rep.Receipts, rep.Keys, rep.LedgerEntries, rep.Mandates)
	return nil
}

// replicaName names this process in the notification outbox's claims.
func replicaName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}
