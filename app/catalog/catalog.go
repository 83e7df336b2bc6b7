// Package catalog is the read model of a Trace root: the index of its run
// files, the summaries and pages of its operations, the one way to find an
// operation, and the guard's history with its cache. The MCP tools, the
// review commands, the reviewer console and an embedded decision engine all
// read runs through a Catalog, so that they see the same operations under
// the same templates.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Config is what a Catalog reads; the caller opens the directories once.
type Config struct {
	// Events is the Trace root's events/ directory (it may not exist yet:
	// see confined.Dir.OpenDirLazy).
	Events *confined.Dir
	// Root, when set, is the Trace root: messages name paths relative to
	// it. Without it they are relative to Events.
	Root *confined.Dir
	// Templates resolves template names (the operator's first); nil means
	// the bundled templates only.
	Templates receipt.TemplateSource
	// Limits bound run files; the zero value means receipt.DefaultLimits.
	Limits receipt.Limits
	// MaxBytes bounds the memory of the run index (0: runindex's default).
	MaxBytes int64
	Logger   *slog.Logger
	// State, when set, is where the run index is saved between processes
	// (runindex.IndexFile), so that a restart answers from it; every run is
	// still checked against its file, and read again where it changed.
	State *confined.Dir
	// Progress, when set, is told how a refresh of the run index that
	// must read runs goes (a cold index reads them all): runindex's
	// Options.Progress.
	Progress func(done, total int)
	// Reading, when set, is told before a refresh reads run files about
	// how many bytes it will read, and what it returns is called once they
	// are read: runindex's Options.Reading.
	Reading func(bytes int64) (done func())
	// SaveDelay is a test hook: a save of the run index waits this long
	// before each run (runindex.Options.SaveDelay).
	SaveDelay time.Duration
	// noBackground keeps the runs a restart took from the saved index
	// there until used (tests that count what is decoded).
	noBackground bool
}

// Catalog reads the operations of one Trace root. It is safe for
// concurrent use.
type Catalog struct {
	cfg   Config
	index *runindex.Index[Summary, guard.EventFacts]
	// histCache keeps the guard's history per template while no run
	// changed (see History).
	histMu    sync.Mutex
	histCache map[string]*cachedHistory
	// sinceCache is HistorySince's, per template; digests are the runs'
	// digests as last read (see digestFor), digestsRead how many were
	// read from a saved index.
	sinceCache  map[string]*cachedSince
	digMu       sync.Mutex
	digests     map[string]*digestEntry
	digestsRead atomic.Int64
	// cursors writes the next-page cursors of List.
	cursors cursorCodec
	// warming is set while Warm reads the runs; readDone and readTotal are
	// how far the last refresh that read runs went.
	warming             atomic.Bool
	readDone, readTotal atomic.Int64
}

