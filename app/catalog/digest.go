package catalog

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// runDigest is what the guard's decisions read of one run's view without
// its summaries: the operations they always read one by one (guard.Keep),
// in listing order, and the counts of the others (guard.Elided), with the
// latest time any window reads of those others; and, where every kept
// operation is countable too (guard.Countable), their counts with the
// first evidence of the open ones (guard.Elided.AddRun) and their latest
// time, so that a decision older than every operation of the run reads
// counts only. It is saved in the run's authenticated header
// (runindex.Options.Digest), so that a restart's first decision reads the
// headers and not every run's summaries; the kept operations stay encoded
// there until a decision reads them.
type runDigest struct {
	runID  string
	elided *guard.Elided
	// latest is the latest guard.Horizon of the operations left out; bad
	// says one of their times cannot be read.
	latest time.Time
	bad    bool
	// counted counts the kept operations (nil: one of them is not
	// countable, or its time cannot be read); keptLatest is the latest
	// guard.Horizon of those.
	counted    *guard.Elided
	keptLatest time.Time
	// kept are the kept operations, decoded from keptBlob when first read.
	keptOnce sync.Once
	keptBlob []byte
	kept     []guard.Op
	keptErr  error
	// items and keptAt, for a view in memory, are its summaries and the
	// places of the kept ones among them: read from there, not copied (a
	// cold start's history would otherwise hold every kept operation
	// twice beside the index's).
	items    []Summary
	fillOnce sync.Once
	keptAt   []int32
}

// elidable says whether a decision whose windows start at or after since
// can read the run from its digest: no operation left out is that recent.
func (d *runDigest) elidable(since time.Time) bool {
	return !d.bad && d.latest.Before(since)
}

// countable says whether such a decision can read the run from its counts
// alone: no operation of it is that recent.
func (d *runDigest) countable(since time.Time) bool {
	return d.elidable(since) && d.counted != nil && d.keptLatest.Before(since)
}

// keptOps are the run's kept operations.
func (d *runDigest) keptOps() ([]guard.Op, error) {
	d.keptOnce.Do(func() {
		if d.keptBlob == nil {
			return
		}
		dec := runindex.NewDec(d.keptBlob)
		const most = 1 << 30
		d.kept = make([]guard.Op, dec.Len(most))
		for i := range d.kept {
			d.kept[i] = decodeSummary(d.runID, dec).Guard
		}
		if err := dec.Done(); err != nil {
			d.kept, d.keptErr = nil, fmt.Errorf("run %s: the guard's digest: its operations: %w", d.runID, err)
		}
	})
	return d.kept, d.keptErr
}

// appendKept appends the run's kept operations to ops.
func (d *runDigest) appendKept(ops []guard.Op) ([]guard.Op, error) {
	if d.items != nil {
		d.counts()
		for _, i := range d.keptAt {
			ops = append(ops, d.items[i].Guard)
		}
		return ops, nil
	}
	kept, err := d.keptOps()
	return append(ops, kept...), err
}

// keptLen is how many operations appendKept appends (0 when they cannot
// be read).
func (d *runDigest) keptLen() int {
	if d.items != nil {
		d.counts()
		return len(d.keptAt)
	}
	kept, _ := d.keptOps()
	return len(kept)
}

// digestOf is the digest of a view's summaries: with its kept operations
// listed (keep: a view in memory), or counted (count) for a save. A view
// in memory is read as its kept operations: their counts would be kept
// beside the summaries as long as the view, for nothing a question needs.
// Its other operations are counted only when a question first reads them
// (counts): a decision whose windows reach back past the run's newest
// operation reads the run whole, and would never read the counts made
// ahead (a cold start of a big root spent a fifth of its memory on them).
func digestOf(items []Summary, keep, count bool) *runDigest {
	d := &runDigest{}
	if !keep {
		d.fill(items, count)
		return d
	}
	d.items = items[:len(items):len(items)]
	if d.items == nil {
		d.items = []Summary{}
	}
	for i := range items {
		o := &items[i].Guard
		if guard.Keep(*o) {
			continue
		}
		if at, ok := guard.Horizon(*o); !ok {
			d.bad = true
		} else if at.After(d.latest) {
			d.latest = at
		}
	}
	return d
}

