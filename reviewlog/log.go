// Package reviewlog keeps the review log (guard/decisions.ndjson in the
// file store), the append-only log of reviews the guard opened and the
// decisions humans made on them, and the signed chains beside it. The state
// of a review is the fold of its lines; the log is the audit trail. The
// line format lives here (line.go), for every Store.
//
// Every append happens under the store's write lock (Store.Locked), which
// holds across the processes, or replicas, sharing the store. The locked
// section is a small transaction: read the log, run the caller's hook
// (where the signed decision receipt is appended), then write whole lines.
package reviewlog

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Names under the Trace root.
const (
	DirName  = "guard"
	FileName = "decisions.ndjson"
	LockName = "decisions.lock"
)

// Bounds.
const (
	maxLineBytes    = 1 << 20
	maxByBytes      = 256
	maxNoteBytes    = 4096
	maxFieldBytes   = 2048
	defaultLockWait = 5 * time.Second
)

// Errors a caller can tell apart with errors.Is.
var (
	ErrUnknownReview  = errors.New("unknown review")
	ErrAlreadyDecided = errors.New("review already decided")
	ErrLockTimeout    = errors.New("review log lock not obtained")
	ErrCorrupt        = errors.New("review log is corrupt")
	ErrBadID          = errors.New("bad review id")
	ErrBadInput       = errors.New("bad review input")
	ErrExpired        = errors.New("review expired")
	// ErrReviewOpen: a store that keeps one open review per question
	// refuses a second (see ReviewRowsWriter).
	ErrReviewOpen = errors.New("a review of this question is open already")
	ErrUntrusted  = errors.New("reviewer not trusted")
	// ErrTampered: an unsigned record disagrees with the signed receipts;
	// nothing is decided on it.
	ErrTampered = errors.New("review records tampered with")
)

// Options tune a Log. The zero value is usable.
type Options struct {
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// LockWait bounds how long an operation waits for the lock (5 s when 0).
	LockWait time.Duration
	// Reviewers reads the trusted reviewers each time a decision is
	// verified; nil trusts no one, so every decision reads Unverified.
	Reviewers func() (Reviewers, error)
	// Passkeys reads the trusted reviewers' passkeys each time a decision
	// is verified; nil trusts no passkey.
	Passkeys func() (Passkeys, error)
	// Tenant, when set, is the tenant of a server that serves several
	// (--tenants-dir) whose log this is: a decision counts only when the
	// reviewer is granted Tenant (Grants), and a review whose signed
	// terms name another tenant does not count here. "" is a single root,
	// where every trusted reviewer decides and no grant is read.
	Tenant string
	// Grants reads the trusted reviewers' tenant grants each time a
	// decision is verified (only with Tenant); nil grants nothing, so no
	// decision counts.
	Grants func() (Grants, error)
	// Trust, when set, reads the trusted reviewers file whole — keys,
	// passkeys and grants — once each time decisions are verified, in place
	// of Reviewers, Passkeys and Grants (which the other readers still
	// use): one reading of the file, not one for each.
	Trust func() (ReviewerTrust, error)
	// ReviewTTL: a pending review older than this reads Expired (never
	// when 0).
	ReviewTTL time.Duration
	// ServerKeys verify the terms the server signed; nil reads the
	// store's keyring each time.
	ServerKeys noa.Keyring
	// Parallel is how many questions this process answers at once on a
	// store that locks scopes (ScopedStore: PostgreSQL), each in a lane
	// of its own that keeps its own fold of the log in memory (so the
	// log's memory is that many times one fold's). 0: DefaultParallel;
	// 1: one at a time. Stores that lock everything answer one at a time.
	Parallel int
}

// DefaultParallel is Options.Parallel's default.
const DefaultParallel = 4

