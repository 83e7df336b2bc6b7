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

// ledgerSinceSQL reads every lane from the seq asked on, each lane by its
// primary key (LATERAL: an index range a lane, whatever the table holds),
// and, where $3, each lane's last seq as a row without a line, so that a
// lane cut short behind the position asked is seen in the same statement.
const ledgerSinceSQL = `SELECT h.lane, e.seq, e.line FROM unnest($1::int[], $2::bigint[]) AS h(lane, seq)
CROSS JOIN LATERAL (SELECT seq, line FROM ledger_entries WHERE lane = h.lane AND seq >= h.seq ORDER BY seq) AS e
UNION ALL
SELECT h.lane, coalesce((SELECT seq FROM ledger_entries WHERE lane = h.lane ORDER BY seq DESC LIMIT 1), -1), NULL
FROM unnest($1::int[], $2::bigint[]) AS h(lane, seq) WHERE $3 AND h.seq > 0
ORDER BY 1, 2`

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
// kept: a lane is its rows by seq), in one statement.
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
	rows, err := l.q.Query(ctx, ledgerSinceSQL, lanes, seqs, l.ends)
	if err != nil {
		return nil, fmt.Errorf("read the ledger: %w", scrub(err))
	}
	defer rows.Close()
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
	if l.ends {
		// A lane read before that holds nothing from where it stood, and
		// whose last entry is before it: cut short.
		for i, s := range seqs {
			if s > 0 && !seen[i] && last[i]+1 < s {
				out = append(out, ledger.Raw{Pos: ledger.Pos{Lane: i, Seq: last[i] + 1}})
			}
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
const segmentLinesSQL = `SELECT f.stream, r.off, r.line FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS f(stream, off, upto)
CROSS JOIN LATERAL (SELECT off, line FROM receipts WHERE stream = f.stream AND off >= f.off AND off < f.upto ORDER BY off) AS r
ORDER BY 1, 2`

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
