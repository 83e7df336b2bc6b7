package catalog

import (
	"container/heap"
	"context"
	"fmt"
	"sort"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
)

// ListQuery is one page of a listing.
type ListQuery struct {
	// Template names the template receipts are assembled under ("" is
	// guard.DefaultTemplate).
	Template string
	// Run selects one run: "" every run, "latest" the run that wrote
	// last, anything else a run id.
	Run string
	// Completeness keeps "full" or "partial" receipts only ("" keeps all).
	Completeness string
	// Limit is the page size (at least 1).
	Limit int
	// Cursor is a NextCursor an earlier page returned ("" starts).
	Cursor string
}

// Page is one page of a listing, newest first.
type Page struct {
	Operations []*Summary
	// RunsScanned is how many runs the listing covers.
	RunsScanned int
	// Unreadable are the runs (of the selection) that cannot be read, each
	// with why, relative to the root.
	Unreadable []guard.UnreadableRun
	// NextCursor, when not "", reads the next page.
	NextCursor string
}

// List returns a page of the operations under q.Template, newest last event
// first. Later pages (q.Cursor) list the runs as they were when the first
// page was read: appends can neither move an unseen operation before the
// position nor show one twice. A run id that names no run, or a run that
// cannot be read, is a *RunError; a bad cursor a *CursorError; a bad
// template a *TemplateError.
func (c *Catalog) List(ctx context.Context, q ListQuery) (Page, error) {
	if q.Template == "" {
		q.Template = guard.DefaultTemplate
	}
	if q.Limit < 1 {
		q.Limit = 1
	}
	t, err := c.Template(q.Template)
	if err != nil {
		return Page{}, err
	}
	var cur *listCursor
	if q.Cursor != "" {
		if cur, err = decodeCursor(q.Cursor); err != nil {
			return Page{}, err
		}
		if cur.Template != q.Template || cur.Completeness != q.Completeness || cur.RunSel != q.Run {
			return Page{}, &CursorError{Kind: CursorOtherListing, Template: cur.Template, Run: cur.RunSel, Completeness: cur.Completeness}
		}
	}
	var at map[string]int
	if cur != nil {
		at = cur.snapshot()
	}
	// After a restart, runs are decoded from the saved index only as a
	// page needs them (see firstPageRuns).
	listing, err := c.index.ListSome(ctx, t, at, func(runs []runindex.RunView[Summary]) []bool {
		need := make([]bool, len(runs))
		sel := selectRuns(runs, q, cur)
		if cur != nil {
			for _, i := range sel {
				need[i] = true
			}
			return need
		}
		for _, i := range firstPageRuns(runs, sel, q.Completeness, q.Limit+1) {
			need[i] = true
		}
		return need
	})
	if err != nil {
		return Page{}, fmt.Errorf("list runs: %w", err)
	}
	var runs []runindex.RunView[Summary]
	for _, i := range selectRuns(listing.Runs, q, cur) {
		runs = append(runs, listing.Runs[i])
	}
	if q.Run != "" && q.Run != "latest" && len(runs) == 0 {
		for _, u := range listing.Unreadable {
			if u.RunID == q.Run {
				return Page{}, &RunError{RunID: q.Run, Detail: c.Relative(u.Err.Error())}
			}
		}
		return Page{}, &RunError{RunID: q.Run, Unknown: true}
	}
	page := Page{Operations: []*Summary{}, Unreadable: []guard.UnreadableRun{}}
	for _, u := range listing.Unreadable {
		if q.Run == "" || q.Run == "latest" || u.RunID == q.Run {
			page.Unreadable = append(page.Unreadable, guard.UnreadableRun{RunID: u.RunID, Error: c.Relative(u.Err.Error())})
		}
	}
	page.RunsScanned = len(runs)
	rows := mergeNewest(runs, q.Completeness, cur, q.Limit+1)
	more := len(rows) > q.Limit
	if more {
		rows = rows[:q.Limit]
	}
	page.Operations = append(page.Operations, rows...)
	if more {
		next := listCursor{Template: q.Template, RunSel: q.Run, Completeness: q.Completeness}
		if cur != nil {
			next.Runs, next.Lines = cur.Runs, cur.Lines
		} else {
			for _, rv := range runs {
				next.Runs = append(next.Runs, rv.RunID)
				next.Lines = append(next.Lines, rv.Lines)
			}
		}
		last := rows[len(rows)-1]
		next.At, next.Run, next.Op = last.LastEventAt, last.RunID, last.OperationID
		page.NextCursor = c.cursors.encode(next)
	}
	return page, nil
}

