package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// ledgerKey seals the contract's ledger lines.
var ledgerKey = []byte("storetest-ledger-key-0123456789ab")

// runLedger is the spend ledger's part of the contract: what a section
// appends to its lane is read back, by every handle, in order and byte
// for byte; a section that fails leaves nothing of it; a seq already
// taken is refused; positions read before let a reader take only what is
// new.
func runLedger(t *testing.T, factory Factory) {
	t.Run("LedgerAppendsAndReadsBack", func(t *testing.T) { testLedgerRoundTrip(t, newFixture(t, factory)) })
	t.Run("LedgerFailedSectionLeavesNothing", func(t *testing.T) { testLedgerFailedSection(t, newFixture(t, factory)) })
	t.Run("LedgerSeqTakenRefused", func(t *testing.T) { testLedgerSeqTaken(t, newFixture(t, factory)) })
}

// appendEntries seals n hold entries at the end of the section's lane, as
// the Book reads it, and appends them.
func appendEntries(ctx context.Context, w reviewlog.Writer, b *ledger.Book, from, n int) ([]ledger.Raw, error) {
	app := w.LedgerAppender()
	if _, err := app.Since(ctx, nil); err != nil {
		return nil, err
	}
	raws, err := app.Since(ctx, b.Heads())
	if err != nil {
		return nil, err
	}
	b.Apply(raws)
	pos, prev := b.Next(app.Lane())
	at := pos
	var lines [][]byte
	var out []ledger.Raw
	for i := range n {
		e := ledger.Entry{Kind: ledger.KindHold, Lane: pos.Lane, Seq: pos.Seq, Prev: prev, At: ledger.FormatTime(time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)),
			Until: ledger.FormatTime(time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)), Receipt: fmt.Sprintf("rcpt_%d", from+i), Caller: "c",
			PayTo: "0xabc", Atomic: "1", Asset: "usdc"}
		line, err := e.Seal(ledgerKey)
		if err != nil {
			return nil, err
		}
		lines = append(lines, line)
		out = append(out, ledger.Raw{Pos: pos, Line: line})
		pos.Seq++
		pos.Off += int64(len(line)) + 1
		prev = ledger.Hash(line)
	}
	return out, app.Append(ctx, at, lines)
}

func readLedger(t *testing.T, s reviewlog.Store) []ledger.Raw {
	t.Helper()
	var raws []ledger.Raw
	err := s.View(context.Background(), func(r reviewlog.Reader) error {
		var err error
		raws, err = r.Ledger().Since(context.Background(), nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return raws
}

func testLedgerRoundTrip(t *testing.T, f *fixture) {
	ctx := context.Background()
	s := f.another()
	b := ledger.NewBook(ledgerKey, "", time.Hour)
	for round := range 3 {
		err := s.Locked(ctx, 5*time.Second, func(w reviewlog.Writer) error {
			raws, err := appendEntries(ctx, w, b, round*4, 4)
			if err == nil {
				b.Apply(raws)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Another handle reads all twelve, in order, and they verify.
	other := f.another()
	raws := readLedger(t, other)
	if len(raws) != 12 {
		t.Fatalf("%d lines read back, want 12", len(raws))
	}
	reader := ledger.NewBook(ledgerKey, "", time.Hour)
	if found := reader.Apply(raws); len(found) != 0 {
		t.Fatalf("the lines read back do not verify: %v", found)
	}
	// From the positions it read, nothing is new; after four more, four.
	var since []ledger.Raw
	err := other.View(ctx, func(r reviewlog.Reader) error {
		var err error
		since, err = r.Ledger().Since(ctx, reader.Heads())
		return err
	})
	if err != nil || len(since) != 0 {
		t.Fatalf("read again from where it stood: %d lines, %v", len(since), err)
	}
	if err := s.Locked(ctx, 5*time.Second, func(w reviewlog.Writer) error { _, err := appendEntries(ctx, w, b, 12, 4); return err }); err != nil {
		t.Fatal(err)
	}
	err = other.View(ctx, func(r reviewlog.Reader) error {
		var err error
		since, err = r.Ledger().Since(ctx, reader.Heads())
		return err
	})
	if err != nil || len(since) != 4 || since[0].Seq != 12 {
		t.Fatalf("the new lines: %d (%v)", len(since), err)
	}
	if found := reader.Apply(since); len(found) != 0 {
		t.Fatalf("the new lines do not verify: %v", found)
	}
}

func testLedgerFailedSection(t *testing.T, f *fixture) {
	ctx := context.Background()
	s := f.another()
	b := ledger.NewBook(ledgerKey, "", time.Hour)
	fail := errors.New("the receipt could not be signed")
	err := s.Locked(ctx, 5*time.Second, func(w reviewlog.Writer) error {
		if _, err := appendEntries(ctx, w, b, 0, 2); err != nil {
			return err
		}
		return fail
	})
	if !errors.Is(err, fail) {
		t.Fatalf("the section: %v", err)
	}
	if raws := readLedger(t, f.another()); len(raws) != 0 {
		t.Fatalf("a failed section left %d ledger lines", len(raws))
	}
	// The lane is whole for the next section.
	if err := s.Locked(ctx, 5*time.Second, func(w reviewlog.Writer) error { _, err := appendEntries(ctx, w, b, 0, 1); return err }); err != nil {
		t.Fatal(err)
	}
	if found := ledger.NewBook(ledgerKey, "", time.Hour).Apply(readLedger(t, f.another())); len(found) != 0 {
		t.Fatalf("after a failed section: %v", found)
	}
}

func testLedgerSeqTaken(t *testing.T, f *fixture) {
	ctx := context.Background()
	s := f.another()
	b := ledger.NewBook(ledgerKey, "", time.Hour)
	if err := s.Locked(ctx, 5*time.Second, func(w reviewlog.Writer) error { _, err := appendEntries(ctx, w, b, 0, 2); return err }); err != nil {
		t.Fatal(err)
	}
	// A writer that did not read the lane appends at its start again: a
	// store that numbers lines refuses it; a store of byte offsets cuts
	// off only what lies past the offset it is given, and the readers'
	// checks see the rest. Either way nothing already committed reads
	// differently from what it was.
	stale := ledger.NewBook(ledgerKey, "", time.Hour)
	before := readLedger(t, s)
	err := s.Locked(ctx, 5*time.Second, func(w reviewlog.Writer) error {
		app := w.LedgerAppender()
		e := ledger.Entry{Kind: ledger.KindHold, Lane: app.Lane(), Seq: 0, At: ledger.FormatTime(time.Now()), Receipt: "rcpt_stale", Caller: "c", PayTo: "0xabc", Atomic: "1", Asset: "usdc"}
		line, err := e.Seal(ledgerKey)
		if err != nil {
			return err
		}
		pos, _ := stale.Next(app.Lane())
		return app.Append(ctx, pos, [][]byte{line})
	})
	if !errors.Is(err, ledger.ErrSeqTaken) {
		t.Fatalf("an append at a seq already taken: %v, want ErrSeqTaken", err)
	}
	after := readLedger(t, s)
	if len(after) != len(before) {
		t.Fatalf("%d lines after a refused append, %d before", len(after), len(before))
	}
	for i := range before {
		if string(after[i].Line) != string(before[i].Line) {
			t.Fatalf("line %d changed under a refused append", i)
		}
	}
}
