package pgstore

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// unbounded is an upper bound no seq or offset reaches (2^62), read beside a
// lower one. It is there for the plan PostgreSQL caches for a prepared
// statement after a few runs: a generic plan, made without the values,
// reads `col >= $n` alone as a third of the rows, and one cached while the
// table was small scans the whole table on every decision for the
// connection's life (measured: 0.5 ms a lane at 3,000 entries, growing);
// a range bounded on both sides reads as a narrow one, so the primary key
// is used however long the ledger and the chains grow.
const unbounded = "4611686018427387904"

// ledgerSinceSQL reads every lane from the seq asked on, each lane by its
// primary key (LATERAL: an index range a lane, whatever the table holds),
// and, where $3, each lane's last seq as a row without a line, so that a
// lane cut short behind the position asked is seen in the same statement.
// The bound above seq (unbounded) is never reached; see unbounded. The rows
// come in no order: collectLedger orders them (a sort in the statement cost
// the database a sort node's start and end at every decision).
const ledgerSinceSQL = `SELECT h.lane, e.seq, e.line FROM unnest($1::int[], $2::bigint[]) AS h(lane, seq)
CROSS JOIN LATERAL (SELECT seq, line FROM ledger_entries WHERE lane = h.lane AND seq >= h.seq AND seq < h.seq + ` + unbounded + ` ORDER BY seq) AS e
UNION ALL
SELECT h.lane, coalesce((SELECT seq FROM ledger_entries WHERE lane = h.lane ORDER BY seq DESC LIMIT 1), -1), NULL
FROM unnest($1::int[], $2::bigint[]) AS h(lane, seq) WHERE $3 AND h.seq > 0`

type pgLedger struct {
	q   querier
	pre *prefetchedLedger
	// ends: a lane cut short behind the position asked is reported. Only
	// in a locked section (READ COMMITTED: each statement sees every
	// commit before it, and the positions a process asks from are of
	// commits before it); a view's snapshot may be older than what the
	// process read since, and its lanes would read as cut short.
	ends bool
}

func (r *reader) Ledger() ledger.Reader { return pgLedger{q: r.q} }

// Ledger in a locked section reports a lane cut short.
func (w *writer) Ledger() ledger.Reader { return pgLedger{q: w.q, ends: true} }

// ledgerArgs are ledgerSinceSQL's arguments for the positions asked.
func ledgerArgs(from []ledger.Pos, ends bool) []any {
	lanes := make([]int32, ledger.Lanes)
	seqs := make([]int64, ledger.Lanes)
	for i := range lanes {
		lanes[i] = int32(i)
	}
	for _, p := range from {
		if p.Lane >= 0 && p.Lane < ledger.Lanes {
			seqs[p.Lane] = p.Seq
		}
	}
	return []any{lanes, seqs, ends}
}

// collectLedger reads ledgerSinceSQL's rows: the lines, and, where ends,
// a Raw without a line for each lane read before that now ends before the
// position asked (cut short).
func collectLedger(rows pgx.Rows, from []ledger.Pos, ends bool) ([]ledger.Raw, error) {
	defer rows.Close()
	seqs := make([]int64, ledger.Lanes)
	for _, p := range from {
		if p.Lane >= 0 && p.Lane < ledger.Lanes {
			seqs[p.Lane] = p.Seq
		}
	}
	var out []ledger.Raw
	seen := make([]bool, ledger.Lanes)
	last := make([]int64, ledger.Lanes)
	for rows.Next() {
		var lane int32
		var seq int64
		var line []byte
		if err := rows.Scan(&lane, &seq, &line); err != nil {
			return nil, fmt.Errorf("read the ledger: %w", scrub(err))
		}
		if lane < 0 || int(lane) >= ledger.Lanes {
			continue
		}
		if line == nil {
			last[lane] = seq
			continue
		}
		out = append(out, ledger.Raw{Pos: ledger.Pos{Lane: int(lane), Seq: seq}, Line: line})
		seen[lane] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the ledger: %w", scrub(err))
	}
	// In lane and seq order, as a lane is replayed.
	slices.SortFunc(out, func(a, b ledger.Raw) int {
		return cmp.Or(cmp.Compare(a.Pos.Lane, b.Pos.Lane), cmp.Compare(a.Pos.Seq, b.Pos.Seq))
	})
	if ends {
		for i, s := range seqs {
			if s > 0 && !seen[i] && last[i]+1 < s {
				out = append(out, ledger.Raw{Pos: ledger.Pos{Lane: i, Seq: last[i] + 1}})
			}
		}
	}
	return out, nil
}

// prefetchedLedger is the ledger a section read with its locks, from the
// positions it named.
type prefetchedLedger struct {
	from []ledger.Pos
	raws []ledger.Raw
	used bool
}