// Log is the review log under one Trace root. It is safe for concurrent use.
//
// The fold of the log is kept in memory and brought up to date by reading
// only the bytes appended since the last read, keyed by the file's identity
// (device, inode) and the bytes just before the last offset; a log that was
// replaced or rewritten is read again from the start, and that is reported
// as a finding. The receipts of the decision chains are indexed the same way
// (review id → chain file and offset), so no call reads a whole chain.
type Log struct {
	store     Store
	now       func() time.Time
	lockWait  time.Duration
	reviewers func() (Reviewers, error)
	passkeys  func() (Passkeys, error)
	// tenant and grants: see Options.Tenant and Options.Grants.
	tenant string
	grants func() (Grants, error)
	trust  func() (ReviewerTrust, error)
	// reviewTTL (nanoseconds) can change while the log is in use: the
	// server re-reads its policy on SIGHUP (SetReviewTTL).
	reviewTTL atomic.Int64
	// serverKeys: see Options.ServerKeys.
	serverKeys noa.Keyring
	// sem serialises this process's callers so they queue on a channel
	// instead of all polling flock.
	sem chan struct{}

	mu    sync.Mutex // guards cache while it is refreshed and used
	cache *cachedState
	// warmed: the lane read what it reads before its first question
	// (l.mu; see warm).
	warmed bool
	// archived maps the id of each review in an archive already read to
	// that archive; archivesRead names them (l.mu guards both).
	archived     map[string]string
	archivesRead map[string]bool
	// lastArchive is the fold of the archive lastArchiveName (l.mu).
	lastArchive     *state
	lastArchiveName string
	rx              receiptIndex
	// lanes, on a store that locks scopes, are further logs over the same
	// store, each with its own fold and its own turn, that answer
	// questions side by side as replicas would; subs lists them (nil:
	// this log answers every question itself).
	lanes chan *Log
	subs  []*Log
	// gate is the process's turn at each scope, shared by the lanes (nil:
	// the store does not lock scopes).
	gate *scopeGate
}

// cachedState is the fold of the log with the identity it was read from.
type cachedState struct {
	st       *state
	identity string
	anchor   []byte // the bytes just before st.offset
}

const anchorBytes = 64

// ttl is the time a pending review lives (0: forever).
func (l *Log) ttl() time.Duration { return time.Duration(l.reviewTTL.Load()) }

// SetReviewTTL changes how long a pending review lives, for a server that
// re-read its policy; answers given from then on use it.
func (l *Log) SetReviewTTL(d time.Duration) {
	l.reviewTTL.Store(int64(d))
	for _, sub := range l.subs {
		sub.SetReviewTTL(d)
	}
}

// OpenStore returns the review log kept in s.
func OpenStore(s Store, opts Options) *Log {
	l := &Log{store: s, now: opts.Now, lockWait: opts.LockWait, sem: make(chan struct{}, 1), reviewers: opts.Reviewers, passkeys: opts.Passkeys,
		tenant: opts.Tenant, grants: opts.Grants, trust: opts.Trust, serverKeys: opts.ServerKeys}
	l.reviewTTL.Store(int64(opts.ReviewTTL))
	if l.now == nil {
		l.now = time.Now
	}
	if l.lockWait <= 0 {
		l.lockWait = defaultLockWait
	}
	if _, ok := s.(ScopedStore); ok {
		l.gate = newScopeGate()
		n := opts.Parallel
		if n == 0 {
			n = DefaultParallel
		}
		if n > 1 {
			one := opts
			one.Parallel = 1
			l.lanes = make(chan *Log, n)
			for range n {
				sub := OpenStore(s, one)
				sub.gate = l.gate
				l.subs = append(l.subs, sub)
				l.lanes <- sub
			}
		}
	}
	return l
}

