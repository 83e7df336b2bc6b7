// Package pgstore keeps the guard's state in PostgreSQL, for replicas on
// separate hosts that share no filesystem. It implements reviewlog.Store:
// every line of the review log and every signed receipt is a row holding
// the exact bytes, at its byte offset in its stream, so the logic above it
// (folding the log, verifying signatures, sealing the next receipt) is the
// file store's, and `store export` writes back the same files.
//
// The write lock is a transaction-scoped advisory lock: one locked section
// is one READ COMMITTED transaction that takes pg_advisory_xact_lock first,
// so the review row and its receipt commit together or not at all, the
// same question asked of three replicas at once opens one review, and a
// chain's head cannot be sealed twice (the schema's UNIQUE (stream, seq)
// would refuse it anyway).
package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const (
	logStream      = reviewlog.FileName
	receiptsPrefix = reviewlog.ReceiptsDir + "/"
	// lockKey is the advisory lock of the guard's state (any constant
	// that no other application on the database uses).
	lockKey = 0x4861696147756172 // "HaiaGuar"
	// Channel is what every commit that opens a review NOTIFYs, with the
	// review id as payload; ChannelLog is notified on every append.
	Channel    = "haia_guard_opened"
	ChannelLog = "haia_guard_log"
	// statementTimeout bounds every statement, so a stuck database turns
	// into an error (and the guard fails closed) instead of a hang.
	statementTimeout = 10 * time.Second
	connectTimeout   = 5 * time.Second
)

// Store is the PostgreSQL store. It is safe for concurrent use.
type Store struct {
	pool     *pgxpool.Pool
	describe string
	// schema is the schema version this binary carries.
	schema int64
	// heads keeps the last row of each chain segment this store read or
	// committed, so that sealing the next receipt does not read it again
	// while the segment is still as long (and of the same generation).
	heads heads
	// keys is the keyring as a scoped section last read it, whole (nil:
	// none read yet, or this process added a key since): a decision's
	// section starts from it instead of reading the table again, and
	// reads it again for a key it does not hold (KeyringWith).
	keysMu sync.Mutex
	keys   noa.Keyring
}

// cachedKeys is a copy of the keyring as last read (nil: none).
func (s *Store) cachedKeys() noa.Keyring {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	if s.keys == nil {
		return nil
	}
	return maps.Clone(s.keys)
}

// keepKeys remembers kr, a whole reading of the keyring (nil forgets).
func (s *Store) keepKeys(kr noa.Keyring) {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	s.keys = maps.Clone(kr)
}

// heads is the last rows of segments, by stream name.
type heads struct {
	mu sync.Mutex
	m  map[string]head
}

// head is a segment's last row as of its size and generation.
type head struct {
	gen       string
	size, off int64
	line      []byte
}

func (h *heads) get(name, gen string, size int64) (head, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.m[name]
	return e, ok && e.gen == gen && e.size == size
}

func (h *heads) put(name string, e head) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string]head{}
	}
	h.m[name] = e
}

// IsURL says whether s names a PostgreSQL store.
func IsURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// Redact is dsn without its password, for messages.
func Redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	u.RawQuery = ""
	return u.String()
}

func connect(ctx context.Context, dsn string, counter *Counter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's message may quote the URL: never echo a password.
		return nil, fmt.Errorf("the store URL %s cannot be parsed as a PostgreSQL connection string", Redact(dsn))
	}
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > connectTimeout {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["statement_timeout"]; !ok {
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.Itoa(int(statementTimeout / time.Millisecond))
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "haia-trace-mcp"
	if counter != nil {
		cfg.ConnConfig.Tracer = counter
	}
	cfg.HealthCheckPeriod = 5 * time.Second
	if !strings.Contains(dsn, "pool_max_conns") {
		// Connections LISTEN for good (the notifier, the console's live
		// queue, review watch); decisions and reads share the rest.
		cfg.MaxConns = max(cfg.MaxConns, 8)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", Redact(dsn), err)
	}
	return pool, nil
}

// Open connects to the database at dsn and checks that its schema is the
// one this binary carries (ErrSchema, saying what to run, otherwise).
func Open(ctx context.Context, dsn string) (*Store, error) { return OpenCounted(ctx, dsn, nil) }

// OpenCounted is Open with every statement and round trip counted in c
// (nil: none).
func OpenCounted(ctx context.Context, dsn string, c *Counter) (*Store, error) {
	pool, err := connect(ctx, dsn, c)
	if err != nil {
		return nil, err
	}
	s := &Store{pool: pool, describe: Redact(dsn)}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout+statementTimeout)
	defer cancel()
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s does not answer: %w", s.describe, scrub(err))
	}
	v, err := checkSchema(cctx, pool, s.describe)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.schema = v
	return s, nil
}

