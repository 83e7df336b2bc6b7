package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// ledgerSinceSQL reads every lane from the seq asked on, and each lane's
// last seq (so that a lane cut short behind the position asked is seen).
const ledgerSinceSQL = `SELECT e.lane, e.seq, e.line FROM ledger_entries e
JOIN unnest($1::int[], $2::bigint[]) AS h(lane, seq) ON e.lane = h.lane AND e.seq >= h.seq
ORDER BY e.lane, e.seq`

const ledgerEndsSQL = `SELECT lane, max(seq) FROM ledger_entries GROUP BY lane`

type pgLedger struct {
	q querier
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

// Since reads the lanes from the positions asked (byte offsets are not
// kept: a lane is its rows by seq).
func (l pgLedger) Since(ctx context.Context, from []ledger.Pos) ([]ledger.Raw, error) {
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
	var out []ledger.Raw
	rows, err := l.q.Query(ctx, ledgerSinceSQL, lanes, seqs)
	if err != nil {
		return nil, fmt.Errorf("read the ledger: %w", scrub(err))
	}
	seen := make([]bool, ledger.Lanes)
	for rows.Next() {
		var lane int32
		var seq int64
		var line []byte
		if err := rows.Scan(&lane, &seq, &line); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the ledger: %w", scrub(err))
		}
		out = append(out, ledger.Raw{Pos: ledger.Pos{Lane: int(lane), Seq: seq}, Line: line})
		if int(lane) < ledger.Lanes {
			seen[lane] = true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the ledger: %w", scrub(err))
	}
	// A lane with nothing from its position on: does it still reach it?
	var check bool
	for i, s := range seqs {
		if s > 0 && !seen[i] && l.ends {
			check = true
		}
	}
	if !check {
		return out, nil
	}
	ends := map[int]int64{}
	erows, err := l.q.Query(ctx, ledgerEndsSQL)
	if err != nil {
		return nil, fmt.Errorf("read the ledger: %w", scrub(err))
	}
	for erows.Next() {
		var lane int32
		var last int64
		if err := erows.Scan(&lane, &last); err != nil {
			erows.Close()
			return nil, fmt.Errorf("read the ledger: %w", scrub(err))
		}
		ends[int(lane)] = last
	}
	erows.Close()
	if err := erows.Err(); err != nil {
		return nil, fmt.Errorf("read the ledger: %w", scrub(err))
	}
	for i, s := range seqs {
		if s == 0 || seen[i] {
			continue
		}
		last, ok := ends[i]
		if !ok {
			last = -1
		}
		if last+1 < s {
			out = append(out, ledger.Raw{Pos: ledger.Pos{Lane: i, Seq: last + 1}})
		}
	}
	return out, nil
}

// pgLedgerAppender appends in the section's transaction.
type pgLedgerAppender struct {
	pgLedger
	lane int
	// bulk: a copy, which may write any lane.
	bulk bool
}

func (w *writer) LedgerAppender() ledger.Appender {
	return &pgLedgerAppender{pgLedger: pgLedger{q: w.q, ends: true}, lane: 0, bulk: w.bulk}
}

func (w *scopedWriter) LedgerAppender() ledger.Appender {
	return &pgLedgerAppender{pgLedger: pgLedger{q: w.q, ends: true}, lane: w.lane}
}

func (a *pgLedgerAppender) Lane() int { return a.lane }

// Append inserts the lines as rows; a seq already taken is refused by the
// primary key (ledger.ErrSeqTaken), the section then failing whole.
func (a *pgLedgerAppender) Append(ctx context.Context, at ledger.Pos, lines [][]byte) error {
	if at.Lane != a.lane && !(a.bulk && at.Lane >= 0 && at.Lane < ledger.Lanes) {
		return fmt.Errorf("this section holds ledger lane %d, not %d", a.lane, at.Lane)
	}
	for i, line := range lines {
		_, err := a.q.Exec(ctx, "INSERT INTO ledger_entries (lane, seq, line) VALUES ($1, $2, $3)", at.Lane, at.Seq+int64(i), line)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" {
			return fmt.Errorf("%w (lane %d, entry %d)", ledger.ErrSeqTaken, at.Lane, at.Seq+int64(i))
		}
		if err != nil {
			return fmt.Errorf("append to the ledger: %w", scrub(err))
		}
	}
	return nil
}

// segmentLinesSQL reads the receipts of the named segments past their
// offsets, up to each segment's size in the reader's snapshot.
const segmentLinesSQL = `SELECT r.stream, r.off, r.line FROM receipts r
JOIN unnest($1::text[], $2::bigint[], $3::bigint[]) AS f(stream, off, upto) ON r.stream = f.stream AND r.off >= f.off AND r.off < f.upto
ORDER BY r.stream, r.off`

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
	defer rows.Close()
	var out []reviewlog.SegmentLine
	for rows.Next() {
		var name string
		var off int64
		var line []byte
		if err := rows.Scan(&name, &off, &line); err != nil {
			return nil, err
		}
		out = append(out, reviewlog.SegmentLine{Segment: strings.TrimPrefix(name, receiptsPrefix), Off: off, Line: bytes.TrimRight(line, "\r\n")})
	}
	return out, rows.Err()
}
