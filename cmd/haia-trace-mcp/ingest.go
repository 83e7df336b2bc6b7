package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/ingest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

const ingestKeyDetails = `An ingest key lets a Haia Trace recorder's Control Plane writer post its
events to a server started with --ingest (POST /v1/events:batch, the key in
the x-haia-api-key header). create prints a new key once: the keys file
keeps only its SHA-256, its public id and its tenant. list shows the ids;
revoke refuses a key from the server's next request on.

The keys file is ingest-keys.json beside the trusted reviewers file
(--reviewers, default in the configuration directory), or --ingest-keys.
A key made with --tenant NAME delivers to tenant NAME of a --tenants-dir
server; one without delivers to a server of one Trace root.

exit codes: 0 done, 1 error, 2 usage
`

// ingestFlags are the serve flags of the ingest endpoint.
type ingestFlags struct {
	on      bool
	keys    string
	maxBody int64
}

func (f *ingestFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "ingest", false, "with --http: accept Haia Trace recorders' events at POST /v1/events:batch (the Control Plane writer's endpoint), authenticated by the keys ingest-key create makes; events land in the Trace root's events/")
	fs.StringVar(&f.keys, "ingest-keys", "", "the ingest keys `FILE` (default: ingest-keys.json beside the trusted reviewers file)")
	fs.Int64Var(&f.maxBody, "ingest-max-body", ingest.DefaultMaxBody, "largest batch body in bytes (413 past it)")
}

// ingestKeysPath is --ingest-keys, else ingest-keys.json beside the
// trusted reviewers file.
func ingestKeysPath(keysFlag, reviewersFlag string) (string, error) {
	if keysFlag != "" {
		return keysFlag, nil
	}
	reviewers, err := reviewersFile(reviewersFlag)
	if err != nil {
		return "", fmt.Errorf("%w (or --ingest-keys)", err)
	}
	return filepath.Join(filepath.Dir(reviewers), ingest.KeysFileName), nil
}

// pgIngest keeps ingested events in each tenant's PostgreSQL database
// (ingest_events) and copies them into this replica's own run files: on
// every commit of any replica (LISTEN, and a poll every second), and
// before a batch this replica took is acknowledged, so that its own
// tools read what it acknowledged.
type pgIngest struct {
	events map[string]*pgstore.Events
	mirror *ingest.Mirror
	logger *slog.Logger
}

func (p *pgIngest) Store(ctx context.Context, tenant string, events []ingest.Event) ([]bool, error) {
	e := p.events[tenant]
	if e == nil {
		return nil, fmt.Errorf("no PostgreSQL store for tenant %q", tenant)
	}
	dup, err := e.Store(ctx, tenant, events)
	if err != nil {
		return nil, err
	}
	if _, err := p.mirror.Sync(ctx, tenant); err != nil {
		// Stored and durable; the copy catches up on the next notification.
		p.logger.WarnContext(ctx, "ingest: the events are stored, the run files' copy is behind", "tenant", tenant, "err", err)
	}
	return dup, nil
}

func (p *pgIngest) Since(ctx context.Context, tenant string, after int64, limit int) ([]ingest.Stored, error) {
	e := p.events[tenant]
	if e == nil {
		return nil, fmt.Errorf("no PostgreSQL store for tenant %q", tenant)
	}
	return e.Since(ctx, tenant, after, limit)
}

func (p *pgIngest) close() {
	for _, e := range p.events {
		e.Close()
	}
	p.mirror.Close()
}

// openPGIngest opens the events table of every served tenant's database,
// brings this replica's run files up to it, and keeps them so.
func openPGIngest(ctx context.Context, spec string, roots map[string]string, logger *slog.Logger) (*pgIngest, func(), error) {
	// A replica's root is its own copy of the table, often an empty
	// directory at first: give it the root's layout, guard/ included,
	// where the run index is saved so that a restart answers from it
	// instead of reading every run again.
	for _, root := range roots {
		if _, err := app.InitRoot(root); err != nil {
			return nil, nil, fmt.Errorf("--ingest: the replica's Trace root %s: %w", root, err)
		}
	}
	p := &pgIngest{events: map[string]*pgstore.Events{}, logger: logger}
	p.mirror = ingest.NewMirror(p, roots, logger)
	for tenant := range roots {
		dsn, err := app.TenantStore(spec, tenant)
		if err == nil {
			p.events[tenant], err = pgstore.OpenEvents(ctx, dsn)
		}
		if err != nil {
			p.close()
			return nil, nil, fmt.Errorf("--ingest: %w", err)
		}
	}
	if err := p.mirror.SyncAll(ctx); err != nil {
		p.close()
		return nil, nil, fmt.Errorf("--ingest: copy the ingested events into the run files: %w", err)
	}
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for tenant, e := range p.events {
		wg.Go(func() {
			e.Listen(lctx, time.Second, func() {
				if _, err := p.mirror.Sync(lctx, tenant); err != nil && lctx.Err() == nil {
					logger.Warn("ingest: copying the ingested events into the run files failed; retrying", "tenant", tenant, "err", err)
				}
			}, logger)
		})
	}
	return p, func() { cancel(); wg.Wait(); p.close() }, nil
}