// Describe is the database URL without its password.
func (s *Store) Describe() string { return s.describe }

// Close closes the connection pool.
func (s *Store) Close() error { s.pool.Close(); return nil }

// Ready asks the database and checks that its schema is still the
// binary's: a newer binary that migrated it under this one takes this one
// out of service rather than let it write a schema it does not know.
func (s *Store) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	var v int64
	err := s.pool.QueryRow(ctx, "SELECT COALESCE(max(version_id), 0) FROM "+versionTable+" WHERE is_applied").Scan(&v)
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: %w", s.describe, scrub(err))
	}
	if v != s.schema {
		return fmt.Errorf("%w: %s is now at schema version %d, this binary speaks %d", ErrSchema, s.describe, v, s.schema)
	}
	return nil
}

// View runs fn inside one read-only REPEATABLE READ transaction, so the
// log and the chains it reads are one moment's.
func (s *Store) View(ctx context.Context, fn func(r reviewlog.Reader) error) error {
	// No bound on the whole: an audit or an export reads for as long as
	// the chains are long. Every statement is bounded by statement_timeout.
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: begin: %w", s.describe, scrub(err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(&reader{s: s, q: tx}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Locked runs fn in one transaction holding the guard's advisory lock.
func (s *Store) Locked(ctx context.Context, wait time.Duration, fn func(w reviewlog.Writer) error) error {
	if !reviewlog.IsBulk(ctx) {
		// A decision is bounded as a whole: a database that answers each
		// statement slowly still fails closed in bounded time.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait+3*statementTimeout)
		defer cancel()
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: begin: %w", s.describe, scrub(err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// One round trip: both are integers formatted here, never input.
	lockSQL := fmt.Sprintf("SET LOCAL lock_timeout = %d; SELECT pg_advisory_xact_lock(%d)", max(wait.Milliseconds(), 1), int64(lockKey))
	if _, err := tx.Exec(ctx, lockSQL); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" {
			return fmt.Errorf("%s: %w within %s (another replica holds it)", s.describe, reviewlog.ErrLockTimeout, wait)
		}
		return fmt.Errorf("PostgreSQL at %s: take the guard lock: %w", s.describe, scrub(err))
	}
	w := &writer{reader: reader{s: s, q: tx}, bulk: reviewlog.IsBulk(ctx)}
	if w.bulk {
		// A copy brings receipts signed before the ledger, with their
		// entries where there are any (commitment_in_ledger).
		if _, err := tx.Exec(ctx, "SET LOCAL haia.copy = 'on'"); err != nil {
			return fmt.Errorf("PostgreSQL at %s: %w", s.describe, scrub(err))
		}
	}
	if err := fn(w); err != nil {
		return err
	}
	if err := w.flush(ctx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("PostgreSQL at %s: commit: %w", s.describe, scrub(err))
	}
	w.committed()
	return nil
}

// scrub keeps what a person can act on from a driver error.
func scrub(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	return err
}

type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type reader struct {
	s *Store
	q querier
	// snap, when set, is every stream's size and generation at one moment
	// (a scoped section's), read by the first read that needs it; reads
	// go no further than it. nil: each read asks the database.
	snap *snapshot
	// keyring is the keyring as first read in this transaction, with what
	// it added since (the keyring only grows).
	keyring noa.Keyring
	// earlierKeys is the keyring as this process read it before this
	// transaction (Store.cachedKeys; nil: none), which KeyringWith answers
	// from while it holds the key asked for.
	earlierKeys noa.Keyring
	// written is the last row this transaction appended to each segment;
	// the store remembers them once it commits.
	written map[string]head
}

// head is the last row of a segment as this transaction sees it.
func (r *reader) head(name, gen string, size int64) (head, bool) {
	if h, ok := r.written[name]; ok {
		return h, h.gen == gen && h.size == size
	}
	return r.s.heads.get(name, gen, size)
}

// committed remembers what the transaction appended, now that it is in
// the database.
func (r *reader) committed() {
	for name, h := range r.written {
		r.s.heads.put(name, h)
	}
}

// snapshot is the guard_streams of one moment.
type snapshot struct {
	taken   bool
	streams map[string]streamInfo
	// logLast is the review log's last row as the snapshot read it (nil:
	// not read).
	logLast *head
}

type streamInfo struct {
	size int64
	gen  string
}

// take reads every stream's size in one statement: the streams of one
// commit are all in it or none, so a reader of the log and the chains sees
// each decision's line and receipts together or not at all.
func (r *reader) take(ctx context.Context) error {
	if r.snap == nil || r.snap.taken {
		return nil
	}
	rows, err := r.q.Query(ctx, snapshotSQL)
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: streams: %w", r.s.describe, scrub(err))
	}
	return r.readSnapshot(rows)
}

