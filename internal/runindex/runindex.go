// Package runindex keeps an index of the run files under a Trace root's
// events/ directory, so that repeated listings cost little.
//
// A run is keyed by its file identity (device, inode, size, modification
// time). A file that grew under the same identity is read from where the last
// read stopped, because run files are append-only; a file that was replaced or
// shrank is read again from the start. The index keeps no event: per run it
// keeps the summaries of its operations (per template) and where each
// operation's lines are in the file, and reads the lines again when it needs
// them (an append re-assembles only the operations it touched, from their
// earlier lines and the new ones). What it keeps is bounded: past the budget,
// the least recently used runs are dropped and read again on demand.
package runindex

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
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
	// MaxBytes is the budget, in estimated bytes, for what the index keeps
	// in memory (summaries and the places of operations' lines). Zero means
	// DefaultMaxBytes.
	MaxBytes int64
	// Compact is applied to each event after Extract, before it is
	// assembled; the index keeps no event past the read that assembles it.
	// The event's Raw value is valid only during Extract. Nil changes
	// nothing.
	Compact func(receipt.Event) receipt.Event
	// Extract reads, from each event while its Raw value is valid, the facts
	// Summarize will need (what the payload says, mostly). Strings it keeps
	// must be copied out of the event's (they are the read buffer's, used
	// again for the next lines), except its ID and OccurredAt,
	// which are the index's own copies already: share returns the read's
	// one copy of a string (for those that repeat: hosts, addresses,
	// amounts). Nil keeps zero facts.
	Extract func(e receipt.Event, share func(string) string) F
	// ItemCost estimates the memory one summary holds; summaries count
	// against MaxBytes. Nil counts nothing.
	ItemCost func(T) int64
	// Summarize turns one assembled receipt into what callers list. It is
	// called once per operation and template, and again only for the
	// operations an append touches; its results are cached, and must not
	// keep the receipt's events, any of its slices (r is valid only during
	// the call: its storage is reused for the next receipt), or strings
	// other than its events' (which the index copies out of the file's
	// text). It may be called from several goroutines at once.
	Summarize func(runID string, r *receipt.Receipt, facts func(e *receipt.Event) F) T
	// Compare orders a run's summaries as callers list them (see
	// RunView.Items); nil keeps the order of first appearance.
	Compare func(a, b *T) int
	// Facet names a summary's group for filtered listings (see
	// RunView.ByFacet); nil groups nothing.
	Facet func(*T) string
	// OperationID returns the operation a summary is about. With it, an
	// append re-assembles only the operations it touched; without it, the
	// whole run is read and assembled again.
	OperationID func(*T) string
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
	// State, when set, is where the index is saved for the next process
	// (IndexFile, authenticated with KeyFile, made there the first time),
	// with EncodeItem and DecodeItem writing and reading one summary, and
	// Version naming what computed the summaries (a saved index of another
	// version is not used).
	State      *confined.Dir
	EncodeItem func(e *Enc, it *T)
	DecodeItem func(runID string, d *Dec) T
	Version    func() string
	// Digest, with State, writes into a saved run's header what a caller
	// may read of a view without its summaries (RunView.Digest), from
	// them; its own table of strings. It is authenticated with the
	// headers. Nil writes none.
	Digest func(e *Enc, items []T)
	// SaveDelay is a test hook: a save waits this long before each run it
	// encodes, so that a test can stop a process while it saves.
	SaveDelay time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// DecodeInBackground, with State, decodes the runs a restart took from
	// the saved index in the background, one at a time, after the first
	// listing that left some undecoded (see ListSome).
	DecodeInBackground bool
	// Progress, when set, is told how a refresh that must read runs goes:
	// after each run it reads (a new or changed file, or one dropped to
	// honour the budget or not yet listed under the template), how many of
	// the runs it must read are done, of how many. A cold index reads every
	// run; a warm one reads only what changed. Calls come one at a time,
	// done counting up from 1.
	Progress func(done, total int)
	// Reading, when set, is called before a refresh reads run files, with
	// about how many bytes of them it will read (a cold index: every
	// file's size), and what it returns is called once they are read. A
	// process may make its collector lazier for a cold read's burst of
	// allocations (see cmd/haia-trace-mcp's coldRead). Nil does nothing.
	Reading func(bytes int64) (done func())
}

// DefaultMaxBytes is the default memory budget of the index: the summaries
// of a root of about three million events.
const DefaultMaxBytes = 768 << 20

// locCost estimates the memory of one event's place (see loc).
const locCost = 16

