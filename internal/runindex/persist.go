package runindex

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
)

// The index a process saves for the next one to start from: in
// Options.State, IndexFile, authenticated with the key in KeyFile. A run is
// taken from it only while its file still has at least the size it had and
// the same first bytes and the same bytes before where the read stopped
// (compared by SHA-256); anything else is read from the file. A file whose
// headers do not authenticate, or that this build cannot read, is ignored
// and written anew. A run's body (its summaries) is checked against the
// SHA-256 its authenticated header holds when it is first used; one that
// does not match is not used, and the run is read from its file.
const (
	IndexFile = "run-index.bin"
	KeyFile   = "run-index.key"
	// indexMagic names the format; a new format is a new magic.
	indexMagic = "HAIA-RUNINDEX 5\n"
	// tailBytes is how much of the end of what was read is hashed.
	tailBytes = 4096
	// maxIndexBytes bounds the file read back (about 20 million events).
	maxIndexBytes = 4 << 30
	// saveEvery is how long appends alone wait before they are saved.
	saveEvery = time.Minute
)

// Enc appends the fields of a saved index. Strings are numbered in a table
// per run (see Str), so that a run's strings are read back as parts of one.
type Enc struct {
	B     []byte
	strs  map[string]uint64
	table []string
}

// Uint appends v.
func (e *Enc) Uint(v uint64) { e.B = binary.AppendUvarint(e.B, v) }

// Int appends v.
func (e *Enc) Int(v int64) { e.B = binary.AppendVarint(e.B, v) }

// Bool appends b.
func (e *Enc) Bool(b bool) {
	if b {
		e.B = append(e.B, 1)
	} else {
		e.B = append(e.B, 0)
	}
}

// Str appends s as its number in the run's table.
func (e *Enc) Str(s string) {
	k, ok := e.strs[s]
	if !ok {
		k = uint64(len(e.table))
		e.strs[s] = k
		e.table = append(e.table, s)
	}
	e.Uint(k)
}

// NewEnc is an Enc with a table of its own, for a blob (see Blob).
func NewEnc() *Enc { return &Enc{strs: map[string]uint64{}} }

// Bytes appends b as its length and its bytes.
func (e *Enc) Bytes(b []byte) {
	e.Uint(uint64(len(b)))
	e.B = append(e.B, b...)
}

// Blob is what e holds with its table of strings first, as NewDec reads
// it back.
func (e *Enc) Blob() []byte {
	var out Enc
	writeTable(&out, e)
	return out.B
}

// writeTable appends e's table (the count of its strings, their lengths,
// then their bytes) and e's bytes to dst.
func writeTable(dst *Enc, e *Enc) {
	dst.Uint(uint64(len(e.table)))
	for _, t := range e.table {
		dst.Uint(uint64(len(t)))
	}
	for _, t := range e.table {
		dst.B = append(dst.B, t...)
	}
	dst.B = append(dst.B, e.B...)
}

// NewDec reads a blob Enc.Blob wrote.
func NewDec(blob []byte) *Dec {
	d := &Dec{b: blob, Memo: map[string]any{}}
	d.readTable()
	return d
}

// Done reports an error when bytes are left after what was read.
func (d *Dec) Done() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("bytes after the end")
	}
	return d.err
}

// Bytes reads what Enc.Bytes wrote (a part of what is read, not a copy).
func (d *Dec) Bytes() []byte {
	n := d.Len(len(d.b))
	if d.err != nil {
		return nil
	}
	b := d.b[:n:n]
	d.b = d.b[n:]
	return b
}

// Dec reads what Enc wrote; the first error sticks and zero values follow.
type Dec struct {
	b     []byte
	err   error
	table []string // the run's strings, parts of one string
	// Memo is the decoder's own per run (values equal items may share).
	Memo map[string]any
}

// Err is the first error met.
func (d *Dec) Err() error { return d.err }

