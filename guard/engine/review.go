package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// ReviewStatus is a review as get_review_status reports it: its state and
// the signed receipts that record it — its opening, the human decision, the
// use of an approval, and the first answer of every other kind; the same
// answer given again (a pending review or a hold repeated) is in the chain
// each time but listed once, so the status stays the same size however
// often the agent asks.
type ReviewStatus struct {
	reviewlog.Review
	Receipts []string `json:"receipts"`
	// Quorum says how far a review that needs several approvals is: "1 of
	// 2 approvals (alice)" ("" when one approval suffices).
	Quorum string `json:"quorum,omitempty"`
	// Moot: the review is pending, but its question would now be answered
	// without review; it no longer counts towards the caller's pending
	// cap, and a reviewer may still decide it.
	Moot bool `json:"moot,omitempty"`
	// Reservations are the reservations to the review's counterparty
	// that hold now; ReservedTotal counts those to anyone (they bear on
	// the total and velocity limits), and ReservationProblems say where
	// the records and the signed chain disagree.
	Reservations        []*ReservationInfo `json:"reservations,omitempty"`
	ReservedTotal       int                `json:"reserved_total"`
	ReservationProblems []string           `json:"reservation_problems,omitempty"`
}

// ErrUnknownReview is returned for an id no review has.
var ErrUnknownReview = errors.New("no such review")

// ReviewStatus reads one review's state and its receipts.
func (e *Engine) ReviewStatus(ctx context.Context, id string) (ReviewStatus, error) {
	rv, ids, err := e.cfg.Log.Verified(ctx, id)
	switch {
	case errors.Is(err, reviewlog.ErrUnknownReview), errors.Is(err, reviewlog.ErrBadID):
		return ReviewStatus{}, fmt.Errorf("%w: %q", ErrUnknownReview, id)
	case err != nil:
		return ReviewStatus{}, fmt.Errorf("read review %s: %w", id, err)
	}
	e.integrity(rv)
	rv.AssetSymbol = e.assetSymbol(rv.Asset)
	if e.cfg.ReviewURL != nil {
		rv.ReviewURL = e.cfg.ReviewURL(rv.ID)
	}
	st := ReviewStatus{Review: rv, Receipts: ids, Quorum: reviewlog.QuorumText(rv)}
	if err := e.bearing(ctx, &st); err != nil {
		return ReviewStatus{}, fmt.Errorf("read the reservations bearing on review %s: %w", id, err)
	}
	return st, nil
}

// bearing adds what bears on a review now: the reservations, and whether
// its question would now be answered without review.
func (e *Engine) bearing(ctx context.Context, st *ReviewStatus) error {
	judged, now, err := e.judgedNow(ctx, true)
	if err != nil {
		return err
	}
	st.ReservationProblems = judged.ReservationProblems
	for _, en := range e.book.Live(now) {
		i := e.entryInfo(en)
		if i == nil {
			continue
		}
		st.ReservedTotal++
		if bearsOn(i, st.Review) {
			st.Reservations = append(st.Reservations, i)
		}
	}
	st.Moot = st.Status == reviewlog.Pending && e.moot(st.Review, judged, now)
	return nil
}

// Decider records a human's decision on a review: the log line and the
// receipt, signed with the reviewer's own key into the reviewer's chain, are
// written together under the log's lock, or neither is.
type Decider struct {
	Log *reviewlog.Log
	// Chains signs with the reviewer's key.
	Chains *reviewlog.Chains
	// ExpectTermsHash, when set, is the TermsHash of the terms the reviewer
	// was shown; the decision is refused, nothing written, when the
	// review's signed terms are any other.
	ExpectTermsHash string
}

// Decide approves (status reviewlog.Approved) or rejects a review.
func (d Decider) Decide(ctx context.Context, id, status, note, by string) (reviewlog.Review, error) {
	return d.Log.DecideReview(ctx, id, status, note, by, func(tx reviewlog.Tx) error {
		if d.ExpectTermsHash != "" && tx.Review.TermsHash != d.ExpectTermsHash {
			return fmt.Errorf("%w: review %s's signed terms (%s) are not the terms you were shown (%s); nothing was written — show it again", reviewlog.ErrTampered, id, tx.Review.TermsHash, d.ExpectTermsHash)
		}
		draft, err := HumanDecisionDraft(tx.Review)
		if err != nil {
			return err
		}
		_, err = d.Chains.Append(ctx, tx.Store, draft)
		return err
	})
}

// NotReadyError says why the engine cannot answer now; Reason is safe to
// show to an unauthenticated probe (no paths), Err is for the log.
type NotReadyError struct {
	Reason string
	Err    error
}

func (e *NotReadyError) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *NotReadyError) Unwrap() error { return e.Err }

// TenantNotReady names the tenant whose readiness check failed with err,
// keeping the reason err gave (or "not ready"), so every front that serves
// tenants says the same thing on /readyz.
func TenantNotReady(tenant string, err error) *NotReadyError {
	reason := "not ready"
	var nr *NotReadyError
	if errors.As(err, &nr) {
		reason = nr.Reason
	}
	return &NotReadyError{Reason: fmt.Sprintf("tenant %q: %s", tenant, reason), Err: err}
}

// pinger is a signer that can be asked whether it answers (a signer
// process); a key held in memory always does.
type pinger interface {
	Ping(ctx context.Context) error
}

// Ready reports whether a decision could be recorded now: the signer
// answers, the review log can be appended to, and the trusted reviewers can
// be read.
func (e *Engine) Ready(ctx context.Context) error {
	if p, ok := e.cfg.Chains.Signer.(pinger); ok {
		if err := p.Ping(ctx); err != nil {
			return &NotReadyError{Reason: "the signer does not answer", Err: err}
		}
	}
	if err := e.cfg.Log.Appendable(ctx); err != nil {
		return &NotReadyError{Reason: "the guard's store cannot take a decision (" + e.cfg.Log.Store().Describe() + ")", Err: err}
	}
	if err := e.cfg.Log.ReviewersReadable(); err != nil {
		return &NotReadyError{Reason: "the trusted reviewers file cannot be read", Err: err}
	}
	return nil
}