// Index is safe for concurrent use; refreshes are serialized, and the runs a
// refresh must read are read in parallel, at most GOMAXPROCS at once.
type Index[T, F any] struct {
	opt  Options[T, F]
	mu   sync.Mutex
	runs map[string]*run[T, F]
	tick uint64
	// templates are the templates listed so far, by fingerprint: a run read
	// again (rewritten, grown) brings every view it had up to date.
	templates map[string]*receipt.Template
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
	// changes counts the listings that found a run file new, grown,
	// rewritten or gone (Changes).
	changes atomic.Uint64
	// The saved index (see persist.go): loaded once, its runs adopted as
	// they are listed; dirty (a run read from the start) and appended (under
	// acct) say a save is due.
	loaded, saving  bool
	saved           map[string]*savedRun[T]
	savedFile       *os.File
	decoding        bool
	dirty, appended bool
	savedAt         time.Time
	saves           sync.WaitGroup
	versionOnce     sync.Once
	versionName     string
	// freeBufs and freeBatches (under free) are what a run's read used,
	// for the next read of the same listing to use again: a cold index
	// reads every run, and fresh memory for each (a MiB of read buffer,
	// room for its events) cost page faults and collections. A listing
	// drops them when it ends, so that nothing of a read outlives it.
	free        sync.Mutex
	freeBufs    [][]byte
	freeBatches []batch[F]
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
	ResidentRuns  int   // runs whose summaries are in memory
	Events        int   // events of operations whose places are kept
	Bytes         int64 // estimated bytes the index keeps
	BytesRead     int64 // total bytes read from run files since start
	FullReads     int64 // runs read from the start (new, rewritten or dropped)
	IncrementalRs int64 // runs read from a previous offset
	LinesReread   int64 // earlier lines of operations an append touched, read again
	ViewReads     int64 // runs read again to list them under another template or as of an earlier line
	Evictions     int64 // runs dropped to honour the budget
	SharedLists   int64 // listings of the present answered by one begun after they were asked
	Adopted       int64 // runs taken from the saved index, their files unchanged since
	Saves         int64 // times the index was saved
	Decoded       int64 // adopted runs whose part of the saved index was decoded
	Rejected      int64 // adopted runs whose part of the saved index did not match its header, read from their files instead
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
	offset   int64 // bytes consumed so far (up to the last complete line)
	nextLine int
	// locs is where each event that belongs to an operation is, in line
	// order; ops are the operations' ids (loc.op indexes them), each the
	// one copy the run's summaries share.
	locs   []loc
	ops    []string
	cost   int64
	err    error // why the run is unreadable, or nil
	used   uint64
	views  map[string]*view[T] // per template fingerprint
	lastAt string              // latest occurred_at, for "latest run"
	anchor anchor              // bytes an in-place rewrite would change
	// head and tail are the SHA-256 of the file's first bytes and of those
	// before offset, taken when it was read (what a saved index is checked
	// against); hashed says they were.
	head, tail [32]byte
	hashed     bool
	asOf       *view[T] // the last view taken at an earlier line (paging)
	// pend, when set, is the run's part of the saved index, not decoded
	// yet: ops, locs and views are empty until settle.
	pend *savedRun[T]
}

// loc is where one event's line starts in its run file, its line number,
// and its operation (an index into run.ops).
type loc struct {
	off  int64
	line int32
	op   int32
}

// view is a run's summaries for one template, sorted by Options.Compare.
type view[T any] struct {
	fp      string
	items   []T
	byFacet map[string][]int32
	lines   int    // the run's complete lines it covers
	lastAt  string // the latest occurred_at of those lines (views as of a line)
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
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Index[T, F]{opt: opt, runs: map[string]*run[T, F]{}, templates: map[string]*receipt.Template{}, fullReads: make(chan struct{}, MaxConcurrentFullReads)}
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
	// Pending says the run's summaries are still in the saved index (see
	// ListSome): Items and ByFacet are nil, and First and FirstByFacet are
	// its first item (in Options.Compare order) and that of each facet,
	// nil and absent when it has none.
	Pending      bool
	First        *T
	FirstByFacet map[string]*T
	// Digest is, for a Pending run, what Options.Digest wrote of the view
	// when it was saved (nil: none); NewDec reads it. It is authenticated
	// with the saved index's headers and is of the run as Lines says.
	Digest []byte
	pend   *savedRun[T]
	fp     string
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
	return ix.ListSome(ctx, t, at, nil)
}

// ListSome is ListAt for a caller that needs only some runs' summaries: a
// restart leaves each run's summaries in the saved index until first used,
// and pick, called with the listing's runs when some are Pending, says
// which it needs (nil: all). Those are decoded, in parallel, each checked
// against its authenticated header; the others stay Pending (Items nil,
// First and FirstByFacet set). A run whose part of the saved index does
// not match is not used: it is read from its file, and the listing taken
// again. With Options.DecodeInBackground, what is left is then decoded in
// the background.
func (ix *Index[T, F]) ListSome(ctx context.Context, t *receipt.Template, at map[string]int, pick func([]RunView[T]) []bool) (Listing[T], error) {
	return ix.listSome(ctx, t, at, pick, true)
}

// ListSomeQuiet is ListSome without the background decoding: the runs
// pick leaves stay in the saved index until a caller needs them. A reader
// that never needs them (the guard's decisions, which read the runs'
// digests) does not pay for them, nor wait behind them for the CPU.
func (ix *Index[T, F]) ListSomeQuiet(ctx context.Context, t *receipt.Template, at map[string]int, pick func([]RunView[T]) []bool) (Listing[T], error) {
	return ix.listSome(ctx, t, at, pick, false)
}

