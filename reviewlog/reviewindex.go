package reviewlog

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ReviewIndex is a Writer that keeps the review state in rows beside the
// lines (the PostgreSQL store's reviews table) and can give a decision the
// reviews that bear on its question without the log's fold: each row with
// every line of its review. A row is an index, never a record: the log
// folds only those lines (with the fold's own rules), checks every row
// against them, and the verifier proves each review by its signatures as
// it does the fold's.
//
// It is one of the optional interfaces a store's Writer may implement
// (like ReservationIndex); the log uses it in a section that holds only
// the question's scopes (ScopedWriter).
type ReviewIndex interface {
	IndexedReviews(ctx context.Context, q ReviewQuery) ([]IndexedReview, error)
}

// ReviewQuery names the reviews one decision reads. A store may give more
// (the log keeps only what the rows name); never fewer.
type ReviewQuery struct {
	// QuestionKey: every review of this question (QuestionKey, hex).
	QuestionKey string
	// Caller: the caller's undecided reviews that may still be pending
	// (status pending or superseded) opened after Since (zero: any).
	Caller string
	Since  time.Time
	// IDs: these reviews, whatever their question.
	IDs []string
}

// Covers says whether the rows read for p hold every row q names.
func (p ReviewQuery) Covers(q ReviewQuery) bool {
	return p.QuestionKey == q.QuestionKey && p.Caller == q.Caller && !q.Since.Before(p.Since) && len(notInStrings(q.IDs, p.IDs)) == 0
}

func notInStrings(list, set []string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(set, s) {
			out = append(out, s)
		}
	}
	return out
}

// ReviewQueryOf is the reviews ctx says a locked section is about to
// read (ok: it says). A store that reads them with its locks gives those
// rows to IndexedReviews when asked a query they cover.
func ReviewQueryOf(ctx context.Context) (ReviewQuery, bool) {
	return markOf[ReviewQuery](ctx)
}

// LinePlace is where a line of the review log or of an archive is.
type LinePlace struct {
	// Stream is FileName or an archive's name ("": no line).
	Stream string
	Off    int64
}

// IndexedLine is one line a store holds, at its place.
type IndexedLine struct {
	LinePlace
	Line []byte
}

// ReviewRow is one review's row as the store holds it: unverified.
type ReviewRow struct {
	ID, Tenant, Caller, QuestionKey, TermsKey string
	// Status is the row's: pending, superseded, expired, approved or
	// rejected.
	Status string
	// Where the row says the review's lines are (Stream "": none).
	Opened, Decided, Used LinePlace
}

// IndexedReview is a row with the lines of its review: those at the row's
// places and every other the store files under its id, in stream and
// offset order.
type IndexedReview struct {
	Row   ReviewRow
	Lines []IndexedLine
}

// rowIndex is what a scoped section read of the reviews by index: the
// fold of the lines of those reviews alone (st, whose offsets are those of
// buf, the lines laid end to end), the rows, and what the rows and the
// lines disagree on, by review id.
type rowIndex struct {
	in       []IndexedReview
	rows     []ReviewRow
	st       *state
	problems map[string][]string
	// bad is what kept the lines from being folded at all.
	bad []string
}