// fill counts items into d: the operations left out (elided, and latest
// and bad), the kept ones' places (for a view in memory) and, with count,
// the kept ones counted too.
func (d *runDigest) fill(items []Summary, count bool) {
	d.elided = guard.NewElided()
	if count {
		d.counted = guard.NewElided()
	}
	var bad bool
	var latest time.Time
	for i := range items {
		o := &items[i].Guard
		at, ok := guard.Horizon(*o)
		if guard.Keep(*o) {
			if d.items != nil {
				d.keptAt = append(d.keptAt, int32(i))
			}
			switch {
			case d.counted == nil:
			case !ok || !guard.Countable(*o):
				d.counted = nil
			default:
				d.counted.AddRun(*o, i)
				if at.After(d.keptLatest) {
					d.keptLatest = at
				}
			}
			continue
		}
		d.elided.Add(*o)
		if !ok {
			bad = true
		} else if at.After(latest) {
			latest = at
		}
	}
	if d.items == nil {
		// A view in memory had them from digestOf, and they may be read
		// meanwhile.
		d.bad, d.latest = bad, latest
	}
	d.elided.Seal()
	if d.counted != nil {
		d.counted.Seal()
	}
}

// counts is what d counts of the operations it leaves out, counted now
// for a view in memory when first asked.
func (d *runDigest) counts() *guard.Elided {
	if d.items != nil {
		d.fillOnce.Do(func() { d.fill(d.items, false) })
	}
	return d.elided
}

// writeDigest is runindex.Options.Digest: a view's digest for the saved
// index. The kept operations are a blob of their own, which a start skips.
func writeDigest(e *runindex.Enc, items []Summary) {
	d := digestOf(items, false, true)
	ke := runindex.NewEnc()
	var n uint64
	for i := range items {
		if guard.Keep(items[i].Guard) {
			n++
		}
	}
	ke.Uint(n)
	for i := range items {
		if guard.Keep(items[i].Guard) {
			encodeSummary(ke, &items[i])
		}
	}
	e.Bytes(ke.Blob())
	e.Bool(d.bad)
	e.Int(d.latest.UnixNano())
	writeElided(e, d.elided)
	e.Bool(d.counted != nil)
	if d.counted == nil {
		return
	}
	e.Int(d.keptLatest.UnixNano())
	writeElided(e, d.counted)
	c := d.counted
	e.Uint(uint64(c.PaidWithoutHost))
	e.Uint(uint64(c.OpenOps))
	cps := sortedCounterparties(c.Open)
	e.Uint(uint64(len(cps)))
	for _, cp := range cps {
		w := c.Open[cp]
		e.Str(string(cp.Kind))
		e.Str(cp.Value)
		e.Uint(uint64(w.N))
		writeRefs(e, w.First, false)
	}
	writePairs(e, c.OpenBoth)
	writeRefs(e, c.Elsewhere, true)
}

// writeRefs writes open operations kept as evidence (their places and
// ids; hosts too when asked).
func writeRefs(e *runindex.Enc, rs []guard.OpenRef, hosts bool) {
	e.Uint(uint64(len(rs)))
	for _, r := range rs {
		e.Uint(uint64(r.Seq))
		e.Str(r.Ref.OperationID)
		if hosts {
			e.Uint(uint64(len(r.Hosts)))
			for _, h := range r.Hosts {
				e.Str(h)
			}
		}
	}
}

// writeElided writes what an Elided counts (not its open operations).
func writeElided(e *runindex.Enc, el *guard.Elided) {
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
	cps := sortedCounterparties(el.With)
	e.Uint(uint64(len(cps)))
	for _, c := range cps {
		w := el.With[c]
		e.Str(string(c.Kind))
		e.Str(c.Value)
		e.Uint(uint64(w.N))
		e.Uint(uint64(w.Coarse))
		e.Uint(uint64(w.Spent))
	}
	writePairs(e, el.Both)
}

func writePairs(e *runindex.Enc, m map[[2]string]int) {
	pairs := make([][2]string, 0, len(m))
	for k := range m {
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
		e.Uint(uint64(m[k]))
	}
}