func (ix *Index[T, F]) listSome(ctx context.Context, t *receipt.Template, at map[string]int, pick func([]RunView[T]) []bool, rest bool) (Listing[T], error) {
	for {
		l, err := ix.listAt(ctx, t, at, true)
		if err != nil {
			return l, err
		}
		var want []int
		var need []bool
		for i := range l.Runs {
			if l.Runs[i].Pending {
				if need == nil && pick != nil {
					need = pick(l.Runs)
				}
				if pick == nil || (i < len(need) && need[i]) {
					want = append(want, i)
				}
			}
		}
		left := len(want) < countPending(l.Runs)
		if len(want) == 0 {
			if left && rest {
				ix.mu.Lock()
				ix.decodeRest()
				ix.mu.Unlock()
			}
			return l, nil
		}
		ix.parallel(ctx, len(want), func(k int) { ix.decodeSaved(l.Runs[want[k]].pend) })
		if err := ctx.Err(); err != nil {
			return Listing[T]{}, err
		}
		// Bring the decoded runs into the index; a run whose part did not
		// match is forgotten, so that the next listing reads its file.
		again := false
		ix.mu.Lock()
		for _, i := range want {
			p := l.Runs[i].pend
			if r := ix.runs[l.Runs[i].RunID]; r != nil && r.pend == p && !ix.settle(r) {
				ix.forget(r.id)
			}
			if p.body.err != nil {
				again = true
			}
		}
		if left && !again && rest {
			ix.decodeRest()
		}
		ix.mu.Unlock()
		if again {
			continue
		}
		out := Listing[T]{Runs: slices.Clone(l.Runs), Unreadable: l.Unreadable}
		for _, i := range want {
			rv := &out.Runs[i]
			v := rv.pend.body.views[rv.fp]
			rv.Items, rv.ByFacet, rv.Lines = v.items, v.byFacet, v.lines
			rv.Pending, rv.First, rv.FirstByFacet, rv.Digest, rv.pend = false, nil, nil, nil, nil
		}
		return out, nil
	}
}

func countPending[T any](runs []RunView[T]) int {
	n := 0
	for i := range runs {
		if runs[i].Pending {
			n++
		}
	}
	return n
}

// decodeRest starts, under ix.mu and with Options.DecodeInBackground, one
// goroutine that decodes the runs still in the saved index, one at a time,
// and brings each into the index (or forgets it, when its part does not
// match: the next listing reads its file).
func (ix *Index[T, F]) decodeRest() {
	if !ix.opt.DecodeInBackground || ix.decoding {
		return
	}
	type todo struct {
		r *run[T, F]
		p *savedRun[T]
	}
	var list []todo
	for _, r := range ix.runs {
		if r.pend != nil {
			list = append(list, todo{r, r.pend})
		}
	}
	if len(list) == 0 {
		return
	}
	ix.decoding = true
	go func() {
		for _, w := range list {
			ix.decodeSaved(w.p)
			ix.mu.Lock()
			if ix.runs[w.r.id] == w.r && w.r.pend == w.p && !ix.settle(w.r) {
				ix.forget(w.r.id)
			}
			ix.mu.Unlock()
		}
		ix.mu.Lock()
		ix.decoding = false
		ix.mu.Unlock()
	}()
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
		ix.maybeSave()
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
	defer ix.dropScratch()
	if !ix.loaded {
		ix.load()
	}
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
		pend *savedRun[T]
		size int64
	}
	slots := make([]slot, 0, len(entries))
	ix.templates[fp] = t
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
		if _, ok := ix.runs[id]; !ok && ix.saved != nil {
			ix.adopt(id, e)
		}
		r, work := ix.plan(id, e, fp)
		slots = append(slots, slot{id: id, r: r, work: work, size: e.Size})
	}
	changed := false
	for id := range ix.runs {
		if !seen[id] {
			ix.forget(id)
			changed = true
		}
	}
	// Read what changed, then take each run's view, in parallel.
	toRead := 0
	for _, sl := range slots {
		if sl.r != nil && sl.work != nil {
			toRead++
		}
		if sl.bad != nil {
			changed = true
		}
	}
	if changed || toRead > 0 {
		ix.changes.Add(1)
	}
	if toRead > 0 && ix.opt.Reading != nil {
		var bytes int64
		for _, sl := range slots {
			if sl.r != nil && sl.work != nil {
				// What is past what was read (a new file: all of it).
				bytes += max(sl.size-sl.r.offset, 0)
			}
		}
		done := ix.opt.Reading(bytes)
		defer done()
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
				var err error
				if sl.v, err = ix.viewAt(sl.r, fp, t, lines); err != nil {
					sl.bad = err
				}
				return
			}
		}
		if sl.r.pend != nil {
			sl.pend = sl.r.pend
		} else {
			sl.v = sl.r.views[fp]
		}
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
		case sl.pend != nil:
			ix.tick++
			sl.r.used = ix.tick
			pv := sl.pend.views[fp]
			out.Runs = append(out.Runs, RunView[T]{RunID: sl.id, LastEventAt: sl.r.lastAt, Lines: pv.lines, Pending: true, First: pv.first, FirstByFacet: pv.firstBy, Digest: pv.digest, pend: sl.pend, fp: fp})
		case sl.v != nil:
			ix.tick++
			sl.r.used = ix.tick
			lastAt := sl.r.lastAt
			if sl.v != sl.r.views[fp] {
				lastAt = sl.v.lastAt
			}
			out.Runs = append(out.Runs, RunView[T]{RunID: sl.id, LastEventAt: lastAt, Items: sl.v.items, ByFacet: sl.v.byFacet, Lines: sl.v.lines})
		}
	}
	ix.evict()
	return out, nil
}

