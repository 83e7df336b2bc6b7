package engine

import (
	"context"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// judgedNow is the history a question would be judged against now: the
// Trace under the policy's history templates, with what earlier allows
// still reserve (the records the signed chain and this server's key back).
func (e *Engine) judgedNow(ctx context.Context) (guard.History, reviewlog.ReservationView, time.Time, error) {
	v, err := e.cfg.Log.Reservations(ctx, e.Policy().ReservationTTL)
	if err != nil {
		return guard.History{}, v, time.Time{}, err
	}
	hist, err := e.history(ctx)
	if err != nil {
		return guard.History{}, v, time.Time{}, err
	}
	now := e.cfg.Now()
	return e.withReservations(hist, v, now), v, now, nil
}

// Moot is, for the pending reviews among reviews, whether each would now
// be answered without review: the judgement get_review_status reports as
// moot and the queue cap leaves out, with the history read once. Problems
// are the reservation records that do not verify (altered, forged, or
// sealed with another key than this engine's params key); the judgement
// counts only those that do, as a question would.
func (e *Engine) Moot(ctx context.Context, reviews []reviewlog.Review) (moot map[string]bool, problems []string, err error) {
	judged, _, now, err := e.judgedNow(ctx)
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