// rowsRead folds the lines of the rows given and checks every row against
// them: each line is read as the log reads it, and a row whose lines are
// missing, another review's, or say something else than the row is a
// problem of that review.
func rowsRead(rows []IndexedReview) *rowIndex {
	x := &rowIndex{in: rows, problems: map[string][]string{}}
	type placed struct {
		IndexedLine
		owner string
	}
	var lines []placed
	seen := map[LinePlace]bool{}
	for _, ir := range rows {
		x.rows = append(x.rows, ir.Row)
		for _, ln := range ir.Lines {
			if ln.Line == nil || seen[ln.LinePlace] {
				continue
			}
			seen[ln.LinePlace] = true
			lines = append(lines, placed{ln, ir.Row.ID})
		}
	}
	// The log's order: archives (older) before the log, each by offset.
	slices.SortFunc(lines, func(a, b placed) int {
		if c := strings.Compare(a.Stream, b.Stream); c != 0 {
			return c
		}
		return cmp.Compare(a.Off, b.Off)
	})
	var buf bytes.Buffer
	at := map[int64]LinePlace{}
	for _, ln := range lines {
		h, ok := ParseLineHead(ln.Line)
		if !ok || !bytes.HasSuffix(ln.Line, []byte{'\n'}) || bytes.Count(ln.Line, []byte{'\n'}) != 1 {
			x.problems[ln.owner] = append(x.problems[ln.owner], fmt.Sprintf("the line at offset %d of %s, filed under this review, is not a record the log reads", ln.Off, ln.Stream))
			continue
		}
		if h.ReviewID != ln.owner && !slices.ContainsFunc(rows, func(ir IndexedReview) bool { return ir.Row.ID == h.ReviewID }) {
			x.problems[ln.owner] = append(x.problems[ln.owner], fmt.Sprintf("the line at offset %d of %s, filed under this review, is review %s's", ln.Off, ln.Stream, clip(h.ReviewID)))
			continue
		}
		at[int64(buf.Len())] = ln.LinePlace
		buf.Write(ln.Line)
	}
	st, err := fold(buf.Bytes(), FileName)
	if err != nil {
		// Every line decodes, so the fold has no tail: never so.
		x.bad = append(x.bad, err.Error())
		st = newState()
	}
	for _, f := range st.findings {
		x.problems[f.ReviewID] = append(x.problems[f.ReviewID], "the log's lines of this review contradict each other: "+f.What)
	}
	place := func(off int64) LinePlace {
		if off < 0 {
			return LinePlace{}
		}
		return at[off]
	}
	for _, row := range x.rows {
		e := st.byID[row.ID]
		if e == nil {
			x.problems[row.ID] = append(x.problems[row.ID], fmt.Sprintf("the reviews index names review %s at offset %d of %s, where the log holds no line opening it (a row edited or invented, or its line removed)", clip(row.ID), row.Opened.Off, row.Opened.Stream))
			continue
		}
		if what := rowDisagrees(row, e, place, st); what != "" {
			x.problems[row.ID] = append(x.problems[row.ID], "the reviews index disagrees with the review's lines on its "+what+" (a row edited)")
		}
	}
	x.st = st
	return x
}

// rowDisagrees names what the row says otherwise than the lines of its
// review ("": nothing).
func rowDisagrees(row ReviewRow, e *entry, place func(int64) LinePlace, st *state) string {
	rec, err := st.recordAt(e.opened)
	if err != nil {
		return "opened line"
	}
	h, _ := ParseLineHead(mustLine(st, e.opened))
	switch {
	case row.Caller != e.caller || row.Caller != rec.Caller:
		return "caller"
	case row.QuestionKey != h.QuestionKey:
		return "question"
	case row.TermsKey != h.TermsKey:
		return "terms"
	case row.Tenant != h.Tenant:
		return "tenant"
	case place(e.opened) != row.Opened:
		return "opened line's place"
	case place(e.decided) != row.Decided:
		return "decided line's place"
	case place(e.used) != row.Used:
		return "used line's place"
	}
	switch row.Status {
	case Pending, "superseded", Expired:
		if e.status != Pending {
			return "status"
		}
	default:
		if row.Status != e.status {
			return "status"
		}
	}
	return ""
}

func mustLine(st *state, off int64) []byte {
	line, _ := lineAt(st.src, off)
	return line
}

// add reads more rows into the index (the reviews the chains name that
// the first read did not give).
func (x *rowIndex) add(more []IndexedReview) *rowIndex {
	all := slices.Clone(x.in)
	for _, m := range more {
		if !x.has(m.Row.ID) {
			all = append(all, m)
		}
	}
	return rowsRead(all)
}

// has says whether the index read a row of review id.
func (x *rowIndex) has(id string) bool {
	return slices.ContainsFunc(x.rows, func(r ReviewRow) bool { return r.ID == id })
}

