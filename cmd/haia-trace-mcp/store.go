package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
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

// openCLIStore opens --dir (a Trace root, see openCLIRoot) and the store
// for a command-line tool. With the PostgreSQL store, guard/ need not exist
// under the root.
func openCLIStore(ctx context.Context, command, dir, spec string, stderr io.Writer) (*confined.Dir, reviewlog.Store, int) {
	if err := app.CheckStoreSpec(spec); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %v\n", command, err)
		return nil, nil, exitUsage
	}
	if _, err := app.TenantStore(spec, ""); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %v\n", command, err)
		return nil, nil, exitUsage
	}
	root, code := openCLIRoot(command, dir, stderr)
	if root == nil {
		return nil, nil, code
	}
	st, err := app.OpenStore(ctx, root, spec)
	if err != nil {
		root.Close()
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %s\n", command, termsafe.String(err.Error()))
		return nil, nil, exitFail
	}
	return root, st, exitOK
}

// cliGuard is what the review-log commands open first: the Trace root, the
// guard's store, the trusted reviewers file and the policy.
type cliGuard struct {
	root          *confined.Dir
	store         reviewlog.Store
	reviewersPath string
	policy        *guard.Config
	// tenant is the tenant of a --tenants-dir server whose root this is
	// ("" for a single root): its review log trusts only the reviewers
	// the file grants it.
	tenant string
	// policyKnown is false when the policy the server runs with could not
	// be known (nothing recorded in the store, no --guard-config): policy
	// is then the built-in defaults, fit for listing but not for deciding.
	policyKnown bool
}

// errPolicyUnknown is why a command that decides refuses to when the
// server's policy cannot be known.
const errPolicyUnknown = "the policy the server runs with is not recorded in the guard's store (a server records it when it starts), and no --guard-config was given: a decision could be taken under another reviewTtlMinutes than the server's. Start the server once on this store, or pass --guard-config with the file it runs with; nothing was written"

func (g *cliGuard) Close() { g.store.Close(); g.root.Close() }

// openCLIGuard opens them for command, printing what went wrong and
// returning the exit code when something did.
func openCLIGuard(ctx context.Context, command, dir, storeFlag, reviewers, guardConfig string, stderr io.Writer) (*cliGuard, int) {
	root, st, code := openCLIStore(ctx, command, dir, storeSpec(storeFlag), stderr)
	if root == nil {
		return nil, code
	}
	g := &cliGuard{root: root, store: st}
	var err error
	if g.reviewersPath, err = reviewersFile(reviewers); err != nil {
		g.Close()
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %v\n", command, err)
		return nil, exitFail
	}
	if code := g.openPolicy(ctx, command, guardConfig, stderr); code != exitOK {
		g.Close()
		return nil, code
	}
	return g, exitOK
}

// openPolicy finds the policy the server runs with: the one the server
// recorded in the store (a --guard-config that differs from it is
// refused), else --guard-config, else unknown (built-in defaults, for
// listing only; see policyKnown).
func (g *cliGuard) openPolicy(ctx context.Context, command, guardConfig string, stderr io.Writer) int {
	rec, recorded, err := recordedPolicy(ctx, g.store)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp %s: %s\n", command, termsafe.String(err.Error()))
		return exitFail
	}
	var given *guard.Config
	if guardConfig != "" {
		if given, err = guard.LoadConfig(guardConfig); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp %s: --guard-config: %v\n", command, err)
			return exitUsage
		}
	}
	switch {
	case recorded:
		pol, err := policyFromRecord(rec)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp %s: %s\n", command, termsafe.String(err.Error()))
			return exitFail
		}
		if given != nil && given.Hash != rec.SHA256 {
			fmt.Fprintf(stderr, "haia-trace-mcp %s: --guard-config %s is not the policy the server runs with (the store records %s, sha256 %s, since %s); drop --guard-config to use the server's, or restart (or SIGHUP) the server with this file; nothing was written\n",
				command, guardConfig, termsafe.String(rec.Source), shortHash(rec.SHA256), rec.At)
			return exitUsage
		}
		g.policy, g.policyKnown = pol, true
	case given != nil:
		g.policy, g.policyKnown = given, true
	default:
		g.policy = guard.DefaultConfig()
	}
	return exitOK
}

