// Package filestore keeps the guard's state in files under guard/ of a
// Trace root: the embedded default for one host. It implements
// reviewlog.Store; the PostgreSQL store beside it (reviewlog/pgstore)
// implements the same contract, and reviewlog/storetest runs the same
// cases against both.
package filestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// maxKeyring bounds guard/keyring.json.
const maxKeyring = 1 << 20

// Store keeps the guard's state under guard/ of a Trace root, the
// layout every earlier version wrote: decisions.ndjson, receipts/*.ndjson,
// keyring.json, decisions.archive-*.ndjson. Its write lock is an exclusive
// flock(2) on guard/decisions.lock, which holds across the processes of one
// host sharing the root (not across hosts: that is the PostgreSQL store's
// job). A locked section's writes are not one transaction: the receipt is
// synced before the log line, so a crash between the two leaves a receipt
// of a review the log never opened (audit reports it), never the reverse —
// except an authorization's authorized line, which no decision reads and
// which is synced beside its receipts (AppendLogBeside).
type Store struct {
	root *confined.Dir
	// synced, when set (by this package's tests), hears the name of every
	// file a section has synced, in the order the syncs completed.
	synced func(name string)
	// syncFault, when set (by this package's tests), is the error a
	// section's sync of name fails with instead of syncing (nil: synced).
	syncFault func(name string) error
	// later are the files waiting for their background sync (syncSoon).
	later laterSyncs
}

// New is the store under root's guard/ (created on the first write).
func New(root *confined.Dir) *Store { return &Store{root: root} }

// Describe is the guard/ directory's path.
func (s *Store) Describe() string { return s.root.Path() + "/" + reviewlog.DirName }

// Close syncs what waits for its background sync now; it releases
// nothing else (the root belongs to the caller).
func (s *Store) Close() error {
	s.later.mu.Lock()
	if s.later.timer != nil {
		s.later.timer.Stop()
	}
	s.later.mu.Unlock()
	s.syncLaterNow()
	return nil
}

