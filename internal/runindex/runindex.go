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
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
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
	// Summarize does not need (payloads, mostly). Nil keeps events whole.
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
	// called once per (run version, template) and its results are cached.
	Summarize func(runID string, r *receipt.Receipt, facts func(e *receipt.Event) F) T
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
}

// DefaultMaxBytes is the default memory budget for indexed events.
const DefaultMaxBytes = 256 << 20

// eventOverhead estimates the fixed memory of one kept event (the struct and
// its string headers) on top of its string bytes.
const eventOverhead = 200

// Index is safe for concurrent use; refreshes are serialized.
type Index[T, F any] struct {
	opt   Options[T, F]
	mu    sync.Mutex
	runs  map[string]*run[T, F]
	tick  uint64
	bytes int64
	stats Stats
	// fullReads is a semaphore bounding concurrent full-run reads.
	fullReads chan struct{}
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
	resident bool
	offset   int64 // bytes consumed so far (up to the last complete line)
	nextLine int
	events   []receipt.Event
	facts    []F // facts[i] belongs to events[i]
	intern   map[string]string
	cost     int64
	err      error // why the run is unreadable, or nil
	used     uint64
	views    map[string][]T // per template fingerprint
	viewCost int64          // the part of cost that views hold
	lastAt   string         // latest occurred_at, for "latest run"
	anchor   anchor         // bytes an in-place rewrite would change
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

// RunView is one readable run's summaries for a template.
type RunView[T any] struct {
	RunID string
	// LastEventAt is the latest occurred_at of the run ("" for an empty run).
	LastEventAt string
	Items       []T
}

// Listing is the result of a refresh for one template.
type Listing[T any] struct {
	Runs       []RunView[T]
	Unreadable []Unreadable
}

// List refreshes the index from the directory and returns the summaries of
// every readable run for the template t, in run id order.
func (ix *Index[T, F]) List(ctx context.Context, t *receipt.Template) (Listing[T], error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	entries, err := ix.opt.Events.ReadDir()
	if err != nil {
		return Listing[T]{}, err
	}
	seen := make(map[string]bool, len(entries))
	var out Listing[T]
	fp := Fingerprint(t)
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return Listing[T]{}, err
		}
		id, ok := receipt.RunIDFromFileName(e.Name)
		if !ok {
			continue
		}
		seen[id] = true
		if !e.Regular() {
			ix.forget(id)
			out.Unreadable = append(out.Unreadable, Unreadable{RunID: id, Err: fmt.Errorf("skipped: %s is a %s, not a regular file", e.Name, e.Kind())})
			continue
		}
		r := ix.refresh(id, e)
		if r.err != nil {
			out.Unreadable = append(out.Unreadable, Unreadable{RunID: id, Err: r.err})
			continue
		}
		ix.tick++
		r.used = ix.tick
		items, ok := r.views[fp]
		if !ok {
			res := receipt.Assemble(r.events, t)
			items = make([]T, 0, len(res.Receipts))
			for i := range res.Receipts {
				items = append(items, ix.opt.Summarize(id, &res.Receipts[i], r.factsOf))
			}
			if r.views == nil {
				r.views = map[string][]T{}
			}
			r.views[fp] = items
			if ix.opt.ItemCost != nil {
				var c int64
				for _, it := range items {
					c += ix.opt.ItemCost(it)
				}
				r.viewCost += c
				r.cost += c
				ix.bytes += c
			}
		}
		out.Runs = append(out.Runs, RunView[T]{RunID: id, LastEventAt: r.lastAt, Items: items})
	}
	for id := range ix.runs {
		if !seen[id] {
			ix.forget(id)
		}
	}
	ix.evict()
	return out, nil
}

// forget drops everything known about a run.
func (ix *Index[T, F]) forget(id string) {
	if r, ok := ix.runs[id]; ok {
		ix.bytes -= r.cost
		delete(ix.runs, id)
	}
}