// ingestHandler builds the batch endpoint over the served stacks' roots:
// with the file store, events are appended to the run files; with
// PostgreSQL, to the events table, which every replica copies into its
// own run files.
func ingestHandler(ctx context.Context, f *ingestFlags, reviewers, store string, servers map[string]*served, logger *slog.Logger) (http.Handler, func(), error) {
	if f.maxBody <= 0 {
		return nil, nil, usageErrorf("--ingest-max-body must be above zero")
	}
	path, err := ingestKeysPath(f.keys, reviewers)
	if err != nil {
		return nil, nil, err
	}
	keys, err := ingest.OpenKeys(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--ingest: %w", err)
	}
	roots := map[string]string{}
	for name, s := range servers {
		roots[name] = s.st.Root().Path()
	}
	var sink ingest.Sink
	var closeSink func()
	where := "the run files"
	if spec := storeSpec(store); app.IsFileStore(spec) {
		fs := ingest.NewFileSink(roots)
		sink, closeSink = fs, fs.Close
	} else {
		if sink, closeSink, err = openPGIngest(ctx, spec, roots, logger); err != nil {
			return nil, nil, err
		}
		where = "PostgreSQL (ingest_events), copied into the run files"
	}
	h, err := ingest.NewHandler(ingest.Config{
		Keys:    keys,
		Sink:    sink,
		Serves:  func(t string) bool { _, ok := roots[t]; return ok },
		MaxBody: f.maxBody,
		Logger:  logger,
	})
	if err != nil {
		closeSink()
		return nil, nil, err
	}
	logger.Info("accepting recorders' events", "path", ingest.Path, "keys", path, "into", where)
	return h, closeSink, nil
}

func ingestKeysFlags(fs *flag.FlagSet) (keys, reviewers *string) {
	keys = fs.String("ingest-keys", "", "the ingest keys `FILE` (default: ingest-keys.json beside the trusted reviewers file)")
	reviewers = reviewersFlag(fs)
	return keys, reviewers
}

// defineIngestKeyCreate is `ingest-key create`.
func defineIngestKeyCreate(fs *flag.FlagSet) runFunc {
	keys, reviewers := ingestKeysFlags(fs)
	tenant := fs.String("tenant", "", "the tenant `NAME` of a --tenants-dir server the key delivers to (none: a server of one Trace root)")
	return func(_ context.Context, env *cmdEnv, _ []string) error {
		path, err := ingestKeysPath(*keys, *reviewers)
		if err != nil {
			fmt.Fprintf(env.stderr, "haia-trace-mcp ingest-key create: %v\n", err)
			return exitCode(exitFail)
		}
		key, rec, err := ingest.NewKey(path, *tenant, time.Now())
		if err != nil {
			fmt.Fprintf(env.stderr, "haia-trace-mcp ingest-key create: %s\n", termsafe.String(err.Error()))
			return exitCode(exitFail)
		}
		fmt.Fprintln(env.stdout, key)
		where := "a server of one Trace root"
		if rec.Tenant != "" {
			where = "tenant " + rec.Tenant
		}
		fmt.Fprintf(env.stderr, "ingest key %s for %s, kept as its hash in %s\n", rec.ID, where, path)
		fmt.Fprintln(env.stderr, "the key above is shown once: give it to the recorder (createCpEventWriter({url, apiKey, agentId, runId}))")
		return nil
	}
}

// defineIngestKeyList is `ingest-key list`.
func defineIngestKeyList(fs *flag.FlagSet) runFunc {
	keys, reviewers := ingestKeysFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	return func(_ context.Context, env *cmdEnv, _ []string) error {
		path, err := ingestKeysPath(*keys, *reviewers)
		if err == nil {
			var list []ingest.KeyRecord
			if list, err = ingest.ListKeys(path); err == nil {
				return printIngestKeys(env.stdout, list, *asJSON)
			}
		}
		fmt.Fprintf(env.stderr, "haia-trace-mcp ingest-key list: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
}

func printIngestKeys(w io.Writer, list []ingest.KeyRecord, asJSON bool) error {
	if asJSON {
		if list == nil {
			list = []ingest.KeyRecord{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	}
	if len(list) == 0 {
		fmt.Fprintln(w, "no ingest keys")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tCREATED\tREVOKED")
	for _, r := range list {
		tenant, revoked := r.Tenant, r.RevokedAt
		if tenant == "" {
			tenant = "-"
		}
		if revoked == "" {
			revoked = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", termsafe.String(r.ID), termsafe.String(tenant), termsafe.String(r.CreatedAt), termsafe.String(revoked))
	}
	return tw.Flush()
}

// defineIngestKeyRevoke is `ingest-key revoke ID`.
func defineIngestKeyRevoke(fs *flag.FlagSet) runFunc {
	keys, reviewers := ingestKeysFlags(fs)
	return func(_ context.Context, env *cmdEnv, pos []string) error {
		path, err := ingestKeysPath(*keys, *reviewers)
		if err == nil {
			var rec ingest.KeyRecord
			if rec, err = ingest.RevokeKey(path, pos[0], time.Now()); err == nil {
				fmt.Fprintf(env.stdout, "ingest key %s revoked; a server refuses it from its next request on\n", rec.ID)
				return nil
			}
		}
		fmt.Fprintf(env.stderr, "haia-trace-mcp ingest-key revoke: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
}
