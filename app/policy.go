package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// LoadPolicy reads the policy file named (flagPath), else the one init
// wrote beside the root when there is one, else takes the built-in
// defaults; it says which in the log.
func LoadPolicy(flagPath, rootPath string, logger *slog.Logger) (*guard.Config, error) {
	path := flagPath
	if path == "" {
		if _, err := os.Lstat(PolicyFileBeside(rootPath)); err == nil {
			path = PolicyFileBeside(rootPath)
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

// LoadRules reads the custom rules the policy names ("policy"), or none.
// outcome says what a bad file means ("refusing to start").
func LoadRules(cfg *guard.Config, outcome string, logger *slog.Logger) (*policy.Policy, error) {
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

// PolicyRecord is what a server records of the policy it runs with.
func PolicyRecord(pol *guard.Config, now time.Time) reviewlog.PolicyRecord {
	return reviewlog.PolicyRecord{Source: pol.Source, SHA256: pol.Hash, Text: string(pol.Text), At: now.UTC().Format(time.RFC3339)}
}

// RecordPolicy records the policy this server runs with in its store, for
// the review commands to decide under the same one. Another policy recorded
// there (another replica's, or this server's before a change) is replaced,
// and the log says so.
func RecordPolicy(ctx context.Context, store reviewlog.Store, cfg *guard.Config, now time.Time, logger *slog.Logger) error {
	rec := PolicyRecord(cfg, now)
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