// withIndex runs fn, in a section that holds only the question's scopes,
// over the reviews read by index (q) instead of the log's fold: the log is
// opened as the section's moment holds it, and what an append needs of it
// is that it ends in a clean line. A log that ends otherwise (a torn tail,
// which only a database writer leaves) is repaired by the whole store's
// section: errWiden.
func (l *Log) withIndex(ctx context.Context, w Writer, ix ReviewIndex, q ReviewQuery, fn func(w Writer, st *state, at time.Time) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, err := w.Log(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	if !endsClean(s) {
		return errWiden
	}
	rows, err := ix.IndexedReviews(ctx, q)
	if err != nil {
		return err
	}
	x := rowsRead(rows)
	if len(x.bad) > 0 {
		return errWiden
	}
	st := newState()
	st.src, st.offset, st.rows = s, s.Size(), x
	return fn(w, st, l.now())
}

// endsClean says whether the log's last line is a whole line the log
// reads as a record (an empty log does), read without the rest.
func endsClean(s Stream) bool {
	if s.Size() == 0 {
		return true
	}
	ll, ok := s.(lastLiner)
	if !ok {
		return false
	}
	off, line, err := ll.LastLine()
	if err != nil || line == nil || off+int64(len(line)) != s.Size() || bytes.IndexByte(line, '\n') != len(line)-1 {
		return false
	}
	_, err = decodeRecord(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'}))
	return err == nil
}

// reviewQuery is what answering req reads of the reviews at now: the
// reviews of its question, and the caller's that may be pending.
func (req AskRequest) reviewQuery(now time.Time, ttl time.Duration) ReviewQuery {
	q := ReviewQuery{QuestionKey: QuestionKey(req.Caller, req.Question, req.Resource), Caller: req.Caller}
	if ttl > 0 {
		// The section's time is no earlier than now: a review opened at or
		// before now-ttl has expired by then.
		q.Since = now.Add(-ttl)
	}
	return q
}

// pendingOf are the caller's reviews the rows call undecided and the
// lines pending, in the order they were opened.
func (x *rowIndex) pendingOf(caller string) []*entry {
	var out []*entry
	for _, row := range x.rows {
		if row.Caller != caller || (row.Status != Pending && row.Status != "superseded") {
			continue
		}
		if e := x.st.byID[row.ID]; e != nil && e.caller == caller && e.status == Pending && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *entry) int { return cmp.Compare(a.opened, b.opened) })
	return out
}

// mark adds to r what the rows and the lines of review id disagree on:
// such a review is tampered with, and never answers a question (a signed
// rejection of it still holds).
func (x *rowIndex) mark(r *Review, id string) {
	if p := x.problems[id]; len(p) > 0 {
		r.Tampered = true
		r.Integrity = append(r.Integrity, p...)
	}
}

// indexedReviews is Reviews read by index: the rows of the question,
// newest first, each as its lines hold it and its signatures prove it.
func (a *AskView) indexedReviews() ([]Review, error) {
	x := a.st.rows
	key := QuestionKey(a.req.Caller, a.req.Question, a.req.Resource)
	var list []*entry
	for _, row := range x.rows {
		if row.QuestionKey != key {
			continue
		}
		e := x.st.byID[row.ID]
		if e == nil {
			// A row without its lines answers nothing (no approval is
			// honoured but from a row, its lines and their signatures),
			// and is no open review of the question either.
			a.unread = append(a.unread, row.ID)
			continue
		}
		if !slices.Contains(list, e) {
			list = append(list, e)
		}
	}
	slices.SortFunc(list, func(a, b *entry) int { return cmp.Compare(b.opened, a.opened) })
	var out []Review
	for _, e := range list {
		v, err := a.verifier()
		if err != nil {
			return nil, err
		}
		r, err := x.st.review(e)
		if err != nil {
			return nil, err
		}
		vr, _, err := v.resolve(&r)
		if err != nil {
			return nil, err
		}
		x.mark(&vr, e.id)
		out = append(out, vr)
	}
	a.reviews, a.reviewsRead = out, true
	return out, nil
}

// indexedFind finds the reviews the chains name (ids) by their rows: those
// the first read did not give are read by id, in one statement more, only
// then. A review no row gives is not found.
func (a *AskView) indexedFind(ids []string) (func(id string) (*state, *entry, error), error) {
	var missing []string
	for _, id := range ids {
		if !a.st.rows.has(id) && !slices.Contains(missing, id) {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		ix, ok := a.g.(ReviewIndex)
		if !ok {
			return nil, errWiden
		}
		more, err := ix.IndexedReviews(a.ctx, ReviewQuery{IDs: missing})
		if err != nil {
			return nil, err
		}
		a.st.rows = a.st.rows.add(more)
	}
	x := a.st.rows
	return func(id string) (*state, *entry, error) {
		if !x.has(id) {
			return nil, nil, nil
		}
		return x.st, x.st.byID[id], nil
	}, nil
}

// markKey is the key of what a locked section is about to read, of type
// T, that a store may read in the round trip that takes its locks.
type markKey[T any] struct{}

// withMark marks ctx with v (a ReviewQuery).
func withMark[T any](ctx context.Context, v T) context.Context {
	return context.WithValue(ctx, markKey[T]{}, v)
}

// markOf is what ctx was marked with (ok: it was).
func markOf[T any](ctx context.Context) (T, bool) {
	v, ok := ctx.Value(markKey[T]{}).(T)
	return v, ok
}