const snapshotSQL = "SELECT name, size, generation FROM guard_streams"

// snapshotLastSQL is snapshotSQL with the review log's last line, of the
// same moment.
const snapshotLastSQL = `SELECT g.name, g.size, g.generation, t.off, t.line FROM guard_streams AS g
	LEFT JOIN LATERAL (SELECT off, line FROM review_lines WHERE g.name = '` + logStream + `' AND stream = g.name ORDER BY off DESC LIMIT 1) AS t ON true`

// readSnapshotLast keeps the rows of snapshotLastSQL as the snapshot and
// the log's last line.
func (r *reader) readSnapshotLast(rows pgx.Rows) error {
	defer rows.Close()
	m := map[string]streamInfo{}
	var last *head
	for rows.Next() {
		var name string
		var si streamInfo
		var off *int64
		var line []byte
		if err := rows.Scan(&name, &si.size, &si.gen, &off, &line); err != nil {
			return fmt.Errorf("PostgreSQL at %s: streams: %w", r.s.describe, err)
		}
		m[name] = si
		if name == logStream && off != nil {
			last = &head{gen: si.gen, size: si.size, off: *off, line: line}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("PostgreSQL at %s: streams: %w", r.s.describe, scrub(err))
	}
	r.snap.streams, r.snap.taken, r.snap.logLast = m, true, last
	return nil
}

// readSnapshot keeps the rows of snapshotSQL as the snapshot.
func (r *reader) readSnapshot(rows pgx.Rows) error {
	defer rows.Close()
	m := map[string]streamInfo{}
	for rows.Next() {
		var name string
		var si streamInfo
		if err := rows.Scan(&name, &si.size, &si.gen); err != nil {
			return fmt.Errorf("PostgreSQL at %s: streams: %w", r.s.describe, err)
		}
		m[name] = si
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("PostgreSQL at %s: streams: %w", r.s.describe, scrub(err))
	}
	r.snap.streams, r.snap.taken, r.snap.logLast = m, true, nil
	return nil
}

func (r *reader) Locate(name string) string { return r.s.describe + "#" + name }

func (r *reader) stream(ctx context.Context, name, table string, mustExist bool) (reviewlog.Stream, error) {
	if r.snap != nil {
		if err := r.take(ctx); err != nil {
			return nil, err
		}
		si, ok := r.snap.streams[name]
		if !ok {
			if mustExist {
				return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
			}
			return &stream{ctx: ctx, q: r.q, name: name, table: table, r: r}, nil
		}
		return &stream{ctx: ctx, q: r.q, name: name, table: table, size: si.size, identity: si.gen, r: r}, nil
	}
	var size int64
	var gen string
	err := r.q.QueryRow(ctx, "SELECT size, generation FROM guard_streams WHERE name = $1", name).Scan(&size, &gen)
	if errors.Is(err, pgx.ErrNoRows) {
		if mustExist {
			return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
		}
		return &stream{ctx: ctx, q: r.q, name: name, table: table, r: r}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: stream %s: %w", r.s.describe, name, scrub(err))
	}
	return &stream{ctx: ctx, q: r.q, name: name, table: table, size: size, identity: gen, r: r}, nil
}

func (r *reader) Log(ctx context.Context) (reviewlog.Stream, error) {
	return r.stream(ctx, logStream, "review_lines", false)
}

func (r *reader) Segment(ctx context.Context, file string) (reviewlog.Stream, error) {
	return r.stream(ctx, receiptsPrefix+file, "receipts", true)
}

func (r *reader) Segments(ctx context.Context) ([]reviewlog.StreamInfo, error) {
	if r.snap != nil {
		if err := r.take(ctx); err != nil {
			return nil, err
		}
		var out []reviewlog.StreamInfo
		for name, si := range r.snap.streams {
			if file, ok := strings.CutPrefix(name, receiptsPrefix); ok {
				out = append(out, reviewlog.StreamInfo{Name: file, Identity: si.gen, Size: si.size, Version: strconv.FormatInt(si.size, 10)})
			}
		}
		return out, nil
	}
	rows, err := r.q.Query(ctx, "SELECT name, size, generation FROM guard_streams WHERE starts_with(name, $1)", receiptsPrefix)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: list chain segments: %w", r.s.describe, scrub(err))
	}
	defer rows.Close()
	var out []reviewlog.StreamInfo
	for rows.Next() {
		var name, gen string
		var size int64
		if err := rows.Scan(&name, &size, &gen); err != nil {
			return nil, err
		}
		out = append(out, reviewlog.StreamInfo{Name: strings.TrimPrefix(name, receiptsPrefix), Identity: gen, Size: size, Version: strconv.FormatInt(size, 10)})
	}
	return out, rows.Err()
}

