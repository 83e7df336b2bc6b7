package engine

import (
	"context"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// AskRequest is one question for the review outcome policy (Ask): the
// guard's own answer, the policy's review settings, and what the log
// records of the answer.
type AskRequest struct {
	Caller     string
	Question   guard.Question
	ParamsHash string
	// Decision is the guard's own answer (after custom rules).
	Decision string
	// Reasons go into a review that is opened.
	Reasons                    []guard.Reason
	ApprovalTTL, RejectionHold time.Duration
	// MaxPending caps the caller's pending reviews (no cap when 0).
	MaxPending int
	// ExactParams honours an approval only for a review opened with this
	// very ParamsHash: a proxied tool call's hash covers the exact
	// arguments forwarded, so an approval is spent on that call alone.
	// (The terms carry the ParamsHash, so every approval is bound to it.)
	ExactParams bool
	// Tenant, Resource (canonical URL, or "") and AmountAtomic (the
	// amount in atomic units, "" when it cannot be read) complete the
	// terms of a review (see reviewlog.Terms).
	Tenant, Resource, AmountAtomic string
	// Approvals is the quorum of the caller's policy for this amount
	// (guard.Config.ApprovalsFor): a review opened now needs that many
	// distinct reviewers, and a review is reused, or its approval
	// honoured, only when its signed terms need at least as many.
	Approvals int

	// Judge, when set, decides inside the lock, from the section's store
	// (the spend ledger as it stands), and replaces Decision and Reasons:
	// so that what earlier allows committed is counted by the next
	// question whichever process or replica answers it.
	Judge func(w reviewlog.Writer) (decision string, reasons []guard.Reason, err error)
	// Used, when set, says whether the spend ledger holds a use of a
	// review's approval: a signed use, whatever the review log says, and
	// such an approval is not honoured again.
	Used func(review string) bool
	// Prefetch names what Judge will read beside the log (see
	// reviewlog.AskRequest.Prefetch).
	Prefetch func() *reviewlog.Prefetch
	// Moot, when set, says whether one of the caller's pending reviews
	// would now be answered without review; a moot review does not count
	// towards MaxPending.
	Moot func(r reviewlog.Review) bool
	// Authorized, when set, gives the signed authorization the hook
	// committed, recorded in the same commit (see
	// reviewlog.AskRequest.Authorized).
	Authorized func() *reviewlog.Authorized
	// DryRun: decide and run the hook, but append nothing (the hook must
	// write nothing either).
	DryRun bool
	// Totals: the answer reads sums over every counterparty (see
	// reviewlog.AskRequest.Totals).
	Totals bool
}

// Ask is the review outcome policy, applied under the log's lock: it
// honours a trusted approval of this caller's identical question (once),
// holds a trusted rejection, reuses the caller's pending review, refuses
// to open one past the caller's cap, opens a new one, or lets the guard's
// own answer stand. hook runs before anything is appended and writes the
// answer's receipt; when it fails, nothing is written.
//
// A block is never turned into anything else; an approval only turns a
// review into an allow.
func Ask(ctx context.Context, log *reviewlog.Log, req AskRequest, hook func(tx reviewlog.Tx, out reviewlog.AskOutcome) error) (reviewlog.AskOutcome, error) {
	rec := reviewlog.AskRequest{Caller: req.Caller, Question: req.Question, ParamsHash: req.ParamsHash,
		Tenant: req.Tenant, Resource: req.Resource, AmountAtomic: req.AmountAtomic, Approvals: req.Approvals, DryRun: req.DryRun, Totals: req.Totals, Prefetch: req.Prefetch,
		Authorized: req.Authorized}
	return log.Ask(ctx, rec, func(v *reviewlog.AskView) (reviewlog.AskPlan, error) { return settle(v, req) }, hook)
}

// settle chooses the answer to one question from what the log holds.
func settle(v *reviewlog.AskView, req AskRequest) (reviewlog.AskPlan, error) {
	at := v.At()
	if req.Judge != nil {
		var err error
		if req.Decision, req.Reasons, err = req.Judge(v.Writer()); err != nil {
			return reviewlog.AskPlan{}, err
		}
	}
	// What allows reserves its payment: the guard's own allow, or an
	// approval used.
	plain := reviewlog.AskPlan{Kind: reviewlog.AskPlain, Reserve: req.Decision == guard.Allow}
	// The terms this question would be asked under; an approval is
	// honoured, and a pending review reused, only for these.
	want := v.Terms(req.Reasons)
	// The caller's reviews of this very question, newest first.
	resolved, err := v.Reviews()
	if err != nil {
		return reviewlog.AskPlan{}, err
	}
	if req.Decision != guard.Block {
		// The newest decision a trusted reviewer signed speaks first.
		for _, r := range resolved {
			if r.Status != reviewlog.Approved && r.Status != reviewlog.Rejected {
				continue
			}
			decided, ok := r.Decided()
			if !ok {
				break
			}
			if r.Status == reviewlog.Rejected && at.Before(decided.Add(req.RejectionHold)) {
				return reviewlog.AskPlan{Kind: reviewlog.AskRejected, Review: r}, nil
			}
			// An approval answers only the terms it signed: the same
			// caller, tenant, counterparty, amount, asset and resource,
			// and no reason to review that the reviewer did not see.
			if r.Status == reviewlog.Approved && r.UsedAt == "" && req.Decision == guard.Review && at.Before(decided.Add(req.ApprovalTTL)) && answers(r, want) &&
				(!req.ExactParams || r.ParamsHash == req.ParamsHash) {
				if req.Used != nil && req.Used(r.ID) {
					// The ledger holds a signed use of this approval that
					// the review log lost: it was used, and is not again.
					break
				}
				return reviewlog.AskPlan{Kind: reviewlog.AskApproved, Review: r, Reserve: true}, nil
			}
			break
		}
		// A rejection the chains hold for this very question holds
		// whatever the log says of the review, or where it lost it (a
		// volume writer can edit the log, not forge a signature): the
		// server's own receipts name the caller and the question's keyed
		// hash. Approvals are honoured only through the log, where their
		// one use is recorded, and only for the terms they sign.
		if r, ok, err := heldByChain(v, req.RejectionHold); err != nil {
			return reviewlog.AskPlan{}, err
		} else if ok {
			return reviewlog.AskPlan{Kind: reviewlog.AskRejected, Review: r}, nil
		}
	}
	if req.Decision != guard.Review {
		return plain, nil
	}
	// One open review per question: the caller's pending review that
	// answers it is the answer, whatever its age, until a reviewer decides
	// it or it expires (the verifier reads a review past the log's time to
	// live as expired, never pending).
	for _, r := range resolved {
		if r.Status == reviewlog.Pending && answers(r, want) {
			return reviewlog.AskPlan{Kind: reviewlog.AskReused, Review: r}, nil
		}
	}
	pending := v.Pending()
	if req.MaxPending > 0 && pending >= req.MaxPending && req.Moot != nil {
		// Whether another pending review is moot depends on its own
		// counterparty, which the question's scopes do not hold.
		if err := v.Whole(); err != nil {
			return reviewlog.AskPlan{}, err
		}
		// A review the question would no longer need does not count.
		live, err := v.PendingReviews()
		if err != nil {
			return reviewlog.AskPlan{}, err
		}
		for _, r := range live {
			if req.Moot(r) {
				pending--
			}
		}
	}
	if req.MaxPending > 0 && pending >= req.MaxPending {
		return reviewlog.AskPlan{Kind: reviewlog.AskQueueFull, Pending: pending}, nil
	}
	return reviewlog.AskPlan{Kind: reviewlog.AskOpened, Reasons: req.Reasons, Pending: pending}, nil
}

// heldByChain finds, among the reviews the chains say asked the caller's
// question, the newest a trusted reviewer rejected within the hold.
func heldByChain(v *reviewlog.AskView, hold time.Duration) (reviewlog.Review, bool, error) {
	at := v.At()
	var held reviewlog.Review
	found := false
	err := v.ChainReviews(func(r reviewlog.Review, inLog bool) bool {
		if r.Status != reviewlog.Rejected {
			return true
		}
		decided, ok := r.Decided()
		if !ok || !at.Before(decided.Add(hold)) {
			return true
		}
		if !inLog {
			r.Integrity = append(r.Integrity, "neither the review log nor an archive holds this review, but a trusted reviewer's signed rejection of it does, and holds")
		}
		held, found = r, true
		return false
	})
	if err != nil {
		return reviewlog.Review{}, false, err
	}
	return held, found, nil
}

// answers says whether review r (as resolved) can answer a question asked
// under want: its terms are signed and untouched, ask the same question of
// the same caller, and cover every rule that now asks for a review. An
// approved review must moreover be bound: its trusted approval signs these
// very terms.
func answers(r reviewlog.Review, want reviewlog.Terms) bool {
	if !r.SignedTerms() {
		return false
	}
	if r.Status == reviewlog.Approved && !r.Bound() {
		return false
	}
	// A quorum is fixed when a review opens: a policy that now asks for
	// more approvals than a review's signed terms do is not answered by it.
	return r.Terms.SameQuestion(want) && r.Terms.Covers(want.Rules) && r.Terms.Quorum() >= want.Quorum()
}

// OpenReviewCaller is the caller OpenReview opens reviews for.
const OpenReviewCaller = "reviewlog.OpenReview"

// OpenReview opens a review, for caller OpenReviewCaller, for a question
// the guard answered with "review", or returns the pending one of the
// same question (whatever its age, until decided or expired); created
// says which. The
// engine answers through Ask, which knows the caller; this remains for
// tools and tests that open reviews directly. hook must sign the terms of
// an opened review (reviewlog.TermsDraft), as the engine's does, or the
// review cannot be decided.
func OpenReview(ctx context.Context, log *reviewlog.Log, q guard.Question, reasons []guard.Reason, hook reviewlog.Hook) (reviewlog.Review, bool, error) {
	out, err := Ask(ctx, log, AskRequest{Caller: OpenReviewCaller, Question: q, Decision: guard.Review, Reasons: reasons},
		func(tx reviewlog.Tx, _ reviewlog.AskOutcome) error {
			if hook == nil {
				return nil
			}
			return hook(tx)
		})
	if err != nil {
		return reviewlog.Review{}, false, err
	}
	return out.Review, out.Kind == reviewlog.AskOpened, nil
}