// warm indexes the chains of a lane that has not read them yet, outside
// any lock, so that its first question does not hold its scopes' locks
// while it reads everything. What it cannot read now is read again under
// the lock, where a failure counts. A lane of a store that locks scopes
// reads its reviews by index and never folds the log; any other folds it.
func (l *Log) warm(ctx context.Context) {
	l.mu.Lock()
	cold := !l.warmed
	l.warmed = true
	l.mu.Unlock()
	if !cold {
		return
	}
	_ = l.store.View(ctx, func(r Reader) error {
		if _, scoped := l.store.(ScopedStore); !scoped {
			return l.withFold(ctx, r, func(*state) error {
				_, err := l.newVerifier(ctx, r)
				return err
			})
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		_, err := l.newVerifier(ctx, r)
		return err
	})
}

// lane takes a free lane for one question, waiting at most the lock wait;
// put it back when done.
func (l *Log) lane(ctx context.Context) (*Log, error) {
	t := time.NewTimer(l.lockWait)
	defer t.Stop()
	select {
	case sub := <-l.lanes:
		return sub, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, fmt.Errorf("%s: %w within %s (every lane of this process is answering)", l.Path(), ErrLockTimeout, l.lockWait)
	}
}

// Path is where the log lives, for messages.
func (l *Log) Path() string { return l.store.Describe() + "/" + FileName }

// Store is the store the log is kept in.
func (l *Log) Store() Store { return l.store }

// Tx is what a hook sees inside the locked section.
type Tx struct {
	// Store writes to the guard's store; the lock is held until the hook
	// returns, and what the hook writes commits with the log's line.
	Store Writer
	// At is the time stamp of this append.
	At time.Time
	// Kind is "opened" (a new review), "reused" (an existing pending review
	// answers the question again; nothing is appended to this log),
	// "decided", "used", KindApproval, or "" for WithLock.
	Kind string
	// Review is the review's state once this transaction commits.
	Review Review
}

// KindApproval is the Tx.Kind of an approval that does not complete its
// review's quorum: the hook signs it, and nothing is appended to the log.
const KindApproval = "approval"

// Hook runs inside the lock before the line is written; an error aborts the
// append and is returned to the caller.
type Hook func(tx Tx) error

// DecideReview records a human decision (status Approved or Rejected) on a
// pending review. A review is decided once: a second decision fails with
// ErrAlreadyDecided, an id not in the log with ErrUnknownReview.
func (l *Log) DecideReview(ctx context.Context, id, status, note, by string, hook Hook) (Review, error) {
	if err := checkID(id); err != nil {
		return Review{}, err
	}
	if status != Approved && status != Rejected {
		return Review{}, fmt.Errorf("%w: status %q is neither approved nor rejected", ErrBadInput, clip(status))
	}
	if err := checkText("by", by, maxByBytes, false); err != nil {
		return Review{}, err
	}
	if by == "" {
		return Review{}, fmt.Errorf("%w: by (who decides) is empty", ErrBadInput)
	}
	if err := checkText("note", note, maxNoteBytes, true); err != nil {
		return Review{}, err
	}
	var out Review
	err := l.transact(ctx, func(g Writer, st *state, at time.Time) (*record, error) {
		e := st.byID[id]
		if e == nil {
			return nil, fmt.Errorf("%w: %s is not in %s", ErrUnknownReview, id, l.Path())
		}
		// On a tenant's log only a reviewer granted the tenant decides: a
		// decision by anyone else would not count, so none is written.
		if ok, err := l.granted(by); err != nil {
			return nil, fmt.Errorf("%w: %w; nothing was written", ErrUntrusted, err)
		} else if !ok {
			return nil, fmt.Errorf("%w: the trusted reviewers file does not grant reviewer %q tenant %q; nothing was written (the operator grants it: reviewer init or reviewer passkey add --tenant %s)", ErrUntrusted, clip(by), l.tenant, l.tenant)
		}
		r, err := st.review(e)
		if err != nil {
			return nil, err
		}
		// What the signatures say decides: a review a trusted reviewer
		// signed stays decided whatever the log says.
		v, err := l.newVerifier(ctx, g)
		if err != nil {
			return nil, err
		}
		vr, _, err := v.resolve(&r)
		if err != nil {
			return nil, err
		}
		switch vr.Status {
		case Approved, Rejected:
			return nil, fmt.Errorf("%w: %s was %s by %s at %s", ErrAlreadyDecided, id, vr.Status, vr.DecidedBy, vr.DecidedAt)
		case Expired:
			return nil, fmt.Errorf("%w: %s was opened at %s and expired after %s without a decision; the agent must ask again", ErrExpired, id, r.CreatedAt, l.ttl())
		}
		if r.Status != Pending {
			// Decided once, even where no trusted signature backs the line:
			// the review reads unverified and the agent's next question
			// opens a new one for a reviewer to sign.
			return nil, fmt.Errorf("%w: the log says %s was %s by %s at %s, but no trusted reviewer signed it (it reads unverified)", ErrAlreadyDecided, id, r.Status, r.DecidedBy, r.DecidedAt)
		}
		// The reviewer decides the terms the server signed, or nothing.
		switch {
		case vr.Terms == nil && !vr.Tampered:
			return nil, fmt.Errorf("%w: review %s carries no terms the server signed (it was opened by an earlier version), so it cannot be decided; nothing was written — the agent's next question opens a review that can be", ErrTampered, id)
		case vr.Tampered || vr.TermsReceipt == "":
			return nil, fmt.Errorf("%w: review %s is not decided and nothing was written: %s", ErrTampered, id, strings.Join(vr.Integrity, "; "))
		}
		out = vr // the terms as checked against the server's signature
		out.Integrity = nil
		if status == Approved && vr.Approvals > 1 {
			// The two-person rule: each reviewer's approval counts once, and
			// only the one that completes the quorum decides the review.
			if slices.Contains(vr.ApprovedBy, by) {
				return nil, fmt.Errorf("%w: reviewer %q approved review %s already (%s), and an approval counts once; it needs another reviewer's approval — nothing was written", ErrAlreadyDecided, clip(by), id, QuorumText(vr))
			}
			if len(vr.ApprovedBy)+1 < vr.Approvals {
				if note != "" {
					return nil, fmt.Errorf("%w: review %s needs %d approvals and this one does not complete them (%s), so it carries no note — the approval that completes them, or a rejection, carries one; nothing was written", ErrBadInput, id, vr.Approvals, QuorumText(vr))
				}
				// No line: the reviewer's signed approval is the record,
				// and every reader counts it from the chains.
				out.Status, out.DecidedAt, out.DecidedBy, out.Note = Approved, formatTime(at), by, ""
				if err := runHook(hook, Tx{Store: g, At: at, Kind: KindApproval, Review: out}); err != nil {
					return nil, err
				}
				out.Status, out.DecidedAt, out.DecidedBy, out.DecidedWith = Pending, "", "", ""
				out.ApprovedBy = append(slices.Clone(vr.ApprovedBy), by)
				return nil, nil
			}
			out.ApprovedBy = append(slices.Clone(vr.ApprovedBy), by)
		}
		out.Status, out.DecidedAt, out.DecidedBy, out.Note = status, formatTime(at), by, note
		if err := runHook(hook, Tx{Store: g, At: at, Kind: "decided", Review: out}); err != nil {
			return nil, err
		}
		return &record{Type: typeDecided, ReviewID: id, At: out.DecidedAt, Status: status, By: by, Note: note}, nil
	})
	if err != nil {
		return Review{}, err
	}
	return out, nil
}

// WithLock runs fn under the review log's lock without appending to the
// log, for other writers under guard/ that must be serialised with it (the
// receipt of an allow or block answer).
func (l *Log) WithLock(ctx context.Context, fn Hook) error {
	return l.transact(ctx, func(g Writer, st *state, at time.Time) (*record, error) {
		return nil, runHook(fn, Tx{Store: g, At: at})
	})
}

// StartLedger runs fn under the whole log's lock, and appends, in the same
// commit, a line saying the spend ledger started with the genesis receipt
// fn returns ("": nothing appended): a build older than the ledger then
// refuses the log instead of deciding without the ledger.
func (l *Log) StartLedger(ctx context.Context, fn func(tx Tx) (string, error)) error {
	return l.transact(ctx, func(g Writer, st *state, at time.Time) (*record, error) {
		id, err := fn(Tx{Store: g, At: at})
		if err != nil || id == "" {
			return nil, err
		}
		return &record{Type: typeLedger, At: formatTime(at), Ledger: id}, nil
	})
}

// Get returns one review as the signatures prove it (see Verified).
func (l *Log) Get(ctx context.Context, id string) (Review, error) {
	r, _, err := l.Verified(ctx, id)
	return r, err
}

// List returns the pending reviews, or every review when all is set, in
// the order they were opened, each as the signatures prove it.
func (l *Log) List(ctx context.Context, all bool) ([]Review, error) {
	out := []Review{}
	err := l.view(ctx, func(g Reader, st *state) error {
		// Every review: the fold reads each receipt once for all.
		v, err := l.newFoldVerifier(ctx, g)
		if err != nil {
			return err
		}
		for _, e := range st.entries {
			if !all && e.status != Pending {
				continue
			}
			r, err := st.review(e)
			if err != nil {
				return err
			}
			vr, _, err := v.resolve(&r)
			if err != nil {
				return err
			}
			if all || vr.Status == Pending {
				out = append(out, vr)
			}
		}
		return nil
	})
	return out, err
}

// view runs fn over the log's fold brought up to date, without the lock:
// every append is a single write of whole lines, and a write caught
// half-way is a tail the fold skips.
func (l *Log) view(ctx context.Context, fn func(r Reader, st *state) error) error {
	return l.store.View(ctx, func(r Reader) error {
		return l.withFold(ctx, r, func(st *state) error { return fn(r, st) })
	})
}

// withFold brings the cached fold up to date with r's log and runs fn over
// it, holding l.mu. The log is opened (its size read, a database's snapshot
// taken) only once l.mu is held: opened before, a reader could see the log
// shorter than a fold another caller brought further meanwhile, and take
// it for a rewritten log.
func (l *Log) withFold(ctx context.Context, r Reader, fn func(st *state) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, err := r.Log(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	st, err := l.refresh(s)
	if err != nil {
		return err
	}
	return fn(st)
}

// refresh brings the cached fold up to date with s (l.mu held): it reads
// only what was appended since, or the whole log when it is another one or
// was rewritten.
func (l *Log) refresh(s Stream) (*state, error) {
	size := s.Size()
	if size == 0 && s.Identity() == "" {
		// No log yet (or no longer): nothing to fold, and nothing to
		// remember — the log that appears later is no rewrite of this.
		st := newState()
		st.src = s
		return st, nil
	}
	c := l.cache
	if c != nil && (c.identity != s.Identity() || size < c.st.offset || !anchorHolds(s, c)) {
		fresh := newState()
		fresh.addFinding(Finding{What: "the review log was replaced or rewritten since it was last read (its identity or its earlier bytes changed); it was read again from the start"})
		c = &cachedState{st: fresh}
	}
	if c == nil {
		c = &cachedState{st: newState()}
	}
	c.identity = s.Identity()
	c.st.src = s
	if err := c.st.feed(io.NewSectionReader(s, c.st.offset, size-c.st.offset), l.Path()); err != nil {
		l.cache = nil
		return nil, err
	}
	c.anchor = readAnchor(s, c.st.offset)
	l.cache = c
	return c.st, nil
}

func readAnchor(s io.ReaderAt, off int64) []byte {
	start := max(off-anchorBytes, 0)
	buf := make([]byte, off-start)
	n, _ := s.ReadAt(buf, start)
	return buf[:n]
}

func anchorHolds(s io.ReaderAt, c *cachedState) bool {
	return bytes.Equal(readAnchor(s, c.st.offset), c.anchor)
}

// step decides, inside the lock, what to append: nil for nothing.
type step func(w Writer, st *state, at time.Time) (*record, error)

// locked runs fn with the store's write lock held (across processes, and
// for a database across hosts) and the log's fold up to date. With
// scopes, a store that can (ScopedStore) locks only those: fn must then
// depend on nothing outside them, or return errWiden to be run again
// under the whole lock.
//
// pre, when not nil, says what the section reads beside its locks
// (Prefetch); it is asked once the process's turn at the scopes is taken,
// so that it names what the process read up to then.
func (l *Log) locked(ctx context.Context, scopes []Scope, pre func() *Prefetch, fn func(w Writer, st *state, at time.Time) error) error {
	deadline := time.Now().Add(l.lockWait)
	release, err := l.acquire(ctx, deadline)
	if err != nil {
		return err
	}
	defer release()
	section := func(w Writer) error {
		if ix, ok := w.(ReviewIndex); ok {
			if q, ok := ReviewQueryOf(ctx); ok {
				if _, scoped := w.(ScopedWriter); scoped {
					return l.withIndex(ctx, w, ix, q, fn)
				}
			}
		}
		return l.withFold(ctx, w, func(st *state) error { return fn(w, st, l.now()) })
	}
	if ss, ok := l.store.(ScopedStore); ok && len(scopes) > 0 {
		err := l.lockedScopes(ctx, ss, deadline, scopes, pre, section)
		if !errors.Is(err, errWiden) {
			return err
		}
	}
	return l.store.Locked(ctx, max(time.Until(deadline), time.Millisecond), section)
}

// lockedScopes runs section holding scopes in the store, after this
// process's turn at each of them (scopeGate), which it keeps until the
// store's section ends.
func (l *Log) lockedScopes(ctx context.Context, ss ScopedStore, deadline time.Time, scopes []Scope, pre func() *Prefetch, section func(w Writer) error) error {
	if l.gate != nil {
		leave, err := l.gate.enter(ctx, LockOrder(scopes), deadline, l.Path(), l.lockWait)
		if err != nil {
			return err
		}
		defer leave()
	}
	var p *Prefetch
	if pre != nil {
		p = pre()
	}
	return ss.LockedScopes(ctx, max(time.Until(deadline), time.Millisecond), scopes, p, section)
}

// transact is the locked section: lock, bring the fold up to date, let fn
// decide (and run its hook), then append fn's record — preceded, when the
// log ends in a torn tail, by a newline and a repair record.
func (l *Log) transact(ctx context.Context, fn step) error {
	return l.transactAll(ctx, nil, nil, func(w Writer, st *state, at time.Time) ([]record, error) {
		rec, err := fn(w, st, at)
		if err != nil || rec == nil {
			return nil, err
		}
		return []record{*rec}, nil
	})
}

// transactAll is transact for a step that appends several records, in one
// write, locking only scopes where the store can (nil: everything).
func (l *Log) transactAll(ctx context.Context, scopes []Scope, pre func() *Prefetch, fn func(w Writer, st *state, at time.Time) ([]record, error)) error {
	return l.locked(ctx, scopes, pre, func(w Writer, st *state, at time.Time) error {
		recs, err := fn(w, st, at)
		if err != nil || len(recs) == 0 {
			return err
		}
		buf, err := st.appendix(recs, at)
		if err != nil {
			return err
		}
		if lb, ok := w.(LogBesideAppender); ok && besideReceipts(st, recs) {
			return lb.AppendLogBeside(ctx, buf)
		}
		return w.AppendLog(ctx, buf)
	})
}

// besideReceipts says whether recs may be synced at the same time as the
// receipts of their section (LogBesideAppender): authorized lines alone,
// after a log that ends clean. A used, opened or decided line, or a
// repair, still reaches the disk only after the receipts it follows.
func besideReceipts(st *state, recs []record) bool {
	if !st.endsClean || len(st.tailLines()) > 0 {
		return false
	}
	for _, r := range recs {
		if r.Type != typeAuthorized {
			return false
		}
	}
	return true
}

// appendix is what an append writes after the current log: the records,
// preceded, when the log ends in a torn tail, by a newline (if needed) and a
// repair record naming the tail's lines.
func (st *state) appendix(recs []record, at time.Time) ([]byte, error) {
	var lines []byte
	for _, rec := range recs {
		line, err := encodeRecord(rec)
		if err != nil {
			return nil, err
		}
		if len(line) > maxLineBytes {
			return nil, fmt.Errorf("%w: the record is %d bytes; a line may have at most %d", ErrBadInput, len(line), maxLineBytes)
		}
		lines = append(lines, line...)
	}
	line := lines
	var buf []byte
	if !st.endsClean {
		buf = append(buf, '\n') // never glue onto whatever the last line holds
	}
	if tail := st.tailLines(); len(tail) > 0 {
		repair, err := encodeRecord(record{Type: typeRepair, At: formatTime(at), Lines: tail})
		if err != nil {
			return nil, err
		}
		buf = append(buf, repair...)
	}
	return append(buf, line...), nil
}

// acquire takes this process's turn, bounded by the lock wait and ctx.
func (l *Log) acquire(ctx context.Context, deadline time.Time) (func(), error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case l.sem <- struct{}{}:
		return func() { <-l.sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, fmt.Errorf("%s: %w within %s (another caller in this process holds it)", l.Path(), ErrLockTimeout, l.lockWait)
	}
}

func runHook(h Hook, tx Tx) error {
	if h == nil {
		return nil
	}
	return h(tx)
}

// newID makes a random RFC 9562 version 4 UUID.
func newID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make a review id: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	const hexd = "0123456789abcdef"
	var s strings.Builder
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s.WriteByte('-')
		}
		s.WriteByte(hexd[c>>4])
		s.WriteByte(hexd[c&0xf])
	}
	return s.String(), nil
}