// New builds a catalog over cfg.Events; nothing is read until asked.
func New(cfg Config) (*Catalog, error) {
	if cfg.Events == nil {
		return nil, errors.New("catalog: the events directory must be open")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Templates == nil {
		cfg.Templates = receipt.Resolver{} // the bundled templates only
	}
	if cfg.Limits.MaxRunBytes <= 0 {
		cfg.Limits = receipt.DefaultLimits()
	}
	c := &Catalog{cfg: cfg}
	c.index = runindex.New(runindex.Options[Summary, guard.EventFacts]{
		Events:    cfg.Events,
		Limits:    cfg.Limits,
		MaxBytes:  cfg.MaxBytes,
		Extract:   extractFacts,
		Compact:   compactEvent,
		Summarize: summarize,
		ItemCost:  summaryCost,
		// Each run's summaries are kept in listing order, with positions
		// by completeness, so a listing merges runs instead of sorting all.
		Compare:     compareSummaries,
		Facet:       func(s *Summary) string { return s.Completeness },
		OperationID: func(s *Summary) string { return s.OperationID },
		Logger:      cfg.Logger,
		Progress: func(done, total int) {
			c.readDone.Store(int64(done))
			c.readTotal.Store(int64(total))
			if cfg.Progress != nil {
				cfg.Progress(done, total)
			}
		},
		Reading:    cfg.Reading,
		State:      cfg.State,
		EncodeItem: encodeSummary,
		DecodeItem: decodeSummary,
		Digest:     writeDigest,
		SaveDelay:  cfg.SaveDelay,
		Version:    buildVersion,
		// A restart lists from the saved index's headers, decoding the runs
		// a page needs; the rest are decoded meanwhile, for the guard.
		DecodeInBackground: !cfg.noBackground,
	})
	return c, nil
}

// Warm refreshes the run index once, as a server's first question would:
// a first start reads every run, a restart checks the saved index against
// the files and reads only what changed. It decodes nothing a restart took
// from the saved index (a question decodes what it needs). While it runs,
// Warming says so; call BeginWarm first when readiness must not see the
// moment before it starts.
func (c *Catalog) Warm(ctx context.Context) error {
	c.BeginWarm()
	defer c.warming.Store(false)
	t, err := c.Template(guard.DefaultTemplate)
	if err != nil {
		return err
	}
	_, err = c.index.ListSomeQuiet(ctx, t, nil, func(runs []runindex.RunView[Summary]) []bool { return make([]bool, len(runs)) })
	return err
}

// BeginWarm marks the catalog as warming until the Warm that follows ends.
func (c *Catalog) BeginWarm() {
	if !c.warming.Swap(true) {
		c.readDone.Store(0)
		c.readTotal.Store(0)
	}
}

// Warming reports whether Warm is reading the runs and, when it is, how
// many of the runs its refresh must read it has read (0 of 0 before it
// knows).
func (c *Catalog) Warming() (warming bool, done, total int64) {
	if !c.warming.Load() {
		return false, 0, 0
	}
	return true, c.readDone.Load(), c.readTotal.Load()
}

// Changes moves whenever a listing found a run file changed (see
// runindex.Index.Changes): a reader of the run files that keeps its own
// reading skips them while it stays the same.
func (c *Catalog) Changes() uint64 { return c.index.Changes() }

// WaitSaved waits for a save of the run index in progress.
func (c *Catalog) WaitSaved() { c.index.WaitSaved() }

// Events is the events/ directory the catalog reads.
func (c *Catalog) Events() *confined.Dir { return c.cfg.Events }

// Templates is where the catalog resolves template names.
func (c *Catalog) Templates() receipt.TemplateSource { return c.cfg.Templates }

// Stats reports what the run index did (for benchmarks and /metrics).
func (c *Catalog) Stats() runindex.Stats { return c.index.Stats() }

// Relative strips the root's real path from a message, so that what a
// caller reads names no path of the machine.
func (c *Catalog) Relative(msg string) string {
	base := c.cfg.Events
	if c.cfg.Root != nil {
		base = c.cfg.Root
	}
	return strings.ReplaceAll(msg, base.Path()+"/", "")
}

// TemplateError is a template name that is not a bare name or names no
// usable template. Its message is meant for the caller.
type TemplateError struct {
	Name string
	msg  string
}

func (e *TemplateError) Error() string { return e.msg }

// Template resolves a template name; "" is guard.DefaultTemplate.
func (c *Catalog) Template(name string) (*receipt.Template, error) {
	if name == "" {
		name = guard.DefaultTemplate
	}
	if !receipt.IsSlug(name) {
		return nil, &TemplateError{Name: name, msg: fmt.Sprintf("template must be a bare name made of letters, digits, '-' and '_' (got %q)", name)}
	}
	t, err := c.cfg.Templates.Resolve(name)
	if err != nil {
		return nil, &TemplateError{Name: name, msg: fmt.Sprintf("template %q: %s", name, c.Relative(err.Error()))}
	}
	return t, nil
}

// RunError is a run that does not exist or cannot be read. Unknown tells
// which; Detail says why a run cannot be read, relative to the root.
type RunError struct {
	RunID   string
	Unknown bool
	Detail  string
}

func (e *RunError) Error() string {
	if e.Unknown {
		return fmt.Sprintf("no run %q under events/", e.RunID)
	}
	return fmt.Sprintf("run %q cannot be read: %s", e.RunID, e.Detail)
}

// NoOperationError is a run that holds no event of the operation asked for.
type NoOperationError struct{ RunID, OperationID string }

func (e *NoOperationError) Error() string {
	return fmt.Sprintf("run %q has no operation %q", e.RunID, e.OperationID)
}
