package reviewlog

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// What an answer records. The decision engine (guard/engine) chooses one
// for each question; the log records it.
const (
	// AskPlain: nothing about a review; the guard's own answer stands.
	AskPlain = "plain"
	// AskOpened / AskReused: a review answers the question (new, or the
	// caller's pending one for the same question).
	AskOpened = "opened"
	AskReused = "reused"
	// AskApproved: a trusted reviewer's approval of this caller's
	// identical question is used now, once (a used record).
	AskApproved = "approved"
	// AskRejected: a trusted reviewer's rejection holds.
	AskRejected = "rejected"
	// AskQueueFull: the caller holds too many pending reviews to open one.
	AskQueueFull = "queue_full"
)

// AskRequest is one question to answer under the lock: what the records of
// its answer are made of. What the answer is, the decide function of Ask
// says.
type AskRequest struct {
	Caller     string
	Question   guard.Question
	ParamsHash string
	// Tenant, Resource (canonical URL, or "") and AmountAtomic (the
	// amount in atomic units, "" when it cannot be read) complete the
	// terms of a review (see Terms).
	Tenant, Resource, AmountAtomic string
	// Approvals is the quorum a review opened now needs (the policy's
	// quorum for the amount; 0 or 1: one approval).
	Approvals int
	// Reserve gives the reservation recorded with an answer whose plan
	// says Reserve, in the same commit; it runs after the hook.
	Reserve func(tx Tx) (*Reservation, error)
	// Authorized, when set, gives the signed authorization the hook
	// committed (nil: none), after the hook and Reserve: it is appended as
	// the caller's authorized record with the answer's records, in the
	// same commit, so that the authorization is recorded in the section
	// that allowed it (see RecordAuthorization for one recorded alone).
	Authorized func() *Authorized
	// DryRun: decide and run the hook, but append nothing (the hook must
	// write nothing either).
	DryRun bool
	// Totals: the answer reads sums over every counterparty (the caller's
	// policy sets a total limit or a total velocity, or custom rules read
	// those figures), so it waits for every other allow of the tenant;
	// otherwise only for those of the same caller, counterparty or
	// resource (see Scope).
	Totals bool
	// Prefetch, when set, names what decide will read beside the log (the
	// spend ledger, the chains' new receipts), for a store that can read
	// it with its locks; it is called once the question holds its
	// process's turn at its scopes, just before the store's locks are
	// asked for (so it names what the process's questions of the same
	// scopes read and wrote before it).
	Prefetch func() *Prefetch
}

// AskPlan is the answer the decide function of Ask chose, for the log to
// record.
type AskPlan struct {
	// Kind is one of the Ask* constants.
	Kind string
	// Review is the review that answers, for AskReused, AskApproved and
	// AskRejected: one the AskView gave.
	Review Review
	// Reasons are the reasons an AskOpened review is opened for; its
	// terms cover their rules.
	Reasons []guard.Reason
	// Pending is how many pending reviews the caller holds, before an
	// AskOpened review (which counts one more).
	Pending int
	// Reserve records the request's reservation with this answer.
	Reserve bool
}

// AskOutcome says what answered the question.
type AskOutcome struct {
	Kind string
	// Review is the review concerned (opened, reused, approved, rejected).
	Review Review
	// Pending is how many pending reviews the caller holds.
	Pending int
}

