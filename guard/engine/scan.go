package engine

import (
	"context"
	"fmt"

	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// ScanHistory is a HistorySource that reads every run file of an events/
// directory on each call, through a catalog.Catalog of its own that it
// drops afterwards: it keeps nothing between calls, so it suits a program
// that asks rarely. A server keeps one Catalog, whose index and history
// cache last, and gives it to the engine as its history source instead.
type ScanHistory struct {
	Events *confined.Dir
	Limits receipt.Limits
}

// History reads every run under t. A run that cannot be read is reported,
// never skipped silently, and never hides the other runs.
func (s ScanHistory) History(ctx context.Context, t *receipt.Template) (guard.History, error) {
	if s.Events == nil {
		return guard.History{}, fmt.Errorf("list runs: no events directory")
	}
	c, err := catalog.New(catalog.Config{Events: s.Events, Limits: s.Limits})
	if err != nil {
		return guard.History{}, err
	}
	h, err := c.History(ctx, t)
	if err != nil {
		return guard.History{}, fmt.Errorf("list runs: %w", err)
	}
	return h, nil
}
