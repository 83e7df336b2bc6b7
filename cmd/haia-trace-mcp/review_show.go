package main

import (
	"fmt"
	"io"
	"sort"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// explainRef is the explain paragraph of one evidence operation, read from
// its run file now, so the reviewer sees what the agent saw. A run that is
// gone or unreadable says so instead.
func explainRef(root *confined.Dir, template string, ref guard.Ref) string {
	if template == "" {
		template = guard.DefaultTemplate
	}
	t, err := receipt.Resolver{}.Resolve(template)
	if err != nil {
		return fmt.Sprintf("(no explanation: template %s: %v)", template, err)
	}
	events, err := root.OpenDir("events")
	if err != nil {
		return fmt.Sprintf("(no explanation: %v)", err)
	}
	defer events.Close()
	entries, err := events.ReadDir()
	if err != nil {
		return fmt.Sprintf("(no explanation: %v)", err)
	}
	name := ""
	for _, e := range entries {
		if id, ok := receipt.RunIDFromFileName(e.Name); ok && id == ref.RunID && e.Regular() {
			name = e.Name
		}
	}
	if name == "" {
		return fmt.Sprintf("(no explanation: run %s is no longer under events/)", ref.RunID)
	}
	f, err := events.Open(name)
	if err != nil {
		return fmt.Sprintf("(no explanation: %v)", err)
	}
	defer f.Close()
	var kept []receipt.Event
	if _, _, err := receipt.ReadEvents(f, 1, receipt.DefaultLimits(), func(e receipt.Event) error {
		if e.ContextID == ref.OperationID {
			kept = append(kept, e)
		}
		return nil
	}); err != nil {
		return fmt.Sprintf("(no explanation: run %s cannot be read: %v)", ref.RunID, err)
	}
	if len(kept) == 0 {
		return fmt.Sprintf("(no explanation: run %s has no operation %s)", ref.RunID, ref.OperationID)
	}
	r := receipt.AssembleOperation(ref.OperationID, kept, t)
	return receipt.Explain(ref.RunID, &r)
}

// reviewPrintCaps tells the reviewer which callers are at or near the cap
// on pending reviews, past which their questions are blocked
// (review_queue_full) instead of queued.
func reviewPrintCaps(w io.Writer, reviews []reviewlog.Review, max int) {
	count := map[string]int{}
	for _, r := range reviews {
		if r.Status == reviewlog.Pending && r.Caller != "" {
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