// selectRuns returns the positions of the runs a listing reads: all, the
// latest, or one by id (a later page of "latest" keeps the run the first
// page chose).
func selectRuns(runs []runindex.RunView[Summary], q ListQuery, cur *listCursor) []int {
	want := q.Run
	switch {
	case q.Run == "":
		all := make([]int, len(runs))
		for i := range all {
			all[i] = i
		}
		return all
	case q.Run == "latest" && cur == nil:
		return latestRun(runs)
	case q.Run == "latest":
		want = ""
		if len(cur.Runs) == 1 {
			want = cur.Runs[0]
		}
	}
	for i, rv := range runs {
		if rv.RunID == want {
			return []int{i}
		}
	}
	return nil
}

// firstPageRuns returns, of the runs at sel, those that can have a row
// among the first n of a listing from the start: a run's rows are sorted,
// so a run with a row among the first n has its first row (of the
// completeness asked) among the first n of the runs' first rows. Only
// those need their summaries; a restart knows each run's first rows from
// the saved index's headers.
func firstPageRuns(runs []runindex.RunView[Summary], sel []int, completeness string, n int) []int {
	type first struct {
		i int
		s *Summary
	}
	firsts := make([]first, 0, len(sel))
	for _, i := range sel {
		if s := firstRow(&runs[i], completeness); s != nil {
			firsts = append(firsts, first{i, s})
		}
	}
	sort.Slice(firsts, func(a, b int) bool {
		x, y := firsts[a].s, firsts[b].s
		return before(x.LastEventAt, x.RunID, x.OperationID, y.LastEventAt, y.RunID, y.OperationID)
	})
	out := make([]int, 0, min(n, len(firsts)))
	for _, f := range firsts[:min(n, len(firsts))] {
		out = append(out, f.i)
	}
	return out
}

// firstRow is a run's first row of the completeness asked ("": any), or
// nil when it has none.
func firstRow(rv *runindex.RunView[Summary], completeness string) *Summary {
	switch {
	case rv.Pending && completeness == "":
		return rv.First
	case rv.Pending:
		return rv.FirstByFacet[completeness]
	case completeness == "":
		if len(rv.Items) > 0 {
			return &rv.Items[0]
		}
	default:
		if pos := rv.ByFacet[completeness]; len(pos) > 0 {
			return &rv.Items[pos[0]]
		}
	}
	return nil
}

// runHead is one run's position in a merge: the next of its rows to offer.
type runHead struct {
	items []Summary
	pos   []int32 // the facet's positions in items, or nil for all items
	k     int     // index into pos (or items)
}

func (h *runHead) len() int {
	if h.pos != nil {
		return len(h.pos)
	}
	return len(h.items)
}

func (h *runHead) at(k int) *Summary {
	if h.pos != nil {
		return &h.items[h.pos[k]]
	}
	return &h.items[k]
}

// headHeap orders runs by their next row, the listing's first on top.
type headHeap []*runHead

func (h headHeap) Len() int { return len(h) }
func (h headHeap) Less(i, j int) bool {
	a, b := h[i].at(h[i].k), h[j].at(h[j].k)
	return before(a.LastEventAt, a.RunID, a.OperationID, b.LastEventAt, b.RunID, b.OperationID)
}
func (h headHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *headHeap) Push(x any)   { *h = append(*h, x.(*runHead)) }
func (h *headHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mergeNewest returns up to n rows of the runs in listing order, those with
// the given completeness only (when not ""), after the cursor's position
// (when not nil). Each run's rows are sorted already, so this reads about
// n·log(runs) rows plus a binary search per run, never every row. Runs
// still Pending are those firstPageRuns left out: they have no row among
// the first n.
func mergeNewest(runs []runindex.RunView[Summary], completeness string, cur *listCursor, n int) []*Summary {
	h := make(headHeap, 0, len(runs))
	for _, rv := range runs {
		if rv.Pending {
			continue
		}
		rh := &runHead{items: rv.Items}
		if completeness != "" {
			rh.pos = rv.ByFacet[completeness]
			if rh.pos == nil {
				continue
			}
		}
		if cur != nil {
			// The first row after the cursor's, by binary search.
			rh.k = sort.Search(rh.len(), func(k int) bool {
				it := rh.at(k)
				return before(cur.At, cur.Run, cur.Op, it.LastEventAt, it.RunID, it.OperationID)
			})
		}
		if rh.k < rh.len() {
			h = append(h, rh)
		}
	}
	heap.Init(&h)
	var out []*Summary
	for len(out) < n && len(h) > 0 {
		top := h[0]
		out = append(out, top.at(top.k))
		top.k++
		if top.k < top.len() {
			heap.Fix(&h, 0)
		} else {
			heap.Pop(&h)
		}
	}
	return out
}

// latestRun picks the run whose newest event is the latest (ties: the
// greatest run id), which is the recorder session that wrote last.
func latestRun(runs []runindex.RunView[Summary]) []int {
	best := -1
	for i, rv := range runs {
		if best < 0 {
			best = i
			continue
		}
		c := jsjson.CompareUTF16(rv.LastEventAt, runs[best].LastEventAt)
		if c > 0 || (c == 0 && rv.RunID > runs[best].RunID) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	return []int{best}
}
