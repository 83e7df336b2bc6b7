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

// extractFacts reads the guard's facts from an event and copies their
// strings, which may otherwise point into the run's whole parse buffer and
// keep it alive.
func extractFacts(e receipt.Event) guard.EventFacts {
	f := guard.FactsOf(e)
	// One copy holding all six strings: one allocation instead of six.
	var b strings.Builder
	b.Grow(len(f.EventID) + len(f.Host) + len(f.PayTo) + len(f.Atomic) + len(f.Asset) + len(f.Problem))
	for _, s := range []string{f.EventID, f.Host, f.PayTo, f.Atomic, f.Asset, f.Problem} {
		b.WriteString(s)
	}
	all := b.String()
	cut := func(s string) string {
		part := all[:len(s)]
		all = all[len(s):]
		return part
	}
	f.EventID, f.Host, f.PayTo, f.Atomic, f.Asset, f.Problem = cut(f.EventID), cut(f.Host), cut(f.PayTo), cut(f.Atomic), cut(f.Asset), cut(f.Problem)
	return f
}

// factsCost estimates the memory of one event's guard facts.
func factsCost(f guard.EventFacts) int64 {
	return 112 + int64(len(f.EventID)+len(f.Host)+len(f.PayTo)+len(f.Atomic)+len(f.Asset)+len(f.Problem))
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
	sum.LastEventAt = r.LastEventAt()
	sum.Guard = guard.OpFromFacts(runID, r, facts)
	// The receipt's events are not kept past this point.
	sum.Guard.LastEventAt = sum.LastEventAt
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
