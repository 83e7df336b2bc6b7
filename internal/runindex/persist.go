package runindex

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
)

// The index a process saves for the next one to start from: in
// Options.State, IndexFile, authenticated with the key in KeyFile. A run is
// taken from it only while its file still has at least the size it had and
// the same first bytes and the same bytes before where the read stopped
// (compared by SHA-256); anything else is read from the file. A file that
// does not authenticate, or that this build cannot read, is ignored and
// written anew.
const (
	IndexFile = "run-index.bin"
	KeyFile   = "run-index.key"
	// indexMagic names the format; a new format is a new magic.
	indexMagic = "HAIA-RUNINDEX 2\n"
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

// savedRun is what a saved index says of one run.
type savedRun[T any] struct {
	name         string
	size, offset int64
	nextLine     int
	lastAt       string
	head, tail   [32]byte
	ops          []string
	locs         []loc
	views        map[string]*view[T]
}

// headTail hashes the first bytes of a file and those before offset.
func headTail(f io.ReaderAt, offset int64) (head, tail [32]byte, err error) {
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

// load reads the saved index once, keeping what authenticates; each run is
// checked against its file when first listed (see adopt).
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
	defer f.Close()
	var data []byte
	st, err := f.Stat()
	if err == nil && st.Size() > maxIndexBytes {
		err = errors.New("larger than the limit")
	}
	if err == nil {
		data = make([]byte, st.Size())
		_, err = io.ReadFull(f, data)
	}
	if err != nil {
		ix.opt.Logger.Warn("the saved run index cannot be read; reading the runs", "err", err)
		return
	}
	saved, err := ix.decodeIndex(data)
	if err != nil {
		ix.opt.Logger.Warn("the saved run index is not used; reading the runs and saving it anew", "err", err)
		ix.dirty = true
		return
	}
	ix.saved = saved
}

// decodeIndex authenticates and decodes a saved index.
func (ix *Index[T, F]) decodeIndex(data []byte) (map[string]*savedRun[T], error) {
	k, err := ix.key()
	if err != nil {
		return nil, err
	}
	if len(data) < len(indexMagic)+sha256.Size || string(data[:len(indexMagic)]) != indexMagic {
		return nil, errors.New("not a run index of this version")
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	mac := hmac.New(sha256.New, k)
	mac.Write(body)
	if !hmac.Equal(mac.Sum(nil), sum) {
		return nil, errors.New("its authentication code does not match its content (changed or damaged)")
	}
	d := &Dec{b: body[len(indexMagic):]}
	d.readTable()
	if v := d.Str(); v != ix.version() {
		return nil, fmt.Errorf("saved by another build (%.40s), whose summaries may differ", v)
	}
	// Each run is a block of its own, decoded in parallel.
	blocks := make([][]byte, d.Len(len(d.b)))
	for i := range blocks {
		n := d.Len(len(d.b))
		if d.err != nil {
			return nil, d.err
		}
		blocks[i], d.b = d.b[:n], d.b[n:]
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("bytes after the last run")
	}
	if d.err != nil {
		return nil, d.err
	}
	ids := make([]string, len(blocks))
	runs := make([]*savedRun[T], len(blocks))
	errs := make([]error, len(blocks))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(blocks), runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(blocks) {
					return
				}
				ids[i], runs[i], errs[i] = ix.decodeRun(blocks[i])
			}
		})
	}
	wg.Wait()
	out := make(map[string]*savedRun[T], len(blocks))
	for i := range blocks {
		if errs[i] != nil {
			return nil, errs[i]
		}
		out[ids[i]] = runs[i]
	}
	return out, nil
}

