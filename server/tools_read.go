package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

func (s *Server) tools() []toolDef {
	return []toolDef{
		{
			name:  "list_operations",
			title: "List operation receipts",
			description: "List this agent's paid operations with their receipt verdict (full or partial), newest first. " +
				"An operation is identified by (run_id, operation_id). Unreadable runs are reported beside the good ones.",
			readOnly: true, idempotent: true,
			handler: s.listOperations,
		},
		{
			name:        "get_receipt",
			title:       "Get one operation receipt",
			description: "Return the full Haia Trace receipt of one operation, exactly as the reference assembler builds it, plus its run_id.",
			readOnly:    true, idempotent: true,
			handler: s.getReceipt,
		},
		{
			name:  "explain",
			title: "Explain one operation receipt",
			description: "Explain in one plain-language paragraph what was and was not observed for one operation, " +
				"including the buyer-side blind spot when a payment's outcome was never confirmed.",
			readOnly: true, idempotent: true,
			handler: s.explain,
		},
	}
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
	f.EventID = strings.Clone(f.EventID)
	f.Host = strings.Clone(f.Host)
	f.PayTo = strings.Clone(f.PayTo)
	f.Atomic = strings.Clone(f.Atomic)
	f.Asset = strings.Clone(f.Asset)
	f.Problem = strings.Clone(f.Problem)
	return f
}

// factsCost estimates the memory of one event's guard facts.
func factsCost(f guard.EventFacts) int64 {
	return 112 + int64(len(f.EventID)+len(f.Host)+len(f.PayTo)+len(f.Atomic)+len(f.Asset)+len(f.Problem))
}