// Changes counts the listings that found a run file new, grown, rewritten,
// gone or not a regular file (or read one not yet listed under their
// template): while it stays the same, no listing since saw the run files
// change. A reader that keeps its own reading of the files reads them
// again only when it moved.
func (ix *Index[T, F]) Changes() uint64 { return ix.changes.Load() }

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

// forget drops everything known about a run.
func (ix *Index[T, F]) forget(id string) {
	if r, ok := ix.runs[id]; ok {
		ix.account(func(b *int64, _ *Stats) { *b -= r.cost })
		delete(ix.runs, id)
	}
}

// plan finds out, from the directory entry alone, what bringing a run up
// to date for the template fp takes: nothing, or work (reading the file)
// that touches only this run and the shared counters, so that several runs'
// work can run at once.
func (ix *Index[T, F]) plan(id string, e confined.Entry, fp string) (*run[T, F], func()) {
	cur := identity{dev: e.Dev, ino: e.Ino, size: e.Size, mtime: e.ModTime}
	r, ok := ix.runs[id]
	sameFile := ok && r.ident.dev == cur.dev && r.ident.ino == cur.ino
	switch {
	case ok && r.ident == cur && (r.err != nil || r.views[fp] != nil || (r.pend != nil && r.pend.views[fp] != nil)):
		return r, nil // unchanged
	case ok && r.pend != nil:
		// Adopted, and changed since or not saved under fp: its body first.
		return r, func() {
			if !ix.settle(r) {
				ix.readAll(r, cur, fp)
				return
			}
			switch {
			case r.ident == cur:
				ix.addView(r, fp)
			case r.ident.dev == cur.dev && r.ident.ino == cur.ino && cur.size > r.ident.size && ix.stillHolds(r):
				ix.readMore(r, cur, fp)
			default:
				ix.readAll(r, cur, fp)
			}
		}
	case ok && r.ident == cur:
		return r, func() { ix.addView(r, fp) } // unchanged, not yet listed under fp
	case sameFile && r.err == nil && cur.size > r.ident.size:
		return r, func() {
			if ix.stillHolds(r) {
				ix.readMore(r, cur, fp) // grew: read only the appended bytes
			} else {
				ix.readAll(r, cur, fp)
			}
		}
	case sameFile && r.err != nil && cur.size >= r.ident.size:
		return r, func() {
			if ix.stillHolds(r) {
				r.ident = cur // an append-only file with a bad line stays bad
			} else {
				ix.readAll(r, cur, fp)
			}
		}
	}
	if ok {
		ix.forget(id)
	}
	r = &run[T, F]{id: id, name: e.Name}
	ix.runs[id] = r
	return r, func() { ix.readAll(r, cur, fp) }
}

// batch is events read for one assembly, in line order, with their facts.
type batch[F any] struct {
	events []receipt.Event
	facts  []F   // facts[i] belongs to events[i] as read
	lines  []int // lines[i] is events[i].Line as read: an assembly in place moves events
}

// getBatch returns an empty batch with room for at least n events: one a
// read before gave back (putBatch), or a new one.
func (ix *Index[T, F]) getBatch(n int) batch[F] {
	ix.free.Lock()
	if k := len(ix.freeBatches); k > 0 && cap(ix.freeBatches[k-1].events) >= n {
		b := ix.freeBatches[k-1]
		ix.freeBatches = ix.freeBatches[:k-1]
		ix.free.Unlock()
		return b
	}
	ix.free.Unlock()
	if n <= 0 {
		return batch[F]{}
	}
	return batch[F]{events: make([]receipt.Event, 0, n), facts: make([]F, 0, n), lines: make([]int, 0, n)}
}

// putBatch gives b's room back for another read, once nothing uses its
// events or facts (what was built from them holds copies, not pointers
// into them).
func (ix *Index[T, F]) putBatch(b *batch[F]) {
	if cap(b.events) == 0 || cap(b.facts) < cap(b.events) {
		return
	}
	// Cleared, so that the pool holds no string of a run read long ago.
	clear(b.events[:cap(b.events)])
	clear(b.facts[:cap(b.facts)])
	ix.free.Lock()
	ix.freeBatches = append(ix.freeBatches, batch[F]{events: b.events[:0], facts: b.facts[:0], lines: b.lines[:0]})
	ix.free.Unlock()
	*b = batch[F]{}
}