// Ask is the locked part of answering a question. Inside the store's lock,
// decide reads what bears on the question through an AskView and chooses
// the answer; hook then runs before anything is appended and writes the
// answer's receipt, and the log appends the answer's records (a review
// opened, an approval used, a reservation). When decide or hook fails,
// nothing is written. The log decides nothing: it records, once, what
// decide chose, and refuses only what would break its records (a second
// use of one approval, a review it does not hold).
//
// On a store that locks scopes (ScopedStore) the section holds only the
// question's scopes, and a process answers up to Options.Parallel
// questions at once, each in a lane with its own fold, as replicas would.
func (l *Log) Ask(ctx context.Context, req AskRequest, decide func(v *AskView) (AskPlan, error), hook func(tx Tx, out AskOutcome) error) (AskOutcome, error) {
	if req.Caller == "" {
		return AskOutcome{}, fmt.Errorf("%w: the caller must be named", ErrBadInput)
	}
	if l.lanes != nil {
		sub, err := l.lane(ctx)
		if err != nil {
			return AskOutcome{}, err
		}
		defer func() { l.lanes <- sub }()
		sub.warm(ctx)
		return sub.Ask(ctx, req, decide, hook)
	}
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
	var out AskOutcome
	if _, ok := l.store.(ScopedStore); ok {
		// A scoped section reads the reviews by index (ReviewIndex), with
		// its locks where the store can.
		ctx = withMark(ctx, req.reviewQuery(l.now(), l.ttl()))
	}
	err := l.transactAll(ctx, req.scopes(), req.Prefetch, func(g Writer, st *state, at time.Time) ([]record, error) {
		_, scoped := g.(ScopedWriter)
		view := &AskView{l: l, ctx: ctx, g: g, st: st, at: at, req: &req, scoped: scoped}
		plan, err := decide(view)
		if err != nil {
			return nil, err
		}
		var rec *record
		r := plan.Review
		switch plan.Kind {
		case AskPlain, AskQueueFull:
			r = Review{}
		case AskReused, AskRejected:
		case AskApproved:
			e := st.byID[r.ID]
			if st.rows != nil {
				e = st.rows.st.byID[r.ID]
			}
			if e == nil {
				return nil, fmt.Errorf("%w: review %s, whose approval was to be used, is not in %s", ErrUnknownReview, r.ID, l.Path())
			}
			if e.used >= 0 {
				return nil, fmt.Errorf("%w: the approval of review %s is used already; it is used once", ErrAlreadyDecided, r.ID)
			}
			r.UsedAt = formatTime(at)
			rec = &record{Type: typeUsed, ReviewID: r.ID, At: r.UsedAt, By: req.Caller}
		case AskOpened:
			if r, rec, err = view.opening(plan.Reasons); err != nil {
				return nil, err
			}
			view.closeOpen()
			plan.Pending++
		default:
			return nil, fmt.Errorf("%w: unknown answer kind %q", ErrBadInput, clip(plan.Kind))
		}
		out = AskOutcome{Kind: plan.Kind, Review: r, Pending: plan.Pending}
		txKind := plan.Kind
		if plan.Kind == AskApproved {
			txKind = typeUsed
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
		if plan.Reserve && req.Reserve != nil {
			res, err := req.Reserve(tx)
			if err != nil {
				return nil, err
			}
			if res != nil {
				recs = append(recs, reservationRecord(at, res))
			}
		}
		if req.Authorized != nil {
			if a := req.Authorized(); a != nil {
				if err := checkAuthorized(a); err != nil {
					return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
				}
				recs = append(recs, record{Type: typeAuthorized, At: formatTime(at), Caller: req.Caller, Authorization: a})
			}
		}
		return recs, nil
	})
	if err != nil {
		return AskOutcome{}, err
	}
	return out, nil
}

// AskView is what the log holds about one question, read inside the lock
// of Ask; it is valid only while decide runs.
type AskView struct {
	l   *Log
	ctx context.Context
	g   Writer
	st  *state
	at  time.Time
	req *AskRequest
	v   *verifier
	// reviews is Reviews' answer once read.
	reviews     []Review
	reviewsRead bool
	// unread are the rows of the question whose review no line holds
	// (read by index).
	unread []string
	// scoped: the section holds the question's scopes only.
	scoped bool
}

// Whole makes sure the answer is chosen holding the whole store's lock:
// decide calls it before it reads what the question's scopes do not
// guard (whether another of the caller's pending reviews is moot depends
// on that review's counterparty). In a section that holds only scopes it
// returns an error that decide must return as is; Ask then runs the
// question again under the whole store's lock, where Whole returns nil.
func (a *AskView) Whole() error {
	if a.scoped {
		return errWiden
	}
	return nil
}

// Writer is the locked section's store, for what decide reads beside the
// log (the spend ledger).
func (a *AskView) Writer() Writer { return a.g }

// At is the time of this answer: the time stamp of what it records.
func (a *AskView) At() time.Time { return a.at }

// verifier brings the receipt index up to date once, for every query.
func (a *AskView) verifier() (*verifier, error) {
	if a.v == nil {
		v, err := a.l.newVerifier(a.ctx, a.g)
		if err != nil {
			return nil, err
		}
		a.v = v
	}
	return a.v, nil
}

// Reviews are the caller's reviews of this very question (the same
// counterparty, amount, asset, template, resource and payee), newest
// first, as the signatures prove them. The index keeps them, so this costs
// the same at any size of log.
func (a *AskView) Reviews() ([]Review, error) {
	if a.reviewsRead {
		return a.reviews, nil
	}
	if a.st.rows != nil {
		return a.indexedReviews()
	}
	list := a.st.byKey[questionKey(a.req.Caller, a.req.Question, a.req.Resource)]
	var out []Review
	for i := len(list) - 1; i >= 0; i-- {
		v, err := a.verifier()
		if err != nil {
			return nil, err
		}
		r, err := a.st.review(list[i])
		if err != nil {
			return nil, err
		}
		vr, _, err := v.resolve(&r)
		if err != nil {
			return nil, err
		}
		out = append(out, vr)
	}
	a.reviews, a.reviewsRead = out, true
	return out, nil
}

// ChainReviews calls fn, newest first, with each review that the server's
// own signed receipts say asked this caller's question (the question's
// keyed ParamsHash), whatever the log says of it or whether it holds it at
// all: inLog is false when neither the log nor an archive holds it, and
// the review is then what the receipts say, resolved by the signatures. It
// stops when fn returns false. A question without a ParamsHash has none.
func (a *AskView) ChainReviews(fn func(r Review, inLog bool) bool) error {
	if a.req.ParamsHash == "" {
		return nil
	}
	v, err := a.verifier()
	if err != nil {
		return err
	}
	caller, q := a.req.Caller, a.req.Question
	actions, err := v.reviewsOf(caller, a.req.ParamsHash)
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(actions))
	for _, act := range actions {
		ids = append(ids, strings.TrimPrefix(act, "review:"))
	}
	find := func(id string) (*state, *entry, error) {
		if e := a.st.byID[id]; e != nil {
			return a.st, e, nil
		}
		// Archived: read from its archive, as the log held it.
		ast, err := a.l.findArchived(v.ctx, v.r, id)
		if err != nil || ast == nil {
			return nil, nil, err
		}
		return ast, ast.byID[id], nil
	}
	if a.st.rows != nil {
		if find, err = a.indexedFind(ids); err != nil {
			return err
		}
	}
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		// Whatever the log says of it (an edited caller or question) or
		// whether it holds it at all, the server signed that this review
		// asked this caller's question.
		r := Review{ID: id, Status: Pending, Caller: caller, ParamsHash: a.req.ParamsHash,
			Counterparty: q.Counterparty, Amount: q.Amount, Asset: q.Asset}
		inLog := false
		src, e, err := find(id)
		if err != nil {
			return err
		}
		if e != nil {
			lr, err := src.review(e)
			if err != nil {
				return err
			}
			r, inLog = lr, true
		}
		vr, _, err := v.resolve(&r)
		if err != nil {
			return err
		}
		if a.st.rows != nil {
			a.st.rows.mark(&vr, id)
		}
		if !fn(vr, inLog) {
			return nil
		}
	}
	return nil
}

