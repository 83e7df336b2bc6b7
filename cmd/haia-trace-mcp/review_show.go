package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// explainRef is the explain paragraph of one evidence operation, read now
// through the catalog the guard reads (the same templates), so the reviewer
// sees what the agent saw. A run that is gone or unreadable says so instead.
func explainRef(ctx context.Context, cat *catalog.Catalog, template string, ref guard.Ref) string {
	t, err := cat.Template(template)
	if err != nil {
		return fmt.Sprintf("(no explanation: %v)", err)
	}
	r, err := cat.Operation(ctx, ref.RunID, ref.OperationID, t)
	var re *catalog.RunError
	var no *catalog.NoOperationError
	switch {
	case err == nil:
		return receipt.Explain(ref.RunID, r)
	case errors.As(err, &re) && re.Unknown && (ref.RunID == guard.CommitRun || ref.RunID == "reservation"):
		return fmt.Sprintf("an amount held by an earlier allow (receipt %s), not a payment the Trace shows: it counts until the Trace shows the payment or it stops counting (see status)", ref.OperationID)
	case errors.As(err, &re) && re.Unknown:
		return fmt.Sprintf("(no explanation: run %s is no longer under events/)", ref.RunID)
	case errors.As(err, &re):
		return fmt.Sprintf("(no explanation: run %s cannot be read: %s)", ref.RunID, re.Detail)
	case errors.As(err, &no):
		return fmt.Sprintf("(no explanation: run %s has no operation %s)", ref.RunID, ref.OperationID)
	}
	return fmt.Sprintf("(no explanation: %v)", err)
}

// reviewPrintCaps tells the reviewer which callers are at or near the cap
// on pending reviews, past which their questions are blocked
// (review_queue_full) instead of queued. Moot reviews do not count, as
// they do not for the guard.
func reviewPrintCaps(w io.Writer, reviews []reviewlog.Review, max int, moot map[string]bool) {
	count := map[string]int{}
	for _, r := range reviews {
		if r.Status == reviewlog.Pending && r.Caller != "" && !moot[r.ID] {
			count[r.Caller]++
		}
	}
	callers := make([]string, 0, len(count))
	for c := range count {
		callers = append(callers, c)
	}
	sort.Strings(callers)
	for _, c := range callers {
		n := count[c]
		switch {
		case n >= max:
			fmt.Fprintf(w, "caller %s holds %d pending reviews, the cap (maxPendingReviewsPerCaller %d): its questions that need a review are blocked until some are decided\n", reviewOneLine(c), n, max)
		case n*4 >= max*3:
			fmt.Fprintf(w, "caller %s holds %d of at most %d pending reviews\n", reviewOneLine(c), n, max)
		}
	}
}