// dropScratch forgets the read buffers and batches kept for reuse.
func (ix *Index[T, F]) dropScratch() {
	ix.free.Lock()
	ix.freeBufs, ix.freeBatches = nil, nil
	ix.free.Unlock()
}

// scan reads events with ScanEventsBorrowed into a read buffer another read
// used before, and gives it back for the next: fn keeps only copies of an
// event's strings (take copies what the batch keeps).
func (ix *Index[T, F]) scan(r io.Reader, firstLine int, fn func(ev receipt.Event, at int64) error) (consumed int64, nextLine int, err error) {
	var buf []byte
	ix.free.Lock()
	if k := len(ix.freeBufs); k > 0 {
		buf = ix.freeBufs[k-1]
		ix.freeBufs = ix.freeBufs[:k-1]
	}
	ix.free.Unlock()
	consumed, nextLine, buf, err = receipt.ScanEventsBorrowed(r, firstLine, ix.opt.Limits, buf, fn)
	if buf != nil {
		ix.free.Lock()
		ix.freeBufs = append(ix.freeBufs, buf)
		ix.free.Unlock()
	}
	return consumed, nextLine, err
}

// factsOf returns the facts of one of the batch's events, found by its line
// number.
func (b *batch[F]) factsOf(e *receipt.Event) F {
	i, found := slices.BinarySearch(b.lines, e.Line)
	var zero F
	if found {
		return b.facts[i]
	}
	return zero
}

// intern keeps one copy of the short strings that repeat across a read's
// events (types, adapters, roles), so that what they share is not a copy of
// each line.
type intern struct {
	m map[string]string
	// recent holds the last string interned in each of a few slots (by
	// its length and last byte): an event's type, adapter, role, host and
	// asset are mostly the previous event's, found without hashing.
	recent [16]string
	// share is of, made once: a method value made for each event's
	// Extract would be an allocation an event.
	share func(string) string
}

// newIntern returns an intern with room for about n strings.
func newIntern(n int) *intern {
	in := &intern{m: make(map[string]string, n)}
	in.share = in.of
	return in
}

func (in *intern) of(s string) string {
	if s == "" {
		return ""
	}
	k := (len(s) + int(s[len(s)-1])) & (len(in.recent) - 1)
	if v := in.recent[k]; v == s {
		return v
	}
	v, ok := in.m[s]
	if !ok {
		v = strings.Clone(s)
		in.m[v] = v
	}
	in.recent[k] = v
	return v
}

// take turns an event just read (its Raw valid, its strings parts of the
// read buffer, which the next MiB overwrites) into one the batch keeps:
// facts extracted, compacted, its strings copied, its operation id the
// run's one copy.
func (ix *Index[T, F]) take(b *batch[F], in *intern, ev receipt.Event, opID string) {
	// One copy for the two: a Builder always copies (a concatenation with
	// an empty string would not). Made before Extract, which may keep them.
	var sb strings.Builder
	sb.Grow(len(ev.ID) + len(ev.OccurredAt))
	sb.WriteString(ev.ID)
	sb.WriteString(ev.OccurredAt)
	both := sb.String()
	ev.ID, ev.OccurredAt = both[:len(ev.ID)], both[len(ev.ID):]
	var facts F
	if ix.opt.Extract != nil {
		facts = ix.opt.Extract(ev, in.share)
	}
	if ix.opt.Compact != nil {
		ev = ix.opt.Compact(ev)
	}
	ev.Raw = jsjson.Value{}
	ev.Type, ev.Adapter, ev.Role = in.of(ev.Type), in.of(ev.Adapter), in.of(ev.Role)
	ev.ContextID = opID
	b.events = append(b.events, ev)
	b.facts = append(b.facts, facts)
	b.lines = append(b.lines, ev.Line)
}

// reset forgets what was read of a run, before it is read from the start.
func (ix *Index[T, F]) reset(r *run[T, F]) {
	old := r.cost
	ix.account(func(b *int64, _ *Stats) { *b -= old })
	r.offset, r.nextLine, r.locs, r.ops, r.cost, r.err, r.views, r.lastAt, r.asOf, r.pend = 0, 1, nil, nil, 0, nil, nil, "", nil, nil
}

// fail marks a run unreadable, keeping nothing else of it.
func (ix *Index[T, F]) fail(r *run[T, F], err error) {
	var le *receipt.LineError
	if errors.As(err, &le) && le.Run == "" {
		le.Run = r.id
	}
	ix.reset(r)
	r.err = err
}

// recount sets the run's cost from what it keeps and accounts the change.
func (ix *Index[T, F]) recount(r *run[T, F]) {
	n := int64(len(r.locs))*locCost + int64(len(r.ops))*16 + 2*anchorBytes
	for _, id := range r.ops {
		n += int64(len(id))
	}
	for _, v := range r.views {
		n += v.cost
	}
	delta := n - r.cost
	r.cost = n
	ix.account(func(b *int64, _ *Stats) { *b += delta })
}

