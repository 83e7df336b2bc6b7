// Package runindex keeps an in-memory index of the run files under a Trace
// root's events/ directory, so that repeated listings cost little.
//
// A run is keyed by its file identity (device, inode, size, modification
// time). A file that grew under the same identity is read from where the last
// read stopped, because run files are append-only; a file that was replaced or
// shrank is read again from the start. The events kept are compacted by a
// caller-supplied projection and their estimated size is bounded: past the
// budget, the least recently used runs are dropped and read again on demand.
package runindex

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Options configures an Index.
type Options[T, F any] struct {
	// Events is the events/ directory of the Trace root.
	Events *confined.Dir
	// Limits bound what one line and one run file may cost.
	Limits receipt.Limits
	// MaxBytes is the budget, in estimated bytes, for the events the index
	// keeps in memory. Zero means DefaultMaxBytes.
	MaxBytes int64
	// Compact is applied to each event before it is kept; it should drop what
	// Summarize does not need (payloads, mostly), and must drop the event's
	// Raw value, which is valid only during the call (Extract has read what
	// is needed from it by then). Nil keeps events whole.
	Compact func(receipt.Event) receipt.Event
	// Extract reads, from each event before it is compacted, the facts
	// Summarize will need (what the payload says, mostly); they are kept
	// beside the event. Nil keeps zero facts.
	Extract func(receipt.Event) F
	// FactsCost estimates the memory one event's facts hold.
	FactsCost func(F) int64
	// ItemCost estimates the memory one summary holds; summaries count
	// against MaxBytes like the events they came from. Nil counts nothing.
	ItemCost func(T) int64
	// Summarize turns one assembled receipt into what callers list. It is
	// called once per operation and template, and again only for the
	// operations an append touches; its results are cached. It may be called
	// from several goroutines at once.
	Summarize func(runID string, r *receipt.Receipt, facts func(e *receipt.Event) F) T
	// Compare orders a run's summaries as callers list them (see
	// RunView.Items); nil keeps the order of first appearance.
	Compare func(a, b *T) int
	// Facet names a summary's group for filtered listings (see
	// RunView.ByFacet); nil groups nothing.
	Facet func(*T) string
	// OperationID returns the operation a summary is about. With it, an
	// append re-assembles only the operations it touched; without it, the
	// whole run is assembled again.
	OperationID func(*T) string
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
	// Progress, when set, is told how a refresh that must read runs goes:
	// after each run it reads (a new or changed file, or one whose events
	// were dropped), how many of the runs it must read are done, of how
	// many. A cold index reads every run; a warm one reads only what
	// changed. Calls come one at a time, done counting up from 1.
	Progress func(done, total int)
}

// maxEventGuess caps the room reserved for a run's events before they are
// read.
const maxEventGuess = 4096

// DefaultMaxBytes is the default memory budget for indexed events.
const DefaultMaxBytes = 256 << 20

// eventOverhead estimates the fixed memory of one kept event (the struct and
// its string headers) on top of its string bytes.
const eventOverhead = 200

// Index is safe for concurrent use; refreshes are serialized, and the runs a
// refresh must read are read in parallel, at most GOMAXPROCS at once.
type Index[T, F any] struct {
	opt  Options[T, F]
	mu   sync.Mutex
	runs map[string]*run[T, F]
	tick uint64
	// acct guards bytes and stats, which parallel reads update.
	acct  sync.Mutex
	bytes int64
	stats Stats
	// fullReads is a semaphore bounding concurrent full-run reads.
	fullReads chan struct{}
	// begun counts the listings of the present begun; last (under mu) is
	// the latest that completed. A caller of the present takes last when it
	// began after the caller asked: it saw every run file as it was then
	// or later, which a listing of the caller's own would too.
	begun atomic.Uint64
	last  *presentListing[T]
}

// presentListing is a listing of the present: seq numbers it among those
// begun, fp is its template's fingerprint.
type presentListing[T any] struct {
	seq     uint64
	fp      string
	listing Listing[T]
}

