package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

const (
	// chainLanes is how many chains of one signing key the fleet's scoped
	// sections append to at once, each held by one section until it
	// commits (lane 0 is the key's own chain).
	chainLanes = 16
	// laneClass is the first key of the lanes' two-key advisory locks.
	laneClass = 0x48434c4e // "HCLN"
)

// LockedScopes runs fn in one READ COMMITTED transaction holding the
// guard's lock shared (so that Locked, which takes it alone, still
// excludes every section, and a replica of a binary that only knows
// Locked still waits for this one), the advisory lock of each scope in
// key order (shared or alone as the scope says), and one chain lane. All
// are taken, and every stream's size read, in one round trip. fn reads
// the streams as that one statement saw them: later than the last commit
// of every scope it holds, and the same moment for the log and every
// chain.
func (s *Store) LockedScopes(ctx context.Context, wait time.Duration, scopes []reviewlog.Scope, pre *reviewlog.Prefetch, fn func(w reviewlog.Writer) error) error {
	if reviewlog.IsBulk(ctx) {
		return errors.New("a bulk copy locks the whole store")
	}
	var cancel context.CancelFunc
	ctx, cancel = context.WithTimeout(ctx, wait+3*statementTimeout)
	defer cancel()
	order := reviewlog.LockOrder(scopes)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: connect: %w", s.describe, scrub(err))
	}
	defer conn.Release()
	w := &scopedWriter{writer: writer{reader: reader{s: s, q: conn, snap: &snapshot{}}}, scopes: order}
	open := false
	defer func() {
		if open {
			// A connection still in a transaction after this (its
			// rollback failed) is closed on release, never reused.
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	// One round trip: begin, then one statement that bounds the wait, takes
	// the guard's lock shared and each scope's lock in order and tries the
	// lanes, then read every stream's size — a statement of its own, after
	// every lock is held.
	lane := -1
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	lockSQL, lockArgs := lockStatement(order, wait)
	b.Queue(lockSQL, lockArgs...).QueryRow(func(row pgx.Row) error {
		var got *int
		// set_config's value and the locks' voids, then the lane.
		dest := make([]any, len(order)+3)
		dest[len(dest)-1] = &got
		if err := row.Scan(dest...); err != nil {
			return err
		}
		if got != nil {
			lane = *got
		} // else every lane is busy
		return nil
	})
	b.Queue(snapshotLastSQL).Query(func(rows pgx.Rows) error { return w.readSnapshotLast(rows) })
	if q, ok := reviewlog.ReviewQueryOf(ctx); ok {
		// The reviews the section will read, after its locks: the
		// caller's scope is held, so no other section changes them.
		sql, args := reviewsQuery(q)
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			got, err := collectReviews(rows)
			w.preReviews = &prefetchedReviews{q: q, rows: got}
			return err
		})
	}
	if pre != nil {
		// What the section reads beside its locks, after every lock (the
		// lane's included) is held: the spend ledger from the positions
		// its process read to, and the chains' receipts past where it read
		// them (ledgerSince and segmentLinesSince serve them from here).
		w.preLedger = &prefetchedLedger{from: pre.Ledger}
		b.Queue(ledgerSinceSQL, ledgerArgs(pre.Ledger, true)...).Query(func(rows pgx.Rows) error {
			got, err := collectLedger(rows, w.preLedger.from, true)
			w.preLedger.raws = got
			return err
		})
		if pre.Caller != "" {
			w.preQuestion = &prefetchedQuestion{agent: pre.Caller, paramsHash: pre.ParamsHash}
			b.Queue(questionReceiptsSQL, pre.Caller, pre.ParamsHash).Query(func(rows pgx.Rows) error {
				got, err := collectReceipts(rows)
				w.preQuestion.rows = got
				return err
			})
			// And the receipts of each of those reviews, which a question
			// asked again reads to resolve them. A statement of its own:
			// the two as one (a UNION ALL) cost the database more to
			// execute than the two cost it apart (EXPLAIN ANALYZE: 0.11–0.13
			// ms against 0.06–0.07 ms).
			b.Queue(questionActionReceiptsSQL, pre.Caller, pre.ParamsHash).Query(func(rows pgx.Rows) error {
				got, err := collectReceipts(rows)
				w.preQuestion.actions = got
				return err
			})
		}
		// The server's keyring, which a review's signed terms are
		// verified with: as this process last read it, when it did (the
		// keyring only grows, and a kid names one key), which a receipt
		// sealed by a key it does not hold reads again (KeyringWith);
		// else one small statement in this round trip instead of a round
		// trip of its own in the sections that need it.
		if kr := s.cachedKeys(); kr != nil {
			w.earlierKeys = kr
		} else {
			b.Queue("SELECT kid, spki FROM keyring").Query(func(rows pgx.Rows) error {
				kr, err := collectKeyring(rows)
				w.keyring = kr
				if err == nil {
					s.keepKeys(kr)
				}
				return err
			})
		}
		w.preSegs = &prefetchedSegments{marks: pre.Segments}
		b.Queue(segmentsSinceSQL, segmentArgs(pre.Segments)...).Query(func(rows pgx.Rows) error {
			got, last, err := collectSegmentLinesLast(rows)
			w.preSegs.lines = got
			if err == nil && w.snap.taken {
				// The snapshot's statement came before this one in the
				// batch, and its rows are read by now.
				w.keepHeads(last, w.snap.streams)
			}
			return err
		})
	}
	open = true
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return s.lockError(err, wait)
	}
	if lane < 0 {
		// Wait for one lane: after the scopes, so no two sections wait for
		// each other in a cycle; and read the sizes again once it is held.
		lane = rand.IntN(chainLanes)
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int, $2::int)", laneClass, lane); err != nil {
			return s.lockError(err, wait)
		}
		w.snap.taken = false
		if err := w.take(ctx); err != nil {
			return err
		}
		// Read before this wait: read again when asked.
		w.preLedger, w.preSegs, w.preQuestion = nil, nil, nil
	}
	w.lane = lane
	if err := fn(w); err != nil {
		return err
	}
	// What the section appended and the commit, in one round trip.
	tag, err := w.commit(ctx)
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		// A transaction a statement failed in ends rolled back.
		return fmt.Errorf("PostgreSQL at %s: commit: the transaction was rolled back (%s)", s.describe, tag.String())
	}
	open = false
	w.committed()
	return nil
}