// Fail records that what was read makes no sense.
func (d *Dec) Fail(what string) { d.fail(what) }

func (d *Dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("saved run index: %s at %d bytes from the end", what, len(d.b))
	}
}

// Uint reads an unsigned number.
func (d *Dec) Uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad number")
		d.b = nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Int reads a signed number.
func (d *Dec) Int() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad number")
		d.b = nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Len reads a count of at most max things.
func (d *Dec) Len(max int) int {
	v := d.Uint()
	if v > uint64(max) {
		d.fail("count out of range")
		d.b = nil
		return 0
	}
	return int(v)
}

// Bool reads a boolean.
func (d *Dec) Bool() bool { return d.Uint() == 1 }

// Str reads a string: its number in the run's table.
func (d *Dec) Str() string {
	k := d.Uint()
	if k >= uint64(len(d.table)) {
		d.fail("string out of range")
		return ""
	}
	return d.table[k]
}

// readTable reads a run's table of strings: their count, their lengths,
// then their bytes, which become one string.
func (d *Dec) readTable() {
	n := d.Len(len(d.b))
	lens := make([]int, n)
	total := 0
	for i := range lens {
		lens[i] = d.Len(len(d.b))
		total += lens[i]
	}
	if d.err != nil || total > len(d.b) {
		d.fail("bad string table")
		return
	}
	blob := string(d.b[:total])
	d.b = d.b[total:]
	d.table = make([]string, n)
	for i, l := range lens {
		d.table[i], blob = blob[:l], blob[l:]
	}
}

// savedRun is what a saved index says of one run: its header, read and
// authenticated with the index, and its body (the operations, their places
// and the summaries), decoded on first use.
type savedRun[T any] struct {
	id           string
	name         string
	size, offset int64
	nextLine     int
	lastAt       string
	head, tail   [32]byte
	cost         int64
	nLocs        int
	views        map[string]*savedView[T]
	body         *savedBody[T]
}

// savedView is what a run's header says of one of its views: enough to
// tell whether the run has a row on the first page of a listing.
type savedView[T any] struct {
	lines   int
	n       int
	first   *T
	firstBy map[string]*T
	// digest is what Options.Digest wrote of the view (nil: none).
	digest []byte
}

// savedBody is a run's part of the saved index, read, checked against the
// SHA-256 its authenticated header holds, and decoded once, when first
// used (or by the background decoder).
type savedBody[T any] struct {
	src    io.ReaderAt
	off, n int64
	sum    [32]byte
	once   sync.Once
	ops    []string
	locs   []loc
	views  map[string]*view[T]
	err    error
}

// HeadTail hashes (SHA-256) the first bytes of a file (up to 256) and the
// bytes before offset (up to 4,096): what a file that was only appended to
// since offset still holds, as the saved index and the payment package's
// saved sweep of the Trace compare it.
func HeadTail(f io.ReaderAt, offset int64) (head, tail [32]byte, err error) {
	buf := make([]byte, min(offset, tailBytes))
	if _, err = f.ReadAt(buf[:min(offset, anchorBytes)], 0); err != nil {
		return
	}
	head = sha256.Sum256(buf[:min(offset, anchorBytes)])
	if _, err = f.ReadAt(buf, offset-int64(len(buf))); err != nil {
		return
	}
	tail = sha256.Sum256(buf)
	return
}

