package catalog

import (
	"context"
	"errors"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Operation is the one way to find an operation: it reads run runID in
// full, keeping only the operation's own events, and assembles them under
// t. A run that does not exist or cannot be read is a *RunError; a run
// without the operation a *NoOperationError; a cancelled ctx its error.
func (c *Catalog) Operation(ctx context.Context, runID, opID string, t *receipt.Template) (*receipt.Receipt, error) {
	events, err := c.index.ReadRun(ctx, runID, func(e *receipt.Event) bool { return e.ContextID == opID })
	if err != nil {
		if errors.Is(err, runindex.ErrUnknownRun) {
			return nil, &RunError{RunID: runID, Unknown: true}
		}
		var le *receipt.LineError
		if !errors.As(err, &le) && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &RunError{RunID: runID, Detail: c.Relative(err.Error())}
	}
	if len(events) == 0 {
		return nil, &NoOperationError{RunID: runID, OperationID: opID}
	}
	r := receipt.AssembleOperation(opID, events, t)
	return &r, nil
}
