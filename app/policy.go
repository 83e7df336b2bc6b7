package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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
		var ces guard.ConfigErrors
		hint := ""
		if errors.As(err, &ces) {
			hint = fmt.Sprintf(" (haia-trace-mcp policy check %s lists each with its line)", path)
		}
		if flagPath == "" {
			return nil, fmt.Errorf("the guard policy beside the Trace root: %w%s", err, hint)
		}
		return nil, fmt.Errorf("--guard-config: %w%s", err, hint)
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

// PolicyRecord is what a server records of the policy it runs with, as
// the server of tenant ("" for a single root).
func PolicyRecord(pol *guard.Config, tenant string, now time.Time) reviewlog.PolicyRecord {
	return reviewlog.PolicyRecord{Source: pol.Source, SHA256: pol.Hash, Text: string(pol.Text), At: now.UTC().Format(time.RFC3339), Tenant: tenant}
}

// RecordPolicy records the policy this server runs with in its store, for
// the review commands to decide under the same one, with the tenant it
// serves the store as. Another policy recorded there (another replica's,
// or this server's before a change) is replaced, and the log says so.
func RecordPolicy(ctx context.Context, store reviewlog.Store, cfg *guard.Config, tenant string, now time.Time, logger *slog.Logger) error {
	rec := PolicyRecord(cfg, tenant, now)
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

// RecordRefusedReload notes beside the policy recorded in the store that a
// reload of source was refused (why: cause), so that status says so; the
// policy recorded stays the one in force.
func RecordRefusedReload(ctx context.Context, store reviewlog.Store, source string, cause error, now time.Time, logger *slog.Logger) error {
	return store.Locked(ctx, 30*time.Second, func(w reviewlog.Writer) error {
		rec, ok, err := w.Policy(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("the store records no policy in effect")
		}
		rec.Refused = &reviewlog.RefusedPolicy{Source: source, At: now.UTC().Format(time.RFC3339), Error: cause.Error()}
		if err := w.SetPolicy(ctx, rec); err != nil {
			return err
		}
		logger.Info("the refused reload is recorded in the store beside the policy in force", "source", source)
		return nil
	})
}

// RecordedPolicy reads the policy in effect from the store (ok false when
// no server recorded one).
func RecordedPolicy(ctx context.Context, st reviewlog.Store) (rec reviewlog.PolicyRecord, ok bool, err error) {
	err = st.View(ctx, func(r reviewlog.Reader) error {
		rec, ok, err = r.Policy(ctx)
		return err
	})
	if err != nil {
		return rec, false, fmt.Errorf("read the policy the server recorded in %s: %w", st.Describe(), err)
	}
	return rec, ok, nil
}

// PolicyFromRecord parses a recorded policy as the server did; its Source
// says when the server recorded it.
func PolicyFromRecord(rec reviewlog.PolicyRecord) (*guard.Config, error) {
	if rec.Text == "" {
		return guard.DefaultConfig(), nil
	}
	sum := sha256.Sum256([]byte(rec.Text))
	if hex.EncodeToString(sum[:]) != rec.SHA256 {
		return nil, fmt.Errorf("the policy recorded in the store does not match its own hash (%s): it was altered; restart the server to record it again", ShortHash(rec.SHA256))
	}
	pol, err := guard.ParseConfig([]byte(rec.Text), filepath.Dir(rec.Source))
	if err != nil {
		return nil, fmt.Errorf("the policy recorded in the store (%s) does not load: %w", rec.Source, err)
	}
	pol.Source, pol.Text, pol.Hash = rec.Source+" (as the server recorded it at "+rec.At+")", []byte(rec.Text), rec.SHA256
	return pol, nil
}

// ShortHash is a hash cut to twelve digits, for messages.
func ShortHash(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}

// ConfigError is a setting of the caller's that cannot be used as given (a
// command's usage error): a --guard-config that does not load or is not
// the policy in force, a tenant that is not the store's.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// ErrPolicyNotInForce is a --guard-config that is not the policy the
// server recorded in the store.
var ErrPolicyNotInForce = errors.New("not the policy the server runs with")

// toolPolicy is the policy a command goes by: the one the server recorded
// in the store (a guardConfig that differs from it is refused), else
// guardConfig, else the built-in defaults, not known to be the server's.
func toolPolicy(rec reviewlog.PolicyRecord, recorded bool, guardConfig string) (pol *guard.Config, known bool, err error) {
	var given *guard.Config
	if guardConfig != "" {
		if given, err = guard.LoadConfig(guardConfig); err != nil {
			return nil, false, &ConfigError{Err: fmt.Errorf("--guard-config: %w", err)}
		}
	}
	switch {
	case recorded:
		pol, err := PolicyFromRecord(rec)
		if err != nil {
			return nil, false, err
		}
		if given != nil && given.Hash != rec.SHA256 {
			return nil, false, &ConfigError{Err: fmt.Errorf("--guard-config %s is %w (the store records %s, sha256 %s, since %s); drop --guard-config to use the server's, or restart (or SIGHUP) the server with this file; nothing was written",
				guardConfig, ErrPolicyNotInForce, rec.Source, ShortHash(rec.SHA256), rec.At)}
		}
		return pol, true, nil
	case given != nil:
		return given, true, nil
	}
	return guard.DefaultConfig(), false, nil
}
