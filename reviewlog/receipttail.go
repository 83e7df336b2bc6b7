package reviewlog

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// SegmentLine is one whole line of a chain segment, at its byte offset.
type SegmentLine struct {
	Segment string
	Off     int64
	Line    []byte
}

// SegmentMark is how far a reader read one segment: its identity then, and
// the offset after the last whole line read.
type SegmentMark struct {
	Identity string
	Off      int64
}

// Reserving is a signed receipt that commits a payment: a SERVICE ALLOWED
// answer to a question (ReservesOf), which the spend ledger must hold an
// entry of; or the receipt that started the ledger
// (CanonicalLedgerGenesis).
type Reserving struct {
	ID, Agent, Canonical string
	TS                   time.Time
	Segment              string
	Off                  int64
}

// CanonicalLedgerGenesis is the action.canonical of the receipt that
// starts a store's spend ledger.
const CanonicalLedgerGenesis = "haia.ledger.genesis"

// ReceiptTail reads the decision chains from where it last read, for a
// process that checks every new commitment receipt against the spend
// ledger: each call reads only what was appended since the last, in one
// statement on a store that can (SegmentLinesSince).
type ReceiptTail struct {
	mu    sync.Mutex
	marks map[string]SegmentMark
}

// Next reads the receipts appended to every segment since the last call
// and returns those that reserve. A segment that shrank or was replaced is
// read again from its start (its receipts may come again; a caller checks
// each against the ledger, which is idempotent) — unless the reader may lag
// behind the tail (laggingReader), which reads such a segment as not yet
// grown to where the tail read it, and leaves it to a later call.
func (t *ReceiptTail) Next(ctx context.Context, r Reader) ([]Reserving, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.marks == nil {
		t.marks = map[string]SegmentMark{}
	}
	infos, err := r.Segments(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the decision chains: %w", err)
	}
	lags := false
	if l, ok := r.(laggingReader); ok {
		lags = l.SegmentsMayLag()
	}
	from := map[string]int64{}
	for _, si := range infos {
		m, ok := t.marks[si.Name]
		switch {
		case lags && ok && m.Identity == si.Identity && si.Size < m.Off:
			// This reader's moment is older than what the tail read
			// through another section since: nothing in the segment is
			// new to it, and reading it again from the start would only
			// read back what was checked.
			continue
		case !ok || m.Identity != si.Identity || si.Size < m.Off:
			from[si.Name] = 0
			t.marks[si.Name] = SegmentMark{Identity: si.Identity}
		case si.Size > m.Off:
			from[si.Name] = m.Off
		}
	}
	if len(from) == 0 {
		return nil, nil
	}
	lines, err := r.SegmentLinesSince(ctx, from)
	if err != nil {
		return nil, fmt.Errorf("read the decision chains: %w", err)
	}
	var out []Reserving
	for _, l := range lines {
		m := t.marks[l.Segment]
		m.Off = l.Off + int64(len(l.Line)) + 1
		t.marks[l.Segment] = m
		if !bytes.Contains(l.Line, []byte(`"`+noa.VerdictAllowed+`"`)) {
			continue
		}
		// The head alone: this picks the lines the ledger must hold,
		// and a line that is no receipt commits nothing.
		h, err := noa.ParseHead(l.Line)
		if err != nil || (reservesHead(h) == "" && h.Action.Canonical != CanonicalLedgerGenesis) {
			continue
		}
		ts, _ := time.Parse(time.RFC3339Nano, h.TS)
		out = append(out, Reserving{ID: h.ID, Agent: h.Agent.ID, Canonical: h.Action.Canonical, TS: ts, Segment: l.Segment, Off: l.Off})
	}
	return out, nil
}

// laggingReader is a Reader whose view of the segments may be older than
// what another reader of the same process read since: a PostgreSQL
// section's streams are read at its start, and a section of another scope
// may commit, and its process's tail read on, before it catches up. Such a
// reader seeing a segment shorter than the tail read it is behind, not
// looking at a segment cut short.
type laggingReader interface {
	SegmentsMayLag() bool
}

// Skip moves the tail past a receipt this process appended (a), once the
// section that appended it committed, when the tail had read its segment
// to exactly where the receipt starts: the process knows that receipt,
// and took in its ledger entry when the section committed, so it is not
// read back and checked again. Anything else — the tail read the segment
// elsewhere, or not at all — is left for Next to read.
func (t *ReceiptTail) Skip(a Appended) {
	if a.Segment == "" || a.End <= a.Off {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if m, ok := t.marks[a.Segment]; ok && m.Off == a.Off {
		m.Off = a.End
		t.marks[a.Segment] = m
	}
}

// Marks is how far the tail has read each segment: where the next read
// starts.
func (t *ReceiptTail) Marks() map[string]SegmentMark {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]SegmentMark, len(t.marks))
	for k, v := range t.marks {
		out[k] = v
	}
	return out
}

// ReadSegmentLines is SegmentLinesSince for a store that reads segments as
// streams (the file store): each named segment's whole lines from its
// offset on.
func ReadSegmentLines(ctx context.Context, r Reader, from map[string]int64) ([]SegmentLine, error) {
	var out []SegmentLine
	for name, off := range from {
		s, err := r.Segment(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("chain segment %s: %w", name, err)
		}
		size := s.Size()
		if size <= off {
			s.Close()
			continue
		}
		data := make([]byte, size-off)
		n, err := s.ReadAt(data, off)
		s.Close()
		if err != nil && n < len(data) {
			return nil, fmt.Errorf("chain segment %s: %w", name, err)
		}
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				break
			}
			out = append(out, SegmentLine{Segment: name, Off: off, Line: bytes.TrimRight(data[:i], "\r")})
			off += int64(i + 1)
			data = data[i+1:]
		}
	}
	return out, nil
}