// Stats reports what the index did, for benchmarks and /metrics.
type Stats struct {
	Runs          int   // runs currently known (readable or not)
	ResidentRuns  int   // runs whose events are in memory
	Events        int   // events in memory
	Bytes         int64 // estimated bytes of events in memory
	BytesRead     int64 // total bytes read from run files since start
	FullReads     int64 // runs read from the start
	IncrementalRs int64 // runs read from a previous offset
	Evictions     int64 // runs dropped to honour the budget
	SharedLists   int64 // listings of the present answered by one begun after they were asked
}

type identity struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

type run[T, F any] struct {
	id       string
	name     string
	ident    identity
	resident bool  // events are in memory (views may outlive them)
	offset   int64 // bytes consumed so far (up to the last complete line)
	nextLine int
	events   []receipt.Event
	facts    []F // facts[i] belongs to events[i]
	intern   map[string]string
	cost     int64
	err      error // why the run is unreadable, or nil
	used     uint64
	views    map[string]*view[T] // per template fingerprint
	viewCost int64               // the part of cost that views hold
	lastAt   string              // latest occurred_at, for "latest run"
	anchor   anchor              // bytes an in-place rewrite would change
	asOf     *view[T]            // the last view taken at an earlier line (paging)
}

// view is a run's summaries for one template, sorted by Options.Compare.
type view[T any] struct {
	fp      string
	items   []T
	byFacet map[string][]int32
	events  int // how many of the run's events it covers
	lines   int // the run's complete lines it covers
	cost    int64
}

// anchorBytes is how many bytes each part of an anchor samples.
const anchorBytes = 256

// anchor samples a run file where an append cannot change it: its first
// bytes, and the bytes just before the read offset (for a readable run) or
// at the start of the bad line (for an unreadable one). Size and mtime alone
// cannot tell an append from a truncate-and-rewrite of the same inode that
// ends up longer, which would otherwise be read from a stale offset.
type anchor struct {
	head   []byte
	mark   []byte
	markAt int64
	ok     bool
}

// takeAnchor samples f after a read that stopped at offset.
func takeAnchor(f io.ReaderAt, offset int64, unreadable bool) anchor {
	a := anchor{markAt: max(0, offset-anchorBytes)}
	if unreadable {
		a.markAt = offset
	}
	var err error
	if a.head, err = readSome(f, 0); err != nil {
		return anchor{}
	}
	if a.mark, err = readSome(f, a.markAt); err != nil {
		return anchor{}
	}
	if !unreadable && int64(len(a.mark)) > offset-a.markAt {
		a.mark = a.mark[:offset-a.markAt]
	}
	if int64(len(a.head)) > offset && !unreadable {
		a.head = a.head[:offset]
	}
	a.ok = true
	return a
}

// readSome reads up to anchorBytes at off; fewer at the end of the file.
func readSome(f io.ReaderAt, off int64) ([]byte, error) {
	buf := make([]byte, anchorBytes)
	n, err := f.ReadAt(buf, off)
	if err != nil && err != io.EOF {
		return nil, err
	}
	return buf[:n], nil
}

// holds reports whether the file still carries the sampled bytes.
func (a anchor) holds(f io.ReaderAt) bool {
	if !a.ok {
		return false
	}
	for _, part := range []struct {
		at   int64
		want []byte
	}{{0, a.head}, {a.markAt, a.mark}} {
		got := make([]byte, len(part.want))
		if n, err := f.ReadAt(got, part.at); n != len(got) || (err != nil && err != io.EOF) {
			return false
		}
		if string(got) != string(part.want) {
			return false
		}
	}
	return true
}

// stillHolds opens the run file and checks its anchor.
func (ix *Index[T, F]) stillHolds(r *run[T, F]) bool {
	f, err := ix.opt.Events.Open(r.name)
	if err != nil {
		return false
	}
	defer f.Close()
	return r.anchor.holds(f)
}