// sortedCounterparties are m's keys in order (a save writes the same bytes
// for the same view).
func sortedCounterparties[V any](m map[guard.Counterparty]V) []guard.Counterparty {
	cps := make([]guard.Counterparty, 0, len(m))
	for c := range m {
		cps = append(cps, c)
	}
	slices.SortFunc(cps, func(a, b guard.Counterparty) int {
		if a.Kind != b.Kind {
			return compareStr(string(a.Kind), string(b.Kind))
		}
		return compareStr(a.Value, b.Value)
	})
	return cps
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

// readDigest reads what writeDigest wrote of one run; its kept
// operations are decoded when first read (keptOps).
func readDigest(runID string, blob []byte) (*runDigest, error) {
	dec := runindex.NewDec(blob)
	d := &runDigest{runID: runID}
	d.keptBlob = dec.Bytes()
	if d.keptBlob == nil {
		d.keptBlob = []byte{}
	}
	d.bad = dec.Bool()
	d.latest = time.Unix(0, dec.Int())
	d.elided = readElided(dec)
	if dec.Bool() {
		d.keptLatest = time.Unix(0, dec.Int())
		c := readElided(dec)
		const most = 1 << 30
		c.PaidWithoutHost, c.OpenOps = dec.Len(most), dec.Len(most)
		for range dec.Len(most) {
			cp := readCounterparty(dec)
			c.Open[cp] = &guard.ElidedOpen{N: dec.Len(most), First: readRefs(runID, dec, false)}
		}
		readPairs(dec, c.OpenBoth)
		c.Elsewhere = readRefs(runID, dec, true)
		d.counted = c
	}
	if err := dec.Done(); err != nil {
		return nil, fmt.Errorf("run %s: the guard's digest: %w", runID, err)
	}
	return d, nil
}

func readCounterparty(dec *runindex.Dec) guard.Counterparty {
	kind := guard.CounterpartyKind(dec.Str())
	c := guard.Counterparty{Kind: kind, Value: dec.Str()}
	if kind != guard.KindAddress && kind != guard.KindHost {
		dec.Fail("a counterparty of no known kind")
	}
	return c
}

// readRefs reads what writeRefs wrote: evidence in its run's order.
func readRefs(runID string, dec *runindex.Dec, hosts bool) []guard.OpenRef {
	const most = 1 << 30
	rs := make([]guard.OpenRef, dec.Len(most))
	for i := range rs {
		rs[i] = guard.OpenRef{Seq: dec.Len(most), Ref: guard.Ref{RunID: runID, OperationID: dec.Str()}}
		if i > 0 && rs[i].Seq <= rs[i-1].Seq {
			dec.Fail("evidence out of order")
		}
		if hosts {
			rs[i].Hosts = make([]string, dec.Len(most))
			for j := range rs[i].Hosts {
				rs[i].Hosts[j] = dec.Str()
			}
		}
	}
	return rs
}

// readElided reads what writeElided wrote.
func readElided(dec *runindex.Dec) *guard.Elided {
	const most = 1 << 30
	el := guard.NewElided()
	el.Ops, el.SettleUnconfirmed = dec.Len(most), dec.Len(most)
	for _, k := range []guard.CounterpartyKind{guard.KindAddress, guard.KindHost} {
		for range dec.Len(most) {
			w := dec.Str()
			el.Unattributable[k][w] += dec.Len(most)
		}
	}
	for range dec.Len(most) {
		c := readCounterparty(dec)
		el.With[c] = &guard.ElidedWith{N: dec.Len(most), Coarse: dec.Len(most), Spent: dec.Len(most)}
	}
	readPairs(dec, el.Both)
	return el
}

func readPairs(dec *runindex.Dec, m map[[2]string]int) {
	const most = 1 << 30
	for range dec.Len(most) {
		k := [2]string{dec.Str(), dec.Str()}
		m[k] = dec.Len(most)
	}
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
		e.d = digestOf(rv.Items, true, false)
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
			if !need[i] && !d.countable(since) {
				// Its kept operations are read: where they cannot be,
				// its summaries are.
				_, err = d.keptOps()
				need[i] = err != nil
			}
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
		views[i] = sinceKey{run: rv.RunID, d: d, whole: !d.elidable(since), counted: d.countable(since)}
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
	// Sized once: the history is kept while no run changes, and a slice
	// grown by appends keeps up to as much room again unused.
	total := 0
	for i, rv := range listing.Runs {
		switch {
		case views[i].whole:
			total += len(rv.Items)
		case !views[i].counted:
			total += digests[i].keptLen()
		}
	}
	if total > 0 {
		hist.Ops = make([]guard.Op, 0, total)
	}
	elided := guard.NewElided()
	for i, rv := range listing.Runs {
		if views[i].whole {
			for _, it := range rv.Items {
				hist.Ops = append(hist.Ops, it.Guard)
			}
			continue
		}
		if views[i].counted {
			// Every operation of the run is older than the decision's
			// windows: counted, the open ones' first evidence in place.
			elided.MergeAt(digests[i].counts(), len(hist.Ops))
			elided.MergeAt(digests[i].counted, len(hist.Ops))
			continue
		}
		if hist.Ops, err = digests[i].appendKept(hist.Ops); err != nil {
			return guard.History{}, fmt.Errorf("read history: %w", err)
		}
		elided.Merge(digests[i].counts())
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
	run            string
	d              *runDigest
	whole, counted bool
}

type cachedSince struct {
	views []sinceKey
	bad   []string
	hist  guard.History
}

// DigestsRead counts the runs' digests read from a saved index (tests).
func (c *Catalog) DigestsRead() int64 { return c.digestsRead.Load() }
