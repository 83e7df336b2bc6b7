package payment

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
)

// The sweep a process saves for the next one (Config.State, SweepFile):
// per run file whose swept part holds nothing that can bind — no
// settlement kept, no nonce — how far it was swept (its size then, the
// offset of the last whole line, the SHA-256 of its first bytes and of
// those before the offset, as the run index checks its own saved runs), the
// hash of what can bind (traceRun.Sum) and the marks of the operations
// whose settlements were left out; and the payers whose settlements were
// kept. A run file is taken from it only while it still holds those bytes
// and did not shrink (nor change its time without growing); it is then
// read from the offset. A run file that holds a settlement kept or a
// nonce is not saved: it is read whole at the next start, so every
// settlement that binds is bound from events read by the process binding
// it. The saved sweep only decides what need not be read again.
const (
	SweepFile = "trace-sweep.bin"
	// sweepMagic names the format; a new format is a new magic.
	sweepMagic = "HAIA-TRACESWEEP 1\n"
	// maxSweepBytes bounds the file read back (about a million runs).
	maxSweepBytes = 128 << 20
	// sweepSaveEvery is how long a sweep that read appends waits after
	// the last save before it saves (a stopping server saves what is
	// left).
	sweepSaveEvery = time.Minute
)

// savedSweep is what SweepFile holds.
type savedSweep struct {
	payers payerSet
	runs   map[string]sweptRun
}

// sweptRun is one run file as the saved sweep left it.
type sweptRun struct {
	size, off  int64
	lines      int
	mod        int64
	head, tail [32]byte
	sum        uint64
	skipped    int
	dropped    [64]uint64
}

// sweepSaver serializes the saves of one Authorizer.
type sweepSaver struct {
	mu     sync.Mutex
	saving bool
	off    bool
	at     time.Time
	// last is what SweepFile holds (as read or written by this process);
	// pending is a newer sweep not saved yet.
	last, pending []byte
}

// TraceReads says what this process's sweeps of the Trace read.
type TraceReads struct {
	// Bytes of run files read.
	Bytes int64
	// Whole counts the readings of a run file from its first byte.
	Whole int64
	// Saved counts the run files taken from the saved sweep, read from
	// where it stopped.
	Saved int64
}

// TraceReads says what the sweeps of the Trace read so far (benchmarks,
// tests).
func (a *Authorizer) TraceReads() TraceReads {
	st := a.trace
	return TraceReads{Bytes: st.readBytes.Load(), Whole: st.readWhole.Load(), Saved: st.restored.Load()}
}

func (st *traceState) count(n int64, whole bool) {
	if st == nil {
		return
	}
	st.readBytes.Add(n)
	if whole {
		st.readWhole.Add(1)
	}
}

func (a *Authorizer) sweepPath() string {
	if a.cfg.State == nil {
		return SweepFile
	}
	return filepath.Join(a.cfg.State.Path(), SweepFile)
}

