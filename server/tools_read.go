package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

func (s *Server) tools() []toolDef {
	return []toolDef{
		{
			name:  "list_operations",
			title: "List operation receipts",
			description: "List this agent's paid operations with their receipt verdict (full or partial), newest first. " +
				"An operation is identified by (run_id, operation_id). Unreadable runs are reported beside the good ones. " +
				"When more operations follow, next_cursor is returned: pass it as cursor to read the next page.",
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
	NextCursor     string          `json:"next_cursor,omitempty"`
}

func (s *Server) listOperations(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	a := newArgs(raw, "template", "run", "completeness", "limit", "cursor")
	q := catalog.ListQuery{
		Template:     a.str("template", false, guard.DefaultTemplate, 64),
		Run:          a.str("run", false, "", 200),
		Completeness: a.str("completeness", false, "", 16),
	}
	a.oneOf("completeness", q.Completeness, "full", "partial")
	q.Limit = a.intIn("limit", 50, 1, 100)
	q.Cursor = a.str("cursor", false, "", catalog.MaxCursorBytes)
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	page, err := s.cfg.Catalog.List(ctx, q)
	if err != nil {
		return nil, listError(err)
	}
	res := listResult{Operations: make([]operationRow, 0, len(page.Operations)), RunsScanned: page.RunsScanned,
		UnreadableRuns: make([]unreadableRun, 0, len(page.Unreadable)), NextCursor: page.NextCursor}
	for _, u := range page.Unreadable {
		res.UnreadableRuns = append(res.UnreadableRuns, unreadableRun{RunID: u.RunID, Error: u.Error})
	}
	for _, it := range page.Operations {
		res.Operations = append(res.Operations, operationRow{
			RunID: it.RunID, OperationID: it.OperationID, Template: it.Template, Completeness: it.Completeness,
			MissingStages: it.MissingStages, ExceptionCount: it.ExceptionCount, LastEventAt: it.LastEventAt,
		})
	}
	return structured(res, renderList(res)), nil
}

// listError words the catalog's refusals of a listing for the caller;
// anything else is for the operator's log.
func listError(err error) error {
	var te *catalog.TemplateError
	var re *catalog.RunError
	var ce *catalog.CursorError
	switch {
	case errors.As(err, &te):
		return userErrorf("%s", te.Error())
	case errors.As(err, &re) && re.Unknown:
		return userErrorf("no run %q under events/ (list_operations without run shows every run)", re.RunID)
	case errors.As(err, &re):
		return userErrorf("run %q cannot be read: %s", re.RunID, re.Detail)
	case errors.As(err, &ce):
		switch ce.Kind {
		case catalog.CursorOtherVersion:
			return userErrorf("cursor was written by another version of this server: start again without cursor")
		case catalog.CursorOtherListing:
			return userErrorf("cursor belongs to a listing with other arguments (template %q, run %q, completeness %q): repeat those with it, or start again without cursor",
				ce.Template, ce.Run, ce.Completeness)
		}
		return userErrorf("cursor is not one list_operations returned (or it was cut short): pass next_cursor exactly as returned, or start again without cursor")
	}
	return err
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
	tname := a.str("template", false, guard.DefaultTemplate, 64)
	if msg := a.err(); msg != "" {
		return "", nil, userErrorf("%s", msg)
	}
	t, err := s.template(tname)
	if err != nil {
		return "", nil, err
	}
	r, err := s.cfg.Catalog.Operation(ctx, runID, opID, t)
	var re *catalog.RunError
	var no *catalog.NoOperationError
	switch {
	case err == nil:
		return runID, r, nil
	case errors.As(err, &re) && re.Unknown:
		return "", nil, userErrorf("no run %q under events/ (list_operations shows the runs there)", runID)
	case errors.As(err, &re):
		return "", nil, userErrorf("run %q cannot be read: %s", runID, re.Detail)
	case errors.As(err, &no):
		return "", nil, userErrorf("run %q has no operation %q (list_operations with run=%q shows its operations)", runID, opID, runID)
	}
	return "", nil, err
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