// lockStatement bounds the wait for the locks (lock_timeout, for the
// transaction, as SET LOCAL would), takes the guard's lock shared, then
// each scope's lock in order, then tries the chain lanes, in one statement
// and in that order: PostgreSQL evaluates a select list from left to right,
// and the lanes' subquery when its column is reached, after every scope's
// lock is held (a section never holds a lane while it waits for a scope).
// Its last column is the lane it holds (NULL: every lane is busy). The keys are parameters: the statement's text
// depends only on how many scopes there are and which are shared, so a
// connection prepares it once for every question of that shape, not once
// per set of scopes (a text with the keys in it cost a round trip of
// preparation each time a connection met a new set). One statement where
// there were three: each costs the database its executor's start and end.
func lockStatement(order []reviewlog.Scope, wait time.Duration) (string, []any) {
	var b strings.Builder
	args := make([]any, 0, len(order)+4)
	args = append(args, strconv.FormatInt(max(wait.Milliseconds(), 1), 10), int64(lockKey))
	b.WriteString("SELECT set_config('lock_timeout', $1, true), pg_advisory_xact_lock_shared($2::bigint)")
	for _, sc := range order {
		fn := "pg_advisory_xact_lock"
		if sc.Shared {
			fn = "pg_advisory_xact_lock_shared"
		}
		args = append(args, sc.LockKey())
		fmt.Fprintf(&b, ", %s($%d::bigint)", fn, len(args))
	}
	args = append(args, chainLanes, laneClass)
	fmt.Fprintf(&b, ",\n\t(SELECT l FROM generate_series(0, $%d::int - 1) AS l WHERE pg_try_advisory_xact_lock($%d::int, l) LIMIT 1)", len(args)-1, len(args))
	return b.String(), args
}

func (s *Store) lockError(err error, wait time.Duration) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" {
		return fmt.Errorf("%s: %w within %s (another decision of the same scope holds it)", s.describe, reviewlog.ErrLockTimeout, wait)
	}
	return fmt.Errorf("PostgreSQL at %s: take the scopes' locks: %w", s.describe, scrub(err))
}

// scopedWriter is the Writer of a scoped section.
type scopedWriter struct {
	writer
	scopes []reviewlog.Scope
	lane   int
	// preReviews are the reviews read with the locks (nil: none).
	preReviews *prefetchedReviews
	// preLedger and preSegs are the spend ledger and the chains' receipts
	// read with the locks (nil: none).
	preLedger   *prefetchedLedger
	preSegs     *prefetchedSegments
	preQuestion *prefetchedQuestion
}

// prefetchedReviews are the rows of q, read in the round trip that took a
// scoped section's locks.
type prefetchedReviews struct {
	q    reviewlog.ReviewQuery
	rows []reviewlog.IndexedReview
}

// prefetchedQuestion are the receipts of a question read with the locks,
// and the receipts of the review actions among them.
type prefetchedQuestion struct {
	agent, paramsHash string
	rows              []reviewlog.IndexedReceipt
	actions           []reviewlog.IndexedReceipt
}

