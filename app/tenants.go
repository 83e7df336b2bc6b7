package app

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Tenants are the stacks of every tenant under one directory: each
// subdirectory named by a bare slug is a tenant's Trace root, with its own
// catalog, review log and decision chain.
type Tenants struct {
	names  []string
	stacks map[string]*Stack
}

// OpenTenants opens one stack per tenant under dir, each from cfg with its
// Dir and Tenant set; the set is read once. The tenants share one
// integrity counter. Each tenant keeps its guard state apart: under its own
// root with the file store, in its own database with PostgreSQL (the
// --store URL names it with TenantPlaceholder, see TenantStore).
func OpenTenants(ctx context.Context, dir string, cfg Config) (*Tenants, error) {
	if _, err := TenantStore(cfg.Store, "t"); err != nil {
		return nil, err
	}
	if cfg.Integrity == nil {
		cfg.Integrity = NewIntegrityCounter()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := confined.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("--tenants-dir: %w", err)
	}
	entries, err := d.ReadDir()
	base := d.Path()
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("--tenants-dir: %w", err)
	}
	ts := &Tenants{stacks: map[string]*Stack{}}
	for _, e := range entries {
		if e.Type&fs.ModeDir == 0 || !receipt.IsSlug(e.Name) {
			if e.Type&fs.ModeSymlink != 0 {
				cfg.Logger.Warn("--tenants-dir: a symbolic link is no tenant root; skipped", "name", e.Name)
			}
			continue
		}
		tc := cfg
		tc.Dir, tc.Tenant = filepath.Join(base, e.Name), e.Name
		tc.Logger = cfg.Logger.With("tenant", e.Name)
		st, err := Open(ctx, tc)
		if err != nil {
			ts.Close()
			return nil, fmt.Errorf("tenant %s: %w", e.Name, err)
		}
		ts.stacks[e.Name] = st
		ts.names = append(ts.names, e.Name)
		cfg.Logger.Info("tenant served", "tenant", e.Name, "root", st.Root().Path())
	}
	if len(ts.names) == 0 {
		return nil, fmt.Errorf("--tenants-dir %s holds no tenant (a subdirectory named by [A-Za-z0-9_-] per tenant)", dir)
	}
	slices.Sort(ts.names)
	return ts, nil
}

// Names are the tenants, in name order.
func (ts *Tenants) Names() []string { return slices.Clone(ts.names) }

// Stack is a tenant's stack (nil for an unknown tenant).
func (ts *Tenants) Stack(name string) *Stack { return ts.stacks[name] }

// Ready asks every tenant, in name order, and names the first that is not
// ready: one tenant that cannot record a decision takes the process out of
// service, since its callers would otherwise get only errors.
func (ts *Tenants) Ready(ctx context.Context) error {
	for _, name := range ts.names {
		err := ts.stacks[name].Ready(ctx)
		if err == nil {
			continue
		}
		return engine.TenantNotReady(name, err)
	}
	return nil
}

// Start starts every tenant's stack, in name order (see Stack.Start).
func (ts *Tenants) Start(ctx context.Context) error {
	for _, name := range ts.names {
		if err := ts.stacks[name].Start(ctx); err != nil {
			return fmt.Errorf("tenant %s: %w", name, err)
		}
	}
	return nil
}

// Close closes every tenant's stack.
func (ts *Tenants) Close() {
	for _, st := range ts.stacks {
		st.Close()
	}
}