// View runs fn over guard/ as it is (an empty store when it is absent).
func (s *Store) View(ctx context.Context, fn func(r reviewlog.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	g, err := s.root.OpenDir(reviewlog.DirName)
	if errors.Is(err, fs.ErrNotExist) {
		return fn(&fileReader{s: s})
	}
	if err != nil {
		return fmt.Errorf("open the guard directory %s: %w", s.Describe(), err)
	}
	defer g.Close()
	r := &fileReader{s: s, g: g}
	defer r.closeReceipts()
	return fn(r)
}

// Locked takes the flock on guard/decisions.lock and runs fn with the log
// open for appending.
func (s *Store) Locked(ctx context.Context, wait time.Duration, fn func(w reviewlog.Writer) error) error {
	deadline := time.Now().Add(wait)
	g, err := s.root.MkdirAll(reviewlog.DirName, 0o700)
	if err != nil {
		return fmt.Errorf("open the review log directory %s (it must be a real directory, not a symbolic link): %w", s.Describe(), err)
	}
	defer g.Close()
	lock, err := g.OpenFile(reviewlog.LockName, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open the review log lock: %w", err)
	}
	defer lock.Close() // closing the descriptor releases the flock
	if err := flockWait(ctx, int(lock.Fd()), deadline, wait); err != nil {
		return fmt.Errorf("%s/%s: %w", s.Describe(), reviewlog.FileName, err)
	}
	f, err := g.OpenFile(reviewlog.FileName, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open the review log: %w", err)
	}
	defer f.Close()
	w := &fileWriter{fileReader: fileReader{s: s, g: g, log: f}, ledgerEnd: -1}
	defer w.closeReceipts()
	defer w.closeFiles()
	err = fn(w)
	if serr := w.syncPending(); serr != nil && err == nil {
		err = serr
	}
	w.syncLater()
	if err != nil {
		// Nothing of a failed section counts: its ledger entries go too
		// (a crash instead leaves them, counted, never a receipt without
		// its entry).
		w.undoLedger()
	}
	return err
}

// Ready checks, without writing, that the log can be appended to: guard/
// exists or can be made, and the log opens for appending.
func (s *Store) Ready(ctx context.Context) error {
	g, err := s.root.MkdirAll(reviewlog.DirName, 0o700)
	if err != nil {
		return fmt.Errorf("the review log directory: %w", err)
	}
	defer g.Close()
	// New files (chain segments, the keyring, checkpoints) are created in
	// guard/ as decisions come: an appendable log alone is not enough.
	if err := g.Writable(); err != nil {
		return fmt.Errorf("the review log directory: %w", err)
	}
	f, err := g.OpenFile(reviewlog.FileName, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("the review log: %w", err)
	}
	return f.Close()
}

type fileReader struct {
	s   *Store
	g   *confined.Dir // nil: no guard/ yet
	log *os.File      // the log opened by Locked, or nil
	// rdir is guard/receipts/, opened once a section (nil: not yet).
	rdir *confined.Dir
}

func (r *fileReader) Locate(name string) string {
	if r.g != nil {
		return r.g.Path() + "/" + name
	}
	return r.s.Describe() + "/" + name
}

func (r *fileReader) Log(ctx context.Context) (reviewlog.Stream, error) {
	if r.log != nil {
		return newFileStream(r.log, false)
	}
	if r.g == nil {
		return emptyStream{}, nil
	}
	f, err := r.g.Open(reviewlog.FileName)
	if errors.Is(err, fs.ErrNotExist) {
		return emptyStream{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the review log: %w", err)
	}
	return newFileStream(f, true)
}

func (r *fileReader) Segments(ctx context.Context) ([]reviewlog.StreamInfo, error) {
	if r.g == nil {
		return nil, nil
	}
	dir, err := r.receipts(false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("receipts directory: %w", err)
	}
	entries, err := dir.ReadDir()
	if err != nil {
		return nil, err
	}
	var out []reviewlog.StreamInfo
	for _, e := range entries {
		if _, _, ok := reviewlog.ParseSegmentFile(e.Name); ok && e.Regular() {
			out = append(out, reviewlog.StreamInfo{Name: e.Name, Identity: fileIdentity(e.Dev, e.Ino), Size: e.Size, Version: strconv.FormatInt(e.ModTime.UnixNano(), 10)})
		}
	}
	return out, nil
}

// receipts is guard/receipts/, opened on the section's first use and kept
// until its end (closeReceipts): a decision opens its chain's segments
// several times. create makes it when it does not exist yet.
func (r *fileReader) receipts(create bool) (*confined.Dir, error) {
	if r.rdir != nil {
		return r.rdir, nil
	}
	var (
		dir *confined.Dir
		err error
	)
	if create {
		dir, err = r.g.MkdirAll(reviewlog.ReceiptsDir, 0o700)
	} else {
		dir, err = r.g.OpenDir(reviewlog.ReceiptsDir)
	}
	if err != nil {
		return nil, err
	}
	r.rdir = dir
	return dir, nil
}

func (r *fileReader) closeReceipts() {
	if r.rdir != nil {
		r.rdir.Close()
		r.rdir = nil
	}
}

func (r *fileReader) Segment(ctx context.Context, file string) (reviewlog.Stream, error) {
	if r.g == nil {
		return nil, fmt.Errorf("chain file %s: %w", file, fs.ErrNotExist)
	}
	dir, err := r.receipts(false)
	if err != nil {
		return nil, err
	}
	f, err := dir.Open(file)
	if err != nil {
		return nil, err
	}
	return newFileStream(f, true)
}

func (r *fileReader) Keyring(ctx context.Context) (noa.Keyring, error) {
	if r.g == nil {
		return noa.Keyring{}, nil
	}
	return ReadKeyring(r.g)
}

func (r *fileReader) Archives(ctx context.Context) ([]string, error) {
	if r.g == nil {
		return nil, nil
	}
	return archives(r.g)
}

func (r *fileReader) Archive(ctx context.Context, name string) (reviewlog.Stream, error) {
	if r.g == nil {
		return nil, fmt.Errorf("archive %s: %w", name, fs.ErrNotExist)
	}
	f, err := r.g.Open(name)
	if err != nil {
		return nil, err
	}
	return newFileStream(f, true)
}

type fileWriter struct {
	fileReader
	// segs is the chains' listing read in this section (listed: read),
	// which nothing but the section's own AppendSegment changes: a
	// decision lists them for its catch-up, its receipt index and its
	// numbering, and the directory is read once.
	segs   []reviewlog.StreamInfo
	listed bool
	// ledgerEnd is where the ledger ended before this section appended
	// to it (-1: it did not), or, once a receipt followed its entries,
	// where they end: a failed section cuts the ledger back to it.
	ledgerEnd int64
	// ledgerTop is where the section's last entries end.
	ledgerTop int64
	// pending are the files this section appended to whose sync waits
	// for the section's end, or for the next write that must reach the
	// disk after them (see deferSync).
	pending []pendingSync
	// after are the files this section appended to that are synced once
	// it has ended, waited for by no one (see syncAfter).
	after []pendingSync
	// files are the ledger's and the chains' files the section opened,
	// by their name under guard/, kept open for reading and appending
	// until it ends (closeFiles): a decision reads the ledger, then
	// appends to it, and reads its chain twice before appending its
	// receipt, and one descriptor serves them all. Nothing but the
	// section itself writes them while it holds the flock, and no section
	// replaces or removes them.
	files map[string]*os.File
}

// maxSectionFiles bounds the descriptors a section keeps (file): a copy
// writes many chains in one section, and past it each is opened as before,
// closed once read or synced.
const maxSectionFiles = 32

// file is guard/name opened for reading and writing, once a section;
// create makes it when it does not exist. When shared, the descriptor is
// the section's, closed when it ends (its syncs do not close it); else
// (past maxSectionFiles) it is the caller's.
func (w *fileWriter) file(dir *confined.Dir, name string, create bool) (f *os.File, shared bool, err error) {
	if f, ok := w.files[name]; ok {
		return f, true, nil
	}
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE
	}
	base := name
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		base = name[i+1:]
	}
	f, err = dir.OpenFile(base, flag, 0o600)
	if err != nil {
		return nil, false, err
	}
	if len(w.files) >= maxSectionFiles {
		return f, false, nil
	}
	if w.files == nil {
		w.files = map[string]*os.File{}
	}
	w.files[name] = f
	return f, true, nil
}

