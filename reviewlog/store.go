package reviewlog

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Store is where the guard keeps its state: the review log, the segments
// of the decision chains and the keyring (the public keys that signed
// them). The review log and each segment are append-only streams of whole
// lines, kept byte for byte, so that a chain exported from any store is the
// receipts exactly as they were signed.
//
// A Store gives the guard two things the logic above it relies on: a write
// lock that holds across every process (and, for a database, every host)
// sharing the store, and a commit of everything one locked section wrote —
// together where the store can (PostgreSQL: one transaction), in order
// where it cannot (files: the receipt is synced before the log line).
//
// Two implementations exist, each in its own package: reviewlog/filestore
// (guard/ under a Trace root, the default) and reviewlog/pgstore
// (PostgreSQL). Both keep the log's lines as this package writes them and
// read no more of a line than ParseLineHead gives. The contract tests in
// reviewlog/storetest run against both.
type Store interface {
	// Describe names the store in messages (never with a password).
	Describe() string
	// View runs fn over what the store holds now, without the lock.
	View(ctx context.Context, fn func(r Reader) error) error
	// Locked runs fn holding the store's write lock, waiting at most
	// wait for it (ErrLockTimeout). When fn returns nil, what it wrote is
	// committed; otherwise nothing it wrote is.
	Locked(ctx context.Context, wait time.Duration, fn func(w Writer) error) error
	// Ready says why the store cannot take a decision now (nil: it can).
	Ready(ctx context.Context) error
	// Close releases what the store holds (connections, descriptors).
	Close() error
}

// Reader reads a store.
type Reader interface {
	// Log opens the review log; a store with no log yet gives an empty
	// stream.
	Log(ctx context.Context) (Stream, error)
	// Segments lists the chain segment streams, by file name
	// (SegmentFile), in no particular order.
	Segments(ctx context.Context) ([]StreamInfo, error)
	// Segment opens one segment by file name; fs.ErrNotExist when absent.
	Segment(ctx context.Context, file string) (Stream, error)
	// Keyring is every public key that signed a chain here.
	Keyring(ctx context.Context) (noa.Keyring, error)
	// Archives lists the review log's archives, oldest first, and
	// Archive opens one (stores without archives list none).
	Archives(ctx context.Context) ([]string, error)
	Archive(ctx context.Context, name string) (Stream, error)
	// Locate says where a stream lives, for messages and listings: a
	// path under the Trace root, or the database's URL and the name.
	Locate(name string) string
	// Policy is the policy in effect, as the last server to start (or
	// reload) recorded it; ok is false when none has.
	Policy(ctx context.Context) (rec PolicyRecord, ok bool, err error)
	// Ledger reads the spend ledger's lanes (package ledger).
	Ledger() ledger.Reader
	// SegmentLinesSince reads the whole lines of the named chain segments
	// from the given byte offsets on, as of the moment the reader reads
	// the streams' sizes (Segments).
	SegmentLinesSince(ctx context.Context, from map[string]int64) ([]SegmentLine, error)
	// Mandates reads the mandate records (package mandate), every whole
	// line in order (a torn tail left out).
	Mandates(ctx context.Context) ([][]byte, error)
}

// KeyringCache is a Reader that can answer for one key from the keyring
// as its process read it before: the keyring only grows (its table and
// file take no change), and a kid names one key (noa.KeyID).
// KeyringWith is that keyring while it holds kid, else the store's
// keyring read now (as Keyring), so that a key another process added is
// seen before a receipt it sealed is judged. Keyring itself always reads
// the store's.
type KeyringCache interface {
	KeyringWith(ctx context.Context, kid string) (noa.Keyring, error)
}

// Writer is a Reader inside the write lock, that can also append.
type Writer interface {
	Reader
	// AppendLog appends whole lines to the review log. A store shared by
	// replicas also queues, in the same commit, each review the lines open
	// for notification (the PostgreSQL store's outbox), so that one
	// replica notifies it.
	AppendLog(ctx context.Context, data []byte) error
	// AppendSegment writes data at byte end of a segment (creating it),
	// cutting off whatever lies past end first: a torn tail left by a
	// writer that died, never a receipt.
	AppendSegment(ctx context.Context, file string, end int64, data []byte) error
	// AddKey records a signing key's public key (SPKI, base64url).
	AddKey(ctx context.Context, kid, spki string) error
	// ReplaceLog moves archived lines into a new archive named name and
	// leaves kept as the whole review log.
	ReplaceLog(ctx context.Context, name string, archived, kept []byte) error
	// SetPolicy records the policy in effect, replacing the last record.
	SetPolicy(ctx context.Context, rec PolicyRecord) error
	// LedgerAppender appends to the spend ledger, on the lane this section
	// holds, in the section's commit: on the file store it is written and
	// synced at once (before the receipt it stands for) and cut off again
	// if the section fails.
	LedgerAppender() ledger.Appender
	// AppendMandate appends one mandate record after the n records the
	// section read (ErrMandateTaken when another writer appended first).
	AppendMandate(ctx context.Context, n int, line []byte) error
}

// LogBesideAppender is a Writer whose store syncs some log lines at the
// same time as the section's receipts rather than after them (the file
// store; the PostgreSQL store commits a section in one transaction).
// transactAll uses it only for authorized lines alone: no decision reads
// them, their signed receipts (written first, synced in the same wait) and
// their ledger entry (on disk before either) are what counts, so a crash
// that leaves such a line without its receipts leaves nothing trusted
// (audit reports it as INCOMPLETE).
type LogBesideAppender interface {
	AppendLogBeside(ctx context.Context, data []byte) error
}

// ErrMandateTaken is an append of a mandate record after fewer records
// than the store holds: another writer appended one first.
var ErrMandateTaken = errors.New("another mandate record was appended first; read them again")

// Stream is one append-only stream of lines, read at byte offsets.
type Stream interface {
	io.ReaderAt
	// Size is how many bytes it holds.
	Size() int64
	// Identity changes when the stream is replaced rather than appended
	// to (a file's device and inode; a database's generation), so a
	// reader that cached an earlier read starts over.
	Identity() string
	Close() error
}

// StreamInfo describes a stream without opening it: a reader that read a
// stream up to Size before, with the same Identity and Version, has
// nothing new to read.
type StreamInfo struct {
	Name     string
	Identity string
	Size     int64
	Version  string
}

// ReviewRowsWriter is a Writer whose store keeps each review's state in
// rows beside its lines, and lets at most one review of one question and
// terms (TermsKey) be open (the PostgreSQL store). A section that opens a
// review of a question first names the reviews of that question it read
// and found no answer (expired, decided, tampered with): those are no
// longer the question's open review — expired when opened at or before
// expiredAt (zero: none expire), superseded otherwise — and the store
// marks them so with what the section appends. A review the section did
// not read (another replica's, opened meanwhile) stays open, and the store
// refuses the second (ErrReviewOpen). The rows are an index; the lines
// and the signatures stay what a reader believes.
type ReviewRowsWriter interface {
	Writer
	CloseOpen(questionKey string, seen []string, expiredAt time.Time)
}

type bulkKey struct{}

// Bulk marks ctx for a bulk copy (store import and export): a store may let
// one locked section run as long as the copy takes, where a decision's is
// bounded as a whole. Each statement of a database stays bounded.
func Bulk(ctx context.Context) context.Context { return context.WithValue(ctx, bulkKey{}, true) }

// IsBulk says whether ctx was marked by Bulk.
func IsBulk(ctx context.Context) bool { b, _ := ctx.Value(bulkKey{}).(bool); return b }