func (r *reader) Keyring(ctx context.Context) (noa.Keyring, error) {
	if r.keyring != nil {
		return maps.Clone(r.keyring), nil
	}
	kr, err := r.readKeyring(ctx)
	if err != nil {
		return nil, err
	}
	r.keyring = kr
	r.s.keepKeys(kr)
	return maps.Clone(kr), nil
}

// KeyringWith is the keyring as this process read it before, while it
// holds kid and this transaction has not read it; else Keyring
// (reviewlog.KeyringCache).
func (r *reader) KeyringWith(ctx context.Context, kid string) (noa.Keyring, error) {
	if _, ok := r.earlierKeys[kid]; ok && r.keyring == nil {
		return maps.Clone(r.earlierKeys), nil
	}
	return r.Keyring(ctx)
}

func (r *reader) readKeyring(ctx context.Context) (noa.Keyring, error) {
	rows, err := r.q.Query(ctx, "SELECT kid, spki FROM keyring")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: keyring: %w", r.s.describe, scrub(err))
	}
	return collectKeyring(rows)
}

// collectKeyring reads the rows of SELECT kid, spki FROM keyring.
func collectKeyring(rows pgx.Rows) (noa.Keyring, error) {
	defer rows.Close()
	kr := noa.Keyring{}
	for rows.Next() {
		var kid, spki string
		if err := rows.Scan(&kid, &spki); err != nil {
			return nil, err
		}
		kr[kid] = spki
	}
	return kr, rows.Err()
}

// policyKey is the guard_meta row of the policy in effect.
const policyKey = "policy_in_effect"

func (r *reader) Policy(ctx context.Context) (reviewlog.PolicyRecord, bool, error) {
	var value string
	err := r.q.QueryRow(ctx, "SELECT value FROM guard_meta WHERE key = $1", policyKey).Scan(&value)
	if errors.Is(err, pgx.ErrNoRows) {
		return reviewlog.PolicyRecord{}, false, nil
	}
	if err != nil {
		return reviewlog.PolicyRecord{}, false, fmt.Errorf("PostgreSQL at %s: the policy in effect: %w", r.s.describe, scrub(err))
	}
	rec, err := reviewlog.ParsePolicyRecord([]byte(value))
	if err != nil {
		return reviewlog.PolicyRecord{}, false, fmt.Errorf("PostgreSQL at %s: %w", r.s.describe, err)
	}
	return rec, true, nil
}

func (r *reader) Archives(ctx context.Context) ([]string, error) {
	rows, err := r.q.Query(ctx, "SELECT name FROM guard_streams WHERE starts_with(name, $1) ORDER BY name", reviewlog.ArchivePrefix)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: archives: %w", r.s.describe, scrub(err))
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: archives: %w", r.s.describe, scrub(err))
	}
	// Only what the log names an archive is one.
	out := names[:0]
	for _, n := range names {
		if reviewlog.IsArchiveName(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

func (r *reader) Archive(ctx context.Context, name string) (reviewlog.Stream, error) {
	return r.stream(ctx, name, "review_lines", true)
}

type writer struct {
	reader
	// pending are appends queued for the commit's round trip (the chains'
	// receipts and the ledger's entries): a failure among them fails the
	// commit, and the section with it.
	pending *pgx.Batch
	// closings are the CloseOpen calls to send with the next append.
	closings []closing
	// bulk: the section is a bulk copy (reviewlog.Bulk), whose lines were
	// recorded before.
	bulk bool
}

// indexed is what the schema indexes of one line: its type and review id
// (nil when it has none), what it queues in the notification outbox (the
// review it opens, a settlement with findings, an ambiguity; "" when
// none), and its head for the review rows. A line the log cannot read is kept,
// unindexed, for the fold to report.
type indexed struct {
	kind, id *string
	notify   string
	// used names the review whose approval the line uses ("" when none).
	used string
	// reservation and release are a reserved or released line's record
	// (nil for any other line).
	reservation *reviewlog.Reservation
	release     *reviewlog.Release
	// head is the line's head, for the review rows.
	head reviewlog.LineHead
}

func indexLine(line []byte) indexed {
	h, _ := reviewlog.ParseLineHead(line)
	out := indexed{head: h}
	if h.Type != "" {
		out.kind = &h.Type
	}
	if h.ReviewID != "" {
		out.id = &h.ReviewID
	}
	out.notify = h.Notify
	if h.Uses() {
		out.used = h.ReviewID
	}
	out.reservation, out.release = h.Reservation, h.Release
	return out
}

// queueUse records one use of an approval. A decision's use is refused by
// the primary key when the approval is used already (the transaction then
// fails and nothing is written); an archive or an import moves uses that
// are recorded already.
func queueUse(ctx context.Context, b *pgx.Batch, id string, moving bool) {
	if moving || reviewlog.IsBulk(ctx) {
		b.Queue("INSERT INTO review_uses (review_id) VALUES ($1) ON CONFLICT DO NOTHING", id)
		return
	}
	b.Queue("INSERT INTO review_uses (review_id) VALUES ($1)", id)
}

// useRefused turns the database's refusal of a second use into what it
// means.
func useRefused(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "review_uses_pkey" {
		return fmt.Errorf("%w: the database refuses a second use of one approval (review_uses); nothing was written", reviewlog.ErrAlreadyDecided)
	}
	return nil
}

func splitLines(data []byte) ([][]byte, error) {
	if len(data) == 0 || data[len(data)-1] != '\n' {
		return nil, errors.New("an append must be whole lines")
	}
	var out [][]byte
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		out = append(out, data[:i+1])
		data = data[i+1:]
	}
	return out, nil
}

// growSQL moves stream $1 from size $2 to $3 (= $2 + $4), creating it
// when $2 is 0; no row changes when the stream is not $2 bytes long.
const growSQL = `INSERT INTO guard_streams (name, size, generation)
		SELECT $1, $3, value FROM guard_meta
		WHERE key = 'generation' AND ($2 = 0 OR EXISTS (SELECT 1 FROM guard_streams WHERE name = $1))
		ON CONFLICT (name) DO UPDATE SET size = guard_streams.size + $4 WHERE guard_streams.size = $2
		RETURNING generation`

// grow moves a stream's size from want to want+n, creating it; a size
// other than want means the caller's view is not the stream's.
func (w *writer) grow(ctx context.Context, name string, want, n int64) error {
	// A new stream starts at 0; an existing one grows only from the size
	// its writer read.
	var gen string
	err := w.q.QueryRow(ctx, growSQL, name, want, want+n, n).Scan(&gen)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("stream %s is not %d bytes long as its writer read it; refusing to append", name, want)
	}
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: stream %s: %w", w.s.describe, name, scrub(err))
	}
	return nil
}