// closeFiles closes what file opened, once the section's syncs are done.
func (w *fileWriter) closeFiles() {
	for name, f := range w.files {
		f.Close()
		delete(w.files, name)
	}
}

// syncAfter keeps f to be synced once the section has ended, in the
// background: what it holds commits nothing and nothing written later
// depends on it being on disk (a decision's kept question). f is owned by
// the writer from now on.
func (w *fileWriter) syncAfter(name string, f *os.File) {
	for _, p := range w.after {
		if p.name == name {
			f.Close()
			return
		}
	}
	w.after = append(w.after, pendingSync{name: name, f: f})
}

// syncLater hands what syncAfter kept to the store's background sync
// (syncSoon), once the section has ended.
func (w *fileWriter) syncLater() {
	for _, p := range w.after {
		w.s.syncSoon(p.name, p.f)
	}
	w.after = nil
}

// syncLaterEvery is how long a file syncAfter kept waits for its sync, at
// most (and the sync takes): the syncs of the sections of that time are
// one. What such a file holds commits nothing, so no answer waits for it,
// and a crash of the process loses none of it (the kernel has it); only a
// crash of the host may lose its last lines, as it could lose those whose
// sync had not completed.
const syncLaterEvery = 50 * time.Millisecond

// laterSyncs are the files of ended sections waiting for their background
// sync: the newest descriptor of each (a sync covers the file whole).
type laterSyncs struct {
	mu    sync.Mutex
	files map[string]*os.File
	timer *time.Timer
}