// decodeRun decodes one run's block.
func (ix *Index[T, F]) decodeRun(block []byte) (string, *savedRun[T], error) {
	d := &Dec{b: block, Memo: map[string]any{}}
	d.readTable()
	id := d.Str()
	s := &savedRun[T]{name: d.Str(), size: d.Int(), offset: d.Int(), nextLine: int(d.Int()), lastAt: d.Str()}
	copy(s.head[:], d.Str())
	copy(s.tail[:], d.Str())
	s.ops = make([]string, d.Len(len(d.b)))
	for i := range s.ops {
		s.ops[i] = d.Str()
	}
	s.locs = make([]loc, d.Len(len(d.b)))
	var off int64
	var line int32
	for i := range s.locs {
		off += d.Int()
		line += int32(d.Int())
		s.locs[i] = loc{off: off, line: line, op: int32(d.Len(len(s.ops)))}
	}
	nv := d.Len(len(d.b))
	s.views = make(map[string]*view[T], nv)
	for range nv {
		v := &view[T]{fp: d.Str(), lines: int(d.Int())}
		v.items = make([]T, d.Len(len(d.b)))
		for i := range v.items {
			v.items[i] = ix.opt.DecodeItem(id, d)
		}
		if d.err != nil {
			break
		}
		v = ix.finishAs(v)
		s.views[v.fp] = v
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("bytes after the run")
	}
	return id, s, d.err
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
// saved size, so that a file that grew since is read from the offset.
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
	head, tail, err := headTail(f, s.offset)
	if err != nil || head != s.head || tail != s.tail {
		return nil
	}
	r := &run[T, F]{id: id, name: e.Name, offset: s.offset, nextLine: s.nextLine, lastAt: s.lastAt, ops: s.ops, locs: s.locs, views: s.views, head: head, tail: tail, hashed: true}
	r.ident = identity{dev: e.Dev, ino: e.Ino, size: s.size, mtime: e.ModTime}
	if e.Size != s.size {
		r.ident.mtime = time.Time{}
	}
	r.anchor = takeAnchor(f, r.offset, false)
	ix.runs[id] = r
	ix.recount(r)
	ix.account(func(_ *int64, st *Stats) { st.Adopted++ })
	return r
}

// snapshot is what save writes: each readable run's state at one moment
// (its slices are never changed in place below their length).
type snapshot[T any] struct {
	id, name, lastAt string
	size, offset     int64
	nextLine         int
	head, tail       [32]byte
	ops              []string
	locs             []loc
	views            []*view[T]
}

// takeSnapshot copies the runs' headers, under ix.mu.
func (ix *Index[T, F]) takeSnapshot() []snapshot[T] {
	out := make([]snapshot[T], 0, len(ix.runs))
	for _, r := range ix.runs {
		if r.err != nil || len(r.views) == 0 || !r.hashed {
			continue
		}
		s := snapshot[T]{id: r.id, name: r.name, lastAt: r.lastAt, size: r.ident.size, offset: r.offset, nextLine: r.nextLine, head: r.head, tail: r.tail, ops: r.ops[:len(r.ops):len(r.ops)], locs: r.locs[:len(r.locs):len(r.locs)]}
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

// save writes a snapshot: every run's file hashes, places and views.
func (ix *Index[T, F]) save(snap []snapshot[T]) error {
	k, err := ix.key()
	if err != nil {
		return err
	}
	out := &Enc{B: append(make([]byte, 0, 1<<20), indexMagic...)}
	writeTable := func(dst *Enc, e *Enc) {
		dst.Uint(uint64(len(e.table)))
		for _, t := range e.table {
			dst.Uint(uint64(len(t)))
		}
		for _, t := range e.table {
			dst.B = append(dst.B, t...)
		}
		dst.B = append(dst.B, e.B...)
	}
	head := &Enc{strs: map[string]uint64{}}
	head.Str(ix.version())
	writeTable(out, head)
	out.Uint(uint64(len(snap)))
	var e, block Enc
	for _, s := range snap {
		e = Enc{B: e.B[:0], strs: map[string]uint64{}, table: e.table[:0]}
		e.Str(s.id)
		e.Str(s.name)
		e.Int(s.size)
		e.Int(s.offset)
		e.Int(int64(s.nextLine))
		e.Str(s.lastAt)
		e.Str(string(s.head[:]))
		e.Str(string(s.tail[:]))
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
		out.Uint(uint64(len(block.B)))
		out.B = append(out.B, block.B...)
	}
	mac := hmac.New(sha256.New, k)
	mac.Write(out.B)
	out.B = mac.Sum(out.B)
	return ix.opt.State.WriteFileAtomic(IndexFile, out.B, 0o600)
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