func (w *writer) size(ctx context.Context, name string) (int64, error) {
	var size int64
	err := w.q.QueryRow(ctx, "SELECT size FROM guard_streams WHERE name = $1", name).Scan(&size)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("PostgreSQL at %s: stream %s: %w", w.s.describe, name, scrub(err))
	}
	return size, nil
}

// insertLines writes lines at off of stream; moving says they are lines
// recorded before (an archive run rewriting the log), whose approvals'
// uses are recorded already.
func (w *writer) insertLines(ctx context.Context, stream string, off int64, lines [][]byte, moving bool) ([]string, error) {
	var opened []string
	b := &pgx.Batch{}
	w.queueClosings(b)
	end := off
	for _, line := range lines {
		end += int64(len(line))
	}
	copying := moving || w.bulk || reviewlog.IsBulk(ctx)
	for _, line := range lines {
		li := indexLine(line)
		b.Queue("INSERT INTO review_lines (stream, off, line, kind, review_id) VALUES ($1, $2, $3, $4, $5)", stream, off, line, li.kind, li.id)
		queueRow(b, stream, end-off, li.head, copying)
		if li.used != "" {
			queueUse(ctx, b, li.used, moving)
		}
		if stream == logStream {
			queueReservation(b, li, off, false, 0, moving || reviewlog.IsBulk(ctx))
		}
		if li.notify != "" {
			opened = append(opened, li.notify)
		}
		off += int64(len(line))
	}
	if err := w.send(ctx, b); err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: append to %s: %w", w.s.describe, stream, err)
	}
	return opened, nil
}

// send runs a batch of statements in one round trip.
func (w *writer) send(ctx context.Context, b *pgx.Batch) error {
	tx, ok := w.q.(interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	})
	if !ok {
		return errors.New("a write outside a transaction")
	}
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		if u := useRefused(err); u != nil {
			return u
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "ledger_entries_pkey" {
			return fmt.Errorf("%w: %s", ledger.ErrSeqTaken, pe.Detail)
		}
		if o := openRefused(err); o != nil {
			return o
		}
		return scrub(err)
	}
	return nil
}

