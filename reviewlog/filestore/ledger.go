package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// LedgerFile is lane 0 of the spend ledger under guard/, the lane every
// section of the file store appends to; lane k > 0 (written only by an
// export from PostgreSQL) is ledger.lane<k>.ndjson.
const LedgerFile = "ledger.ndjson"

// LedgerLaneFile names the file of one lane of the ledger.
func LedgerLaneFile(lane int) string {
	if lane == 0 {
		return LedgerFile
	}
	return "ledger.lane" + strconv.Itoa(lane) + ".ndjson"
}

// ledgerReader reads the ledger's lane files under guard/; in a locked
// section (w set), through the section's descriptors, which its appends
// write through too.
type ledgerReader struct {
	g *confined.Dir
	w *fileWriter
}

func (r *fileReader) Ledger() ledger.Reader { return ledgerReader{g: r.g} }

// Ledger reads the ledger through the section's descriptors.
func (w *fileWriter) Ledger() ledger.Reader { return ledgerReader{g: w.g, w: w} }

// Since reads each lane file from the offset asked; a file shorter than
// that offset was cut short, and says so.
func (r ledgerReader) Since(ctx context.Context, from []ledger.Pos) ([]ledger.Raw, error) {
	if r.g == nil {
		return nil, nil
	}
	start := make([]ledger.Pos, ledger.Lanes)
	for i := range start {
		start[i].Lane = i
	}
	for _, p := range from {
		if p.Lane >= 0 && p.Lane < ledger.Lanes {
			start[p.Lane] = p
		}
	}
	// Lane 0 is the file store's own; the others exist only where an
	// export from PostgreSQL wrote them (into a store that was empty, so
	// before any reader read it). They are looked for on a first read
	// (every position at its start), and after that only those read before.
	present := map[int]bool{0: true}
	first := true
	for _, p := range start {
		if p.Off > 0 {
			present[p.Lane] = true
			first = false
		}
	}
	if first {
		ents, err := r.g.ReadDir()
		if err != nil {
			return nil, fmt.Errorf("list the guard directory %s: %w", r.g.Path(), err)
		}
		for _, e := range ents {
			for lane := 1; lane < ledger.Lanes; lane++ {
				if e.Name == LedgerLaneFile(lane) {
					present[lane] = true
				}
			}
		}
	}
	var out []ledger.Raw
	for lane := range ledger.Lanes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !present[lane] {
			continue
		}
		raws, err := r.readLane(lane, start[lane])
		if err != nil {
			return nil, err
		}
		out = append(out, raws...)
	}
	return out, nil
}

// open opens one lane's file for reading: in a section, the section's
// descriptor (left open); else one of its own, closed by the caller.
func (r ledgerReader) open(name string) (f *os.File, owned bool, err error) {
	if r.w != nil {
		f, shared, err := r.w.file(r.g, name, false)
		if !errors.Is(err, fs.ErrPermission) {
			return f, !shared, err
		}
		// A lane this process may read and not write: read it as a
		// reader does.
	}
	f, err = r.g.Open(name)
	return f, true, err
}

// readLane reads one lane's whole lines from p on.
func (r ledgerReader) readLane(lane int, p ledger.Pos) ([]ledger.Raw, error) {
	g := r.g
	name := LedgerLaneFile(lane)
	f, owned, err := r.open(name)
	if errors.Is(err, fs.ErrNotExist) {
		if p.Off > 0 {
			return []ledger.Raw{{Pos: ledger.Pos{Lane: lane, Seq: -1}}}, nil
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the ledger %s: %w", g.Path()+"/"+name, err)
	}
	if owned {
		defer f.Close()
	}
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size < p.Off {
		return []ledger.Raw{{Pos: ledger.Pos{Lane: lane, Seq: -1, Off: size}}}, nil
	}
	if size == p.Off {
		return nil, nil
	}
	data := make([]byte, size-p.Off)
	if _, err := f.ReadAt(data, p.Off); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read the ledger %s: %w", g.Path()+"/"+name, err)
	}
	var out []ledger.Raw
	off, seq := p.Off, p.Seq
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // a torn tail: not an entry yet
		}
		line := data[:i]
		out = append(out, ledger.Raw{Pos: ledger.Pos{Lane: lane, Seq: seq, Off: off}, Line: line})
		off += int64(i + 1)
		seq++
		data = data[i+1:]
	}
	return out, nil
}