// key returns the key the index is authenticated with, made the first time.
func (ix *Index[T, F]) key() ([]byte, error) {
	f, err := ix.opt.State.Open(KeyFile)
	if err == nil {
		defer f.Close()
		k, err := io.ReadAll(io.LimitReader(f, 64))
		if err != nil || len(k) != 32 {
			return nil, fmt.Errorf("%s: not a 32-byte key (%v)", KeyFile, err)
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	if err := ix.opt.State.WriteFileAtomic(KeyFile, k, 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

// load reads the saved index's headers once, keeping what authenticates;
// each run is checked against its file when first listed (see adopt), and
// its body against its header when first used (see settle).
func (ix *Index[T, F]) load() {
	ix.loaded = true
	if ix.opt.State == nil || ix.opt.EncodeItem == nil || ix.opt.DecodeItem == nil {
		return
	}
	if ix.version() == "" {
		ix.opt.Logger.Warn("the run index is not saved: this build cannot name itself (no commit, executable unreadable)")
		ix.opt.State = nil
		return
	}
	f, err := ix.opt.State.Open(IndexFile)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		ix.opt.Logger.Warn("the saved run index cannot be opened; reading the runs", "err", err)
		return
	}
	saved, err := ix.readHeaders(f)
	if err != nil {
		f.Close()
		ix.opt.Logger.Warn("the saved run index is not used; reading the runs and saving it anew", "err", err)
		ix.dirty = true
		return
	}
	// The file stays open while bodies are left to decode: a save replaces
	// it by a rename, which leaves this one as it was read.
	ix.savedFile = f
	ix.saved = saved
	ix.opt.Logger.Info("the saved run index is read", "runs", len(saved))
}

// readHeaders authenticates a saved index's headers and decodes them; the
// runs' bodies are left in the file.
func (ix *Index[T, F]) readHeaders(f *os.File) (map[string]*savedRun[T], error) {
	k, err := ix.key()
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	lead := make([]byte, len(indexMagic)+8)
	if size > maxIndexBytes {
		return nil, errors.New("larger than the limit")
	}
	if size < int64(len(lead))+sha256.Size {
		return nil, errors.New("not a run index of this version")
	}
	if _, err := f.ReadAt(lead, 0); err != nil {
		return nil, err
	}
	if string(lead[:len(indexMagic)]) != indexMagic {
		return nil, errors.New("not a run index of this version")
	}
	hdrLen := binary.LittleEndian.Uint64(lead[len(indexMagic):])
	if hdrLen > uint64(size-int64(len(lead))-sha256.Size) {
		return nil, errors.New("its headers end past the end of the file (truncated or damaged)")
	}
	data := make([]byte, int64(len(lead))+int64(hdrLen)+sha256.Size)
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, err
	}
	signed, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	mac := hmac.New(sha256.New, k)
	mac.Write(signed)
	if !hmac.Equal(mac.Sum(nil), sum) {
		return nil, errors.New("its authentication code does not match its content (changed or damaged)")
	}
	d := &Dec{b: signed[len(lead):]}
	d.readTable()
	if v := d.Str(); v != ix.version() {
		return nil, fmt.Errorf("saved by another build (%.40s), whose summaries may differ", v)
	}
	blocks := make([][]byte, d.Len(len(d.b)))
	for i := range blocks {
		n := d.Len(len(d.b))
		if d.err != nil {
			return nil, d.err
		}
		blocks[i], d.b = d.b[:n], d.b[n:]
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("bytes after the last header")
	}
	if d.err != nil {
		return nil, d.err
	}
	out := make(map[string]*savedRun[T], len(blocks))
	off := int64(len(data))
	for _, b := range blocks {
		s, err := ix.decodeHeader(b)
		if err != nil {
			return nil, err
		}
		s.body.src, s.body.off = f, off
		off += s.body.n
		out[s.id] = s
	}
	if off != size {
		return nil, fmt.Errorf("its runs' parts end at byte %d of %d (truncated or damaged)", off, size)
	}
	return out, nil
}

// decodeHeader decodes one run's header.
func (ix *Index[T, F]) decodeHeader(block []byte) (*savedRun[T], error) {
	d := &Dec{b: block, Memo: map[string]any{}}
	d.readTable()
	s := &savedRun[T]{id: d.Str(), name: d.Str(), size: d.Int(), offset: d.Int(), nextLine: int(d.Int()), lastAt: d.Str()}
	copy(s.head[:], d.Str())
	copy(s.tail[:], d.Str())
	s.cost, s.nLocs = d.Int(), d.Len(1<<40)
	s.body = &savedBody[T]{n: d.Int()}
	copy(s.body.sum[:], d.Str())
	if s.body.n < 0 {
		d.fail("a negative length")
	}
	nv := d.Len(len(d.b))
	s.views = make(map[string]*savedView[T], nv)
	for range nv {
		fp := d.Str()
		v := &savedView[T]{lines: int(d.Int()), n: d.Len(1 << 40)}
		if d.Bool() {
			it := ix.opt.DecodeItem(s.id, d)
			v.first = &it
		}
		nf := d.Len(len(d.b))
		v.firstBy = make(map[string]*T, nf)
		for range nf {
			name := d.Str()
			it := ix.opt.DecodeItem(s.id, d)
			v.firstBy[name] = &it
		}
		if d.Bool() {
			v.digest = d.Bytes()
		}
		s.views[fp] = v
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("bytes after the run's header")
	}
	return s, d.err
}

// decodeSaved reads a run's body from the saved index, checks it against
// its header's hash and decodes it, once; b.err says why it cannot be used.
func (ix *Index[T, F]) decodeSaved(s *savedRun[T]) {
	b := s.body
	b.once.Do(func() {
		buf := make([]byte, b.n)
		if _, err := b.src.ReadAt(buf, b.off); err != nil {
			b.err = fmt.Errorf("saved run index: run %s: %w", s.id, err)
			return
		}
		b.src = nil
		if sha256.Sum256(buf) != b.sum {
			b.err = fmt.Errorf("saved run index: run %s: its part does not match the hash its authenticated header holds (changed or damaged)", s.id)
			return
		}
		b.err = ix.decodeBody(s, buf)
	})
}

// decodeBody decodes a run's body, which must hold the views its header
// names, of the same lines and sizes.
func (ix *Index[T, F]) decodeBody(s *savedRun[T], block []byte) error {
	b := s.body
	d := &Dec{b: block, Memo: map[string]any{}}
	d.readTable()
	b.ops = make([]string, d.Len(len(d.b)))
	for i := range b.ops {
		b.ops[i] = d.Str()
	}
	b.locs = make([]loc, d.Len(len(d.b)))
	var off int64
	var line int32
	for i := range b.locs {
		off += d.Int()
		line += int32(d.Int())
		b.locs[i] = loc{off: off, line: line, op: int32(d.Len(len(b.ops)))}
	}
	nv := d.Len(len(d.b))
	if nv != len(s.views) || len(b.locs) != s.nLocs {
		d.fail("a body that is not its header's")
	}
	b.views = make(map[string]*view[T], nv)
	for range nv {
		if d.err != nil {
			break
		}
		v := &view[T]{fp: d.Str(), lines: int(d.Int())}
		h := s.views[v.fp]
		v.items = make([]T, d.Len(len(d.b)))
		if h == nil || h.lines != v.lines || h.n != len(v.items) || b.views[v.fp] != nil {
			d.fail("a view that is not its header's")
			break
		}
		for i := range v.items {
			v.items[i] = ix.opt.DecodeItem(s.id, d)
		}
		if d.err != nil {
			break
		}
		v = ix.finishAs(v)
		b.views[v.fp] = v
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("bytes after the run")
	}
	if d.err != nil {
		b.ops, b.locs, b.views = nil, nil, nil
		return fmt.Errorf("run %s: %w", s.id, d.err)
	}
	return nil
}

// finishAs indexes a decoded view like finish, keeping its fp and lines.
func (ix *Index[T, F]) finishAs(v *view[T]) *view[T] {
	w := ix.finish(v.items)
	w.fp, w.lines = v.fp, v.lines
	return w
}

// adopt takes a run from the saved index when its file still holds what
// was read of it: at least as many bytes, the same first bytes and the same
// bytes before the offset. The run's identity is then the file's, with the
// saved size, so that a file that grew since is read from the offset. Its
// body stays in the saved index until first used (see settle).
func (ix *Index[T, F]) adopt(id string, e confined.Entry) *run[T, F] {
	s := ix.saved[id]
	if s == nil {
		return nil
	}
	delete(ix.saved, id)
	if s.name != e.Name || e.Size < s.size || s.offset > s.size || s.offset < 0 {
		return nil
	}
	f, err := ix.opt.Events.Open(e.Name)
	if err != nil {
		return nil
	}
	defer f.Close()
	head, tail, err := HeadTail(f, s.offset)
	if err != nil || head != s.head || tail != s.tail {
		return nil
	}
	r := &run[T, F]{id: id, name: e.Name, offset: s.offset, nextLine: s.nextLine, lastAt: s.lastAt, pend: s, head: head, tail: tail, hashed: true}
	r.ident = identity{dev: e.Dev, ino: e.Ino, size: s.size, mtime: e.ModTime}
	if e.Size != s.size {
		r.ident.mtime = time.Time{}
	}
	r.anchor = takeAnchor(f, r.offset, false)
	ix.runs[id] = r
	r.cost = max(s.cost, 0)
	ix.account(func(b *int64, st *Stats) { *b += r.cost; st.Adopted++ })
	return r
}

// settle brings a run adopted from the saved index into memory: its body
// decoded, checked against its header. It reports false, with the run
// reset, when the body cannot be used: the run must be read from its file.
func (ix *Index[T, F]) settle(r *run[T, F]) bool {
	s := r.pend
	if s == nil {
		return true
	}
	ix.decodeSaved(s)
	r.pend = nil
	if err := s.body.err; err != nil {
		ix.opt.Logger.Warn("a run's part of the saved run index is not used; reading the run from its file", "run", r.id, "err", err)
		ix.reset(r)
		ix.account(func(_ *int64, st *Stats) { st.Rejected++ })
		return false
	}
	r.ops, r.locs, r.views = s.body.ops, s.body.locs, s.body.views
	ix.recount(r)
	ix.account(func(_ *int64, st *Stats) { st.Decoded++ })
	return true
}

// snapshot is what save writes: each readable run's state at one moment
// (its slices are never changed in place below their length). A run still
// in the saved index (pend) is decoded by the save, off the lock.
type snapshot[T any] struct {
	id, name, lastAt string
	size, offset     int64
	nextLine         int
	head, tail       [32]byte
	cost             int64
	ops              []string
	locs             []loc
	views            []*view[T]
	pend             *savedRun[T]
}

// takeSnapshot copies the runs' headers, under ix.mu.
func (ix *Index[T, F]) takeSnapshot() []snapshot[T] {
	out := make([]snapshot[T], 0, len(ix.runs))
	for _, r := range ix.runs {
		if r.err != nil || (len(r.views) == 0 && r.pend == nil) || !r.hashed {
			continue
		}
		s := snapshot[T]{id: r.id, name: r.name, lastAt: r.lastAt, size: r.ident.size, offset: r.offset, nextLine: r.nextLine, head: r.head, tail: r.tail, cost: r.cost,
			ops: r.ops[:len(r.ops):len(r.ops)], locs: r.locs[:len(r.locs):len(r.locs)], pend: r.pend}
		for _, v := range r.views {
			s.views = append(s.views, v)
		}
		out = append(out, s)
	}
	return out
}

// maybeSave saves the index in the background, under ix.mu, when a listing
// read runs from the start (or appends were read and the last save is a
// while ago), one save at a time.
func (ix *Index[T, F]) maybeSave() {
	if ix.opt.State == nil || ix.opt.EncodeItem == nil || ix.saving {
		return
	}
	now := ix.opt.Now()
	due := false
	ix.account(func(_ *int64, _ *Stats) {
		due = ix.dirty || (ix.appended && now.Sub(ix.savedAt) >= saveEvery)
		if due {
			ix.dirty, ix.appended = false, false
		}
	})
	if !due {
		return
	}
	ix.saving, ix.savedAt = true, now
	snap := ix.takeSnapshot()
	ix.saves.Go(func() {
		err := ix.save(snap)
		ix.account(func(_ *int64, st *Stats) {
			if err == nil {
				st.Saves++
			}
		})
		ix.mu.Lock()
		ix.saving = false
		if err != nil {
			// A read-only root or a missing guard/ stays so: not tried again.
			ix.opt.State = nil
		}
		ix.mu.Unlock()
		if err != nil {
			ix.opt.Logger.Warn("the run index could not be saved and is not saved again by this process; the next start reads the runs", "err", err)
		}
	})
}

// WaitSaved waits for a save in progress (tests, a server stopping).
func (ix *Index[T, F]) WaitSaved() { ix.saves.Wait() }

// save writes a snapshot. The file is the magic, the length of the
// headers, the headers (the build, then each run's: its file's hashes and
// places, the size and SHA-256 of its body, and per view its first item
// overall and of each facet), their HMAC, then the runs' bodies (their
// operations, places and summaries) in the same order: a restart
// authenticates the headers only, and reads a body when first used.
func (ix *Index[T, F]) save(snap []snapshot[T]) error {
	k, err := ix.key()
	if err != nil {
		return err
	}
	var head Enc
	ver := &Enc{strs: map[string]uint64{}}
	ver.Str(ix.version())
	writeTable(&head, ver)
	// The runs' bodies (a big root's are over a hundred MiB) and headers
	// (tens of MiB, with the guard's digests) go to scratch files as they
	// are encoded, not into memory: a cold start saves while its index
	// and the guard's first history are built, and a second copy of the
	// summaries then was its peak.
	scratch, err := ix.opt.State.Scratch(IndexFile + ".bodies")
	if err != nil {
		return err
	}
	defer scratch.Close()
	hscratch, err := ix.opt.State.Scratch(IndexFile + ".headers")
	if err != nil {
		return err
	}
	defer hscratch.Close()
	bodies := bufio.NewWriterSize(scratch, 1<<20)
	runs := bufio.NewWriterSize(hscratch, 256<<10)
	var bodiesLen, runsLen int64
	var e, h, block, size Enc
	n := 0
	// What is encoded is written as it goes, a while after the last
	// write and twice as long each time (at most twice the bytes of one
	// write in all): a process stopped before the save ends (a client
	// that kills the server a few seconds after closing its input) leaves
	// the runs encoded so far for the next, which reads only the others.
	write := func() error {
		for _, w := range []*bufio.Writer{bodies, runs} {
			if err := w.Flush(); err != nil {
				return fmt.Errorf("the run index's scratch file: %w", err)
			}
		}
		// Written in parts, not copied into one buffer: the bodies and
		// headers of a big root are hundreds of MiB.
		top := &Enc{B: append([]byte(nil), head.B...)}
		top.Uint(uint64(n))
		lead := append([]byte(indexMagic), binary.LittleEndian.AppendUint64(nil, uint64(int64(len(top.B))+runsLen))...)
		mac := hmac.New(sha256.New, k)
		mac.Write(lead)
		mac.Write(top.B)
		if _, err := io.Copy(mac, io.NewSectionReader(hscratch, 0, runsLen)); err != nil {
			return fmt.Errorf("the run index's scratch file: %w", err)
		}
		return ix.opt.State.WriteReadersAtomic(IndexFile, 0o600, bytes.NewReader(lead), bytes.NewReader(top.B), io.NewSectionReader(hscratch, 0, runsLen),
			bytes.NewReader(mac.Sum(nil)), io.NewSectionReader(scratch, 0, bodiesLen))
	}
	every := time.Second
	last := time.Now()
	for i, s := range snap {
		if i > 0 && time.Since(last) >= every {
			if err := write(); err != nil {
				return err
			}
			ix.opt.Logger.Info("the run index is saved in part while its save goes on", "runs", n, "of", len(snap))
			last, every = time.Now(), min(2*every, time.Minute)
		}
		if ix.opt.SaveDelay > 0 {
			time.Sleep(ix.opt.SaveDelay)
		}
		if p := s.pend; p != nil {
			ix.decodeSaved(p)
			if p.body.err != nil {
				continue // read from its file by the next process
			}
			s.ops, s.locs, s.views = p.body.ops, p.body.locs, nil
			for _, v := range p.body.views {
				s.views = append(s.views, v)
			}
		}
		e = Enc{B: e.B[:0], strs: map[string]uint64{}, table: e.table[:0]}
		e.Uint(uint64(len(s.ops)))
		for _, op := range s.ops {
			e.Str(op)
		}
		e.Uint(uint64(len(s.locs)))
		var off int64
		var line int32
		for _, l := range s.locs {
			e.Int(l.off - off)
			e.Int(int64(l.line - line))
			e.Uint(uint64(l.op))
			off, line = l.off, l.line
		}
		e.Uint(uint64(len(s.views)))
		for _, v := range s.views {
			e.Str(v.fp)
			e.Int(int64(v.lines))
			e.Uint(uint64(len(v.items)))
			for i := range v.items {
				ix.opt.EncodeItem(&e, &v.items[i])
			}
		}
		block.B = block.B[:0]
		writeTable(&block, &e)
		sum := sha256.Sum256(block.B)
		if _, err := bodies.Write(block.B); err != nil {
			return fmt.Errorf("the run index's scratch file: %w", err)
		}
		bodiesLen += int64(len(block.B))

		h = Enc{B: h.B[:0], strs: map[string]uint64{}, table: h.table[:0]}
		h.Str(s.id)
		h.Str(s.name)
		h.Int(s.size)
		h.Int(s.offset)
		h.Int(int64(s.nextLine))
		h.Str(s.lastAt)
		h.Str(string(s.head[:]))
		h.Str(string(s.tail[:]))
		h.Int(s.cost)
		h.Uint(uint64(len(s.locs)))
		h.Int(int64(len(block.B)))
		h.Str(string(sum[:]))
		h.Uint(uint64(len(s.views)))
		for _, v := range s.views {
			h.Str(v.fp)
			h.Int(int64(v.lines))
			h.Uint(uint64(len(v.items)))
			h.Bool(len(v.items) > 0)
			if len(v.items) > 0 {
				ix.opt.EncodeItem(&h, &v.items[0])
			}
			facets := make([]string, 0, len(v.byFacet))
			for f, pos := range v.byFacet {
				if len(pos) > 0 {
					facets = append(facets, f)
				}
			}
			slices.Sort(facets)
			h.Uint(uint64(len(facets)))
			for _, f := range facets {
				h.Str(f)
				ix.opt.EncodeItem(&h, &v.items[v.byFacet[f][0]])
			}
			h.Bool(ix.opt.Digest != nil)
			if ix.opt.Digest != nil {
				de := NewEnc()
				ix.opt.Digest(de, v.items)
				h.Bytes(de.Blob())
			}
		}
		block.B = block.B[:0]
		writeTable(&block, &h)
		size.B = size.B[:0]
		size.Uint(uint64(len(block.B)))
		for _, p := range [][]byte{size.B, block.B} {
			if _, err := runs.Write(p); err != nil {
				return fmt.Errorf("the run index's scratch file: %w", err)
			}
		}
		runsLen += int64(len(size.B) + len(block.B))
		n++
	}
	return write()
}

// version names the build once (hashing an executable takes a moment).
func (ix *Index[T, F]) version() string {
	ix.versionOnce.Do(func() {
		if ix.opt.Version != nil {
			ix.versionName = ix.opt.Version()
		}
	})
	return ix.versionName
}