func (w *writer) AppendLog(ctx context.Context, data []byte) error {
	if err := w.flush(ctx); err != nil {
		return err
	}
	lines, err := splitLines(data)
	if err != nil {
		return fmt.Errorf("append to %s: %w", logStream, err)
	}
	off, err := w.size(ctx, logStream)
	if err != nil {
		return err
	}
	if err := w.grow(ctx, logStream, off, int64(len(data))); err != nil {
		return err
	}
	opened, err := w.insertLines(ctx, logStream, off, lines, false)
	if err != nil {
		return err
	}
	for _, id := range opened {
		// Delivered at commit, to every replica listening.
		if _, err := w.q.Exec(ctx, "INSERT INTO notify_outbox (review_id) VALUES ($1) ON CONFLICT DO NOTHING", id); err != nil {
			return fmt.Errorf("PostgreSQL at %s: notification outbox: %w", w.s.describe, scrub(err))
		}
		if _, err := w.q.Exec(ctx, "SELECT pg_notify($1, $2)", Channel, id); err != nil {
			return fmt.Errorf("PostgreSQL at %s: notify: %w", w.s.describe, scrub(err))
		}
	}
	if _, err := w.q.Exec(ctx, "SELECT pg_notify($1, '')", ChannelLog); err != nil {
		return fmt.Errorf("PostgreSQL at %s: notify: %w", w.s.describe, scrub(err))
	}
	return nil
}

func (w *writer) AppendSegment(ctx context.Context, file string, end int64, data []byte) error {
	name := receiptsPrefix + file
	lines, err := splitLines(data)
	if err != nil {
		return fmt.Errorf("chain %s: %w", file, err)
	}
	// A row is a whole receipt or nothing: there is never a torn tail to
	// cut, so end must be the stream's size (the first statement checks
	// it). The statements go with the commit (pending), in its round trip.
	n := int64(len(data))
	gen := ""
	if w.snap != nil && w.snap.taken {
		gen = w.snap.streams[name].gen
	}
	queued := &pgx.Batch{}
	queued.Queue(growSQL, name, end, end+n, n).QueryRow(func(row pgx.Row) error {
		var got string
		err := row.Scan(&got)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: stream %s is not %d bytes long as its writer read it; refusing to append", errNotAsRead, name, end)
		}
		return err
	})
	off := end
	for _, line := range lines {
		rc, err := noa.ParseReceipt(bytes.TrimRight(line, "\r\n"))
		if err != nil {
			// A writer whose idea of the segment's length is wrong hears
			// that first.
			if ferr := w.flush(ctx); ferr != nil {
				return ferr
			}
			if gerr := w.grow(ctx, name, end, n); gerr != nil {
				return gerr
			}
			return fmt.Errorf("chain %s: the receipt to append cannot be read: %w", file, err)
		}
		// The receipt and its row (receipts.go), in one statement.
		queued.Queue(appendReceiptSQL, receiptArgs(name, off, line, &rc)...)
		off += int64(len(line))
	}
	if gen == "" {
		// A new stream (or a section with no snapshot): its generation is
		// the store's, read now; send at once.
		if err := w.flush(ctx); err != nil {
			return err
		}
		var g string
		queued.Queue("SELECT generation FROM guard_streams WHERE name = $1", name).QueryRow(func(row pgx.Row) error { return row.Scan(&g) })
		if err := w.send(ctx, queued); err != nil {
			if errors.Is(err, errNotAsRead) {
				return err
			}
			return fmt.Errorf("PostgreSQL at %s: append to chain %s: %w", w.s.describe, file, err)
		}
		gen = g
	} else {
		w.queue(queued)
	}
	if w.snap != nil && w.snap.taken {
		w.snap.streams[name] = streamInfo{size: end + n, gen: gen}
	}
	if w.written == nil {
		w.written = map[string]head{}
	}
	last := lines[len(lines)-1]
	w.written[name] = head{gen: gen, size: end + n, off: end + n - int64(len(last)), line: bytes.Clone(last)}
	return nil
}

// queue adds a batch's statements to the pending appends.
func (w *writer) queue(b *pgx.Batch) {
	if w.pending == nil {
		w.pending = &pgx.Batch{}
	}
	w.pending.QueuedQueries = append(w.pending.QueuedQueries, b.QueuedQueries...)
}

// flush sends the pending appends (before a statement that must see them,
// or before the commit of a section that commits by itself).
func (w *writer) flush(ctx context.Context) error {
	if w.pending == nil || w.pending.Len() == 0 {
		return nil
	}
	b := w.pending
	w.pending = nil
	if err := w.send(ctx, b); err != nil {
		if errors.Is(err, errNotAsRead) || errors.Is(err, ledger.ErrSeqTaken) {
			return err
		}
		return fmt.Errorf("PostgreSQL at %s: append: %w", w.s.describe, err)
	}
	return nil
}

