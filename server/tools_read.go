package server

import (
	"bytes"
	"compress/flate"
	"container/heap"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

func (s *Server) tools() []toolDef {
	return []toolDef{
		{
			name:  "list_operations",
			title: "List operation receipts",
			description: "List this agent's paid operations with their receipt verdict (full or partial), newest first. " +
				"An operation is identified by (run_id, operation_id). Unreadable runs are reported beside the good ones. " +
				"When more operations follow, next_cursor is returned: pass it as cursor to read the next page.",
			readOnly: true, idempotent: true,
			handler: s.listOperations,
		},
		{
			name:        "get_receipt",
			title:       "Get one operation receipt",
			description: "Return the full Haia Trace receipt of one operation, exactly as the reference assembler builds it, plus its run_id.",
			readOnly:    true, idempotent: true,
			handler: s.getReceipt,
		},
		{
			name:  "explain",
			title: "Explain one operation receipt",
			description: "Explain in one plain-language paragraph what was and was not observed for one operation, " +
				"including the buyer-side blind spot when a payment's outcome was never confirmed.",
			readOnly: true, idempotent: true,
			handler: s.explain,
		},
	}
}

// compactEvent drops the payload: what the guard reads from it was
// extracted beforehand (guard.FactsOf) and is kept beside the event.
func compactEvent(e receipt.Event) receipt.Event {
	e.Raw = jsjson.Value{}
	return e
}

// extractFacts reads the guard's facts from an event and copies their
// strings, which may otherwise point into the run's whole parse buffer and
// keep it alive.
func extractFacts(e receipt.Event) guard.EventFacts {
	f := guard.FactsOf(e)
	// One copy holding all six strings: one allocation instead of six.
	var b strings.Builder
	b.Grow(len(f.EventID) + len(f.Host) + len(f.PayTo) + len(f.Atomic) + len(f.Asset) + len(f.Problem))
	for _, s := range []string{f.EventID, f.Host, f.PayTo, f.Atomic, f.Asset, f.Problem} {
		b.WriteString(s)
	}
	all := b.String()
	cut := func(s string) string {
		part := all[:len(s)]
		all = all[len(s):]
		return part
	}
	f.EventID, f.Host, f.PayTo, f.Atomic, f.Asset, f.Problem = cut(f.EventID), cut(f.Host), cut(f.PayTo), cut(f.Atomic), cut(f.Asset), cut(f.Problem)
	return f
}

// factsCost estimates the memory of one event's guard facts.
func factsCost(f guard.EventFacts) int64 {
	return 112 + int64(len(f.EventID)+len(f.Host)+len(f.PayTo)+len(f.Atomic)+len(f.Asset)+len(f.Problem))
}

// summaryCost estimates the memory one cached summary holds: the struct
// with its guard figures, plus its strings.
func summaryCost(s opSummary) int64 {
	n := int64(400 + len(s.OperationID) + len(s.LastEventAt))
	for _, m := range s.MissingStages {
		n += 16 + int64(len(m))
	}
	if s.Guard.Money != nil {
		n += 120 + int64(len(s.Guard.Money.Asset)+len(s.Guard.Money.Problem))
		for _, v := range s.Guard.Money.PayTos {
			n += 16 + int64(len(v))
		}
		for _, v := range s.Guard.Money.Hosts {
			n += 16 + int64(len(v))
		}
	}
	return n + int64(len(s.Guard.Unattributable))
}

func summarize(runID string, r *receipt.Receipt, facts func(e *receipt.Event) guard.EventFacts) opSummary {
	sum := opSummary{
		RunID:          runID,
		OperationID:    r.Operation.OperationID,
		Template:       r.Operation.Template,
		Completeness:   r.Completeness,
		MissingStages:  make([]string, 0, len(r.Missing)),
		ExceptionCount: len(r.Exceptions),
	}
	for _, m := range r.Missing {
		sum.MissingStages = append(sum.MissingStages, m.Stage)
	}
	sum.LastEventAt = r.LastEventAt()
	sum.Guard = guard.OpFromFacts(runID, r, facts)
	// The receipt's events are not kept past this point.
	sum.Guard.LastEventAt = sum.LastEventAt
	return sum
}

type operationRow struct {
	RunID          string   `json:"run_id"`
	OperationID    string   `json:"operation_id"`
	Template       string   `json:"template"`
	Completeness   string   `json:"completeness"`
	MissingStages  []string `json:"missing_stages"`
	ExceptionCount int      `json:"exception_count"`
	LastEventAt    string   `json:"last_event_at"`
}

type unreadableRun struct {
	RunID string `json:"run_id"`
	Error string `json:"error"`
}

type listResult struct {
	Operations     []operationRow  `json:"operations"`
	RunsScanned    int             `json:"runs_scanned"`
	UnreadableRuns []unreadableRun `json:"unreadable_runs"`
	NextCursor     string          `json:"next_cursor,omitempty"`
}

// compareSummaries is the order of one run's operations in a listing:
// newest last event first, then operation id.
func compareSummaries(a, b *opSummary) int {
	if c := jsjson.CompareUTF16(a.LastEventAt, b.LastEventAt); c != 0 {
		return -c
	}
	return strings.Compare(a.OperationID, b.OperationID)
}

// before reports whether a row comes before another in a listing: newest
// last event first, then the greater run id, then the smaller operation id.
func before(aAt, aRun, aOp, bAt, bRun, bOp string) bool {
	if c := jsjson.CompareUTF16(aAt, bAt); c != 0 {
		return c > 0
	}
	if aRun != bRun {
		return aRun > bRun
	}
	return aOp < bOp
}

func (s *Server) listOperations(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	a := newArgs(raw, "template", "run", "completeness", "limit", "cursor")
	tname := a.str("template", false, DefaultTemplate, 64)
	runSel := a.str("run", false, "", 200)
	completeness := a.str("completeness", false, "", 16)
	a.oneOf("completeness", completeness, "full", "partial")
	limit := a.intIn("limit", 50, 1, 100)
	cursorText := a.str("cursor", false, "", maxCursorBytes)
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	t, err := s.template(tname)
	if err != nil {
		return nil, err
	}
	var cur *listCursor
	if cursorText != "" {
		if cur, err = decodeCursor(cursorText); err != nil {
			return nil, err
		}
		if cur.Template != tname || cur.Completeness != completeness || cur.RunSel != runSel {
			return nil, userErrorf("cursor belongs to a listing with other arguments (template %q, run %q, completeness %q): repeat those with it, or start again without cursor",
				cur.Template, cur.RunSel, cur.Completeness)
		}
	}
	var at map[string]int
	if cur != nil {
		at = cur.snapshot()
	}
	listing, err := s.index.ListAt(ctx, t, at)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	res := listResult{Operations: []operationRow{}, UnreadableRuns: []unreadableRun{}}
	runs := listing.Runs
	switch {
	case runSel == "":
	case runSel == "latest" && cur == nil:
		runs = latestRun(runs)
	default:
		// A later page of "latest" keeps the run the first page chose.
		want := runSel
		if cur != nil && runSel == "latest" {
			want = ""
			if len(cur.Runs) == 1 {
				want = cur.Runs[0]
			}
		}
		runs = nil
		for _, rv := range listing.Runs {
			if rv.RunID == want {
				runs = append(runs, rv)
			}
		}
		if len(runs) == 0 && runSel != "latest" {
			for _, u := range listing.Unreadable {
				if u.RunID == runSel {
					return nil, userErrorf("run %q cannot be read: %s", runSel, s.relative(u.Err.Error()))
				}
			}
			return nil, userErrorf("no run %q under events/ (list_operations without run shows every run)", runSel)
		}
	}
	for _, u := range listing.Unreadable {
		if runSel == "" || runSel == "latest" || u.RunID == runSel {
			res.UnreadableRuns = append(res.UnreadableRuns, unreadableRun{RunID: u.RunID, Error: s.relative(u.Err.Error())})
		}
	}
	res.RunsScanned = len(runs)
	rows := mergeNewest(runs, completeness, cur, limit+1)
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	for _, it := range rows {
		res.Operations = append(res.Operations, operationRow{
			RunID: it.RunID, OperationID: it.OperationID, Template: it.Template, Completeness: it.Completeness,
			MissingStages: it.MissingStages, ExceptionCount: it.ExceptionCount, LastEventAt: it.LastEventAt,
		})
	}
	if more {
		next := listCursor{Template: tname, RunSel: runSel, Completeness: completeness}
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
		res.NextCursor = s.cursors.encode(next)
	}
	return structured(res, renderList(res)), nil
}

// runHead is one run's position in a merge: the next of its rows to offer.
type runHead struct {
	items []opSummary
	pos   []int32 // the facet's positions in items, or nil for all items
	k     int     // index into pos (or items)
}

func (h *runHead) len() int {
	if h.pos != nil {
		return len(h.pos)
	}
	return len(h.items)
}

func (h *runHead) at(k int) *opSummary {
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
// n·log(runs) rows plus a binary search per run, never every row.
func mergeNewest(runs []runindex.RunView[opSummary], completeness string, cur *listCursor, n int) []*opSummary {
	h := make(headHeap, 0, len(runs))
	for _, rv := range runs {
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
	var out []*opSummary
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
func latestRun(runs []runindex.RunView[opSummary]) []runindex.RunView[opSummary] {
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
	return runs[best : best+1]
}

func renderList(res listResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d operation(s) from %d run(s)", len(res.Operations), res.RunsScanned)
	if n := len(res.UnreadableRuns); n > 0 {
		fmt.Fprintf(&b, "; %d run(s) could not be read", n)
	}
	b.WriteString(".\n")
	for _, op := range res.Operations {
		fmt.Fprintf(&b, "- %s / %s: %s", op.RunID, op.OperationID, op.Completeness)
		if len(op.MissingStages) > 0 {
			fmt.Fprintf(&b, ", missing %s", strings.Join(op.MissingStages, ", "))
		}
		if op.ExceptionCount > 0 {
			fmt.Fprintf(&b, ", %d fault(s)", op.ExceptionCount)
		}
		fmt.Fprintf(&b, " (last event %s)\n", op.LastEventAt)
	}
	for _, u := range res.UnreadableRuns {
		fmt.Fprintf(&b, "! run %s unreadable: %s\n", u.RunID, u.Error)
	}
	return b.String()
}

// findReceipt reads one run in full and assembles the named operation.
func (s *Server) findReceipt(ctx context.Context, raw any) (string, *receipt.Receipt, error) {
	a := newArgs(raw, "run_id", "operation_id", "template")
	runID := a.str("run_id", true, "", 200)
	opID := a.str("operation_id", true, "", 500)
	tname := a.str("template", false, DefaultTemplate, 64)
	if msg := a.err(); msg != "" {
		return "", nil, userErrorf("%s", msg)
	}
	t, err := s.template(tname)
	if err != nil {
		return "", nil, err
	}
	// Only the operation's own events are kept while the run is read.
	events, err := s.index.ReadRun(ctx, runID, func(e *receipt.Event) bool { return e.ContextID == opID })
	if err != nil {
		if errors.Is(err, runindex.ErrUnknownRun) {
			return "", nil, userErrorf("no run %q under events/ (list_operations shows the runs there)", runID)
		}
		var le *receipt.LineError
		if errors.As(err, &le) {
			return "", nil, userErrorf("run %q cannot be read: %s", runID, s.relative(err.Error()))
		}
		if ctx.Err() != nil {
			return "", nil, ctx.Err()
		}
		return "", nil, userErrorf("run %q cannot be read: %s", runID, s.relative(err.Error()))
	}
	if len(events) > 0 {
		r := receipt.AssembleOperation(opID, events, t)
		return runID, &r, nil
	}
	return "", nil, userErrorf("run %q has no operation %q (list_operations with run=%q shows its operations)", runID, opID, runID)
}

func (s *Server) getReceipt(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	runID, r, err := s.findReceipt(ctx, raw)
	if err != nil {
		return nil, err
	}
	body := r.AppendJSON(nil, "", "  ")
	// The receipt's members follow run_id, in the assembler's order.
	structuredJSON := make([]byte, 0, len(body)+len(runID)+16)
	structuredJSON = append(structuredJSON, `{"run_id":`...)
	structuredJSON = jsjson.AppendString(structuredJSON, runID)
	structuredJSON = append(structuredJSON, ',')
	structuredJSON = append(structuredJSON, body[1:]...)
	return structured(rawJSON(structuredJSON), string(body)), nil
}

type explainResult struct {
	RunID        string `json:"run_id"`
	OperationID  string `json:"operation_id"`
	Template     string `json:"template"`
	Completeness string `json:"completeness"`
	Explanation  string `json:"explanation"`
}

func (s *Server) explain(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	runID, r, err := s.findReceipt(ctx, raw)
	if err != nil {
		return nil, err
	}
	res := explainResult{
		RunID:        runID,
		OperationID:  r.Operation.OperationID,
		Template:     r.Operation.Template,
		Completeness: r.Completeness,
		Explanation:  receipt.Explain(runID, r),
	}
	return structured(res, res.Explanation), nil
}

// maxCursorBytes bounds the cursor argument; maxCursorJSON the JSON it
// inflates to (a cursor names every run of the first page with its length).
const (
	maxCursorBytes = 256 << 10
	maxCursorJSON  = 4 << 20
)

// listCursor is what next_cursor carries: the arguments of the listing, the
// last row returned, and the snapshot the first page was read at (each run
// with its line count then), so that later pages list every operation as it
// was then: appends can neither move an unseen operation before the
// position nor show one twice.
type listCursor struct {
	V            int      `json:"v"`
	Template     string   `json:"t"`
	RunSel       string   `json:"s,omitempty"`
	Completeness string   `json:"c,omitempty"`
	At           string   `json:"a"`
	Run          string   `json:"r"`
	Op           string   `json:"o"`
	Runs         []string `json:"rs"`
	Lines        []int    `json:"ls"`
}

const cursorVersion = 1

func (c *listCursor) snapshot() map[string]int {
	at := make(map[string]int, len(c.Runs))
	for i, id := range c.Runs {
		at[id] = c.Lines[i]
	}
	return at
}

// cursorCodec keeps deflate writers for reuse: a new one costs about a MiB,
// more than the rest of a listing.
type cursorCodec struct{ writers sync.Pool }

// encode deflates the cursor's JSON into unpadded base64url.
func (cc *cursorCodec) encode(c listCursor) string {
	c.V = cursorVersion
	js, err := json.Marshal(c)
	if err != nil {
		return "" // strings and ints always marshal
	}
	var b bytes.Buffer
	zw, _ := cc.writers.Get().(*flate.Writer)
	if zw == nil {
		zw, _ = flate.NewWriter(&b, flate.BestSpeed) // a valid level never fails
	} else {
		zw.Reset(&b)
	}
	_, _ = zw.Write(js) // a bytes.Buffer never fails
	_ = zw.Close()
	cc.writers.Put(zw)
	return base64.RawURLEncoding.EncodeToString(b.Bytes())
}

// decodeCursor reads a cursor back, refusing anything this server did not
// write with a message that says what to do.
func decodeCursor(s string) (*listCursor, error) {
	bad := userErrorf("cursor is not one list_operations returned (or it was cut short): pass next_cursor exactly as returned, or start again without cursor")
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	js, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(raw)), maxCursorJSON+1))
	if err != nil || len(js) > maxCursorJSON {
		return nil, bad
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var c listCursor
	if err := dec.Decode(&c); err != nil || dec.More() {
		return nil, bad
	}
	if c.V != cursorVersion {
		return nil, userErrorf("cursor was written by another version of this server: start again without cursor")
	}
	if len(c.Runs) != len(c.Lines) || c.At == "" || c.Run == "" {
		return nil, bad
	}
	for _, n := range c.Lines {
		if n < 0 {
			return nil, bad
		}
	}
	return &c, nil
}