// syncSoon keeps f, the file name a section appended to, to be synced
// within syncLaterEvery, in the background. f is owned by the store from
// now on.
func (s *Store) syncSoon(name string, f *os.File) {
	s.later.mu.Lock()
	defer s.later.mu.Unlock()
	if old, ok := s.later.files[name]; ok {
		// The same file, appended to again: one sync covers both.
		old.Close()
	}
	if s.later.files == nil {
		s.later.files = map[string]*os.File{}
	}
	s.later.files[name] = f
	if s.later.timer == nil {
		s.later.timer = time.AfterFunc(syncLaterEvery, s.syncLaterNow)
	}
}

// syncLaterNow syncs and closes what syncSoon kept. A sync that fails is
// not retried: what it loses is what a crash would (for a question, a
// decision a replay counts as not kept).
func (s *Store) syncLaterNow() {
	s.later.mu.Lock()
	files := s.later.files
	s.later.files, s.later.timer = nil, nil
	s.later.mu.Unlock()
	for name, f := range files {
		if f.Sync() == nil && s.synced != nil {
			s.synced(name)
		}
		f.Close()
	}
}

// pendingSync is a file appended to in a section, not yet synced, and
// where the section found its end.
type pendingSync struct {
	name  string
	f     *os.File
	start int64
	// done, when set, hears the result of the sync already under way
	// (startSync); nil: not started yet (deferSync).
	done chan error
	// barrier: the next receipt is written only once this sync is done
	// (a ledger entry's).
	barrier bool
	// shared: f is the section's (fileWriter.file), closed when it ends,
	// not once synced.
	shared bool
}

// release closes p's file once its sync is done, unless the section
// closes it.
func (p pendingSync) release() {
	if !p.shared {
		p.f.Close()
	}
}

// sync syncs f, the section's file name.
func (w *fileWriter) sync(name string, f *os.File) error {
	if w.s.syncFault != nil {
		if err := w.s.syncFault(name); err != nil {
			return err
		}
	}
	return f.Sync()
}

// run starts p's sync in the background.
func (w *fileWriter) run(p *pendingSync) {
	done := make(chan error, 1)
	go func(name string, f *os.File) { done <- w.sync(name, f) }(p.name, p.f)
	p.done = done
}

// deferSync keeps f, appended to from start on, to be synced with the
// others at the section's end: the receipts a copy wrote, and a chain's
// further receipts in one section, reach the disk in one wait. f is owned
// by the writer from now on. What must be on disk before something else —
// the ledger entry before the receipt it stands for, a receipt before the
// release bound to it, the terms receipt before the review log's line — is
// kept so by syncPending at the start of every write that must follow
// (a ledger entry, a log line, a mandate, the keyring, the policy), and by
// waitBarriers before a receipt.
func (w *fileWriter) deferSync(name string, f *os.File, start int64, shared bool) {
	for _, p := range w.pending {
		if p.name == name && p.done == nil {
			// Already waiting (from an earlier start): one sync covers both.
			if !shared {
				f.Close()
			}
			return
		}
	}
	w.pending = append(w.pending, pendingSync{name: name, f: f, start: start, shared: shared})
}

// startSync starts syncing f, appended to from start on, at once, in the
// background, and the section goes on meanwhile: with work that writes
// nothing after a ledger entry (its receipt is signed during the entry's
// sync), with what commits nothing after a receipt (its question). What
// must reach the disk after f waits for its sync first — every write that
// syncPending starts, and, when barrier is set (a ledger entry), the next
// receipt (waitBarriers) — so the order on disk is the one a sync waited
// for here would give. f is owned by the writer from now on.
func (w *fileWriter) startSync(name string, f *os.File, start int64, barrier, shared bool) {
	p := pendingSync{name: name, f: f, start: start, barrier: barrier, shared: shared}
	w.run(&p)
	w.pending = append(w.pending, p)
}

// syncing reports whether a sync of name is kept or under way.
func (w *fileWriter) syncing(name string) bool {
	for _, p := range w.pending {
		if p.name == name {
			return true
		}
	}
	return false
}