// loadSweep reads the saved sweep; one that is not there is nil, and one
// that cannot be read (cut short, written over, another format) is nil,
// said in the log, and saved anew after this process's first sweep.
func (a *Authorizer) loadSweep() *savedSweep {
	if a.cfg.State == nil {
		return nil
	}
	f, err := a.cfg.State.Open(SweepFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var b []byte
	if err == nil {
		b, err = io.ReadAll(io.LimitReader(f, maxSweepBytes+1))
		f.Close()
		if err == nil && len(b) > maxSweepBytes {
			err = fmt.Errorf("larger than %d bytes", maxSweepBytes)
		}
	}
	var s *savedSweep
	if err == nil {
		s, err = decodeSweep(b)
	}
	if err != nil {
		a.cfg.Logger.Warn("the saved sweep of the Trace's settlements is not used: every run file is read, and the sweep is saved anew", "file", a.sweepPath(), "err", err)
		return nil
	}
	a.trace.save.mu.Lock()
	a.trace.save.last = b
	a.trace.save.mu.Unlock()
	a.cfg.Logger.Info("the saved sweep of the Trace's settlements is read; each run file is checked against it", "file", a.sweepPath(), "runs", len(s.runs))
	return s
}

// restore takes the run file e from the saved sweep when it still holds
// what was swept of it: at least the size it had (the same time if no
// more), the same first bytes and the same bytes before the offset. The
// run is then read from the offset. Each run is taken once.
func (st *traceState) restore(f io.ReaderAt, e confined.Entry) (cachedRun, bool) {
	if st.saved == nil {
		return cachedRun{}, false
	}
	s, ok := st.saved.runs[e.Name]
	if !ok {
		return cachedRun{}, false
	}
	delete(st.saved.runs, e.Name)
	if e.Size < s.size || (e.Size == s.size && e.ModTime.UnixNano() != s.mod) {
		return cachedRun{}, false
	}
	head, tail, err := runindex.HeadTail(f, s.off)
	if err != nil || head != s.head || tail != s.tail {
		return cachedRun{}, false
	}
	st.restored.Add(1)
	c := cachedRun{ino: e.Ino}
	c.cur = runCursor{off: s.off, lines: s.lines, head: head, tail: tail,
		run: traceRun{Nonces: map[string][]string{}, Skipped: s.skipped, Sum: s.sum, dropped: s.dropped}}
	return c, true
}

// encodeSweep is SweepFile's bytes for the runs read: the magic, the
// sweep, its SHA-256.
func (st *traceState) encodeSweep() []byte {
	e := runindex.NewEnc()
	payers := make([]string, 0, len(st.payers))
	for p := range st.payers {
		payers = append(payers, p)
	}
	slices.Sort(payers)
	e.Uint(uint64(len(payers)))
	for _, p := range payers {
		e.Str(p)
	}
	names := make([]string, 0, len(st.runs))
	for n, c := range st.runs {
		// A run that holds what can bind is read whole at the next start.
		if len(c.cur.run.Settlements) == 0 && len(c.cur.run.Nonces) == 0 && !c.cur.run.reread {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	e.Uint(uint64(len(names)))
	for _, n := range names {
		c := st.runs[n]
		e.Str(n)
		e.Int(c.size)
		e.Int(c.cur.off)
		e.Int(int64(c.cur.lines))
		e.Int(c.mod.UnixNano())
		e.Bytes(c.cur.head[:])
		e.Bytes(c.cur.tail[:])
		e.Uint(c.cur.run.Sum)
		e.Int(int64(c.cur.run.Skipped))
		words := 0
		for _, w := range c.cur.run.dropped {
			if w != 0 {
				words++
			}
		}
		e.Uint(uint64(words))
		for i, w := range c.cur.run.dropped {
			if w != 0 {
				e.Uint(uint64(i))
				e.Uint(w)
			}
		}
	}
	out := append([]byte(sweepMagic), e.Blob()...)
	sum := sha256.Sum256(out)
	return append(out, sum[:]...)
}

// decodeSweep reads what encodeSweep wrote.
func decodeSweep(b []byte) (*savedSweep, error) {
	if !bytes.HasPrefix(b, []byte(sweepMagic)) {
		return nil, fmt.Errorf("not a saved sweep in this build's format (%q)", sweepMagic)
	}
	if len(b) < len(sweepMagic)+sha256.Size {
		return nil, errors.New("cut short")
	}
	body := b[:len(b)-sha256.Size]
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], b[len(body):]) {
		return nil, errors.New("its SHA-256 does not match its bytes (cut short or written over)")
	}
	d := runindex.NewDec(body[len(sweepMagic):])
	s := &savedSweep{payers: payerSet{}, runs: map[string]sweptRun{}}
	for n := d.Len(len(body)); n > 0 && d.Err() == nil; n-- {
		s.payers[d.Str()] = true
	}
	for n := d.Len(len(body)); n > 0 && d.Err() == nil; n-- {
		name := d.Str()
		var r sweptRun
		r.size, r.off = d.Int(), d.Int()
		lines, mod := d.Int(), d.Int()
		head, tail := d.Bytes(), d.Bytes()
		r.sum = d.Uint()
		skipped := d.Int()
		for w := d.Len(len(r.dropped)); w > 0 && d.Err() == nil; w-- {
			i := d.Len(len(r.dropped) - 1)
			r.dropped[i] = d.Uint()
		}
		if d.Err() != nil {
			break
		}
		if r.off < 0 || r.off > r.size || lines < 0 || lines > r.off || skipped < 0 || skipped > lines || lines > math.MaxInt32 ||
			len(head) != len(r.head) || len(tail) != len(r.tail) || s.runs[name] != (sweptRun{}) {
			d.Fail("a run's place out of range")
			break
		}
		r.lines, r.skipped, r.mod = int(lines), int(skipped), mod
		copy(r.head[:], head)
		copy(r.tail[:], tail)
		s.runs[name] = r
	}
	if err := d.Done(); err != nil {
		return nil, err
	}
	return s, nil
}

// saveSweep saves the sweep just made, after the last sweep of a process
// that read nothing more is saved (a restart over an unchanged Trace writes
// nothing), otherwise in the background and at most every sweepSaveEvery;
// what is left is saved by Close.
func (a *Authorizer) saveSweep() {
	if a.cfg.State == nil {
		return
	}
	blob := a.trace.encodeSweep()
	sv := &a.trace.save
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.off {
		return
	}
	if bytes.Equal(blob, sv.last) {
		sv.pending = nil
		return
	}
	sv.pending = blob
	now := time.Now()
	if sv.saving || (!sv.at.IsZero() && now.Sub(sv.at) < sweepSaveEvery) {
		return
	}
	sv.saving, sv.at, sv.pending = true, now, nil
	if !a.background(func() { a.writeSweep(blob) }) {
		sv.saving, sv.pending = false, blob
	}
}

// writeSweep writes blob to SweepFile (a new file synced, then renamed
// over the old); one that cannot be written is not tried again by this
// process.
func (a *Authorizer) writeSweep(blob []byte) {
	err := a.cfg.State.WriteFileAtomic(SweepFile, blob, 0o600)
	sv := &a.trace.save
	sv.mu.Lock()
	sv.saving = false
	if err == nil {
		sv.last = blob
	} else {
		sv.off = true
	}
	sv.mu.Unlock()
	if err != nil {
		a.cfg.Logger.Warn("the sweep of the Trace's settlements could not be saved and is not saved again by this process; the next start reads every run file",
			"file", a.sweepPath(), "err", err)
	}
}

// flushSweep saves a sweep left unsaved (Close, after the background work
// ended).
func (a *Authorizer) flushSweep() {
	if a.cfg.State == nil {
		return
	}
	sv := &a.trace.save
	sv.mu.Lock()
	blob := sv.pending
	sv.pending = nil
	if sv.off || sv.saving {
		blob = nil
	}
	sv.mu.Unlock()
	if blob != nil {
		a.writeSweep(blob)
	}
}
