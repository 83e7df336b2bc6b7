package catalog

import (
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Summary is what the catalog keeps per assembled receipt.
type Summary struct {
	RunID          string
	OperationID    string
	Template       string
	Completeness   string
	MissingStages  []string
	ExceptionCount int
	LastEventAt    string
	// Guard is what the pre-payment guard reads from this receipt.
	Guard guard.Op
}

// compactEvent drops the payload: what the guard reads from it was
// extracted beforehand (guard.FactsOf) and is kept beside the event.
func compactEvent(e receipt.Event) receipt.Event {
	e.Raw = jsjson.Value{}
	return e
}

// extractFacts reads the guard's facts from an event. Its strings may point
// into the run's parse buffer, which is reused: those that repeat (hosts,
// addresses, amounts, assets, an operation's resource) become the read's one
// copy, the others are copied.
func extractFacts(e receipt.Event, share func(string) string) guard.EventFacts {
	f := guard.FactsOf(e)
	// The event's ID is the index's own copy already (Options.Extract).
	f.Problem = strings.Clone(f.Problem)
	f.Host, f.Resource, f.PayTo, f.Atomic, f.Asset = share(f.Host), share(f.Resource), share(f.PayTo), share(f.Atomic), share(f.Asset)
	return f
}

// summaryCost estimates the memory one cached summary holds: the struct
// with its guard figures, plus its strings.
func summaryCost(s Summary) int64 {
	n := int64(400 + len(s.OperationID) + len(s.LastEventAt))
	for _, m := range s.MissingStages {
		n += 16 + int64(len(m))
	}
	if s.Guard.Money != nil {
		n += 120 + int64(len(s.Guard.Money.Asset)+len(s.Guard.Money.Problem))
		for _, v := range s.Guard.Money.PayTos {
			n += 16 + int64(len(v))
		}
		for _, v := range s.Guard.Money.Hosts {
			n += 16 + int64(len(v))
		}
	}
	return n + int64(len(s.Guard.Unattributable))
}

func summarize(runID string, r *receipt.Receipt, facts func(e *receipt.Event) guard.EventFacts) Summary {
	sum := Summary{
		RunID:          runID,
		OperationID:    r.Operation.OperationID,
		Template:       r.Operation.Template,
		Completeness:   r.Completeness,
		MissingStages:  make([]string, 0, len(r.Missing)),
		ExceptionCount: len(r.Exceptions),
	}
	for _, m := range r.Missing {
		sum.MissingStages = append(sum.MissingStages, m.Stage)
	}
	sum.Guard = guard.OpFromFacts(runID, r, facts)
	// The receipt's events are not kept past this point: one copy holds
	// both times, so that they pin none of the events' strings.
	first, last := sum.Guard.FirstEventAt, r.LastEventAt()
	var b strings.Builder
	b.Grow(len(first) + len(last))
	b.WriteString(first)
	b.WriteString(last)
	both := b.String()
	sum.Guard.FirstEventAt, sum.LastEventAt = both[:len(first)], both[len(first):]
	sum.Guard.LastEventAt = sum.LastEventAt
	// Parsed once here: the guard's history is indexed again whenever a
	// run changes, from these summaries (an append keeps the summaries of
	// the operations it did not touch).
	sum.Guard = guard.CacheTimes(sum.Guard)
	return sum
}

// compareSummaries is the order of one run's operations in a listing:
// newest last event first, then operation id.
func compareSummaries(a, b *Summary) int {
	if c := jsjson.CompareUTF16(a.LastEventAt, b.LastEventAt); c != 0 {
		return -c
	}
	return strings.Compare(a.OperationID, b.OperationID)
}

// before reports whether a row comes before another in a listing: newest
// last event first, then the greater run id, then the smaller operation id.
func before(aAt, aRun, aOp, bAt, bRun, bOp string) bool {
	if c := jsjson.CompareUTF16(aAt, bAt); c != 0 {
		return c > 0
	}
	if aRun != bRun {
		return aRun > bRun
	}
	return aOp < bOp
}
