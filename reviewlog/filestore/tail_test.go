package filestore

import (
	"context"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// TestReceiptTailSkipsOnlyWhatItWouldReadNext: a tail moved past a receipt
// its process appended (Skip) does not read that receipt back, but reads
// every other one: a receipt appended where the tail had not read to (by
// another process before it), and every receipt after.
func TestReceiptTailSkipsOnlyWhatItWouldReadNext(t *testing.T) {
	ctx := context.Background()
	sg := newSegGuard(t)
	mine, other := &reviewlog.Chains{Signer: sg.s}, &reviewlog.Chains{Signer: sg.s}
	var tail reviewlog.ReceiptTail
	next := func() []string {
		t.Helper()
		rs, err := tail.Next(ctx, sg.r())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range rs {
			ids = append(ids, r.ID)
		}
		return ids
	}
	appendOne := func(c *reviewlog.Chains, i int) (string, reviewlog.Appended) {
		t.Helper()
		d := segDraft(i)
		d.Action.Canonical = reviewlog.CanonicalAuthorization // a receipt that reserves
		r, at, err := c.AppendAt(ctx, sg.w(), d)
		if err != nil {
			t.Fatal(err)
		}
		if at.Segment == "" || at.End <= at.Off {
			t.Fatalf("appended at %+v", at)
		}
		return r.ID, at
	}
	first, _ := appendOne(mine, 0)
	if got := next(); len(got) != 1 || got[0] != first {
		t.Fatalf("first read: %v, want [%s]", got, first)
	}
	// Appended where the tail read to: skipped.
	_, at := appendOne(mine, 1)
	tail.Skip(at)
	if got := next(); len(got) != 0 {
		t.Fatalf("read back a receipt skipped: %v", got)
	}
	// Another writer appended first: the tail had not read to this
	// receipt's start, so it is not skipped, and neither is the other.
	before, _ := appendOne(other, 2)
	own, at := appendOne(mine, 3)
	tail.Skip(at)
	if got := next(); len(got) != 2 || got[0] != before || got[1] != own {
		t.Fatalf("after another writer's receipt: %v, want [%s %s]", got, before, own)
	}
	// A receipt appended after a skipped one is read.
	_, at = appendOne(mine, 4)
	tail.Skip(at)
	last, _ := appendOne(other, 5)
	if got := next(); len(got) != 1 || got[0] != last {
		t.Fatalf("after a skipped receipt: %v, want [%s]", got, last)
	}
}
