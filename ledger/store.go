package ledger

import (
	"context"
	"fmt"
)

// Lanes is how many lanes a ledger may have. Each lane is a chain of its
// own; a store that lets several decisions commit at once gives each its
// own lane for as long as it holds it (the PostgreSQL store: the decision
// chains' lanes), a store with one writer at a time uses lane 0 only (the
// file store).
const Lanes = 16

// Pos is a place in one lane: the entry numbered Seq, which starts at byte
// Off of the lane's stream (a store that keeps no byte offsets ignores it).
type Pos struct {
	Lane int
	Seq  int64
	Off  int64
}

// Raw is one line of a lane as the store holds it (without its newline).
type Raw struct {
	Pos
	Line []byte
	// own is the entry this process sealed into Line (OwnRaw); nil for a
	// line read from a store.
	own *Entry
}

// OwnRaw is the Raw of entry e that this process sealed: line is what
// e.Seal returned, appended at pos. A Book takes it in without parsing the
// line or checking its seal again (this process made both, under the
// Book's key); its place in the lane and its link to the entry before are
// checked as for any line. Other processes read the line and check all.
func OwnRaw(pos Pos, line []byte, e Entry) Raw { return Raw{Pos: pos, Line: line, own: &e} }

// Reader reads the ledger a store keeps.
type Reader interface {
	// Since returns, for every lane, the whole lines from the given
	// position on (for a lane not named: from its start), in lane order
	// and, within a lane, in order. A store stops a lane at a line that
	// is not whole (a torn tail) and leaves it out. A lane that now ends
	// before the position asked (cut short) is reported by a Raw with no
	// Line at the lane's end as the store sees it (Seq -1 where the store
	// cannot tell the seq).
	Since(ctx context.Context, from []Pos) ([]Raw, error)
}

// Appender is the ledger inside a locked section of the store: what it
// appends commits with the rest of the section, or not at all.
type Appender interface {
	Reader
	// Lane is the lane the section appends to; no other section appends
	// to it until this one ends.
	Lane() int
	// Append writes lines at at (the lane's end as the section read it:
	// the seq of the first line, and its byte offset), cutting off first
	// whatever lies past at.Off in a store with byte offsets (a torn tail
	// a writer that died left). A store refuses a seq already used.
	Append(ctx context.Context, at Pos, lines [][]byte) error
}

// ErrSeqTaken is an append at a seq another writer already used.
var ErrSeqTaken = fmt.Errorf("ledger: the entry's seq is already taken in its lane")