// recordedPolicy reads the policy in effect from the store.
func recordedPolicy(ctx context.Context, st reviewlog.Store) (rec reviewlog.PolicyRecord, ok bool, err error) {
	err = st.View(ctx, func(r reviewlog.Reader) error {
		rec, ok, err = r.Policy(ctx)
		return err
	})
	if err != nil {
		return rec, false, fmt.Errorf("read the policy the server recorded in %s: %w", st.Describe(), err)
	}
	return rec, ok, nil
}

// policyFromRecord parses a recorded policy as the server did.
func policyFromRecord(rec reviewlog.PolicyRecord) (*guard.Config, error) {
	if rec.Text == "" {
		return guard.DefaultConfig(), nil
	}
	sum := sha256.Sum256([]byte(rec.Text))
	if hex.EncodeToString(sum[:]) != rec.SHA256 {
		return nil, fmt.Errorf("the policy recorded in the store does not match its own hash (%s): it was altered; restart the server to record it again", shortHash(rec.SHA256))
	}
	pol, err := guard.ParseConfig([]byte(rec.Text), filepath.Dir(rec.Source))
	if err != nil {
		return nil, fmt.Errorf("the policy recorded in the store (%s) does not load: %w", rec.Source, err)
	}
	pol.Source, pol.Text, pol.Hash = rec.Source+" (as the server recorded it at "+rec.At+")", []byte(rec.Text), rec.SHA256
	return pol, nil
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}

// loadReviewers reads the trusted reviewers each time a decision is
// verified.
func (g *cliGuard) loadReviewers() (reviewlog.Reviewers, error) {
	return reviewlog.LoadReviewers(g.reviewersPath)
}

// loadPasskeys reads the trusted reviewers' passkeys each time a decision
// is verified.
func (g *cliGuard) loadPasskeys() (reviewlog.Passkeys, error) {
	return reviewlog.LoadPasskeys(g.reviewersPath)
}

// grantOptions sets o's tenant and grants as the server reads them: for a
// tenant of a --tenants-dir server, only the reviewers the file grants it
// decide; a single root reads no grant.
func (g *cliGuard) grantOptions(o reviewlog.Options) reviewlog.Options {
	if g.tenant != "" {
		path := g.reviewersPath
		o.Tenant = g.tenant
		o.Grants = func() (reviewlog.Grants, error) { return reviewlog.LoadGrants(path) }
	}
	return o
}

const storeDetails = `migrate applies the schema migrations this binary carries (safe to run from
every replica at once: they take turns) and refuses a schema ahead of the
binary. import copies the file store under the Trace root's guard/ into an
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
		var dir *string
		switch verb {
		case "import":
			dir = fs.String("dir", "", "the Trace root `DIR` whose guard/ is copied from (required)")
		case "export":
			dir = fs.String("dir", "", "the `DIR` whose guard/ the store is written to, as the file layout (required)")
		}
		return func(ctx context.Context, env *cmdEnv, _ []string) error {
			return runStore(ctx, env.stdout, env.stderr, verb, storeFlag, dir)
		}
	}
}

func runStore(ctx context.Context, stdout, stderr io.Writer, verb string, storeFlag, dir *string) error {
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
	fmt.Fprintf(stdout, "%s %s → %s: %d review log lines, %d archives, %d chains (%d receipts, every one VALID before and after), %d keys\n",
		verb, src.Describe(), dst.Describe(), rep.LogLines, rep.Archives, rep.Chains, rep.Receipts, rep.Keys)
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
