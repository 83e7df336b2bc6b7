// Package steptime times the steps of one paying call for the operator's
// debug log, so that where a call's time goes can be read from a running
// server rather than guessed (docs/performance.md).
package steptime

import (
	"context"
	"log/slog"
	"time"
)

// Clock times the steps of one call. It reads no clock and keeps nothing
// when its logger does not log at debug level, so a server at info level
// pays one Enabled check per call.
type Clock struct {
	on          bool
	began, last time.Time
	attrs       []any
}

// Start begins timing a call when l logs at debug level.
func Start(ctx context.Context, l *slog.Logger) *Clock {
	if l == nil || !l.Enabled(ctx, slog.LevelDebug) {
		return &Clock{}
	}
	now := time.Now()
	return &Clock{on: true, began: now, last: now, attrs: make([]any, 0, 16)}
}

// Step ends the step name: its time is from the previous step's end (or
// the start) to now.
func (c *Clock) Step(name string) {
	if !c.on {
		return
	}
	now := time.Now()
	c.attrs = append(c.attrs, name, now.Sub(c.last))
	c.last = now
}

// Log writes msg at debug level with each step's time, then total (from
// the start), then the attributes given.
func (c *Clock) Log(ctx context.Context, l *slog.Logger, msg string, attrs ...any) {
	if !c.on {
		return
	}
	args := append(c.attrs, "total", time.Since(c.began))
	l.DebugContext(ctx, msg, append(args, attrs...)...)
}
