package catalog

import (
	"context"
	"slices"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// cachedHistory is the history of one template as it was built, with what
// it was built from: while no run's view changed, the next question reuses
// it (and its index) instead of walking every operation again.
type cachedHistory struct {
	views []viewKey
	bad   []string
	hist  guard.History
}

type viewKey struct {
	run   string
	items *Summary
	n     int
	lines int
}

// History is every operation under t, as the guard reads it, with the runs
// that cannot be read (never skipped silently, and never hiding the other
// runs). It is the decision engine's history source (engine.HistorySource).
func (c *Catalog) History(ctx context.Context, t *receipt.Template) (guard.History, error) {
	listing, err := c.index.List(ctx, t)
	if err != nil {
		return guard.History{}, err
	}
	views := make([]viewKey, len(listing.Runs))
	for i, rv := range listing.Runs {
		var first *Summary
		if len(rv.Items) > 0 {
			first = &rv.Items[0]
		}
		views[i] = viewKey{run: rv.RunID, items: first, n: len(rv.Items), lines: rv.Lines}
	}
	bad := make([]string, len(listing.Unreadable))
	for i, u := range listing.Unreadable {
		bad[i] = u.RunID + "\x00" + u.Err.Error()
	}
	key := runindex.Fingerprint(t)
	c.histMu.Lock()
	defer c.histMu.Unlock()
	if h := c.histCache[key]; h != nil && slices.Equal(h.views, views) && slices.Equal(h.bad, bad) {
		return h.hist, nil
	}
	hist := guard.History{Runs: len(listing.Runs)}
	// Sized once: grown by appends, copying a million operations' Ops
	// again and again was a fifth of a restart's first decision.
	total := 0
	for _, rv := range listing.Runs {
		total += len(rv.Items)
	}
	if total > 0 {
		hist.Ops = make([]guard.Op, 0, total)
	}
	for _, rv := range listing.Runs {
		for _, it := range rv.Items {
			hist.Ops = append(hist.Ops, it.Guard)
		}
	}
	for _, u := range listing.Unreadable {
		hist.Unreadable = append(hist.Unreadable, guard.UnreadableRun{RunID: u.RunID, Error: c.Relative(u.Err.Error())})
	}
	hist.BuildIndex()
	if c.histCache == nil {
		c.histCache = map[string]*cachedHistory{}
	}
	c.histCache[key] = &cachedHistory{views: views, bad: bad, hist: hist}
	return hist, nil
}