// ingest reads the run from its offset to the end of its complete lines,
// records where the new events' lines are, and returns them.
func (ix *Index[T, F]) ingest(r *run[T, F], f *os.File) (batch[F], error) {
	// Room for the new events, guessed from the new bytes (a recorder
	// line is over half a KiB: a run of them needs no regrowing, which
	// would copy the batch and more than double what it allocates) and
	// capped (the size is the writer's to choose).
	guess := int(min(max(r.ident.size-r.offset, 0)/512, 1<<14))
	b := ix.getBatch(guess)
	if r.offset > 0 {
		if _, err := f.Seek(r.offset, io.SeekStart); err != nil {
			return b, fmt.Errorf("run %s: seek to %d: %w", r.id, r.offset, err)
		}
	}
	// Sized for a recorder's few events an operation and the strings each
	// shares (its resource, its payee), so that neither map grows
	// step by step through a run.
	opIdx := make(map[string]int32, len(r.ops)+guess/4)
	for i, id := range r.ops {
		opIdx[id] = int32(i)
	}
	in := newIntern(guess / 2)
	remaining := ix.opt.Limits.MaxRunBytes - r.offset
	consumed, next, err := ix.scan(io.LimitReader(f, remaining+1), r.nextLine, func(ev receipt.Event, at int64) error {
		opID := ""
		if ev.ContextID != "" {
			k, ok := opIdx[ev.ContextID]
			if !ok {
				// The key is the run's copy: ev's strings are the read
				// buffer's, overwritten by the next MiB.
				id := strings.Clone(ev.ContextID)
				k = int32(len(r.ops))
				opIdx[id] = k
				r.ops = append(r.ops, id)
			}
			opID = r.ops[k]
			r.locs = append(r.locs, loc{off: r.offset + at, line: int32(ev.Line), op: k})
		}
		ix.take(&b, in, ev, opID)
		if jsjson.CompareUTF16(ev.OccurredAt, r.lastAt) > 0 {
			r.lastAt = b.events[len(b.events)-1].OccurredAt
		}
		return nil
	})
	r.anchor = takeAnchor(f, r.offset+consumed, err != nil)
	r.hashed = false
	if err == nil {
		var herr error
		r.head, r.tail, herr = HeadTail(f, r.offset+consumed)
		r.hashed = herr == nil
	}
	ix.account(func(_ *int64, st *Stats) { st.BytesRead += consumed })
	r.offset += consumed
	r.nextLine = next
	if err == nil && r.offset >= ix.opt.Limits.MaxRunBytes {
		err = fmt.Errorf("run %s: file larger than the %d-byte limit for one run", r.id, ix.opt.Limits.MaxRunBytes)
	}
	return b, err
}

// readAll reads a run from the start and builds its views: fp's and every
// one it had.
func (ix *Index[T, F]) readAll(r *run[T, F], cur identity, fp string) {
	fps := []string{fp}
	for k := range r.views {
		if k != fp {
			fps = append(fps, k)
		}
	}
	ix.reset(r)
	ix.account(func(_ *int64, st *Stats) { st.FullReads++; ix.dirty = true })
	r.ident = cur
	f, err := ix.opt.Events.Open(r.name)
	if err != nil {
		ix.fail(r, err)
		return
	}
	defer f.Close()
	b, err := ix.ingest(r, f)
	if err != nil {
		ix.fail(r, err)
		return
	}
	r.views = make(map[string]*view[T], len(fps))
	for i, k := range fps {
		if t := ix.templates[k]; t != nil {
			var v *view[T]
			if i == len(fps)-1 {
				// The batch is not read again: its events are put in
				// receipt order where they are, not copied.
				v = ix.buildInPlace(r, t, &b)
			} else {
				v = ix.build(r, t, &b)
			}
			v.fp, v.lines = k, r.nextLine-1
			r.views[k] = v
		}
	}
	ix.putBatch(&b)
	ix.recount(r)
}