// fileLedger appends to lane 0 inside the flock.
type fileLedger struct {
	ledgerReader
	w *fileWriter
}

func (w *fileWriter) LedgerAppender() ledger.Appender {
	return &fileLedger{ledgerReader: ledgerReader{g: w.g, w: w}, w: w}
}

func (l *fileLedger) Lane() int { return 0 }

// Append writes the lines at at.Off of lane 0 (cutting a torn tail off
// first) and starts their sync: the next write of the section that must
// follow them (the receipt the entry stands for) waits for it, so the
// entry reaches the disk before its receipt is written, while the receipt
// is signed during the sync. The section's end is remembered so that a
// section that fails cuts its entries off again.
func (l *fileLedger) Append(ctx context.Context, at ledger.Pos, lines [][]byte) error {
	if at.Lane != 0 && !(reviewlog.IsBulk(ctx) && at.Lane > 0 && at.Lane < ledger.Lanes) {
		return fmt.Errorf("the file store appends to ledger lane 0, not %d (other lanes only in a copy)", at.Lane)
	}
	// What the section wrote before (a receipt a release is bound to)
	// reaches the disk first.
	if err := l.w.syncPending(); err != nil {
		return err
	}
	f, shared, err := l.w.file(l.w.g, LedgerLaneFile(at.Lane), true)
	if err != nil {
		return fmt.Errorf("open the ledger: %w", err)
	}
	owned := false
	defer func() {
		if !owned && !shared {
			f.Close()
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() < at.Off {
		return fmt.Errorf("the ledger %s is %d bytes, shorter than the %d its entries were read to: cut short behind the guard's back", l.w.Locate(LedgerFile), st.Size(), at.Off)
	}
	if st.Size() > at.Off {
		// Only a torn tail (no whole line) is cut off; a whole line past
		// at.Off is an entry another writer committed.
		tail := make([]byte, st.Size()-at.Off)
		if _, err := f.ReadAt(tail, at.Off); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read the ledger's tail: %w", err)
		}
		if bytes.IndexByte(tail, '\n') >= 0 {
			return fmt.Errorf("%w (lane %d, entry %d: the ledger holds whole lines past byte %d)", ledger.ErrSeqTaken, at.Lane, at.Seq, at.Off)
		}
	}
	var buf []byte
	for _, line := range lines {
		buf = append(append(buf, line...), '\n')
	}
	if st.Size() > at.Off {
		if err := f.Truncate(at.Off); err != nil {
			return fmt.Errorf("drop the ledger's torn tail: %w", err)
		}
	}
	if l.w.ledgerEnd < 0 && at.Lane == 0 {
		l.w.ledgerEnd = at.Off
	}
	if _, err := f.WriteAt(buf, at.Off); err != nil {
		_ = f.Truncate(at.Off)
		return fmt.Errorf("append to the ledger %s: %w", l.w.Locate(LedgerFile), err)
	}
	if at.Lane == 0 {
		l.w.ledgerTop = at.Off + int64(len(buf))
	}
	owned = true
	l.w.startSync(LedgerLaneFile(at.Lane), f, at.Off, true, shared)
	return nil
}

// undoLedger cuts off what a failed section appended to the ledger.
func (w *fileWriter) undoLedger() {
	if w.ledgerEnd < 0 {
		return
	}
	f, err := w.g.OpenFile(LedgerFile, os.O_RDWR, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	if f.Truncate(w.ledgerEnd) == nil {
		_ = f.Sync()
	}
}

// SegmentLinesSince reads each segment file from its offset.
func (r *fileReader) SegmentLinesSince(ctx context.Context, from map[string]int64) ([]reviewlog.SegmentLine, error) {
	return reviewlog.ReadSegmentLines(ctx, r, from)
}