// Pending is how many reviews the caller holds that the log calls pending
// and that have not expired.
func (a *AskView) Pending() int { return len(a.livePending()) }

// PendingReviews are those reviews, as the log holds them.
func (a *AskView) PendingReviews() ([]Review, error) {
	var out []Review
	src := a.st
	if a.st.rows != nil {
		src = a.st.rows.st
	}
	for _, e := range a.livePending() {
		r, err := src.review(e)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (a *AskView) livePending() []*entry {
	var live []*entry
	list := a.st.pendingOf
	if a.st.rows != nil {
		list = a.st.rows.pendingOf
	}
	for _, e := range list(a.req.Caller) {
		if ttl := a.l.ttl(); ttl <= 0 || a.at.Before(e.created.Add(ttl)) {
			live = append(live, e)
		}
	}
	return live
}

// Terms are the terms this question is asked under, for a review opened
// for reasons: a review answers it again, and an approval is honoured,
// only under these (Review.SignedTerms, Terms.SameQuestion, Terms.Covers).
func (a *AskView) Terms(reasons []guard.Reason) Terms {
	q := a.req.Question
	return Terms{Caller: a.req.Caller, Tenant: a.req.Tenant, Counterparty: q.Counterparty, Amount: q.Amount, AmountAtomic: a.req.AmountAtomic,
		Asset: q.Asset, Resource: a.req.Resource, Template: q.Template, Rules: ReviewRules(reasons), ParamsHash: a.req.ParamsHash, Approvals: quorumOf(a.req.Approvals)}
}

// quorumOf is the Terms.Approvals of a quorum: 0 when one approval suffices.
func quorumOf(n int) int {
	if n <= 1 {
		return 0
	}
	return n
}

// opening is a new review of the question, and its opened record.
func (a *AskView) opening(reasons []guard.Reason) (Review, *record, error) {
	id, err := newID()
	if err != nil {
		return Review{}, nil, err
	}
	if reasons == nil {
		reasons = []guard.Reason{}
	}
	q, req := a.req.Question, a.req
	amount := q.Amount
	terms := a.Terms(reasons)
	terms.ReviewID = id
	th, err := TermsHash(terms)
	if err != nil {
		return Review{}, nil, err
	}
	rec := &record{Type: typeOpened, ReviewID: id, At: formatTime(a.at), Counterparty: q.Counterparty, Amount: &amount,
		Asset: q.Asset, Template: q.Template, Reasons: reasons, Caller: req.Caller, ParamsHash: req.ParamsHash, Terms: &terms, PayTo: q.PayTo}
	r := Review{ID: id, Status: Pending, CreatedAt: rec.At, Counterparty: q.Counterparty, Amount: q.Amount,
		Asset: q.Asset, Template: q.Template, Reasons: reasons, Caller: req.Caller, ParamsHash: req.ParamsHash,
		Tenant: terms.Tenant, Resource: terms.Resource, Terms: &terms, TermsHash: th, PayTo: q.PayTo}
	return r, rec, nil
}

// closeOpen tells a store that keeps one open review per question that
// the reviews of this question read here do not answer it (the answer
// opens another), so that the review about to open is the question's one
// open review.
func (a *AskView) closeOpen() {
	x, ok := a.g.(ReviewRowsWriter)
	if !ok || !a.reviewsRead || len(a.reviews)+len(a.unread) == 0 {
		return
	}
	seen := make([]string, 0, len(a.reviews)+len(a.unread))
	for _, r := range a.reviews {
		seen = append(seen, r.ID)
	}
	seen = append(seen, a.unread...)
	var expiredAt time.Time
	if ttl := a.l.ttl(); ttl > 0 {
		// As the verifier reads expiry.
		now := a.at
		if a.v != nil {
			now = a.v.now
		}
		expiredAt = now.Add(-ttl)
	}
	x.CloseOpen(QuestionKey(a.req.Caller, a.req.Question, a.req.Resource), seen, expiredAt)
}

// SignedTerms says whether the review's terms are signed by the server
// and untouched since.
func (r Review) SignedTerms() bool { return r.Terms != nil && !r.Tampered && r.TermsReceipt != "" }

// Bound says whether the review's trusted decision signs its signed terms
// and note (so an approval answers those terms alone).
func (r Review) Bound() bool { return r.bound }

// Created is when the review was opened (false when the log's time cannot
// be read).
func (r Review) Created() (time.Time, bool) {
	t, err := parseTime(r.CreatedAt)
	return t, err == nil
}

// Decided is when the review was decided, by the time its decision carries
// (false when undecided or unreadable).
func (r Review) Decided() (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, r.DecidedAt)
	return t, err == nil
}