// waitBarriers waits for the ledger entries' syncs under way, and leaves
// the others for later. When one fails, what the section appended to that
// file is cut off again (best effort) and the section fails, before the
// receipt that must follow it is written.
func (w *fileWriter) waitBarriers() error {
	var (
		failed error
		kept   []pendingSync
	)
	for _, p := range w.pending {
		if !p.barrier {
			kept = append(kept, p)
			continue
		}
		if err := <-p.done; err != nil {
			if failed == nil {
				failed = fmt.Errorf("sync %s: %w", w.Locate(p.name), err)
			}
			if p.f.Truncate(p.start) == nil {
				_ = p.f.Sync()
			}
		} else {
			w.heard(p.name)
		}
		p.release()
	}
	w.pending = kept
	return failed
}

// heard tells the test hook that name was synced.
func (w *fileWriter) heard(name string) {
	if w.s.synced != nil {
		w.s.synced(name)
	}
}

// syncPending syncs every file deferSync kept, at once, and closes them.
// When one fails, what the section appended to each is cut off again
// (best effort) and the section fails: an answer not durable is not
// given.
func (w *fileWriter) syncPending() error {
	if len(w.pending) == 0 {
		return nil
	}
	pend := w.pending
	w.pending = nil
	errs := make([]error, len(pend))
	if len(pend) > 1 {
		// All at once: one wait for every file.
		for i := range pend {
			if pend[i].done == nil {
				w.run(&pend[i])
			}
		}
	}
	for i, p := range pend {
		if p.done != nil {
			errs[i] = <-p.done
		} else {
			errs[i] = w.sync(p.name, p.f)
		}
	}
	var failed error
	for i, p := range pend {
		if errs[i] != nil && failed == nil {
			failed = fmt.Errorf("sync %s: %w", w.Locate(p.name), errs[i])
		}
		if errs[i] == nil {
			w.heard(p.name)
		}
	}
	// A file appended to twice (a receipt's sync under way, a second one
	// kept) is cut once, to where the section found it.
	cut := map[string]int64{}
	for _, p := range pend {
		if c, ok := cut[p.name]; !ok || p.start < c {
			cut[p.name] = p.start
		}
	}
	for _, p := range pend {
		if c, ok := cut[p.name]; ok && failed != nil {
			delete(cut, p.name)
			if p.f.Truncate(c) == nil {
				_ = p.f.Sync()
			}
		}
		p.release()
	}
	return failed
}

func (w *fileWriter) AppendLog(ctx context.Context, data []byte) error {
	if err := w.syncPending(); err != nil {
		return err
	}
	// One write of whole lines: a reader never sees half of it except as
	// a torn tail, which the fold skips.
	if _, err := w.log.Write(data); err != nil {
		return fmt.Errorf("append to %s: %w", w.Locate(reviewlog.FileName), err)
	}
	if err := w.log.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", w.Locate(reviewlog.FileName), err)
	}
	w.heard(reviewlog.FileName)
	return nil
}

// AppendLogBeside appends lines that no later write of the section needs
// on disk first (an authorization's authorized line, whose receipts were
// written before it) and syncs them at the same time as the section's
// receipts, in one wait, instead of after them: the section still ends
// only once all are on disk. A crash of the host in that wait may leave
// the line without its receipts (the entry the receipts stand for was on
// disk before either was written); audit reports that as INCOMPLETE and
// nothing decides from such a line. When any of the syncs fails, what the
// section appended to each file, the line included, is cut off again and
// the section fails.
func (w *fileWriter) AppendLogBeside(ctx context.Context, data []byte) error {
	// The ledger entries under way reach the disk before the line is
	// written, as before a receipt.
	if err := w.waitBarriers(); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(w.log.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", w.Locate(reviewlog.FileName), err)
	}
	if _, err := w.log.Write(data); err != nil {
		_ = w.log.Truncate(st.Size)
		return fmt.Errorf("append to %s: %w", w.Locate(reviewlog.FileName), err)
	}
	w.pending = append(w.pending, pendingSync{name: reviewlog.FileName, f: w.log, start: st.Size, shared: true})
	return w.syncPending()
}