// checkText bounds free text a person types: valid UTF-8, no control
// characters (a note may have line breaks and tabs).
func checkText(name, s string, max int, multiline bool) error {
	if len(s) > max {
		return fmt.Errorf("%w: %s is %d bytes long; at most %d are accepted", ErrBadInput, name, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrBadInput, name)
	}
	for _, r := range s {
		if (r < 0x20 && !(multiline && (r == '\n' || r == '\t'))) || r == 0x7f {
			return fmt.Errorf("%w: %s contains the control character %U", ErrBadInput, name, r)
		}
	}
	return nil
}

// Appendable checks, without writing, that the store can take a
// decision now.
func (l *Log) Appendable(ctx context.Context) error { return l.store.Ready(ctx) }

// ReviewersReadable checks that the trusted reviewers can be read.
func (l *Log) ReviewersReadable() error {
	if l.reviewers == nil {
		return nil
	}
	_, err := l.reviewers()
	return err
}

// MandateTrust is who may sign the mandates this log's guard honours:
// the trusted reviewers' keys and passkeys and, for a tenant's log (Options.Tenant),
// only the reviewers the file grants that tenant. A log that trusts no
// one trusts no mandate.
func (l *Log) MandateTrust() (mandate.Trust, error) {
	var t mandate.Trust
	if l.reviewers != nil {
		rs, err := l.reviewers()
		if err != nil {
			return mandate.Trust{}, fmt.Errorf("read the trusted reviewers: %w", err)
		}
		t.Keys = rs
	}
	if l.passkeys != nil {
		pks, err := l.passkeys()
		if err != nil {
			return mandate.Trust{}, fmt.Errorf("read the trusted reviewers' passkeys: %w", err)
		}
		t.Passkeys = pks
	}
	if l.tenant != "" {
		var g Grants
		if l.grants != nil {
			var err error
			if g, err = l.grants(); err != nil {
				return mandate.Trust{}, fmt.Errorf("the trusted reviewers file's tenant grants cannot be read: %w", err)
			}
		}
		tenant := l.tenant
		t.Granted = func(reviewer string) bool { return g.Allows(reviewer, tenant) }
	}
	return t, nil
}
