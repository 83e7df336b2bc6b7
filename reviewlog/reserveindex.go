package reviewlog

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// ReservationIndex is a Writer that keeps its reservation records in an
// index as well (the PostgreSQL store's reservations table) and can give
// a decision the records of its scopes without the log's fold: each row
// with the lines it points to. A row is an index, never a record: the log
// reads what each line says, checks the row against it, and the engine
// verifies each line's seal as it does the fold's.
//
// It is one of the optional interfaces a store's Writer may implement
// (like ScopedWriter and ChainLaner); the log uses it when present.
type ReservationIndex interface {
	IndexedReservations(ctx context.Context, q ReservationQuery) ([]IndexedReservation, error)
}

// ReservationQuery names the reservation records one decision reads: those
// of its tenant that may hold at Since, and bear on its question. A store
// may give more (the log keeps only what bears); never fewer.
type ReservationQuery struct {
	// Tenant: records that name it, and those that name no tenant (the
	// store's own tenant's, written by an earlier version).
	Tenant string
	// All: every record of the tenant (a decision that reads totals);
	// the fields below are then not read.
	All bool
	// Keys: records whose payee address or host is one of these,
	// compared without case (lower-cased here).
	Keys []string
	// Resource: records of this resource, compared without case ("":
	// none).
	Resource string
	// NoPayTo, NoHost: also every record that names no payee address, or
	// no host (the guard cannot tell whom those paid, for a question of
	// that kind); Open: also every record that holds an open payment.
	NoPayTo, NoHost, Open bool
	// Since: records whose until is after it, and holds (which have
	// none).
	Since time.Time
	// Before: records whose line starts before this offset of the log
	// (the log as the decision's moment holds it); later ones are another
	// decision's, committed since.
	Before int64
}

// markKey is the key of what a locked section is about to read, of type
// T, that a store may read in the round trip that takes its locks.
type markKey[T any] struct{}

// withMark marks ctx with v (ReservationQuery, ReviewQuery, linesFrom).
func withMark[T any](ctx context.Context, v T) context.Context {
	return context.WithValue(ctx, markKey[T]{}, v)
}

// markOf is what ctx was marked with (ok: it was).
func markOf[T any](ctx context.Context) (T, bool) {
	v, ok := ctx.Value(markKey[T]{}).(T)
	return v, ok
}

// ReservationQueryOf is the reservations ctx says a locked section is
// about to read (Since: no later than the section's time; Before not
// set; ok: it says). A store that reads them with its locks gives those
// rows to IndexedReservations when asked the same query of a time no
// earlier (Covers); their lines are read as any others.
func ReservationQueryOf(ctx context.Context) (ReservationQuery, bool) {
	return markOf[ReservationQuery](ctx)
}

// Covers says whether the rows read for p hold every row q names: the
// same tenant and scopes, of a time no later than q's (Before is not
// compared: the log filters by it).
func (p ReservationQuery) Covers(q ReservationQuery) bool {
	return p.Tenant == q.Tenant && p.All == q.All && slices.Equal(p.Keys, q.Keys) && p.Resource == q.Resource &&
		p.NoPayTo == q.NoPayTo && p.NoHost == q.NoHost && p.Open == q.Open && !q.Since.Before(p.Since)
}

// IndexedReservation is one row of the index as the store holds it, with
// the lines it points to (nil where the log holds no line at the offset).
type IndexedReservation struct {
	// Row is the row's fields (MAC, Releases empty): unverified.
	Row Reservation
	// Off is the offset of its reserved line, Line that line.
	Off  int64
	Line []byte
	// ReleaseOff is the offset of its released line (-1: none recorded),
	// ReleaseLine that line.
	ReleaseOff  int64
	ReleaseLine []byte
}

// reservationQuery is what answering req reads of the reservations at at:
// the records of its counterparty (and payee), its resource, and those
// the guard cannot tell apart from them; every record where the answer
// reads totals or the counterparty cannot be read.
func (req AskRequest) reservationQuery(at time.Time, before int64) ReservationQuery {
	q := ReservationQuery{Tenant: req.Tenant, Since: at, Before: before, All: req.Totals}
	cp, err := guard.ParseCounterparty(req.Question.Counterparty)
	if err != nil {
		q.All = true
		return q
	}
	for _, k := range []string{req.Question.Counterparty, req.Question.PayTo} {
		if k != "" {
			q.Keys = append(q.Keys, strings.ToLower(k))
		}
	}
	q.Resource = strings.ToLower(req.Resource)
	// As guard.Decide reads a reservation: with the question's
	// counterparty, or unattributable for its kind, or open elsewhere for
	// a host alone.
	byAddress := cp.Kind == guard.KindAddress || (req.Question.PayTo != "" && req.Question.PayTo != cp.Value)
	q.NoPayTo = byAddress
	q.NoHost = !byAddress
	q.Open = cp.Kind == guard.KindHost && !byAddress
	return q
}