// New returns an empty index.
func New[T, F any](opt Options[T, F]) *Index[T, F] {
	if opt.MaxBytes <= 0 {
		opt.MaxBytes = DefaultMaxBytes
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	return &Index[T, F]{opt: opt, runs: map[string]*run[T, F]{}, fullReads: make(chan struct{}, MaxConcurrentFullReads)}
}

// Unreadable is a run (or a file in events/) that could not be used, with
// the reason a person can act on.
type Unreadable struct {
	RunID string
	Err   error
}

// RunView is one readable run's summaries for a template. Its slices are
// shared with the index and must not be modified; they stay valid (an
// update replaces them, it never changes them).
type RunView[T any] struct {
	RunID string
	// LastEventAt is the latest occurred_at of the run ("" for an empty run).
	LastEventAt string
	// Items are sorted by Options.Compare.
	Items []T
	// ByFacet holds, per Options.Facet value, the positions in Items of the
	// items with that value, ascending.
	ByFacet map[string][]int32
	// Lines is how many complete lines of the run the view covers; ListAt
	// can list the run as it was at that line.
	Lines int
}

// Listing is the result of a refresh for one template.
type Listing[T any] struct {
	Runs       []RunView[T]
	Unreadable []Unreadable
}

// List refreshes the index from the directory and returns the summaries of
// every readable run for the template t, in run id order.
func (ix *Index[T, F]) List(ctx context.Context, t *receipt.Template) (Listing[T], error) {
	return ix.ListAt(ctx, t, nil)
}

// ListAt is List as of a snapshot: at maps run ids to line counts (a
// RunView's Lines) taken by an earlier listing, and each run that has grown
// since is summarised as it was at that line; runs not in at are left out.
// A nil at is the present. Runs read from the start since (a rewrite, not an
// append) are summarised as they are now, when fewer lines than at exist.
//
// Callers of the present that wait while another lists share the next
// listing that begins after they asked: under a flood of questions the
// directory is listed and its files stat'ed once per turn of the lock, not
// once per question, and each still sees every run file as it was when it
// asked, or later.
func (ix *Index[T, F]) ListAt(ctx context.Context, t *receipt.Template, at map[string]int) (Listing[T], error) {
	return ix.listAt(ctx, t, at, true)
}

// listAt is ListAt; share false lists anew even when a listing begun
// since the call could answer (for benchmarks).
func (ix *Index[T, F]) listAt(ctx context.Context, t *receipt.Template, at map[string]int, share bool) (Listing[T], error) {
	asked := ix.begun.Load()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	fp := Fingerprint(t)
	if at == nil && share {
		if l := ix.last; l != nil && l.seq > asked && l.fp == fp {
			ix.account(func(_ *int64, st *Stats) { st.SharedLists++ })
			return l.listing, nil
		}
	}
	if at == nil {
		seq := ix.begun.Add(1)
		out, err := ix.listLocked(ctx, t, nil, fp)
		ix.last = nil
		if err == nil {
			ix.last = &presentListing[T]{seq: seq, fp: fp, listing: out}
		}
		return out, err
	}
	return ix.listLocked(ctx, t, at, fp)
}

// listLocked lists the directory under ix.mu.
func (ix *Index[T, F]) listLocked(ctx context.Context, t *receipt.Template, at map[string]int, fp string) (Listing[T], error) {
	entries, err := ix.opt.Events.ReadDir()
	if err != nil {
		return Listing[T]{}, err
	}
	seen := make(map[string]bool, len(entries))
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	type slot struct {
		id   string
		r    *run[T, F]
		bad  error
		work func()
		v    *view[T]
	}
	slots := make([]slot, 0, len(entries))
	for _, e := range entries {
		id, ok := receipt.RunIDFromFileName(e.Name)
		if !ok {
			continue
		}
		seen[id] = true
		if !e.Regular() {
			ix.forget(id)
			slots = append(slots, slot{id: id, bad: fmt.Errorf("skipped: %s is a %s, not a regular file", e.Name, e.Kind())})
			continue
		}
		r, work := ix.plan(id, e, fp)
		slots = append(slots, slot{id: id, r: r, work: work})
	}
	for id := range ix.runs {
		if !seen[id] {
			ix.forget(id)
		}
	}
	// Read what changed, then bring each run's view up to date, in parallel.
	toRead := 0
	for _, sl := range slots {
		if sl.r != nil && sl.work != nil {
			toRead++
		}
	}
	var progress sync.Mutex
	read := 0
	ix.parallel(ctx, len(slots), func(k int) {
		sl := &slots[k]
		if sl.r == nil {
			return
		}
		if sl.work != nil {
			sl.work()
			if ix.opt.Progress != nil {
				progress.Lock()
				read++
				ix.opt.Progress(read, toRead)
				progress.Unlock()
			}
		}
		if sl.r.err != nil {
			return
		}
		if at != nil {
			lines, ok := at[sl.id]
			if !ok {
				return // the run did not exist at the snapshot
			}
			if lines < sl.r.nextLine-1 {
				if !sl.r.resident {
					ix.read(sl.r, sl.r.ident, false) // its events were dropped
					if sl.r.err != nil {
						return
					}
				}
				if lines < sl.r.nextLine-1 {
					sl.v = ix.viewAt(sl.r, fp, t, lines)
					return
				}
			}
		}
		sl.v = ix.currentView(sl.r, fp, t)
	})
	if err := ctx.Err(); err != nil {
		return Listing[T]{}, err
	}
	var out Listing[T]
	for _, sl := range slots {
		switch {
		case sl.bad != nil:
			out.Unreadable = append(out.Unreadable, Unreadable{RunID: sl.id, Err: sl.bad})
		case sl.r.err != nil:
			out.Unreadable = append(out.Unreadable, Unreadable{RunID: sl.id, Err: sl.r.err})
		case sl.v != nil:
			ix.tick++
			sl.r.used = ix.tick
			lastAt := sl.r.lastAt
			if sl.v != sl.r.views[fp] {
				lastAt = lastEventAt(sl.v, sl.r)
			}
			out.Runs = append(out.Runs, RunView[T]{RunID: sl.id, LastEventAt: lastAt, Items: sl.v.items, ByFacet: sl.v.byFacet, Lines: sl.v.lines})
		}
	}
	ix.evict()
	return out, nil
}

// parallel calls fn(0..n-1) on at most GOMAXPROCS goroutines and waits;
// once ctx is done, the calls not yet started are skipped.
func (ix *Index[T, F]) parallel(ctx context.Context, n int, fn func(k int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for k := range n {
			if ctx.Err() != nil {
				return
			}
			fn(k)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= n || ctx.Err() != nil {
					return
				}
				fn(k)
			}
		})
	}
	wg.Wait()
}