// Since reads the lanes from the positions asked (byte offsets are not
// kept: a lane is its rows by seq), in one statement — or gives what the
// section read with its locks from those very positions.
//
// The prefetch serves positions at or past those it read from: it holds
// every line committed before it (after every lock of the section was
// held) from where it began, and lines before the positions now asked were
// taken in by the reader already (another section of its process), which
// skips them.
func (l pgLedger) Since(ctx context.Context, from []ledger.Pos) ([]ledger.Raw, error) {
	if p := l.pre; p != nil && !p.used && atOrPast(from, p.from) {
		p.used = true
		return p.raws, nil
	}
	rows, err := l.q.Query(ctx, ledgerSinceSQL, ledgerArgs(from, l.ends)...)
	if err != nil {
		return nil, fmt.Errorf("read the ledger: %w", scrub(err))
	}
	return collectLedger(rows, from, l.ends)
}

// atOrPast says whether every lane of a is at or past its place in b.
func atOrPast(a, b []ledger.Pos) bool {
	seq := func(ps []ledger.Pos) [ledger.Lanes]int64 {
		var out [ledger.Lanes]int64
		for _, p := range ps {
			if p.Lane >= 0 && p.Lane < ledger.Lanes {
				out[p.Lane] = p.Seq
			}
		}
		return out
	}
	sa, sb := seq(a), seq(b)
	for i := range sa {
		if sa[i] < sb[i] {
			return false
		}
	}
	return true
}

// pgLedgerAppender appends in the section's transaction.
type pgLedgerAppender struct {
	pgLedger
	lane int
	// bulk: a copy, which may write any lane.
	bulk bool
	// w queues the appends for the section's commit.
	w *writer
}

func (w *writer) LedgerAppender() ledger.Appender {
	return &pgLedgerAppender{pgLedger: pgLedger{q: w.q, ends: true}, lane: 0, bulk: w.bulk, w: w}
}

func (w *scopedWriter) LedgerAppender() ledger.Appender {
	return &pgLedgerAppender{pgLedger: pgLedger{q: w.q, ends: true, pre: w.preLedger}, lane: w.lane, w: &w.writer}
}

// Ledger in a scoped section serves what the section read with its locks.
func (w *scopedWriter) Ledger() ledger.Reader { return pgLedger{q: w.q, ends: true, pre: w.preLedger} }

func (a *pgLedgerAppender) Lane() int { return a.lane }

// Append queues the lines' rows for the section's commit (one round trip
// with it); a seq already taken is refused by the primary key there
// (ledger.ErrSeqTaken), the section then failing whole.
func (a *pgLedgerAppender) Append(ctx context.Context, at ledger.Pos, lines [][]byte) error {
	if at.Lane != a.lane && !(a.bulk && at.Lane >= 0 && at.Lane < ledger.Lanes) {
		return fmt.Errorf("this section holds ledger lane %d, not %d", a.lane, at.Lane)
	}
	b := &pgx.Batch{}
	lanes := make([]int32, len(lines))
	seqs := make([]int64, len(lines))
	receipts := make([]*string, len(lines))
	for i, line := range lines {
		lanes[i], seqs[i] = int32(at.Lane), at.Seq+int64(i)
		// The receipt the entry names, as an index beside the line (the
		// line, which readers verify, is the record).
		if e, err := ledger.Peek(line); err == nil && e.Receipt != "" && e.Kind != ledger.KindRelease {
			r := e.Receipt
			receipts[i] = &r
		}
	}
	b.Queue("INSERT INTO ledger_entries (lane, seq, line, receipt) SELECT * FROM unnest($1::int[], $2::bigint[], $3::bytea[], $4::text[])", lanes, seqs, lines, receipts)
	a.w.queue(b)
	return nil
}

// segmentLinesSQL reads the receipts of the named segments past their
// offsets, up to each segment's size in the reader's snapshot.
const segmentLinesSQL = `SELECT f.stream, r.off, r.line FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS f(stream, off, upto)
CROSS JOIN LATERAL (SELECT off, line FROM receipts WHERE stream = f.stream AND off >= f.off AND off < f.upto ORDER BY off) AS r
ORDER BY 1, 2`

// segmentsSinceSQL reads, for a section's prefetch, every segment's
// receipts past where its process read it (from the start for a segment it
// has not read, or whose generation changed), in no order:
// collectSegmentLinesLast orders them (a sort here cost the database a
// sort node's start and end at every decision).
const segmentsSinceSQL = `SELECT g.name, r.off, r.line FROM guard_streams AS g
LEFT JOIN unnest($1::text[], $2::bigint[], $3::text[]) AS m(stream, off, gen) ON m.stream = g.name
CROSS JOIN LATERAL (SELECT CASE WHEN m.gen = g.generation THEN m.off ELSE 0 END AS off) AS f
CROSS JOIN LATERAL (SELECT off, line FROM receipts WHERE stream = g.name AND off >= f.off AND off < f.off + ` + unbounded + ` ORDER BY off) AS r
WHERE starts_with(g.name, '` + receiptsPrefix + `')`