// readMore reads what was appended to a run and brings its views up to
// date: only the operations the new lines touch are assembled again, from
// their earlier lines (read again at their places) and the new ones.
func (ix *Index[T, F]) readMore(r *run[T, F], cur identity, fp string) {
	ix.account(func(_ *int64, st *Stats) { st.IncrementalRs++; ix.appended = true })
	f, err := ix.opt.Events.Open(r.name)
	if err != nil {
		ix.fail(r, err)
		return
	}
	defer f.Close()
	before, beforeLocs := r.offset, len(r.locs)
	r.ident = cur
	fresh, err := ix.ingest(r, f)
	if err != nil {
		ix.fail(r, err)
		return
	}
	// r.asOf stays: an append leaves the earlier lines as they were.
	if len(fresh.events) > 0 && len(r.views) > 0 {
		if ix.opt.OperationID == nil || ix.opt.Compare == nil {
			f.Close()
			ix.readAll(r, cur, fp)
			return
		}
		touched := map[int32]bool{}
		for _, l := range r.locs[beforeLocs:] {
			touched[l.op] = true
		}
		var earlier []loc
		for _, l := range r.locs[:beforeLocs] {
			if touched[l.op] {
				earlier = append(earlier, l)
			}
		}
		sel, err := ix.reread(r, f, earlier, before)
		if err != nil {
			// The lines are not what was read there before: the file was
			// changed, not appended to.
			ix.opt.Logger.Warn("a run's earlier lines changed under an append; reading it again from the start", "run", r.id, "err", err)
			f.Close()
			ix.readAll(r, cur, fp)
			return
		}
		for i := range fresh.events {
			if fresh.events[i].ContextID != "" {
				sel.events = append(sel.events, fresh.events[i])
				sel.facts = append(sel.facts, fresh.facts[i])
				sel.lines = append(sel.lines, fresh.lines[i])
			}
		}
		ids := map[string]bool{}
		for k := range touched {
			ids[r.ops[k]] = true
		}
		views := make(map[string]*view[T], len(r.views))
		for k, old := range r.views {
			if ix.templates[k] == nil {
				continue // a saved view of a template not listed since: dropped
			}
			v := ix.updated(r, old, ix.templates[k], ids, &sel)
			v.fp, v.lines = k, r.nextLine-1
			views[k] = v
		}
		r.views = views
	} else {
		views := make(map[string]*view[T], len(r.views))
		for k, old := range r.views {
			v := *old
			v.lines = r.nextLine - 1
			views[k] = &v
		}
		r.views = views
	}
	if r.views[fp] == nil {
		if b, err := ix.readPrefix(r, f, r.nextLine-1); err == nil {
			v := ix.build(r, ix.templates[fp], &b)
			v.fp, v.lines = fp, r.nextLine-1
			r.views[fp] = v
		} else {
			f.Close()
			ix.readAll(r, cur, fp)
			return
		}
	}
	ix.recount(r)
}

// reread reads the lines at locs again (each before end), checks that each
// is still the event of its operation read there before, and returns them.
func (ix *Index[T, F]) reread(r *run[T, F], f io.ReaderAt, locs []loc, end int64) (batch[F], error) {
	var b batch[F]
	in := newIntern(0)
	buf := make([]byte, 0, 64<<10)
	base := int64(-1) // where buf starts in the file
	for _, l := range locs {
		var text []byte
		for {
			if base >= 0 && l.off >= base && l.off < base+int64(len(buf)) {
				if nl := indexNL(buf[l.off-base:]); nl >= 0 {
					text = buf[l.off-base : l.off-base+int64(nl)]
					break
				}
				if base == l.off && len(buf) == cap(buf) {
					if cap(buf) > ix.opt.Limits.MaxLineBytes {
						return b, fmt.Errorf("line %d is longer than the line limit", l.line)
					}
					buf = make([]byte, 0, 2*cap(buf))
				}
			}
			n, err := f.ReadAt(buf[:min(int64(cap(buf)), end-l.off)], l.off)
			if n == 0 && err != nil {
				return b, fmt.Errorf("line %d: %w", l.line, err)
			}
			buf, base = buf[:n], l.off
			if indexNL(buf) < 0 && (n < cap(buf) || err != nil) {
				return b, fmt.Errorf("line %d has no end before byte %d", l.line, end)
			}
		}
		ev, err := receipt.DecodeLineAt(text, int(l.line))
		if err != nil {
			return b, err
		}
		if ev.ContextID != r.ops[l.op] {
			return b, fmt.Errorf("line %d belongs to operation %q, not %q", l.line, ev.ContextID, r.ops[l.op])
		}
		ix.take(&b, in, ev, r.ops[l.op])
	}
	ix.account(func(_ *int64, st *Stats) { st.LinesReread += int64(len(locs)) })
	return b, nil
}

func indexNL(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return -1
}

// errStop ends a read at the line asked for.
var errStop = errors.New("stop")

// readPrefix reads the run's events up to line lines (at most its offset).
func (ix *Index[T, F]) readPrefix(r *run[T, F], f io.ReaderAt, lines int) (batch[F], error) {
	var b batch[F]
	in := newIntern(0)
	consumed, _, err := ix.scan(io.NewSectionReader(f, 0, r.offset), 1, func(ev receipt.Event, _ int64) error {
		if ev.Line > lines {
			return errStop
		}
		ix.take(&b, in, ev, strings.Clone(ev.ContextID))
		return nil
	})
	ix.account(func(_ *int64, st *Stats) { st.ViewReads++; st.BytesRead += consumed })
	if err != nil && !errors.Is(err, errStop) {
		return b, err
	}
	return b, nil
}

// addView builds the run's view for a template it was not listed under
// yet, from the file as far as it was read.
func (ix *Index[T, F]) addView(r *run[T, F], fp string) {
	f, err := ix.opt.Events.Open(r.name)
	if err != nil {
		ix.fail(r, err)
		return
	}
	defer f.Close()
	b, err := ix.readPrefix(r, f, r.nextLine-1)
	if err != nil {
		f.Close()
		ix.readAll(r, r.ident, fp)
		return
	}
	v := ix.build(r, ix.templates[fp], &b)
	v.fp, v.lines = fp, r.nextLine-1
	views := make(map[string]*view[T], len(r.views)+1)
	for k, old := range r.views {
		views[k] = old
	}
	views[fp] = v
	r.views = views
	ix.recount(r)
	ix.account(func(_ *int64, _ *Stats) { ix.dirty = true })
}

