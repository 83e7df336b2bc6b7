package reviewlog

import (
	"context"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// UncheckReceiptIndex turns off, on l and its lanes, the checks of a
// store's receipt index (rows against their lines, and their numbering),
// so that a test shows an edit of the index gets through without them.
func UncheckReceiptIndex(l *Log) {
	l.rx.unchecked = true
	for _, sub := range l.subs {
		sub.rx.unchecked = true
	}
}

// IndexedLookups are the lookups a decision makes through a store's
// receipt index, each line checked against what was looked up.
func IndexedLookups(ctx context.Context, idx ReceiptIndex) (actions func(string) ([]noa.Receipt, error), reviews func(caller, paramsHash string) ([]string, error), passkey func(string) ([]noa.Receipt, error)) {
	s := &indexSource{ctx: ctx, idx: idx}
	return s.actionReceipts, s.reviewsOf, s.byPasskey
}