// commit sends the pending appends and COMMIT in one round trip.
func (w *writer) commit(ctx context.Context) (pgconn.CommandTag, error) {
	b := w.pending
	w.pending = nil
	if b == nil {
		b = &pgx.Batch{}
	}
	var tag pgconn.CommandTag
	b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	if err := w.send(ctx, b); err != nil {
		if errors.Is(err, errNotAsRead) || errors.Is(err, ledger.ErrSeqTaken) {
			return tag, err
		}
		return tag, fmt.Errorf("PostgreSQL at %s: commit: %w", w.s.describe, err)
	}
	return tag, nil
}

// errNotAsRead: a stream is not as long as its writer read it.
var errNotAsRead = errors.New("stream changed under its writer")

func (w *writer) AddKey(ctx context.Context, kid, spki string) error {
	tag, err := w.q.Exec(ctx, "INSERT INTO keyring (kid, spki) VALUES ($1, $2) ON CONFLICT (kid) DO NOTHING", kid, spki)
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: keyring: %w", w.s.describe, scrub(err))
	}
	if tag.RowsAffected() == 0 {
		var cur string
		if err := w.q.QueryRow(ctx, "SELECT spki FROM keyring WHERE kid = $1", kid).Scan(&cur); err != nil {
			return fmt.Errorf("PostgreSQL at %s: keyring: %w", w.s.describe, scrub(err))
		}
		if cur != spki {
			return fmt.Errorf("keyring: key id %s is recorded with another public key", kid)
		}
	}
	if w.keyring != nil {
		w.keyring[kid] = spki
	}
	// The next section reads the keyring whole again, with this key.
	w.s.keepKeys(nil)
	return nil
}

func (w *writer) SetPolicy(ctx context.Context, rec reviewlog.PolicyRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := w.q.Exec(ctx, "INSERT INTO guard_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", policyKey, string(data)); err != nil {
		return fmt.Errorf("PostgreSQL at %s: record the policy in effect: %w", w.s.describe, scrub(err))
	}
	return nil
}

// SettleNotifications marks every opened review as notified (a store
// import brings reviews that were notified where they came from), and
// settles the imported review rows.
func (w *writer) SettleNotifications(ctx context.Context) error {
	if _, err := w.q.Exec(ctx, "UPDATE notify_outbox SET delivered_at = now(), claimed_by = 'import' WHERE delivered_at IS NULL"); err != nil {
		return fmt.Errorf("PostgreSQL at %s: notification outbox: %w", w.s.describe, scrub(err))
	}
	// The import's reviews are in rows: each question's newest undecided
	// one is its open review.
	return w.settleRows(ctx)
}

// ReplaceLog moves archived lines into a new archive stream and rewrites
// the log as kept, under a new generation, in the same transaction.
func (w *writer) ReplaceLog(ctx context.Context, name string, archived, kept []byte) error {
	if !reviewlog.IsArchiveName(name) {
		return fmt.Errorf("archive %q: not an archive name", name)
	}
	al, err := splitLines(archived)
	if err != nil {
		return fmt.Errorf("archive %s: %w", name, err)
	}
	if err := w.grow(ctx, name, 0, int64(len(archived))); err != nil {
		return err
	}
	if _, err := w.insertLines(ctx, name, 0, al, true); err != nil {
		return err
	}
	// The kept lines are indexed again at their new offsets; the rows of
	// the lines archived go (an archive run keeps what may still hold).
	if _, err := w.q.Exec(ctx, "DELETE FROM reservations"); err != nil {
		return fmt.Errorf("PostgreSQL at %s: rewrite the reservations: %w", w.s.describe, scrub(err))
	}
	if _, err := w.q.Exec(ctx, "DELETE FROM review_lines WHERE stream = $1", logStream); err != nil {
		return fmt.Errorf("PostgreSQL at %s: rewrite the review log: %w", w.s.describe, scrub(err))
	}
	if _, err := w.q.Exec(ctx, "UPDATE guard_streams SET size = $2, generation = gen_random_uuid()::text WHERE name = $1", logStream, len(kept)); err != nil {
		return fmt.Errorf("PostgreSQL at %s: rewrite the review log: %w", w.s.describe, scrub(err))
	}
	if len(kept) == 0 {
		return w.settleRows(ctx)
	}
	kl, err := splitLines(kept)
	if err != nil {
		return fmt.Errorf("%s: %w", logStream, err)
	}
	if _, err = w.insertLines(ctx, logStream, 0, kl, true); err != nil {
		return err
	}
	return w.settleRows(ctx)
}

// stream reads one stream's rows at byte offsets. It keeps the rows it
// fetched last, since readers often read forward in small steps.
type stream struct {
	ctx context.Context
	q   querier
	// r is the reader that opened it (its transaction's heads).
	r           *reader
	name, table string
	size        int64
	identity    string
	// cache holds the bytes [cacheOff, cacheOff+len(cache)).
	cacheOff int64
	cache    []byte
}

