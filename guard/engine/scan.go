package engine

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// ScanHistory is a HistorySource that reads every run file of an events/
// directory on each call. It keeps nothing between calls, so it suits a
// program that asks rarely; a server keeps an index instead.
type ScanHistory struct {
	Events *confined.Dir
	Limits receipt.Limits
}

// History reads every run under t. A run that cannot be read is reported,
// never skipped silently, and never hides the other runs.
func (s ScanHistory) History(ctx context.Context, t *receipt.Template) (guard.History, error) {
	entries, err := s.Events.ReadDir()
	if err != nil {
		return guard.History{}, fmt.Errorf("list runs: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	var h guard.History
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return guard.History{}, err
		}
		id, ok := receipt.RunIDFromFileName(e.Name)
		if !ok {
			continue
		}
		if !e.Regular() {
			h.Unreadable = append(h.Unreadable, guard.UnreadableRun{RunID: id, Error: fmt.Sprintf("run %s is a %s, not a regular file", id, e.Kind())})
			continue
		}
		ops, err := s.readRun(id, e.Name, t)
		if err != nil {
			h.Unreadable = append(h.Unreadable, guard.UnreadableRun{RunID: id, Error: strings.ReplaceAll(err.Error(), s.Events.Path()+"/", "")})
			continue
		}
		h.Runs++
		h.Ops = append(h.Ops, ops...)
	}
	h.BuildIndex()
	return h, nil
}

func (s ScanHistory) readRun(id, name string, t *receipt.Template) ([]guard.Op, error) {
	f, err := s.Events.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	lim := s.Limits
	if lim.MaxRunBytes <= 0 {
		lim = receipt.DefaultLimits()
	}
	if st, err := f.Stat(); err != nil {
		return nil, err
	} else if st.Size() > lim.MaxRunBytes {
		return nil, fmt.Errorf("run %s: file is %d bytes, over the limit of %d bytes a run may have", id, st.Size(), lim.MaxRunBytes)
	}
	var events []receipt.Event
	if _, _, err := receipt.ReadEvents(f, 1, lim, func(e receipt.Event) error {
		events = append(events, e)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("run %s: %w", id, err)
	}
	res := receipt.Assemble(events, t)
	return guard.OpsFromResult(id, &res), nil
}