// summaryCost estimates the memory one cached summary holds: the struct
// with its guard figures, plus its strings.
func summaryCost(s opSummary) int64 {
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

func summarize(runID string, r *receipt.Receipt, facts func(e *receipt.Event) guard.EventFacts) opSummary {
	sum := opSummary{
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

type operationRow struct {
	RunID          string   `json:"run_id"`
	OperationID    string   `json:"operation_id"`
	Template       string   `json:"template"`
	Completeness   string   `json:"completeness"`
	MissingStages  []string `json:"missing_stages"`
	ExceptionCount int      `json:"exception_count"`
	LastEventAt    string   `json:"last_event_at"`
}

type unreadableRun struct {
	RunID string `json:"run_id"`
	Error string `json:"error"`
}

type listResult struct {
	Operations     []operationRow  `json:"operations"`
	RunsScanned    int             `json:"runs_scanned"`
	UnreadableRuns []unreadableRun `json:"unreadable_runs"`
}

func (s *Server) listOperations(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	a := newArgs(raw, "template", "run", "completeness", "limit")
	tname := a.str("template", false, DefaultTemplate, 64)
	runSel := a.str("run", false, "", 200)
	completeness := a.str("completeness", false, "", 16)
	a.oneOf("completeness", completeness, "full", "partial")
	limit := a.intIn("limit", 50, 1, 100)
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	t, err := s.template(tname)
	if err != nil {
		return nil, err
	}
	listing, err := s.index.List(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	res := listResult{Operations: []operationRow{}, UnreadableRuns: []unreadableRun{}}
	runs := listing.Runs
	switch runSel {
	case "":
	case "latest":
		runs = latestRun(runs)
	default:
		runs = nil
		for _, rv := range listing.Runs {
			if rv.RunID == runSel {
				runs = append(runs, rv)
			}
		}
		if len(runs) == 0 {
			for _, u := range listing.Unreadable {
				if u.RunID == runSel {
					return nil, userErrorf("run %q cannot be read: %s", runSel, s.relative(u.Err.Error()))
				}
			}
			return nil, userErrorf("no run %q under events/ (list_operations without run shows every run)", runSel)
		}
	}
	for _, u := range listing.Unreadable {
		if runSel == "" || runSel == "latest" || u.RunID == runSel {
			res.UnreadableRuns = append(res.UnreadableRuns, unreadableRun{RunID: u.RunID, Error: s.relative(u.Err.Error())})
		}
	}
	res.RunsScanned = len(runs)
	// Sort pointers to the cached summaries and copy out only the rows
	// returned: a large root has tens of thousands of operations.
	var picked []*opSummary
	for _, rv := range runs {
		for i := range rv.Items {
			if completeness == "" || rv.Items[i].Completeness == completeness {
				picked = append(picked, &rv.Items[i])
			}
		}
	}
	sort.Slice(picked, func(i, j int) bool {
		a, b := picked[i], picked[j]
		if c := jsjson.CompareUTF16(a.LastEventAt, b.LastEventAt); c != 0 {
			return c > 0
		}
		if a.RunID != b.RunID {
			return a.RunID > b.RunID
		}
		return a.OperationID < b.OperationID
	})
	if len(picked) > limit {
		picked = picked[:limit]
	}
	for _, it := range picked {
		res.Operations = append(res.Operations, operationRow{
			RunID: it.RunID, OperationID: it.OperationID, Template: it.Template, Completeness: it.Completeness,
			MissingStages: it.MissingStages, ExceptionCount: it.ExceptionCount, LastEventAt: it.LastEventAt,
		})
	}
	return structured(res, renderList(res)), nil
}

// latestRun picks the run whose newest event is the latest (ties: the
// greatest run id), which is the recorder session that wrote last.
func latestRun(runs []runindex.RunView[opSummary]) []runindex.RunView[opSummary] {
	best := -1
	for i, rv := range runs {
		if best < 0 {
			best = i
			continue
		}
		c := jsjson.CompareUTF16(rv.LastEventAt, runs[best].LastEventAt)
		if c > 0 || (c == 0 && rv.RunID > runs[best].RunID) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	return runs[best : best+1]
}

func renderList(res listResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d operation(s) from %d run(s)", len(res.Operations), res.RunsScanned)
	if n := len(res.UnreadableRuns); n > 0 {
		fmt.Fprintf(&b, "; %d run(s) could not be read", n)
	}
	b.WriteString(".\n")
	for _, op := range res.Operations {
		fmt.Fprintf(&b, "- %s / %s: %s", op.RunID, op.OperationID, op.Completeness)
		if len(op.MissingStages) > 0 {
			fmt.Fprintf(&b, ", missing %s", strings.Join(op.MissingStages, ", "))
		}
		if op.ExceptionCount > 0 {
			fmt.Fprintf(&b, ", %d fault(s)", op.ExceptionCount)
		}
		fmt.Fprintf(&b, " (last event %s)\n", op.LastEventAt)
	}
	for _, u := range res.UnreadableRuns {
		fmt.Fprintf(&b, "! run %s unreadable: %s\n", u.RunID, u.Error)
	}
	return b.String()
}

// findReceipt reads one run in full and assembles the named operation.
func (s *Server) findReceipt(ctx context.Context, raw any) (string, *receipt.Receipt, error) {
	a := newArgs(raw, "run_id", "operation_id", "template")
	runID := a.str("run_id", true, "", 200)
	opID := a.str("operation_id", true, "", 500)
	tname := a.str("template", false, DefaultTemplate, 64)
	if msg := a.err(); msg != "" {
		return "", nil, userErrorf("%s", msg)
	}
	t, err := s.template(tname)
	if err != nil {
		return "", nil, err
	}
	// Only the operation's own events are kept while the run is read.
	events, err := s.index.ReadRun(ctx, runID, func(e *receipt.Event) bool { return e.ContextID == opID })
	if err != nil {
		if errors.Is(err, runindex.ErrUnknownRun) {
			return "", nil, userErrorf("no run %q under events/ (list_operations shows the runs there)", runID)
		}
		var le *receipt.LineError
		if errors.As(err, &le) {
			return "", nil, userErrorf("run %q cannot be read: %s", runID, s.relative(err.Error()))
		}
		if ctx.Err() != nil {
			return "", nil, ctx.Err()
		}
		return "", nil, userErrorf("run %q cannot be read: %s", runID, s.relative(err.Error()))
	}
	if len(events) > 0 {
		r := receipt.AssembleOperation(opID, events, t)
		return runID, &r, nil
	}
	return "", nil, userErrorf("run %q has no operation %q (list_operations with run=%q shows its operations)", runID, opID, runID)
}

func (s *Server) getReceipt(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	runID, r, err := s.findReceipt(ctx, raw)
	if err != nil {
		return nil, err
	}
	body := r.AppendJSON(nil, "", "  ")
	// The receipt's members follow run_id, in the assembler's order.
	structuredJSON := make([]byte, 0, len(body)+len(runID)+16)
	structuredJSON = append(structuredJSON, `{"run_id":`...)
	structuredJSON = jsjson.AppendString(structuredJSON, runID)
	structuredJSON = append(structuredJSON, ',')
	structuredJSON = append(structuredJSON, body[1:]...)
	return structured(rawJSON(structuredJSON), string(body)), nil
}

type explainResult struct {
	RunID        string `json:"run_id"`
	OperationID  string `json:"operation_id"`
	Template     string `json:"template"`
	Completeness string `json:"completeness"`
	Explanation  string `json:"explanation"`
}

func (s *Server) explain(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	runID, r, err := s.findReceipt(ctx, raw)
	if err != nil {
		return nil, err
	}
	res := explainResult{
		RunID:        runID,
		OperationID:  r.Operation.OperationID,
		Template:     r.Operation.Template,
		Completeness: r.Completeness,
		Explanation:  receipt.Explain(runID, r),
	}
	return structured(res, res.Explanation), nil
}