// bears says whether q reads record r (the store's filter, done here
// again for the fold's records).
// A record of another tenant bears as any other: the store gives it
// not, and the log reports it.
func (q ReservationQuery) bears(r *Reservation) bool {
	if q.All {
		return true
	}
	switch {
	case r.PayTo != "" && slices.Contains(q.Keys, strings.ToLower(r.PayTo)),
		r.Host != "" && slices.Contains(q.Keys, strings.ToLower(r.Host)),
		q.Resource != "" && r.Resource != "" && strings.ToLower(r.Resource) == q.Resource,
		q.NoPayTo && r.PayTo == "",
		q.NoHost && r.Host == "",
		q.Open && r.Open:
		return true
	}
	return false
}

// indexedView reads the reservations of one decision through the store's
// index: each row's line (and its release's) read as the log reads it, the
// row checked against it, and the fold's records that bear on the
// question checked to have their row. The chain's cross-check is the
// fold's (reservationView).
func (l *Log) indexedView(ctx context.Context, idx ReservationIndex, st *state, req *AskRequest, at time.Time, ttl time.Duration) (ReservationView, error) {
	q := req.reservationQuery(at, st.offset)
	rows, err := idx.IndexedReservations(ctx, q)
	if err != nil {
		return ReservationView{}, err
	}
	var held []Reservation
	var problems []string
	rowAt := map[string]int64{}
	for _, row := range rows {
		id := clip(row.Row.ReceiptID)
		if row.Off >= q.Before {
			continue // another decision's, committed since this one's moment
		}
		rowAt[row.Row.ReceiptID] = row.Off
		if row.Line == nil {
			problems = append(problems, fmt.Sprintf("the reservations index names receipt %s at offset %d of %s, where the log holds no line (removed)", id, row.Off, FileName))
			continue
		}
		h, ok := st.lineHead(row.Off, row.Line)
		if !ok || h.Reservation == nil || h.Reservation.ReceiptID != row.Row.ReceiptID {
			problems = append(problems, fmt.Sprintf("the reservations index names receipt %s at offset %d of %s, where the log holds no reserved line of that receipt", id, row.Off, FileName))
			continue
		}
		res := *h.Reservation
		if what := rowDiffers(row.Row, res); what != "" {
			problems = append(problems, fmt.Sprintf("the reservations index disagrees with the reserved line of receipt %s on its %s (a row edited)", id, what))
			continue
		}
		if !q.bears(&res) {
			continue // a row the store gave beyond the question
		}
		if u := res.Until; u != "" {
			if t, err := parseTime(u); err == nil && !at.Before(t) {
				continue // lapsed
			}
		}
		// Its releases: the row's, and every one the fold saw (the engine
		// honours one only when sealed, and reports any other).
		if row.ReleaseOff >= 0 && row.ReleaseOff < q.Before {
			rh, ok := ParseLineHead(row.ReleaseLine)
			if ok && rh.Release != nil && rh.Release.ReceiptID == row.Row.ReceiptID {
				res.Releases = append(res.Releases, *rh.Release)
			}
			// Anything else releases nothing: the reservation counts.
		}
		rels, err := st.releasesOf(res.ReceiptID, row.ReleaseOff)
		if err != nil {
			return ReservationView{}, err
		}
		res.Releases = append(res.Releases, rels...)
		held = append(held, res)
	}
	// Every record of the fold that bears on the question has its row, at
	// its line: a row deleted or moved to another scope leaves its line
	// here, and the answer cannot count it.
	for _, e := range st.liveReservations(at) {
		if !q.bears(&e.res) {
			continue
		}
		if off, ok := rowAt[e.receiptID]; ok && off == e.off {
			continue
		}
		if e.res.Tenant != "" && e.res.Tenant != q.Tenant {
			problems = append(problems, fmt.Sprintf("the reserved line of receipt %s at offset %d of %s was written for tenant %q, not this store's %q (moved between tenants' stores)", clip(e.receiptID), e.off, FileName, clip(e.res.Tenant), q.Tenant))
		} else {
			problems = append(problems, fmt.Sprintf("the reserved line of receipt %s at offset %d of %s has no row in the reservations index (a row removed or edited, or the line written by a server of an earlier release: run store migrate)", clip(e.receiptID), e.off, FileName))
		}
	}
	if len(st.heads) > 2*len(rows)+1024 {
		st.heads = nil // lapsed ones: the next question reads the live again
	}
	v, err := l.checkHeld(st, held, at, ttl)
	if err != nil {
		return ReservationView{}, err
	}
	v.Problems = append(problems, v.Problems...)
	return v, nil
}

// parsedHead is a line of the log as ParseLineHead read it.
type parsedHead struct {
	line []byte
	head LineHead
	ok   bool
}

