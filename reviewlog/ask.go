package reviewlog

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// What Ask did.
const (
	// AskPlain: nothing about a review; the guard's own answer stands.
	AskPlain = "plain"
	// AskOpened / AskReused: a review answers the question (new, or the
	// caller's pending one for the same question).
	AskOpened = "opened"
	AskReused = "reused"
	// AskApproved: a trusted reviewer approved this caller's identical
	// question; the approval is used now, once.
	AskApproved = "approved"
	// AskRejected: a trusted reviewer rejected it, and the hold holds.
	AskRejected = "rejected"
	// AskQueueFull: the caller holds too many pending reviews to open one.
	AskQueueFull = "queue_full"
)

// AskRequest is one answered question, for the locked part of answering.
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
	// terms of a review (see Terms).
	Tenant, Resource, AmountAtomic string

	// Judge, when set, decides inside the lock, from the reservations that
	// hold now, and replaces Decision and Reasons: so that what earlier
	// allows reserved is counted by the next question whichever process
	// or replica answers it.
	Judge func(v ReservationView) (decision string, reasons []guard.Reason, err error)
	// ReservationTTL is the policy's reservationMinutes: the allows of the
	// chain younger than it must each have a reservation record.
	ReservationTTL time.Duration
	// Reserve, when set, is called after the hook of an answer that
	// allows (the guard's own allow, or an approval used) and gives the
	// reservation recorded with it, in the same commit.
	Reserve func(tx Tx) (*Reservation, error)
	// Moot, when set, says whether one of the caller's pending reviews
	// would now be answered without review; a moot review does not count
	// towards MaxPending.
	Moot func(r Review) bool
	// DryRun: decide and run the hook, but append nothing (the hook must
	// write nothing either).
	DryRun bool
}

// AskOutcome says what answered the question.
type AskOutcome struct {
	Kind string
	// Review is the review concerned (opened, reused, approved, rejected).
	Review Review
	// Pending is how many pending reviews the caller holds.
	Pending int
}

// Ask is the locked part of answering a question: it honours a trusted
// approval of this caller's identical question (once), holds a trusted
// rejection, reuses the caller's pending review, opens a new one, or
// records the guard's own answer. hook runs before anything is appended and
// writes the answer's receipt; when it fails, nothing is written.
//
// A block is never turned into anything else; an approval only turns a
// review into an allow.
func (l *Log) Ask(ctx context.Context, req AskRequest, hook func(tx Tx, out AskOutcome) error) (AskOutcome, error) {
	if req.Caller == "" {
		return AskOutcome{}, fmt.Errorf("%w: the caller must be named", ErrBadInput)
	}
	return l.ask(ctx, req, hook)
}

