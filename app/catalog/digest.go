package catalog

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// runDigest is what the guard's decisions read of one run's view without
// its summaries: the operations they always read one by one (guard.Keep),
// in listing order, and the counts of the others (guard.Elided), with the
// latest time any window reads of those others. It is saved in the run's
// authenticated header (runindex.Options.Digest), so that a restart's
// first decision reads the headers and not every run's summaries.
type runDigest struct {
	kept   []guard.Op
	elided *guard.Elided
	// latest is the latest guard.Horizon of the operations left out; bad
	// says one of their times cannot be read.
	latest time.Time
	bad    bool
}

// elidable says whether a decision whose windows start at or after since
// can read the run from its digest: no operation left out is that recent.
func (d *runDigest) elidable(since time.Time) bool {
	return !d.bad && d.latest.Before(since)
}

// digestOf is the digest of a view's summaries.
func digestOf(items []Summary) *runDigest {
	return digestKeeping(items, true)
}

// digestKeeping is digestOf; without keep, the operations kept are left
// out of it (a save encodes them from the summaries).
func digestKeeping(items []Summary, keep bool) *runDigest {
	d := &runDigest{elided: guard.NewElided()}
	for i := range items {
		o := &items[i].Guard
		if guard.Keep(*o) {
			if keep {
				d.kept = append(d.kept, *o)
			}
			continue
		}
		d.elided.Add(*o)
		at, ok := guard.Horizon(*o)
		if !ok {
			d.bad = true
		} else if at.After(d.latest) {
			d.latest = at
		}
	}
	return d
}