// Segments lists the chains' segments once a section, until it appends.
func (w *fileWriter) Segments(ctx context.Context) ([]reviewlog.StreamInfo, error) {
	if !w.listed {
		segs, err := w.fileReader.Segments(ctx)
		if err != nil {
			return nil, err
		}
		w.segs, w.listed = segs, true
	}
	return slices.Clone(w.segs), nil
}

func (w *fileWriter) AppendSegment(ctx context.Context, file string, end int64, data []byte) error {
	// A ledger entry whose sync is under way reaches the disk before the
	// receipt it stands for is written.
	if err := w.waitBarriers(); err != nil {
		return err
	}
	w.listed = false
	dir, err := w.receipts(true)
	if err != nil {
		return fmt.Errorf("receipts directory: %w", err)
	}
	name := reviewlog.ReceiptsDir + "/" + file
	f, shared, err := w.file(dir, name, true)
	if err != nil {
		return fmt.Errorf("chain file: %w", err)
	}
	keep := false
	defer func() {
		if !keep && !shared {
			f.Close()
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat the chain file %s: %w", w.Locate(name), err)
	}
	// Only a file that is not end bytes long is cut (a torn tail) or
	// extended to end: a truncate to the size a file has already is a
	// journalled change of its own on ext4, which the receipt's sync
	// then waits for.
	if st.Size != end {
		if err := f.Truncate(end); err != nil {
			return fmt.Errorf("drop torn tail: %w", err)
		}
	}
	if _, err := f.WriteAt(data, end); err != nil {
		_ = f.Truncate(end)
		return fmt.Errorf("append: %w", err)
	}
	if w.ledgerEnd >= 0 {
		// The entries before this receipt stand for it (their syncs are
		// done): should the section fail now, they stay with it, counted,
		// rather than leave a signed receipt without its entry.
		w.ledgerEnd = w.ledgerTop
	}
	if reviewlog.IsBulk(ctx) || w.syncing(name) {
		// A copy's receipts, or a chain's second receipt of the
		// section: one sync at the end covers them.
		keep = true
		w.deferSync(name, f, end, shared)
		return nil
	}
	// The receipt's sync starts now, and the section ends waiting for it
	// (a decision's question is written meanwhile).
	keep = true
	w.startSync(name, f, end, false, shared)
	return nil
}

// Segment reads a chain through the section's descriptor of its file
// (file), which its AppendSegment writes through too.
func (w *fileWriter) Segment(ctx context.Context, file string) (reviewlog.Stream, error) {
	dir, err := w.receipts(false)
	if err != nil {
		return nil, err
	}
	f, shared, err := w.file(dir, reviewlog.ReceiptsDir+"/"+file, false)
	if errors.Is(err, fs.ErrPermission) {
		// A chain this process may read and not write (an operator's
		// choice): read it as a reader does.
		return w.fileReader.Segment(ctx, file)
	}
	if err != nil {
		return nil, err
	}
	return newFileStream(f, !shared)
}

func (w *fileWriter) AddKey(ctx context.Context, kid, spki string) error {
	if err := w.syncPending(); err != nil {
		return err
	}
	kr, err := ReadKeyring(w.g)
	if err != nil {
		return err
	}
	kr[kid] = spki
	data, err := kr.JSON()
	if err != nil {
		return err
	}
	return w.g.WriteFileAtomic(reviewlog.KeyringFile, data, 0o644)
}

// ReplaceLog writes the archive, synced, before the log is replaced, so a
// crash leaves the reviews in both files (audit reads each once), never in
// none.
func (w *fileWriter) ReplaceLog(ctx context.Context, name string, archived, kept []byte) error {
	if err := w.syncPending(); err != nil {
		return err
	}
	if err := w.g.WriteFileAtomic(name, archived, 0o600); err != nil {
		return fmt.Errorf("write the archive %s: %w", name, err)
	}
	if err := w.g.WriteFileAtomic(reviewlog.FileName, kept, 0o600); err != nil {
		return fmt.Errorf("rewrite %s without the archived reviews: %w", w.Locate(reviewlog.FileName), err)
	}
	return nil
}

// fileStream is an open file with the size and identity it had when
// opened.
type fileStream struct {
	f        *os.File
	size     int64
	identity string
	owned    bool
}

func newFileStream(f *os.File, owned bool) (*fileStream, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		if owned {
			f.Close()
		}
		return nil, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return &fileStream{f: f, size: st.Size, identity: fileIdentity(uint64(st.Dev), st.Ino), owned: owned}, nil
}

func (s *fileStream) ReadAt(p []byte, off int64) (int, error) { return s.f.ReadAt(p, off) }
func (s *fileStream) Size() int64                             { return s.size }
func (s *fileStream) Identity() string                        { return s.identity }
func (s *fileStream) Close() error {
	if s.owned {
		return s.f.Close()
	}
	return nil
}

func fileIdentity(dev, ino uint64) string {
	return strconv.FormatUint(dev, 10) + ":" + strconv.FormatUint(ino, 10)
}

// emptyStream is a log or segment that does not exist yet.
type emptyStream struct{}

func (emptyStream) ReadAt(p []byte, off int64) (int, error) { return 0, io.EOF }
func (emptyStream) Size() int64                             { return 0 }
func (emptyStream) Identity() string                        { return "" }
func (emptyStream) Close() error                            { return nil }

// ReadKeyring reads guard/keyring.json under g (empty when absent).
func ReadKeyring(g *confined.Dir) (noa.Keyring, error) {
	data, err := fs.ReadFile(g.FS(maxKeyring), reviewlog.KeyringFile)
	if errors.Is(err, fs.ErrNotExist) {
		return noa.Keyring{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", reviewlog.KeyringFile, err)
	}
	kr, err := noa.ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", reviewlog.KeyringFile, err)
	}
	return kr, nil
}

// archives lists the archive files under g, oldest first.
func archives(g *confined.Dir) ([]string, error) {
	entries, err := g.ReadDir()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Regular() && reviewlog.IsArchiveName(e.Name) {
			out = append(out, e.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// readPolicyRecord reads guard/policy-in-effect.json; ok is false when it
// does not exist.
func readPolicyRecord(g *confined.Dir) (reviewlog.PolicyRecord, bool, error) {
	data, err := fs.ReadFile(g.FS(reviewlog.MaxPolicyRecord+1), reviewlog.PolicyFile)
	if errors.Is(err, fs.ErrNotExist) {
		return reviewlog.PolicyRecord{}, false, nil
	}
	if err != nil {
		return reviewlog.PolicyRecord{}, false, fmt.Errorf("%s: %w", reviewlog.PolicyFile, err)
	}
	rec, err := reviewlog.ParsePolicyRecord(data)
	if err != nil {
		return reviewlog.PolicyRecord{}, false, fmt.Errorf("%s: %w", reviewlog.PolicyFile, err)
	}
	return rec, true, nil
}

func (r *fileReader) Policy(ctx context.Context) (reviewlog.PolicyRecord, bool, error) {
	if r.g == nil {
		return reviewlog.PolicyRecord{}, false, nil
	}
	return readPolicyRecord(r.g)
}

func (w *fileWriter) SetPolicy(ctx context.Context, rec reviewlog.PolicyRecord) error {
	if err := w.syncPending(); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := w.g.WriteFileAtomic(reviewlog.PolicyFile, data, 0o644); err != nil {
		return fmt.Errorf("record the policy in effect in %s: %w", w.Locate(reviewlog.PolicyFile), err)
	}
	return nil
}

// flockWait takes an exclusive flock, polling with a growing pause until
// the deadline (wait is only for the message).
func flockWait(ctx context.Context, fd int, deadline time.Time, wait time.Duration) error {
	pause := time.Millisecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("lock: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w within %s (another process holds it)", reviewlog.ErrLockTimeout, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(pause*2, 50*time.Millisecond)
	}
}