// ask is Ask for any caller, also none (OpenReview's reviews).
func (l *Log) ask(ctx context.Context, req AskRequest, hook func(tx Tx, out AskOutcome) error) (AskOutcome, error) {
	q := req.Question
	if q.Counterparty == "" {
		return AskOutcome{}, fmt.Errorf("%w: the counterparty is empty", ErrBadInput)
	}
	for name, v := range map[string]string{"counterparty": q.Counterparty, "amount": q.Amount, "asset": q.Asset, "template": q.Template, "caller": req.Caller,
		"tenant": req.Tenant, "resource": req.Resource, "amount_atomic": req.AmountAtomic, "pay_to": q.PayTo} {
		if len(v) > maxFieldBytes || !utf8.ValidString(v) {
			return AskOutcome{}, fmt.Errorf("%w: %s is longer than %d bytes or not UTF-8", ErrBadInput, name, maxFieldBytes)
		}
	}
	caller := req.Caller
	// The terms this question would be asked under; an approval is
	// honoured, and a pending review reused, only for these.
	want := Terms{Caller: caller, Tenant: req.Tenant, Counterparty: q.Counterparty, Amount: q.Amount, AmountAtomic: req.AmountAtomic,
		Asset: q.Asset, Resource: req.Resource, Template: q.Template, Rules: ReviewRules(req.Reasons), ParamsHash: req.ParamsHash}
	var out AskOutcome
	err := l.transactAll(ctx, func(g Writer, st *state, at time.Time) ([]record, error) {
		var v *verifier
		if req.Judge != nil {
			var err error
			if v, err = l.newVerifier(ctx, g); err != nil {
				return nil, err
			}
			view, err := l.reservationView(st, at, req.ReservationTTL)
			if err != nil {
				return nil, err
			}
			if req.Decision, req.Reasons, err = req.Judge(view); err != nil {
				return nil, err
			}
			want.Rules = ReviewRules(req.Reasons)
		}
		run := func(kind string, r Review, rec *record) ([]record, error) {
			out = AskOutcome{Kind: kind, Review: r, Pending: out.Pending}
			txKind := kind
			if kind == AskApproved {
				txKind = "used"
			}
			tx := Tx{Store: g, At: at, Kind: txKind, Review: r}
			if err := hook(tx, out); err != nil {
				return nil, err
			}
			if req.DryRun {
				return nil, nil
			}
			var recs []record
			if rec != nil {
				recs = append(recs, *rec)
			}
			if req.Reserve != nil && (kind == AskApproved || (kind == AskPlain && req.Decision == guard.Allow)) {
				res, err := req.Reserve(tx)
				if err != nil {
					return nil, err
				}
				if res != nil {
					recs = append(recs, reservationRecord(at, res))
				}
			}
			return recs, nil
		}
		// The caller's reviews of this very question, newest first; the
		// index keeps them, so this costs the same at any size of log.
		list := st.byKey[questionKey(caller, q, req.Resource)]
		var resolved []Review
		if v == nil && (len(list) > 0 || (req.ParamsHash != "" && req.Decision != guard.Block)) {
			var err error
			if v, err = l.newVerifier(ctx, g); err != nil {
				return nil, err
			}
		}
		if len(list) > 0 {
			for i := len(list) - 1; i >= 0; i-- {
				r, err := st.review(list[i])
				if err != nil {
					return nil, err
				}
				vr, _, err := v.resolve(&r)
				if err != nil {
					return nil, err
				}
				resolved = append(resolved, vr)
			}
		}
		// The newest decision a trusted reviewer signed speaks first.
		if req.Decision != guard.Block {
			for _, r := range resolved {
				if r.Status != Approved && r.Status != Rejected {
					continue
				}
				decided, err := time.Parse(time.RFC3339Nano, r.DecidedAt)
				if err != nil {
					break
				}
				if r.Status == Rejected && at.Before(decided.Add(req.RejectionHold)) {
					return run(AskRejected, r, nil)
				}
				// An approval answers only the terms it signed: the same
				// caller, tenant, counterparty, amount, asset and resource,
				// and no reason to review that the reviewer did not see.
				if r.Status == Approved && r.UsedAt == "" && req.Decision == guard.Review && at.Before(decided.Add(req.ApprovalTTL)) && r.answers(want) &&
					(!req.ExactParams || r.ParamsHash == req.ParamsHash) {
					r.UsedAt = formatTime(at)
					return run(AskApproved, r, &record{Type: typeUsed, ReviewID: r.ID, At: formatTime(at), By: caller})
				}
				break
			}
			// A rejection the chains hold for this very question holds
			// whatever the log says of the review, or where it lost it (a
			// volume writer can edit the log, not forge a signature): the
			// server's own receipts name the caller and the question's
			// keyed hash. Approvals are honoured only through the log, where
			// their one use is recorded, and only for the terms they sign.
			if r, ok, err := l.heldByChain(v, st, caller, req, at); err != nil {
				return nil, err
			} else if ok {
				return run(AskRejected, r, nil)
			}
		}
		if req.Decision != guard.Review {
			return run(AskPlain, Review{}, nil)
		}
		since := at.Add(-IdempotencyWindow)
		for _, r := range resolved {
			if t, err := parseTime(r.CreatedAt); r.Status == Pending && err == nil && !t.Before(since) && r.answers(want) {
				return run(AskReused, r, nil)
			}
		}
		var live []*entry
		for _, e := range st.pendingOf(caller) {
			if ttl := l.ttl(); ttl <= 0 || at.Before(e.created.Add(ttl)) {
				live = append(live, e)
			}
		}
		out.Pending = len(live)
		if req.MaxPending > 0 && out.Pending >= req.MaxPending && req.Moot != nil {
			// A review the question would no longer need does not count.
			for _, e := range live {
				r, err := st.review(e)
				if err != nil {
					return nil, err
				}
				if req.Moot(r) {
					out.Pending--
				}
			}
		}
		if req.MaxPending > 0 && out.Pending >= req.MaxPending {
			return run(AskQueueFull, Review{}, nil)
		}
		id, err := newID()
		if err != nil {
			return nil, err
		}
		reasons := req.Reasons
		if reasons == nil {
			reasons = []guard.Reason{}
		}
		amount := q.Amount
		terms := want
		terms.ReviewID = id
		th, err := TermsHash(terms)
		if err != nil {
			return nil, err
		}
		rec := &record{Type: typeOpened, ReviewID: id, At: formatTime(at), Counterparty: q.Counterparty, Amount: &amount,
			Asset: q.Asset, Template: q.Template, Reasons: reasons, Caller: caller, ParamsHash: req.ParamsHash, Terms: &terms, PayTo: q.PayTo}
		r := Review{ID: id, Status: Pending, CreatedAt: rec.At, Counterparty: q.Counterparty, Amount: q.Amount,
			Asset: q.Asset, Template: q.Template, Reasons: reasons, Caller: caller, ParamsHash: req.ParamsHash,
			Tenant: terms.Tenant, Resource: terms.Resource, Terms: &terms, TermsHash: th, PayTo: q.PayTo}
		out.Pending++
		return run(AskOpened, r, rec)
	})
	if err != nil {
		return AskOutcome{}, err
	}
	return out, nil
}