// ActionReceipts gives the receipts read with the locks when action is one
// of the question's reviews (as the rows read with them name it), and
// reads them otherwise.
func (w *scopedWriter) ActionReceipts(ctx context.Context, action string) ([]reviewlog.IndexedReceipt, error) {
	if p := w.preQuestion; p != nil && slices.ContainsFunc(p.rows, func(r reviewlog.IndexedReceipt) bool { return r.ActionID == action }) {
		var out []reviewlog.IndexedReceipt
		for _, r := range p.actions {
			if r.ActionID == action {
				out = append(out, r)
			}
		}
		return out, nil
	}
	return w.writer.ActionReceipts(ctx, action)
}

// QuestionReceipts gives the receipts read with the locks for this very
// question, and reads them otherwise.
func (w *scopedWriter) QuestionReceipts(ctx context.Context, agent, paramsHash string) ([]reviewlog.IndexedReceipt, error) {
	if p := w.preQuestion; p != nil && p.agent == agent && p.paramsHash == paramsHash {
		return p.rows, nil
	}
	return w.writer.QuestionReceipts(ctx, agent, paramsHash)
}

// IndexedReviews gives the rows read with the locks when they cover q,
// and reads q otherwise.
func (w *scopedWriter) IndexedReviews(ctx context.Context, q reviewlog.ReviewQuery) ([]reviewlog.IndexedReview, error) {
	if w.preReviews != nil && w.preReviews.q.Covers(q) {
		return w.preReviews.rows, nil
	}
	return w.writer.IndexedReviews(ctx, q)
}

func (w *scopedWriter) Scopes() []reviewlog.Scope { return w.scopes }
func (w *scopedWriter) ChainLane() int            { return w.lane }

// AppendLog appends the lines at the end of the review log as it is now,
// in one statement with the outbox and the notifications: sections of
// other scopes append to the same log, and the log's row keeps them in
// line (its update waits for the one before to commit).
func (w *scopedWriter) AppendLog(ctx context.Context, data []byte) error {
	lines, err := splitLines(data)
	if err != nil {
		return fmt.Errorf("append to %s: %w", logStream, err)
	}
	rel := make([]int64, len(lines))
	kinds := make([]*string, len(lines))
	ids := make([]*string, len(lines))
	var off int64
	var opened, used []string
	var heads []indexed
	for i, line := range lines {
		rel[i] = off
		off += int64(len(line))
		li := indexLine(line)
		heads = append(heads, li)
		kinds[i], ids[i] = li.kind, li.id
		if li.notify != "" {
			opened = append(opened, li.notify)
		}
		if li.used != "" {
			used = append(used, li.used)
		}
	}
	b := &pgx.Batch{}
	w.queueClosings(b)
	var base int64
	b.Queue(`WITH g AS (
			INSERT INTO guard_streams (name, size, generation) SELECT $1, $2, value FROM guard_meta WHERE key = 'generation'
			ON CONFLICT (name) DO UPDATE SET size = guard_streams.size + $2
			RETURNING size - $2 AS base),
		i AS (INSERT INTO review_lines (stream, off, line, kind, review_id)
			SELECT $1, g.base + x.rel, x.line, x.kind, x.rid FROM g, unnest($3::bigint[], $4::bytea[], $5::text[], $6::text[]) AS x (rel, line, kind, rid))
		SELECT base FROM g`, logStream, off, rel, lines, kinds, ids).QueryRow(func(row pgx.Row) error { return row.Scan(&base) })
	for i, li := range heads {
		queueRow(b, logStream, off-rel[i], li.head, false)
	}
	for _, id := range used {
		queueUse(ctx, b, id, false)
	}
	for i, li := range heads {
		queueReservation(b, li, rel[i], true, off, false)
	}
	for _, id := range opened {
		// Delivered at commit, to every replica listening.
		b.Queue("INSERT INTO notify_outbox (review_id) VALUES ($1) ON CONFLICT DO NOTHING", id)
		b.Queue("SELECT pg_notify($1, $2)", Channel, id)
	}
	b.Queue("SELECT pg_notify($1, '')", ChannelLog)
	if err := w.send(ctx, b); err != nil {
		if errors.Is(err, reviewlog.ErrAlreadyDecided) || errors.Is(err, reviewlog.ErrReviewOpen) {
			return err
		}
		return fmt.Errorf("PostgreSQL at %s: append to %s: %w", w.s.describe, logStream, err)
	}
	if w.snap.taken {
		// Every row before base is committed: its writer held the log's
		// row until it did.
		si := w.snap.streams[logStream]
		si.size = base + off
		w.snap.streams[logStream] = si
	}
	return nil
}

// The scoped writer appends at the log's end; the rest must not rewrite it.
func (w *scopedWriter) ReplaceLog(context.Context, string, []byte, []byte) error {
	return errors.New("the review log is rewritten holding the whole store's lock, not a scope's")
}