// account applies a change to the shared counters.
func (ix *Index[T, F]) account(fn func(bytes *int64, st *Stats)) {
	ix.acct.Lock()
	fn(&ix.bytes, &ix.stats)
	ix.acct.Unlock()
}

// currentView returns the run's view for the template, built or brought up
// to date with the events read since it was built.
func (ix *Index[T, F]) currentView(r *run[T, F], fp string, t *receipt.Template) *view[T] {
	old := r.views[fp]
	if old != nil && old.events == len(r.events) && old.lines == r.nextLine-1 {
		return old
	}
	if old != nil && !r.resident {
		return old // events dropped to honour the budget; the file is unchanged
	}
	var v *view[T]
	if old != nil && ix.opt.OperationID != nil && ix.opt.Compare != nil {
		v = ix.updated(r, old, t)
	} else {
		v = ix.build(r, fp, t, r.events)
	}
	v.fp, v.events, v.lines = fp, len(r.events), r.nextLine-1
	if r.views == nil {
		r.views = map[string]*view[T]{}
	}
	r.views[fp] = v
	delta := v.cost
	if old != nil {
		delta -= old.cost
	}
	r.viewCost += delta
	r.cost += delta
	ix.account(func(b *int64, _ *Stats) { *b += delta })
	return v
}