// writeDigest is runindex.Options.Digest: a view's digest for the saved
// index.
func writeDigest(e *runindex.Enc, items []Summary) {
	var kept []int
	for i := range items {
		if guard.Keep(items[i].Guard) {
			kept = append(kept, i)
		}
	}
	d := digestKeeping(items, false)
	e.Uint(uint64(len(kept)))
	for _, i := range kept {
		encodeSummary(e, &items[i])
	}
	e.Bool(d.bad)
	e.Int(d.latest.UnixNano())
	el := d.elided
	e.Uint(uint64(el.Ops))
	e.Uint(uint64(el.SettleUnconfirmed))
	for _, k := range []guard.CounterpartyKind{guard.KindAddress, guard.KindHost} {
		why := el.Unattributable[k]
		keys := make([]string, 0, len(why))
		for w := range why {
			keys = append(keys, w)
		}
		slices.Sort(keys)
		e.Uint(uint64(len(keys)))
		for _, w := range keys {
			e.Str(w)
			e.Uint(uint64(why[w]))
		}
	}
	cps := make([]guard.Counterparty, 0, len(el.With))
	for c := range el.With {
		cps = append(cps, c)
	}
	slices.SortFunc(cps, func(a, b guard.Counterparty) int {
		if a.Kind != b.Kind {
			return compareStr(string(a.Kind), string(b.Kind))
		}
		return compareStr(a.Value, b.Value)
	})
	e.Uint(uint64(len(cps)))
	for _, c := range cps {
		w := el.With[c]
		e.Str(string(c.Kind))
		e.Str(c.Value)
		e.Uint(uint64(w.N))
		e.Uint(uint64(w.Coarse))
		e.Uint(uint64(w.Spent))
	}
	pairs := make([][2]string, 0, len(el.Both))
	for k := range el.Both {
		pairs = append(pairs, k)
	}
	slices.SortFunc(pairs, func(a, b [2]string) int {
		if a[0] != b[0] {
			return compareStr(a[0], b[0])
		}
		return compareStr(a[1], b[1])
	})
	e.Uint(uint64(len(pairs)))
	for _, k := range pairs {
		e.Str(k[0])
		e.Str(k[1])
		e.Uint(uint64(el.Both[k]))
	}
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// readDigest reads what writeDigest wrote of one run.
func readDigest(runID string, blob []byte) (*runDigest, error) {
	dec := runindex.NewDec(blob)
	const most = 1 << 30
	d := &runDigest{elided: guard.NewElided()}
	d.kept = make([]guard.Op, dec.Len(most))
	for i := range d.kept {
		d.kept[i] = decodeSummary(runID, dec).Guard
	}
	d.bad = dec.Bool()
	d.latest = time.Unix(0, dec.Int())
	el := d.elided
	el.Ops, el.SettleUnconfirmed = dec.Len(most), dec.Len(most)
	for _, k := range []guard.CounterpartyKind{guard.KindAddress, guard.KindHost} {
		for range dec.Len(most) {
			w := dec.Str()
			el.Unattributable[k][w] += dec.Len(most)
		}
	}
	for range dec.Len(most) {
		kind := guard.CounterpartyKind(dec.Str())
		c := guard.Counterparty{Kind: kind, Value: dec.Str()}
		if kind != guard.KindAddress && kind != guard.KindHost {
			dec.Fail("a counterparty of no known kind")
		}
		el.With[c] = &guard.ElidedWith{N: dec.Len(most), Coarse: dec.Len(most), Spent: dec.Len(most)}
	}
	for range dec.Len(most) {
		k := [2]string{dec.Str(), dec.Str()}
		el.Both[k] = dec.Len(most)
	}
	if err := dec.Done(); err != nil {
		return nil, fmt.Errorf("run %s: the guard's digest: %w", runID, err)
	}
	return d, nil
}

// digestEntry is a run's digest as last read, and what it was read from.
type digestEntry struct {
	key digestKey
	d   *runDigest
	err error
}

// digestKey names what a digest was read from: the saved header's bytes,
// or the view's summaries (which an update replaces, never changes).
type digestKey struct {
	blob *byte
	item *Summary
	n    int
}

// digestFor is the digest of a listed run: read from its saved header
// while it is pending, made from its summaries otherwise; kept per run
// while what it was read from is the same.
func (c *Catalog) digestFor(rv *runindex.RunView[Summary]) (*runDigest, error) {
	var key digestKey
	switch {
	case rv.Pending && len(rv.Digest) == 0:
		return nil, fmt.Errorf("run %s: the saved index holds no digest of it", rv.RunID)
	case rv.Pending:
		key = digestKey{blob: &rv.Digest[0], n: len(rv.Digest)}
	case len(rv.Items) > 0:
		key = digestKey{item: &rv.Items[0], n: len(rv.Items)}
	}
	c.digMu.Lock()
	e := c.digests[rv.RunID]
	c.digMu.Unlock()
	if e != nil && e.key == key {
		return e.d, e.err
	}
	e = &digestEntry{key: key}
	if rv.Pending {
		e.d, e.err = readDigest(rv.RunID, rv.Digest)
		c.digestsRead.Add(1)
	} else {
		e.d = digestOf(rv.Items)
	}
	c.digMu.Lock()
	if c.digests == nil {
		c.digests = map[string]*digestEntry{}
	}
	c.digests[rv.RunID] = e
	c.digMu.Unlock()
	return e.d, e.err
}

// HistorySince is History for a decision whose windows (and the spend
// ledger's matching) start at or after since: the operations no such
// decision reads one by one are counted, not listed (guard.Elided), and a
// run a restart took from the saved index is read from its authenticated
// digest instead of its summaries, unless an operation it left out is
// that recent. The decisions are those History gives (see guard.Elided).
func (c *Catalog) HistorySince(ctx context.Context, t *receipt.Template, since time.Time) (guard.History, error) {
	// The digests of the pending runs, as pick read them.
	pick := func(runs []runindex.RunView[Summary]) []bool {
		need := make([]bool, len(runs))
		for i := range runs {
			if !runs[i].Pending {
				continue
			}
			d, err := c.digestFor(&runs[i])
			need[i] = err != nil || !d.elidable(since)
			if err != nil {
				c.cfg.Logger.Warn("a run's digest in the saved run index is not used; reading its summaries", "run", runs[i].RunID, "err", err)
			}
		}
		return need
	}
	listing, err := c.index.ListSomeQuiet(ctx, t, nil, pick)
	if err != nil {
		return guard.History{}, err
	}
	digests := make([]*runDigest, len(listing.Runs))
	views := make([]sinceKey, len(listing.Runs))
	for i := range listing.Runs {
		rv := &listing.Runs[i]
		d, err := c.digestFor(rv)
		if err != nil {
			// pick asked for every pending run whose digest cannot be read.
			return guard.History{}, fmt.Errorf("read history: %w", err)
		}
		digests[i] = d
		views[i] = sinceKey{run: rv.RunID, d: d, whole: !d.elidable(since)}
		if rv.Pending && views[i].whole {
			return guard.History{}, fmt.Errorf("read history: run %s was left in the saved index", rv.RunID)
		}
	}
	bad := make([]string, len(listing.Unreadable))
	for i, u := range listing.Unreadable {
		bad[i] = u.RunID + "\x00" + u.Err.Error()
	}
	key := runindex.Fingerprint(t)
	c.histMu.Lock()
	defer c.histMu.Unlock()
	if h := c.sinceCache[key]; h != nil && slices.Equal(h.views, views) && slices.Equal(h.bad, bad) {
		return h.hist, nil
	}
	hist := guard.History{Runs: len(listing.Runs)}
	elided := guard.NewElided()
	for i, rv := range listing.Runs {
		if views[i].whole {
			for _, it := range rv.Items {
				hist.Ops = append(hist.Ops, it.Guard)
			}
			continue
		}
		hist.Ops = append(hist.Ops, digests[i].kept...)
		elided.Merge(digests[i].elided)
	}
	for _, u := range listing.Unreadable {
		hist.Unreadable = append(hist.Unreadable, guard.UnreadableRun{RunID: u.RunID, Error: c.Relative(u.Err.Error())})
	}
	hist.BuildIndex()
	hist.SetElided(elided)
	if c.sinceCache == nil {
		c.sinceCache = map[string]*cachedSince{}
	}
	c.sinceCache[key] = &cachedSince{views: views, bad: bad, hist: hist}
	return hist, nil
}

// sinceKey is one run as a HistorySince read it: its digest, and whether
// its summaries were read whole.
type sinceKey struct {
	run   string
	d     *runDigest
	whole bool
}

type cachedSince struct {
	views []sinceKey
	bad   []string
	hist  guard.History
}

// DigestsRead counts the runs' digests read from a saved index (tests).
func (c *Catalog) DigestsRead() int64 { return c.digestsRead.Load() }