// viewAt returns the run's view as it was when it had lines complete lines,
// read again from the file (not cached beyond the last one asked for, nor
// counted in the budget).
func (ix *Index[T, F]) viewAt(r *run[T, F], fp string, t *receipt.Template, lines int) (*view[T], error) {
	if v := r.asOf; v != nil && v.fp == fp && v.lines == lines {
		return v, nil
	}
	f, err := ix.opt.Events.Open(r.name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := ix.readPrefix(r, f, lines)
	if err != nil {
		return nil, err
	}
	v := ix.build(r, t, &b)
	v.fp, v.lines = fp, lines
	for i := range b.events {
		if jsjson.CompareUTF16(b.events[i].OccurredAt, v.lastAt) > 0 {
			v.lastAt = b.events[i].OccurredAt
		}
	}
	r.asOf = v
	return v, nil
}

// build assembles a batch of the run's events into a sorted view.
func (ix *Index[T, F]) build(r *run[T, F], t *receipt.Template, b *batch[F]) *view[T] {
	return ix.view(r, b, receipt.Assemble(b.events, t))
}

// buildInPlace is build for the batch's last assembly: it moves the
// batch's events (AssembleInPlaceEach) instead of copying them, and
// summarises each receipt as it is folded, in storage reused for the next;
// only factsOf (by line) may read the batch after.
func (ix *Index[T, F]) buildInPlace(r *run[T, F], t *receipt.Template, b *batch[F]) *view[T] {
	// One receipt an operation read (the batch is the whole run): the
	// view keeps this array, so it is made to size.
	items := make([]T, 0, len(r.ops))
	receipt.AssembleInPlaceEach(b.events, t, func(rc *receipt.Receipt) {
		items = append(items, ix.opt.Summarize(r.id, rc, b.factsOf))
	})
	return ix.finish(ix.sorted(items))
}

// view summarises an assembly of b's events into a sorted view.
func (ix *Index[T, F]) view(r *run[T, F], b *batch[F], res receipt.Result) *view[T] {
	items := make([]T, 0, len(res.Receipts))
	for i := range res.Receipts {
		items = append(items, ix.opt.Summarize(r.id, &res.Receipts[i], b.factsOf))
	}
	return ix.finish(ix.sorted(items))
}

// sorted puts items in Options.Compare order, stably, and returns them.
// Summaries can be large structs, so positions are sorted and each item is
// moved once, where it is (a copy would allocate the view twice).
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
	// items[k] takes items[order[k]]: each cycle of the permutation is
	// followed once, its first item held aside; a done position is -1.
	for k := range order {
		if order[k] < 0 {
			continue
		}
		held := items[k]
		j := k
		for {
			src := int(order[j])
			order[j] = -1
			if src == k {
				items[j] = held
				break
			}
			items[j] = items[src]
			j = src
		}
	}
	return items
}

// updated brings a view up to date with an append: the operations ids
// names are assembled again from sel (every event of theirs, in line
// order), sorted, and merged into the rest, which keep their order.
func (ix *Index[T, F]) updated(r *run[T, F], old *view[T], t *receipt.Template, ids map[string]bool, sel *batch[F]) *view[T] {
	res := receipt.Assemble(sel.events, t)
	fresh := make([]T, 0, len(res.Receipts))
	for i := range res.Receipts {
		fresh = append(fresh, ix.opt.Summarize(r.id, &res.Receipts[i], sel.factsOf))
	}
	fresh = ix.sorted(fresh)
	items := make([]T, 0, len(old.items)+len(fresh))
	k := 0
	for i := range old.items {
		it := &old.items[i]
		if ids[ix.opt.OperationID(it)] {
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

// evict honours the budget: it drops the least recently used runs whole
// (read again from the start when next listed).
func (ix *Index[T, F]) evict() {
	if ix.bytes <= ix.opt.MaxBytes {
		return
	}
	kept := make([]*run[T, F], 0, len(ix.runs))
	for _, r := range ix.runs {
		if r.err == nil && len(r.views) > 0 {
			kept = append(kept, r)
		}
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].used < kept[j].used })
	for _, r := range kept {
		if ix.bytes <= ix.opt.MaxBytes {
			return
		}
		ix.forget(r.id)
		ix.stats.Evictions++
	}
}

// Stats returns a snapshot of the index's counters.
func (ix *Index[T, F]) Stats() Stats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	// The counters are written under acct (a save in the background too).
	var s Stats
	ix.account(func(b *int64, st *Stats) { s, s.Bytes = *st, *b })
	s.Runs = len(ix.runs)
	for _, r := range ix.runs {
		if len(r.views) > 0 && r.err == nil {
			s.ResidentRuns++
			s.Events += len(r.locs)
		} else if r.pend != nil {
			s.ResidentRuns++
			s.Events += r.pend.nLocs
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