// viewAt returns the run's view as it was when it had lines complete lines
// (not cached beyond the last one asked for, nor counted in the budget).
func (ix *Index[T, F]) viewAt(r *run[T, F], fp string, t *receipt.Template, lines int) *view[T] {
	if v := r.asOf; v != nil && v.fp == fp && v.lines == lines {
		return v
	}
	n := sort.Search(len(r.events), func(i int) bool { return r.events[i].Line > lines })
	v := ix.build(r, fp, t, r.events[:n])
	v.fp, v.events, v.lines = fp, n, lines
	r.asOf = v
	return v
}

// lastEventAt is the latest occurred_at among the events a view covers.
func lastEventAt[T, F any](v *view[T], r *run[T, F]) string {
	last := ""
	for i := range r.events[:v.events] {
		if jsjson.CompareUTF16(r.events[i].OccurredAt, last) > 0 {
			last = r.events[i].OccurredAt
		}
	}
	return last
}

// build assembles events (a run's, or a prefix of them) into a sorted view.
func (ix *Index[T, F]) build(r *run[T, F], fp string, t *receipt.Template, events []receipt.Event) *view[T] {
	res := receipt.Assemble(events, t)
	items := make([]T, 0, len(res.Receipts))
	for i := range res.Receipts {
		items = append(items, ix.opt.Summarize(r.id, &res.Receipts[i], r.factsOf))
	}
	return ix.finish(ix.sorted(items))
}

