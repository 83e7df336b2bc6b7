package engine

import (
	"context"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// judgedNow is the history a question would be judged against now: the
// Trace under the policy's history templates, with what the spend ledger
// holds (its verified entries).
// With decide, it is read for decisions only (see historyFor).
func (e *Engine) judgedNow(ctx context.Context, decide bool) (guard.History, time.Time, error) {
	if err := e.cfg.Log.Store().View(ctx, func(r reviewlog.Reader) error { return e.catchUp(ctx, r) }); err != nil {
		return guard.History{}, time.Time{}, err
	}
	hist, err := e.historyFor(ctx, decide)
	if err != nil {
		return guard.History{}, time.Time{}, err
	}
	now := e.cfg.Now()
	return e.withLedger(hist, now), now, nil
}

// Moot is, for the pending reviews among reviews, whether each would now
// be answered without review: the judgement get_review_status reports as
// moot and the queue cap leaves out, with the history read once. Problems
// are the reservation records that do not verify (altered, forged, or
// sealed with another key than this engine's params key); the judgement
// counts only those that do, as a question would.
func (e *Engine) Moot(ctx context.Context, reviews []reviewlog.Review) (moot map[string]bool, problems []string, err error) {
	judged, now, err := e.judgedNow(ctx, true)
	if err != nil {
		return nil, nil, err
	}
	moot = map[string]bool{}
	for _, r := range reviews {
		if r.Status == reviewlog.Pending && e.moot(r, judged, now) {
			moot[r.ID] = true
		}
	}
	return moot, judged.ReservationProblems, nil
}