// lineHead is ParseLineHead(line), remembered by the line's offset and
// bytes: a question reads every reservation of its scopes, and decoding
// each line again on every question would make its cost grow with them.
// A line whose bytes differ in any way is read afresh.
func (st *state) lineHead(off int64, line []byte) (LineHead, bool) {
	c, hit := st.heads[off]
	if !hit || !bytes.Equal(c.line, line) {
		c.head, c.ok = ParseLineHead(line)
		c.line = bytes.Clone(line)
		if st.heads == nil {
			st.heads = map[int64]parsedHead{}
		}
		st.heads[off] = c
	}
	// The caller's own copy of what it may change.
	h := c.head
	if h.Reservation != nil {
		r := *h.Reservation
		h.Reservation = &r
	}
	return h, c.ok
}

// rowDiffers names the first field of the row that is not the line's ("":
// none).
func rowDiffers(row, line Reservation) string {
	switch {
	case row.Tenant != line.Tenant:
		return "tenant"
	case row.Caller != line.Caller:
		return "caller"
	case row.PayTo != line.PayTo:
		return "payee"
	case row.Host != line.Host:
		return "host"
	case row.Resource != line.Resource:
		return "resource"
	case row.Atomic != line.Atomic:
		return "amount"
	case row.Asset != line.Asset:
		return "asset"
	case row.Open != line.Open:
		return "open flag"
	case !sameTime(row.At, line.At):
		return "time"
	case (row.Until == "") != (line.Until == ""):
		return "end"
	case row.Until != "" && !sameTime(row.Until, line.Until):
		return "end"
	}
	return ""
}

// sameTime says whether a row's time (RFC 3339 as PostgreSQL gives it) is
// the instant its line writes; either unreadable is not the same.
func sameTime(row, line string) bool {
	lt, err1 := parseTime(line)
	rt, err2 := time.Parse(time.RFC3339Nano, row)
	return err1 == nil && err2 == nil && rt.Equal(lt)
}

// ReservationLines is a Writer (or a Reader) that gives the log's lines
// from an offset on as rows (the PostgreSQL store), in the round trip of
// a section's locks. A lane keeps the reservation records of the reserved
// and released lines among them as the fold would, reading only what was
// appended since it last read and keeping nothing of the reviews' lines:
// the check that every record bearing on a question has its row
// (indexedView) and that every signed allow has a record (checkHeld) then
// needs no fold of the log. Each line is read for what it says; no
// column beside it is trusted to tell its kind.
type ReservationLines interface {
	ReservationLines(ctx context.Context, from int64) ([]IndexedLine, error)
}

// linesFrom is the offset a locked section reads the log's lines from
// (withMark).
type linesFrom struct{ off int64 }

// LinesFromOf is the offset ctx says a locked section reads the log's
// lines from, for its reservation records (ok: it says). A store that reads the lines
// from it with its locks gives them to ReservationLines when asked from
// an offset no earlier.
func LinesFromOf(ctx context.Context) (int64, bool) {
	from, ok := markOf[linesFrom](ctx)
	return from.off, ok
}

// laneReservations is a lane's reservation records, read from the log's
// reserved and released lines (see ReservationLines), as of the log of
// identity gen up to st.offset.
type laneReservations struct {
	st  *state
	gen string
}

// linesFrom is where the lane's next read of the reservation lines starts.
func (l *Log) linesFrom() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.resLane == nil {
		return 0
	}
	return l.resLane.st.offset
}

// laneReservationState brings the lane's reservation records up to the
// log s as the section's moment holds it (l.mu held): the lines appended
// since its last read, or every one when the log was rewritten.
func (l *Log) laneReservationState(ctx context.Context, rl ReservationLines, s Stream) (*state, error) {
	c := l.resLane
	if c == nil || c.gen != s.Identity() || c.st.offset > s.Size() {
		c = &laneReservations{st: newState(), gen: s.Identity()}
	}
	lines, err := rl.ReservationLines(ctx, c.st.offset)
	if err != nil {
		l.resLane = nil
		return nil, err
	}
	for _, ln := range lines {
		if ln.Stream != FileName || ln.Off < c.st.offset || ln.Off >= s.Size() {
			continue // read before, or committed since this section's moment
		}
		c.st.applyLine(ln.Off, ln.Line)
	}
	c.st.offset, c.st.src = s.Size(), s
	l.resLane = c
	return c.st, nil
}

// applyLine applies one reserved or released line at off as the fold
// does; any other line, or one the log does not read, is not applied.
func (st *state) applyLine(off int64, line []byte) {
	if bytes.IndexByte(line, '\n') != len(line)-1 {
		return
	}
	rec, err := decodeRecord(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'}))
	if err != nil || (rec.Type != typeReserved && rec.Type != typeReleased) {
		return
	}
	if why := st.check(rec); why != "" {
		st.addFinding(Finding{ReviewID: rec.ReviewID, What: why + "; the line is not applied"})
		return
	}
	st.apply(rec, off)
}