// heldByChain finds, among the reviews the chains say answered the caller's
// question but the log does not hold, one a trusted reviewer rejected
// within the hold.
func (l *Log) heldByChain(v *verifier, st *state, caller string, req AskRequest, at time.Time) (Review, bool, error) {
	if v == nil || req.ParamsHash == "" {
		return Review{}, false, nil
	}
	actions := v.rx.reviewsOf(caller, req.ParamsHash)
	for i := len(actions) - 1; i >= 0; i-- {
		id := strings.TrimPrefix(actions[i], "review:")
		// Whatever the log says of it (an edited caller or question) or
		// whether it holds it at all, the server signed that this review
		// asked this caller's question.
		r := Review{ID: id, Status: Pending, Caller: caller, ParamsHash: req.ParamsHash,
			Counterparty: req.Question.Counterparty, Amount: req.Question.Amount, Asset: req.Question.Asset}
		inLog := false
		src, e := st, st.byID[id]
		if e == nil {
			// Archived: read from its archive, as the log held it.
			ast, err := l.findArchived(v.ctx, v.r, id)
			if err != nil {
				return Review{}, false, err
			}
			if ast != nil {
				src, e = ast, ast.byID[id]
			}
		}
		if e != nil {
			lr, err := src.review(e)
			if err != nil {
				return Review{}, false, err
			}
			r, inLog = lr, true
		}
		vr, _, err := v.resolve(&r)
		if err != nil {
			return Review{}, false, err
		}
		if vr.Status != Rejected {
			continue
		}
		decided, err := time.Parse(time.RFC3339Nano, vr.DecidedAt)
		if err == nil && at.Before(decided.Add(req.RejectionHold)) {
			if !inLog {
				vr.Integrity = append(vr.Integrity, "neither the review log nor an archive holds this review, but a trusted reviewer's signed rejection of it does, and holds")
			}
			return vr, true, nil
		}
	}
	return Review{}, false, nil
}

// answers says whether review r (as resolved) can answer a question asked
// under want: its terms are signed and untouched, ask the same question of
// the same caller, and cover every rule that now asks for a review. An
// approved review must moreover be bound: its trusted approval signs these
// very terms.
func (r Review) answers(want Terms) bool {
	if r.Terms == nil || r.Tampered || r.TermsReceipt == "" {
		return false
	}
	if r.Status == Approved && !r.bound {
		return false
	}
	return r.Terms.sameQuestion(want) && r.Terms.covers(want.Rules)
}