// sorted returns items in Options.Compare order, stably. Summaries can be
// large structs, so positions are sorted and each item is moved once.
func (ix *Index[T, F]) sorted(items []T) []T {
	if ix.opt.Compare == nil || len(items) < 2 {
		return items
	}
	order := make([]int32, len(items))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		if c := ix.opt.Compare(&items[a], &items[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	out := make([]T, len(items))
	for k, i := range order {
		out[k] = items[i]
	}
	return out
}

// updated brings a view up to date with the events appended since it was
// built: only the operations those events belong to are assembled again,
// sorted, and merged into the rest, which keep their order.
func (ix *Index[T, F]) updated(r *run[T, F], old *view[T], t *receipt.Template) *view[T] {
	touched := map[string]bool{}
	for i := old.events; i < len(r.events); i++ {
		if id := r.events[i].ContextID; id != "" {
			touched[id] = true
		}
	}
	if len(touched) == 0 {
		return ix.finish(old.items)
	}
	var sel []receipt.Event
	for i := range r.events {
		if touched[r.events[i].ContextID] {
			sel = append(sel, r.events[i])
		}
	}
	res := receipt.Assemble(sel, t)
	fresh := make([]T, 0, len(res.Receipts))
	for i := range res.Receipts {
		fresh = append(fresh, ix.opt.Summarize(r.id, &res.Receipts[i], r.factsOf))
	}
	fresh = ix.sorted(fresh)
	items := make([]T, 0, len(old.items)+len(fresh))
	k := 0
	for i := range old.items {
		it := &old.items[i]
		if touched[ix.opt.OperationID(it)] {
			continue
		}
		for k < len(fresh) && ix.opt.Compare(&fresh[k], it) < 0 {
			items = append(items, fresh[k])
			k++
		}
		items = append(items, *it)
	}
	items = append(items, fresh[k:]...)
	return ix.finish(items)
}

// finish indexes a view's sorted items by facet and counts its cost.
func (ix *Index[T, F]) finish(items []T) *view[T] {
	v := &view[T]{items: items}
	if ix.opt.Facet != nil {
		v.byFacet = map[string][]int32{}
		for i := range items {
			f := ix.opt.Facet(&items[i])
			v.byFacet[f] = append(v.byFacet[f], int32(i))
		}
		v.cost += int64(len(items)) * 4
	}
	if ix.opt.ItemCost != nil {
		for _, it := range items {
			v.cost += ix.opt.ItemCost(it)
		}
	}
	return v
}

// forget drops everything known about a run.
func (ix *Index[T, F]) forget(id string) {
	if r, ok := ix.runs[id]; ok {
		ix.account(func(b *int64, _ *Stats) { *b -= r.cost })
		delete(ix.runs, id)
	}
}

// plan finds out, from the directory entry alone, what bringing a run up
// to date takes: nothing, or work (reading the file) that touches only this
// run and the shared counters, so that several runs' work can run at once.
func (ix *Index[T, F]) plan(id string, e confined.Entry, fp string) (*run[T, F], func()) {
	cur := identity{dev: e.Dev, ino: e.Ino, size: e.Size, mtime: e.ModTime}
	r, ok := ix.runs[id]
	sameFile := ok && r.ident.dev == cur.dev && r.ident.ino == cur.ino
	switch {
	case ok && r.ident == cur && (r.resident || r.err != nil || r.views[fp] != nil):
		return r, nil // unchanged (its events may have been dropped, not its view)
	case sameFile && r.resident && r.err == nil && cur.size > r.ident.size:
		return r, func() {
			if ix.stillHolds(r) {
				ix.read(r, cur, true) // grew: read only the appended bytes
			} else {
				ix.read(r, cur, false)
			}
		}
	case sameFile && r.err != nil && cur.size >= r.ident.size:
		return r, func() {
			if ix.stillHolds(r) {
				r.ident = cur // an append-only file with a bad line stays bad
			} else {
				ix.read(r, cur, false)
			}
		}
	}
	if ok {
		ix.forget(id)
	}
	r = &run[T, F]{id: id, name: e.Name}
	ix.runs[id] = r
	return r, func() { ix.read(r, cur, false) }
}

// read reads a run from its offset (incremental) or from the start.
func (ix *Index[T, F]) read(r *run[T, F], cur identity, incremental bool) {
	if !incremental {
		old := r.cost
		ix.account(func(b *int64, st *Stats) { *b -= old; st.FullReads++ })
		r.events, r.facts, r.intern, r.cost, r.offset, r.nextLine, r.err, r.views, r.viewCost, r.lastAt, r.asOf = nil, nil, nil, 0, 0, 1, nil, nil, 0, "", nil
	} else {
		ix.account(func(_ *int64, st *Stats) { st.IncrementalRs++ })
	}
	r.ident = cur
	r.resident = true
	f, err := ix.opt.Events.Open(r.name)
	if err != nil {
		r.err = err
		return
	}
	defer f.Close()
	if r.offset > 0 {
		if _, err := f.Seek(r.offset, io.SeekStart); err != nil {
			r.err = fmt.Errorf("run %s: seek to %d: %w", r.id, r.offset, err)
			return
		}
	}
	// Room for the new events, guessed low from the new bytes (a recorder
	// line is over half a KiB), so that the slices regrow less often.
	// The guess is capped: a file's size is the writer's to choose (a
	// sparse 1 GiB run would otherwise reserve room for 256k events before
	// one line is read); appends grow the rest as they come.
	if guess := min(int(min(cur.size-r.offset, ix.opt.Limits.MaxRunBytes)/1024), maxEventGuess); guess > cap(r.events)-len(r.events) {
		r.events = slices.Grow(r.events, guess)
		r.facts = slices.Grow(r.facts, guess)
	}
	remaining := ix.opt.Limits.MaxRunBytes - r.offset
	var added int64
	scan := receipt.ReadEvents
	if ix.opt.Compact != nil {
		scan = receipt.ScanEvents // the payload is dropped right away
	}
	consumed, next, err := scan(io.LimitReader(f, remaining+1), r.nextLine, ix.opt.Limits, func(ev receipt.Event) error {
		var facts F
		if ix.opt.Extract != nil {
			facts = ix.opt.Extract(ev)
			if ix.opt.FactsCost != nil {
				added += ix.opt.FactsCost(facts)
			}
		}
		if ix.opt.Compact != nil {
			ev = ix.opt.Compact(ev)
		}
		if r.intern == nil {
			r.intern = map[string]string{}
		}
		ev = r.detach(ev)
		r.events = append(r.events, ev)
		r.facts = append(r.facts, facts)
		added += costOf(&ev)
		if jsjson.CompareUTF16(ev.OccurredAt, r.lastAt) > 0 {
			r.lastAt = ev.OccurredAt
		}
		return nil
	})
	r.anchor = takeAnchor(f, r.offset+consumed, err != nil)
	r.cost += added
	ix.account(func(b *int64, st *Stats) { st.BytesRead += consumed; *b += added })
	r.offset += consumed
	r.nextLine = next
	if err == nil && r.offset >= ix.opt.Limits.MaxRunBytes {
		err = fmt.Errorf("run %s: file larger than the %d-byte limit for one run", r.id, ix.opt.Limits.MaxRunBytes)
	}
	if err != nil {
		var le *receipt.LineError
		if errors.As(err, &le) && le.Run == "" {
			le.Run = r.id
		}
		r.err = err
		old := r.cost
		ix.account(func(b *int64, _ *Stats) { *b -= old })
		r.events, r.facts, r.intern, r.cost, r.views, r.viewCost, r.asOf = nil, nil, nil, 0, nil, 0, nil
	}
}

// detach copies a compacted event's strings. The reader parses each line in
// place, so they are substrings of the whole line: kept as they are, an ID of
// a few bytes would keep its line's payload alive, and the index would hold
// far more memory than its budget counts.
func (r *run[T, F]) detach(e receipt.Event) receipt.Event {
	// One copy for the two: a Builder always copies (a concatenation with
	// an empty string would not).
	var b strings.Builder
	b.Grow(len(e.ID) + len(e.OccurredAt))
	b.WriteString(e.ID)
	b.WriteString(e.OccurredAt)
	both := b.String()
	e.ID, e.OccurredAt = both[:len(e.ID)], both[len(e.ID):]
	// Types, adapters, roles and operation ids repeat: keep one copy each.
	e.Type = r.share(e.Type)
	e.Adapter = r.share(e.Adapter)
	e.Role = r.share(e.Role)
	e.ContextID = r.share(e.ContextID)
	return e
}

// share returns the run's one copy of s (a copy, so it pins no line).
func (r *run[T, F]) share(s string) string {
	if v, ok := r.intern[s]; ok {
		return v
	}
	v := strings.Clone(s)
	r.intern[v] = v
	return v
}

// factsOf returns the facts kept for one of the run's events, found by its
// line number (events are kept in line order).
func (r *run[T, F]) factsOf(e *receipt.Event) F {
	i := sort.Search(len(r.events), func(i int) bool { return r.events[i].Line >= e.Line })
	var zero F
	if i < len(r.events) && r.events[i].Line == e.Line && i < len(r.facts) {
		return r.facts[i]
	}
	return zero
}

func costOf(e *receipt.Event) int64 {
	return eventOverhead + int64(len(e.ID)+len(e.Type)+len(e.OccurredAt)+len(e.Adapter)+len(e.Role)+len(e.ContextID)) + valueCost(e.Raw)
}

// valueCost estimates the memory a kept JSON value holds.
func valueCost(v jsjson.Value) int64 {
	switch v.Kind() {
	case jsjson.String:
		s, _ := v.Str()
		return 32 + int64(len(s))
	case jsjson.Array:
		n := int64(48)
		for _, it := range v.Items() {
			n += valueCost(it)
		}
		return n
	case jsjson.Object:
		n := int64(48)
		for _, m := range v.Members() {
			n += 16 + int64(len(m.Key)) + valueCost(m.Value)
		}
		return n
	default:
		return 32
	}
}

// evict honours the budget: it drops the least recently used runs' events
// first, keeping their summaries (served as long as the file is unchanged;
// a grown file is then read again from the start), and, if that is not
// enough, their summaries too.
func (ix *Index[T, F]) evict() {
	if ix.bytes <= ix.opt.MaxBytes {
		return
	}
	kept := make([]*run[T, F], 0, len(ix.runs))
	for _, r := range ix.runs {
		if r.err == nil && (r.resident || len(r.views) > 0) {
			kept = append(kept, r)
		}
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].used < kept[j].used })
	for _, r := range kept {
		if ix.bytes <= ix.opt.MaxBytes {
			return
		}
		if r.resident {
			freed := r.cost - r.viewCost
			ix.bytes -= freed
			r.cost = r.viewCost
			r.events, r.facts, r.intern, r.resident, r.asOf = nil, nil, nil, false, nil
			ix.stats.Evictions++
		}
	}
	for _, r := range kept {
		if ix.bytes <= ix.opt.MaxBytes {
			return
		}
		ix.bytes -= r.cost
		r.cost, r.views, r.viewCost = 0, nil, 0
		r.offset, r.nextLine = 0, 1
	}
}