// refresh brings one run up to date with its file and returns it.
func (ix *Index[T, F]) refresh(id string, e confined.Entry) *run[T, F] {
	cur := identity{dev: e.Dev, ino: e.Ino, size: e.Size, mtime: e.ModTime}
	r, ok := ix.runs[id]
	switch {
	case ok && r.ident == cur && (r.resident || r.err != nil):
		return r // unchanged
	case ok && r.resident && r.err == nil && r.ident.dev == cur.dev && r.ident.ino == cur.ino && cur.size > r.ident.size && ix.stillHolds(r):
		ix.read(r, cur, true) // grew: read only the appended bytes
		return r
	case ok && r.err != nil && r.ident.dev == cur.dev && r.ident.ino == cur.ino && cur.size >= r.ident.size && ix.stillHolds(r):
		// An append-only file with a bad line stays bad; remember the new size.
		r.ident = cur
		return r
	}
	if ok {
		ix.forget(id)
	}
	r = &run[T, F]{id: id, name: e.Name}
	ix.runs[id] = r
	ix.read(r, cur, false)
	return r
}

// read reads a run from its offset (incremental) or from the start.
func (ix *Index[T, F]) read(r *run[T, F], cur identity, incremental bool) {
	if !incremental {
		ix.bytes -= r.cost
		r.events, r.facts, r.intern, r.cost, r.offset, r.nextLine, r.err, r.views, r.viewCost, r.lastAt = nil, nil, nil, 0, 0, 1, nil, nil, 0, ""
		ix.stats.FullReads++
	} else {
		ix.stats.IncrementalRs++
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
	remaining := ix.opt.Limits.MaxRunBytes - r.offset
	var added int64
	consumed, next, err := receipt.ReadEvents(io.LimitReader(f, remaining+1), r.nextLine, ix.opt.Limits, func(ev receipt.Event) error {
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
	ix.stats.BytesRead += consumed
	r.anchor = takeAnchor(f, r.offset+consumed, err != nil)
	r.cost += added
	ix.bytes += added
	r.offset += consumed
	r.nextLine = next
	if len(r.views) > 0 && added > 0 {
		r.cost -= r.viewCost
		ix.bytes -= r.viewCost
		r.views, r.viewCost = nil, 0
	}
	if err != nil {
		var le *receipt.LineError
		if errors.As(err, &le) && le.Run == "" {
			le.Run = r.id
		}
		r.err = err
		ix.bytes -= r.cost
		r.events, r.facts, r.intern, r.cost, r.views, r.viewCost = nil, nil, nil, 0, nil, 0
		return
	}
	if r.offset >= ix.opt.Limits.MaxRunBytes {
		r.err = fmt.Errorf("run %s: file larger than the %d-byte limit for one run", r.id, ix.opt.Limits.MaxRunBytes)
		ix.bytes -= r.cost
		r.events, r.facts, r.intern, r.cost, r.views, r.viewCost = nil, nil, nil, 0, nil, 0
	}
}

// detach copies a compacted event's strings. The reader parses each line in
// place, so they are substrings of the whole line: kept as they are, an ID of
// a few bytes would keep its line's payload alive, and the index would hold
// far more memory than its budget counts.
func (r *run[T, F]) detach(e receipt.Event) receipt.Event {
	e.ID = strings.Clone(e.ID)
	e.OccurredAt = strings.Clone(e.OccurredAt)
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

// evict drops the least recently used runs' events until the budget holds.
func (ix *Index[T, F]) evict() {
	if ix.bytes <= ix.opt.MaxBytes {
		return
	}
	resident := make([]*run[T, F], 0, len(ix.runs))
	for _, r := range ix.runs {
		if r.resident && r.err == nil {
			resident = append(resident, r)
		}
	}
	sort.Slice(resident, func(i, j int) bool { return resident[i].used < resident[j].used })
	for _, r := range resident {
		if ix.bytes <= ix.opt.MaxBytes {
			break
		}
		ix.bytes -= r.cost
		r.events, r.facts, r.intern, r.cost, r.views, r.viewCost, r.resident = nil, nil, nil, 0, nil, 0, false
		r.offset, r.nextLine = 0, 1
		ix.stats.Evictions++
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