// fetchBytes is how much one query reads ahead for a reader going forward,
// so that small sequential steps cost one query per this many bytes.
const fetchBytes = 256 << 10

func (s *stream) Size() int64      { return s.size }
func (s *stream) Identity() string { return s.identity }
func (s *stream) Close() error     { return nil }

func (s *stream) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	if off >= s.size {
		return 0, io.EOF
	}
	want := min(int64(len(p)), s.size-off)
	if off < s.cacheOff || off+want > s.cacheOff+int64(len(s.cache)) {
		// Reading on from where the cache ends is a fold or a scan: fetch
		// ahead. A read elsewhere (one receipt, an anchor) fetches what it
		// asked for.
		ahead := want
		if len(s.cache) > 0 && off >= s.cacheOff && off <= s.cacheOff+int64(len(s.cache)) {
			ahead = max(want, fetchBytes)
		}
		if err := s.fetch(off, off+ahead); err != nil {
			return 0, err
		}
	}
	n := copy(p[:want], s.cache[off-s.cacheOff:])
	if int64(n) < want {
		return n, fmt.Errorf("stream %s: %d bytes at offset %d are not in the database (%d read)", s.name, want, off, n)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// LastLine is the stream's last row (nil when empty): the head of a chain
// without reading the end of the segment.
func (s *stream) LastLine() (int64, []byte, error) {
	if s.size == 0 {
		return 0, nil, nil
	}
	if h, ok := s.r.head(s.name, s.identity, s.size); ok {
		return h.off, bytes.Clone(h.line), nil
	}
	if sn := s.r.snap; s.name == logStream && sn != nil && sn.logLast != nil && sn.logLast.gen == s.identity && sn.logLast.size == s.size {
		if h := sn.logLast; h.off+int64(len(h.line)) == s.size {
			return h.off, bytes.Clone(h.line), nil
		}
	}
	var off int64
	var line []byte
	err := s.q.QueryRow(s.ctx, `SELECT off, line FROM `+s.table+` WHERE stream = $1 ORDER BY off DESC LIMIT 1`, s.name).Scan(&off, &line)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil, fmt.Errorf("stream %s: %d bytes long, but no row holds them", s.name, s.size)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read %s: %w", s.name, scrub(err))
	}
	if off+int64(len(line)) != s.size {
		return 0, nil, fmt.Errorf("stream %s: its last row ends at byte %d, but the stream is %d bytes long", s.name, off+int64(len(line)), s.size)
	}
	if s.table == "receipts" && s.identity != "" {
		s.r.s.heads.put(s.name, head{gen: s.identity, size: s.size, off: off, line: bytes.Clone(line)})
	}
	return off, line, nil
}

// fetch reads the rows covering [from, to) into the cache.
func (s *stream) fetch(from, to int64) error {
	q := `SELECT off, line FROM ` + s.table + ` WHERE stream = $1
		AND off >= COALESCE((SELECT max(off) FROM ` + s.table + ` WHERE stream = $1 AND off <= $2), 0)
		AND off < $3 ORDER BY off`
	rs, err := s.q.Query(s.ctx, q, s.name, from, to)
	if err != nil {
		return fmt.Errorf("read %s: %w", s.name, scrub(err))
	}
	defer rs.Close()
	var got []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.off, &r.line); err != nil {
			return fmt.Errorf("read %s: %w", s.name, err)
		}
		got = append(got, r)
	}
	if err := rs.Err(); err != nil {
		return fmt.Errorf("read %s: %w", s.name, scrub(err))
	}
	start, buf, err := contiguous(s.name, got, from)
	if err != nil {
		return err
	}
	s.cacheOff, s.cache = start, buf
	return nil
}

// row is one stored line at its byte offset.
type row struct {
	off  int64
	line []byte
}

// contiguous joins rows (in offset order) into the bytes they hold, which
// must include offset from. Rows are whatever the database holds, and
// whoever can write it can leave gaps, overlaps or holes: each is an
// error, never a short or shifted read.
func contiguous(name string, rows []row, from int64) (int64, []byte, error) {
	if len(rows) == 0 || rows[0].off > from || rows[0].off < 0 {
		return 0, nil, fmt.Errorf("stream %s: no row holds offset %d", name, from)
	}
	start := rows[0].off
	var buf []byte
	for _, r := range rows {
		if r.off != start+int64(len(buf)) {
			return 0, nil, fmt.Errorf("stream %s: the row at offset %d does not follow the one before (a gap or an overlap)", name, r.off)
		}
		buf = append(buf, r.line...)
	}
	if start+int64(len(buf)) <= from {
		return 0, nil, fmt.Errorf("stream %s: no row holds offset %d (the rows end at %d)", name, from, start+int64(len(buf)))
	}
	return start, buf, nil
}