// Stats returns a snapshot of the index's counters.
func (ix *Index[T, F]) Stats() Stats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.stats
	s.Runs = len(ix.runs)
	s.Bytes = ix.bytes
	for _, r := range ix.runs {
		if r.resident && r.err == nil {
			s.ResidentRuns++
			s.Events += len(r.events)
		}
	}
	return s
}

// ErrUnknownRun is returned when a run id names no run file.
var ErrUnknownRun = errors.New("no such run")

// MaxConcurrentFullReads bounds how many runs are read in full (payloads
// included) at once: such a read costs memory in proportion to the run.
const MaxConcurrentFullReads = 2

// ReadRun reads one run in full, payloads included, and keeps the events
// for which keep returns true (nil keeps all) exactly as written. The id is
// looked up among the files that exist, never joined onto a path. At most
// MaxConcurrentFullReads such reads run at once; others wait their turn.
func (ix *Index[T, F]) ReadRun(ctx context.Context, id string, keep func(*receipt.Event) bool) ([]receipt.Event, error) {
	select {
	case ix.fullReads <- struct{}{}:
		defer func() { <-ix.fullReads }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	entries, err := ix.opt.Events.ReadDir()
	if err != nil {
		return nil, err
	}
	var name string
	for _, e := range entries {
		if rid, ok := receipt.RunIDFromFileName(e.Name); ok && rid == id {
			if !e.Regular() {
				return nil, fmt.Errorf("run %s: %s is a %s, not a regular file", id, e.Name, e.Kind())
			}
			name = e.Name
			break
		}
	}
	if name == "" {
		return nil, fmt.Errorf("run %q: %w", id, ErrUnknownRun)
	}
	f, err := ix.opt.Events.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []receipt.Event
	consumed, _, err := receipt.ReadEvents(io.LimitReader(f, ix.opt.Limits.MaxRunBytes+1), 1, ix.opt.Limits, func(ev receipt.Event) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if keep == nil || keep(&ev) {
			events = append(events, ev)
		}
		return nil
	})
	if err != nil {
		var le *receipt.LineError
		if errors.As(err, &le) && le.Run == "" {
			le.Run = id
		}
		return nil, err
	}
	if consumed >= ix.opt.Limits.MaxRunBytes {
		return nil, fmt.Errorf("run %s: file larger than the %d-byte limit for one run", id, ix.opt.Limits.MaxRunBytes)
	}
	return events, nil
}

// Fingerprint identifies a template's content, so cached assemblies are
// reused only for the very same stages.
func Fingerprint(t *receipt.Template) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\x00%v\x00", t.Name, t.Version)
	for _, s := range t.Stages {
		fmt.Fprintf(&b, "%s\x00%t\x00%s\x00", s.ID, s.Required, s.MissingExplanation)
		for _, w := range s.Match {
			fmt.Fprintf(&b, "%s\x00%s\x00%t\x00", w.Event, w.Role, w.HasRole)
		}
		b.WriteByte(1)
	}
	for _, x := range t.Exceptions {
		fmt.Fprintf(&b, "%s\x00", x)
	}
	return b.String()
}
