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
	"text/tabwriter"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ingest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
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

// ingestHandler builds the batch endpoint over the served stacks' roots.
func ingestHandler(f *ingestFlags, reviewers string, servers map[string]*served, logger *slog.Logger) (http.Handler, func(), error) {
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
	sink := ingest.NewFileSink(roots)
	h, err := ingest.NewHandler(ingest.Config{
		Keys:    keys,
		Sink:    sink,
		Serves:  func(t string) bool { _, ok := roots[t]; return ok },
		MaxBody: f.maxBody,
		Logger:  logger,
	})
	if err != nil {
		sink.Close()
		return nil, nil, err
	}
	logger.Info("accepting recorders' events", "path", ingest.Path, "keys", path)
	return h, sink.Close, nil
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