func segmentArgs(marks map[string]reviewlog.SegmentMark) []any {
	var names, gens []string
	var offs []int64
	for name, m := range marks {
		names = append(names, receiptsPrefix+name)
		offs = append(offs, m.Off)
		gens = append(gens, m.Identity)
	}
	return []any{names, offs, gens}
}

// collectSegmentLinesLast reads the rows of segmentLinesSQL or
// segmentsSinceSQL, in any order: the whole lines in stream and offset
// order, and each stream's last row as read, line break included.
func collectSegmentLinesLast(rows pgx.Rows) ([]reviewlog.SegmentLine, map[string]row, error) {
	defer rows.Close()
	type named struct {
		name string
		row
	}
	var got []named
	for rows.Next() {
		var n named
		if err := rows.Scan(&n.name, &n.off, &n.line); err != nil {
			return nil, nil, err
		}
		got = append(got, n)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	slices.SortFunc(got, func(a, b named) int { return cmp.Or(strings.Compare(a.name, b.name), cmp.Compare(a.off, b.off)) })
	out := make([]reviewlog.SegmentLine, 0, len(got))
	last := map[string]row{}
	for _, n := range got {
		last[n.name] = n.row
		out = append(out, reviewlog.SegmentLine{Segment: strings.TrimPrefix(n.name, receiptsPrefix), Off: n.off, Line: bytes.TrimRight(n.line, "\r\n")})
	}
	return out, last, nil
}

// keepHeads remembers, as a segment's head, each last row read that ends
// the segment as the reader sees it (of the generation and size in
// streams, by stream name): the row a chain appending there next links
// to, which is then not read again (LastLine). A row past that size
// (another lane's, committed after the size was read) is not taken.
func (r *reader) keepHeads(last map[string]row, streams map[string]streamInfo) {
	for name, x := range last {
		si, ok := streams[name]
		if !ok || si.gen == "" || x.off+int64(len(x.line)) != si.size {
			continue
		}
		r.s.heads.put(name, head{gen: si.gen, size: si.size, off: x.off, line: bytes.Clone(x.line)})
	}
}

// prefetchedSegments are the chains' receipts a section read with its
// locks, past the marks it named.
type prefetchedSegments struct {
	marks map[string]reviewlog.SegmentMark
	lines []reviewlog.SegmentLine
}

// SegmentLinesSince in a scoped section serves what the section read with
// its locks, where that covers what is asked: each segment from an offset
// the prefetch read from, up to the snapshot's size.
func (w *scopedWriter) SegmentLinesSince(ctx context.Context, from map[string]int64) ([]reviewlog.SegmentLine, error) {
	p := w.preSegs
	if p == nil {
		return w.writer.SegmentLinesSince(ctx, from)
	}
	infos, err := w.Segments(ctx)
	if err != nil {
		return nil, err
	}
	size := map[string]int64{}
	for _, si := range infos {
		size[si.Name] = si.Size
		start, asked := from[si.Name]
		if m, ok := p.marks[si.Name]; asked && ok && m.Identity == si.Identity && start < m.Off {
			// Asked from before where the prefetch began: not covered.
			return w.writer.SegmentLinesSince(ctx, from)
		}
	}
	var out []reviewlog.SegmentLine
	for _, l := range p.lines {
		start, asked := from[l.Segment]
		if !asked || l.Off < start || l.Off >= size[l.Segment] {
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// SegmentsMayLag: a reader's segments are as one moment saw them (a
// section's snapshot, a view's transaction), which another section of the
// same process may have read past since (reviewlog.ReceiptTail). A segment
// here is never cut short by the server: its receipts are rows its role
// cannot delete, and a size lowered in guard_streams makes the next append
// there fail (its last row ends past the size, or the offset and seq it
// would take are a row's already), so a segment shorter than the tail
// read it is read as one not yet grown that far.
func (r *reader) SegmentsMayLag() bool { return true }

// SegmentLinesSince reads every named segment's new receipts in one
// statement.
func (r *reader) SegmentLinesSince(ctx context.Context, from map[string]int64) ([]reviewlog.SegmentLine, error) {
	infos, err := r.Segments(ctx)
	if err != nil {
		return nil, err
	}
	size := map[string]int64{}
	for _, si := range infos {
		size[si.Name] = si.Size
	}
	var names []string
	var offs, uptos []int64
	for name, off := range from {
		names = append(names, receiptsPrefix+name)
		offs = append(offs, off)
		uptos = append(uptos, size[name])
	}
	rows, err := r.q.Query(ctx, segmentLinesSQL, names, offs, uptos)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: read the chains: %w", r.s.describe, scrub(err))
	}
	out, last, err := collectSegmentLinesLast(rows)
	if err != nil {
		return nil, err
	}
	streams := make(map[string]streamInfo, len(infos))
	for _, si := range infos {
		streams[receiptsPrefix+si.Name] = streamInfo{size: si.Size, gen: si.Identity}
	}
	r.keepHeads(last, streams)
	return out, nil
}
