// Package engine is the one decision engine of the pre-payment guard. Every
// entry point — the MCP tool, the review CLI, a Go program embedding the
// guard — hands it a question and a caller identity and gets back the
// answer as recorded: the review log and the signed decision chain are
// written before the answer is returned, or no answer is given at all.
//
// What the engine judges by is fixed when it is built: the policy, the
// custom rules and the templates history is read under. Nothing in a
// question or an event can change them.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// HistorySource reads every past operation under one template, with the runs
// that could not be read. A catalog.Catalog is one (the one a server keeps,
// with its index and cache); ScanHistory, which reads the run files on every
// call through a catalog of its own, is another.
type HistorySource interface {
	History(ctx context.Context, t *receipt.Template) (guard.History, error)
}

// Templates resolves the template names the policy reads history under.
type Templates interface {
	Resolve(name string) (*receipt.Template, error)
}

// overrider is implemented by template sets that know whether an operator
// file replaces a bundled template.
type overrider interface {
	Overrides(name string) bool
}

// Config is what an Engine needs; every part is fixed for its lifetime but
// the policy and its rules, which SetPolicy replaces.
type Config struct {
	Policy *guard.Config
	// Rules are the operator's custom rules (noa.policy/0.2), or nil.
	Rules     *policy.Policy
	Templates Templates
	History   HistorySource
	Log       *reviewlog.Log
	// Chains signs every answer into the decision chain.
	Chains *reviewlog.Chains
	// ParamsKey keys the HMAC that stands for a question in receipts.
	ParamsKey []byte
	Now       func() time.Time
	Logger    *slog.Logger
	// Notify, when set, is told of each review this engine opens, after it
	// is recorded. It must not block (reviewlog/notify queues).
	Notify func(reviewlog.Review)
	// ReviewURL, when set, is the reviewer console's page of a review; it
	// is given in review answers, notifications and get_review_status.
	ReviewURL func(id string) string
	// OnIntegrity, when set, is called once per integrity warning (the log
	// and the signatures disagree about a review), for a metric.
	OnIntegrity func()
	// Authorizations, when set, reads asset contracts on chain: an
	// authorization whose validBefore passed and that the contract says
	// was never used stops counting (see expire). Nil: expired
	// authorizations count for their window.
	Authorizations AuthorizationChain
}

// Engine answers check_before_pay questions.
type Engine struct {
	cfg Config
	// judged is the policy and custom rules in force; SetPolicy swaps them
	// whole (cfg.Policy and cfg.Rules are only the first ones).
	judged atomic.Pointer[judged]
	// seals are the reservation records whose seal verified.
	seals sealCache
	// book is this process's verified reading of the spend ledger.
	book *ledger.Book
	// pruned is how many entries the Book had read when it was last pruned.
	pruned atomic.Int64
	// tail reads the decision chains' new commitment receipts.
	tail reviewlog.ReceiptTail
	// expiry is when expired authorizations may be asked about again.
	expiry expiryState
	// mandateSigs are the mandate records whose signature verified;
	// mandateLines is how many records this process read at most.
	mandateSigs  mandate.Cache
	mandateLines atomic.Int64
}

// judged is a policy with its custom rules, swapped together.
type judged struct {
	policy *guard.Config
	rules  *policy.Policy
}

// New checks the configuration and that every template the policy reads
// history under exists, so that a typo in historyTemplates stops the start
// instead of silently reading nothing.
func New(cfg Config) (*Engine, error) {
	switch {
	case cfg.Policy == nil:
		return nil, errors.New("engine: no policy")
	case cfg.Templates == nil || cfg.History == nil:
		return nil, errors.New("engine: no templates or history source")
	case cfg.Log == nil || cfg.Chains == nil:
		return nil, errors.New("engine: no review log or decision chain")
	case len(cfg.ParamsKey) == 0:
		return nil, errors.New("engine: no params key")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Engine{cfg: cfg, book: ledger.NewBook(cfg.ParamsKey, cfg.Chains.Tenant, horizon(cfg.Policy))}
	if err := e.SetPolicy(cfg.Policy, cfg.Rules); err != nil {
		return nil, err
	}
	return e, nil
}

// SetPolicy puts a policy and its custom rules in force, for the questions
// asked from then on, after checking that every template it reads history
// under exists; on error the running policy stays.
func (e *Engine) SetPolicy(p *guard.Config, rules *policy.Policy) error {
	if err := e.CheckPolicy(p); err != nil {
		return err
	}
	e.judged.Store(&judged{policy: p, rules: rules})
	if e.book != nil {
		e.book.SetHorizon(horizon(p))
	}
	return nil
}

// CheckPolicy says whether SetPolicy would accept p.
func (e *Engine) CheckPolicy(p *guard.Config) error {
	if p == nil {
		return errors.New("engine: no policy")
	}
	if len(p.HistoryTemplates) == 0 {
		return errors.New("engine: the policy names no history templates")
	}
	for _, name := range p.HistoryTemplates {
		if _, err := e.cfg.Templates.Resolve(name); err != nil {
			return fmt.Errorf("guard config historyTemplates names %q, which cannot be used: %w", name, err)
		}
	}
	return nil
}

// Policy is the policy the engine judges by.
func (e *Engine) Policy() *guard.Config { return e.judged.Load().policy }

// Question is what a caller asks: check_before_pay's arguments.
type Question = guard.RawRequest

// Answer is the recorded answer to a question.
type Answer struct {
	Decision string         `json:"decision"`
	Reasons  []guard.Reason `json:"reasons"`
	ReviewID string         `json:"review_id,omitempty"`
	// ReviewURL is the console page of the review a human decides (set
	// with --console-url, on a review answer only).
	ReviewURL string `json:"review_url,omitempty"`
	ReceiptID string `json:"receipt_id"`
	// ActionID and ParamsHash are the receipt's action.id and
	// action.paramsHash, for a record that follows the decision (the
	// outcome of a proxied call); they are not part of the answer.
	ActionID   string `json:"-"`
	ParamsHash string `json:"-"`
	// Reservation is what an allow reserved (nil for review and block).
	Reservation *ReservationInfo `json:"reservation,omitempty"`
	// Authorization is the authorization signed and recorded with the
	// allow (AuthorizationTerms.Sign), its Receipt set; nil otherwise.
	Authorization *reviewlog.Authorized `json:"-"`
	// DryRun: the answer is what the guard would say; nothing was
	// recorded, reserved, opened or used.
	DryRun bool `json:"dry_run,omitempty"`
}

// CheckOptions change how a question is answered.
type CheckOptions struct {
	// DryRun answers what the guard would say now, recording, reserving,
	// opening and using nothing.
	DryRun bool
	// Hold makes an allow hold its payment as an open payment to the
	// counterparty until the Trace shows it (see Authorize).
	Hold bool
	// Authorization, with Hold, names what the allow will sign, so that
	// its hold can be released once the authorization expired unused.
	Authorization *AuthorizationTerms
}

// RefusedError means the question cannot be judged as asked; nothing was
// recorded. Its message is meant for the caller.
type RefusedError struct{ Message string }

func (e *RefusedError) Error() string { return e.Message }

// NotRecordedError means a decision was reached but could not be recorded,
// so none is given (fail closed). Message is meant for the caller; Err is
// for the operator's log.
type NotRecordedError struct {
	Message string
	Err     error
}

func (e *NotRecordedError) Error() string { return e.Message + ": " + e.Err.Error() }
func (e *NotRecordedError) Unwrap() error { return e.Err }

func refusedf(format string, a ...any) error {
	return &RefusedError{Message: fmt.Sprintf(format, a...)}
}

// Receipt vocabulary for guard decisions.
const (
	actionCanonical = "x402.payment"
	governanceMode  = "approvals_on"
	ruleCustom      = "custom_rule"
)

// Check answers one question for one caller. The caller is who asked — the
// verified token subject over HTTP, the configured agent id over stdio —
// never anything the question says. An allow reserves its payment: until
// the Trace shows it, or the policy's reservationMinutes pass, it counts
// as a payment against every limit, for every caller and replica.
func (e *Engine) Check(ctx context.Context, caller string, q Question) (Answer, error) {
	return e.check(ctx, caller, q, nil, CheckOptions{})
}

// Authorize answers a question as Check does, for a payment about to be
// signed (an x402 authorization): its allow reserves the payment AND holds
// it as a payment open to the counterparty (its pay_to) until the Trace
// shows that payment — it never lapses, so an agent that uses the
// authorization and keeps the recorder from writing it cannot hide the
// payment from the next question. The answer's receipt id names the
// signed decision the authorization is bound to.
func (e *Engine) Authorize(ctx context.Context, caller string, q Question) (Answer, error) {
	return e.check(ctx, caller, q, nil, CheckOptions{Hold: true})
}

// AuthorizeTerms is Authorize for an authorization whose terms are known
// before it is signed: its payer, its validBefore and its nonce are sealed
// into the hold, which is released once validBefore has passed and the
// asset contract says the nonce was never used (Config.Authorizations).
func (e *Engine) AuthorizeTerms(ctx context.Context, caller string, q Question, terms AuthorizationTerms) (Answer, error) {
	if terms.Nonce == nil || terms.Payer == "" || terms.ValidBefore.IsZero() {
		return Answer{}, errors.New("engine: authorization terms without a payer, a validBefore or a nonce")
	}
	return e.check(ctx, caller, q, nil, CheckOptions{Hold: true, Authorization: &terms})
}

// CheckWith is Check with options.
func (e *Engine) CheckWith(ctx context.Context, caller string, q Question, opts CheckOptions) (Answer, error) {
	return e.check(ctx, caller, q, nil, opts)
}

// check answers q; call, when set, is the proxied tool call whose exact
// arguments the receipt's paramsHash stands for.
func (e *Engine) check(ctx context.Context, caller string, q Question, call *Call, opts CheckOptions) (Answer, error) {
	if caller == "" {
		return Answer{}, errors.New("engine: no caller identity")
	}
	// The caller's own policy under agents, else the default one. Both
	// read history under the same templates: agents set limits only.
	pol := e.Policy().For(caller)
	req, err := e.parse(pol, q)
	if err != nil {
		return Answer{}, err
	}
	hist, err := e.historyFor(ctx, true)
	if err != nil {
		return Answer{}, err
	}
	if !opts.DryRun {
		if err := e.ensureLedger(ctx); err != nil {
			return Answer{}, e.notRecorded("start the spend ledger", err)
		}
		// Before the decision's section: the chain is read without the
		// store's lock, and what it releases counts no more for this
		// decision.
		e.expire(ctx)
	}
	now := e.cfg.Now()
	var paramsHash string
	if call != nil {
		paramsHash, err = CallParamsHash(e.cfg.ParamsKey, *call)
	} else {
		paramsHash, err = QuestionHash(e.cfg.ParamsKey, req.Question(), req.Resource)
	}
	if err != nil {
		return Answer{}, err
	}
	canonical := actionCanonical
	if opts.Hold {
		canonical = reviewlog.CanonicalAuthorization
	}
	draft := noa.Draft{
		TS:    now,
		Agent: noa.Agent{ID: caller, Principal: noa.PrincipalService},
		Action: noa.Action{
			Canonical: canonical, RiskClass: "IRREVERSIBLE", ParamsHash: paramsHash, Reversible: false,
		},
		Governance: noa.Governance{Mode: governanceMode},
	}
	plainID, err := randomID("check")
	if err != nil {
		return Answer{}, err
	}
	termsReceipt := ""
	// What is judged inside the lock: history as read, with what the
	// spend ledger holds.
	var (
		dec    guard.Decision
		judged guard.History
		ans    Answer
		own    *ledger.Raw
		// wrote is where the decision's receipt went (Skip).
		wrote reviewlog.Appended
		// under is the mandate the answer allows under (nil: none).
		under *mandateUse
		// signed is the authorization signed and recorded in the allow's
		// section (AuthorizationTerms.Sign).
		signed *reviewlog.Authorized
	)
	var sign SignFunc
	if opts.Hold && opts.Authorization != nil && !opts.DryRun {
		sign = opts.Authorization.Sign
	}
	kind := ledger.KindHold
	switch {
	case opts.Hold:
		kind = ledger.KindAuthorization
	case call != nil:
		kind = ledger.KindSpend
	}
	out, err := Ask(ctx, e.cfg.Log, AskRequest{
		Caller: caller, Question: req.Question(), ParamsHash: paramsHash,
		ApprovalTTL: pol.ApprovalTTL, RejectionHold: pol.RejectionHold, MaxPending: pol.MaxPendingReviews,
		ExactParams: call != nil,
		Tenant:      e.cfg.Chains.Tenant, Resource: req.Resource, AmountAtomic: atomicText(req),
		Approvals: pol.ApprovalsFor(req.Atomic, req.AssetErr == nil && req.AmountErr == nil && req.Atomic != nil && req.Asset.Key == pol.DefaultAsset.Key),
		DryRun:    opts.DryRun,
		Totals:    readsTotals(pol, e.judged.Load().rules != nil),
		Judge: func(w reviewlog.Writer) (string, []guard.Reason, error) {
			if err := e.catchUp(ctx, w); err != nil {
				return "", nil, err
			}
			judged = e.withLedger(hist, now)
			dec = e.decide(req, judged, pol, now, &draft)
			under = nil
			if amountOnly(dec) {
				// Only the amount asks for a review: a mandate a reviewer
				// signed may answer it, read as this section sees the
				// records and the ledger's uses of it.
				mu, why := e.fitMandate(ctx, w, req, caller, pol, now)
				switch {
				case mu != nil:
					under = mu
					withMandate(&dec, mu, pol)
				case why != "":
					notCovered(&dec, why)
				}
			}
			return dec.Decision, dec.Reasons, nil
		},
		Used: func(review string) bool { _, used := e.book.Used(review); return used },
		Prefetch: func() *reviewlog.Prefetch {
			return &reviewlog.Prefetch{Ledger: e.book.Heads(), Segments: e.tail.Marks(), Caller: caller, ParamsHash: paramsHash}
		},
		Moot:       func(r reviewlog.Review) bool { return e.moot(r, judged, now) },
		Authorized: func() *reviewlog.Authorized { return signed },
	}, func(tx reviewlog.Tx, out reviewlog.AskOutcome) error {
		if out.Kind == reviewlog.AskOpened && !opts.DryRun {
			// The server signs the review's terms first: the human decides
			// them, and nothing unsigned can change them.
			td, err := reviewlog.TermsDraft(out.Review, tx.At)
			if err != nil {
				return err
			}
			tr, err := e.cfg.Chains.Append(ctx, tx.Store, td)
			if err != nil {
				return err
			}
			termsReceipt = tr.ID
		}
		d := draft
		a := e.shape(dec, out)
		d.Governance.Verdict, d.Governance.RuleID = verdictOf(a.Decision), firstRule(guard.Decision{Decision: a.Decision, Reasons: a.Reasons})
		if out.Kind == reviewlog.AskApproved {
			rule := reviewlog.RuleHumanApproved
			d.Governance.RuleID = &rule
		}
		d.Action.ID = plainID
		if a.ReviewID != "" {
			d.Action.ID = reviewlog.ActionID(a.ReviewID)
		}
		ans = a
		if opts.DryRun {
			return nil
		}
		own, wrote, signed = nil, reviewlog.Appended{}, nil
		var (
			signing    *reviewlog.Authorized
			signDigest [32]byte
		)
		if a.Decision == guard.Allow {
			// The commitment reaches the ledger before its receipt the
			// chain: a receipt never stands without its entry.
			id, err := newReceiptID()
			if err != nil {
				return err
			}
			d.ID = id
			en, err := e.commitment(req, caller, id, tx, pol, kind)
			if err != nil {
				return err
			}
			if under != nil && out.Kind == reviewlog.AskPlain {
				en.Mandate = under.m.Grant.ID
			}
			if t := opts.Authorization; t != nil && opts.Hold {
				en.Payer, en.Nonce, en.ValidBefore = strings.ToLower(t.Payer), strings.ToLower(t.Nonce(id)), ledger.FormatTime(t.ValidBefore)
			}
			raw, err := e.appendEntry(ctx, tx.Store, en)
			if err != nil {
				return err
			}
			own = &raw
			ans.Reservation = e.entryInfo(en)
			if sign != nil {
				// Signed while the entry syncs, before any receipt is
				// written: a signer that fails leaves only the entry,
				// which the failed section takes back.
				au, digest, err := sign(ctx, Signing{DecisionReceipt: id, ReviewID: a.ReviewID})
				if err != nil {
					return &signFailed{err: err}
				}
				au.DecisionReceipt, au.ReviewID = id, a.ReviewID
				signing, signDigest = &au, digest
			}
		}
		var r noa.Receipt
		if signing != nil {
			// The authorization's receipt follows the decision's in its
			// chain: both sealed while the entry syncs and written in one
			// append (one sync covers both where the store syncs), and its
			// log line follows both; the section ends only once all are on
			// disk, so the signature leaves with its records durable.
			au, digest := *signing, signDigest
			var ar noa.Receipt
			r, ar, wrote, err = e.cfg.Chains.AppendPairAt(ctx, tx.Store, d, func(noa.Receipt) noa.Draft {
				return authorizationDraft(caller, au, digest, tx.At)
			})
			if err != nil {
				return err
			}
			signing.Receipt = ar.ID
			signed = signing
		} else if r, wrote, err = e.cfg.Chains.AppendAt(ctx, tx.Store, d); err != nil {
			return err
		}
		// The question beside its receipt, for a policy tried on
		// history (Simulate).
		if err := e.keepQuestion(ctx, tx.Store, r, questionKind(opts, call), caller, req, q, call); err != nil {
			return err
		}
		ans.ReceiptID = r.ID
		ans.ActionID = d.Action.ID
		ans.ParamsHash = paramsHash
		return nil
	})
	if sf := (*signFailed)(nil); errors.As(err, &sf) {
		e.cfg.Logger.Error("the payer signer did not sign an allowed payment; nothing was recorded", "err", sf.err, "caller", caller)
		return Answer{}, &NotRecordedError{Message: "the payment would be allowed, but the payer signer did not sign it, so no authorization is given and nothing was recorded, reserved or signed (fail closed); the operator's log says why", Err: sf.err}
	}
	if err != nil {
		return Answer{}, e.notRecorded("record the "+dec.Decision+" decision", err)
	}
	ans.Authorization = signed
	if own != nil {
		e.committed(*own)
	}
	// This process need not read its own receipt back: its entry, when it
	// commits a payment, is in the Book now.
	e.tail.Skip(wrote)
	if ans.Reservation != nil {
		// The history line stays last.
		n := len(ans.Reasons)
		ans.Reasons = append(ans.Reasons[:n-1:n-1], ans.Reservation.reason(pol), ans.Reasons[n-1])
	}
	if opts.DryRun {
		ans = dryRun(ans, out)
		e.cfg.Logger.Info("check_before_pay dry run", "decision", ans.Decision, "outcome", out.Kind, "caller", caller)
		return ans, nil
	}
	e.integrity(out.Review)
	if ans.Decision == guard.Review && ans.ReviewID != "" && e.cfg.ReviewURL != nil {
		ans.ReviewURL = e.cfg.ReviewURL(ans.ReviewID)
	}
	if out.Kind == reviewlog.AskOpened && e.cfg.Notify != nil {
		rv := out.Review
		rv.TermsReceipt = termsReceipt
		rv.AssetSymbol = e.assetSymbol(rv.Asset)
		rv.ReviewURL = ans.ReviewURL
		e.cfg.Notify(rv)
	}
	e.cfg.Logger.Info("check_before_pay", "decision", ans.Decision, "outcome", out.Kind, "review_id", ans.ReviewID, "receipt_id", ans.ReceiptID, "caller", caller)
	if au := ans.Authorization; au != nil {
		e.cfg.Logger.Info("authorize_payment", "decision_receipt", au.DecisionReceipt, "receipt_id", au.Receipt, "nonce", au.Nonce, "to", au.To, "value", au.Value, "caller", caller)
	}
	return ans, nil
}

// questionKind names the entry point that asked.
func questionKind(opts CheckOptions, call *Call) string {
	switch {
	case call != nil:
		return QuestionCall
	case opts.Hold:
		return QuestionAuthorize
	}
	return QuestionCheck
}

// readsTotals says whether an answer under pol reads what every
// counterparty was paid or reserved (so it waits for every other allow of
// the tenant): a total limit or total velocity, or custom rules, which see
// the figures over every counterparty (the total in the window, the
// payments without a resource). The duplicate window reads only its
// resource's payments, which the resource's scope guards.
func readsTotals(pol *guard.Config, customRules bool) bool {
	return customRules || pol.TotalLimit != nil || pol.Velocity.Total != nil
}

// parse reads a question under the caller's policy.
func (e *Engine) parse(pol *guard.Config, q Question) (guard.Request, error) {
	if q.Template == "" {
		q.Template = pol.QuestionTemplate()
	} else if !slices.Contains(pol.HistoryTemplates, q.Template) {
		return guard.Request{}, refusedf("template %q cannot be used here: the guard reads history under the policy's history templates (%s), so template may only name one of them",
			clipText(q.Template), strings.Join(pol.HistoryTemplates, ", "))
	}
	if err := guard.CheckAmountSyntax(q.Amount); err != nil {
		return guard.Request{}, refusedf("%s; an amount is a plain decimal string in display units such as \"0.25\" (digits, optionally a point and digits; no sign, exponent or spaces); nothing was recorded",
			strings.TrimPrefix(err.Error(), guard.ErrAmount.Error()+": "))
	}
	req, err := guard.ParseRequest(q, pol)
	if err != nil {
		return guard.Request{}, refusedf("%s", strings.TrimPrefix(err.Error(), guard.ErrRequest.Error()+": "))
	}
	return req, nil
}

// decide applies the built-in rules and the custom rules; the draft gets
// the custom rules' compliance.
func (e *Engine) decide(req guard.Request, h guard.History, pol *guard.Config, now time.Time, draft *noa.Draft) guard.Decision {
	dec := guard.Decide(req, h, pol, now)
	if rules := e.judged.Load().rules; rules != nil {
		c := applyRules(rules, &dec, req)
		if draft != nil {
			draft.Governance.Compliance = c
		}
	}
	return dec
}

// dryRun marks an answer as what the guard would say.
func dryRun(a Answer, out reviewlog.AskOutcome) Answer {
	what := "nothing was recorded, reserved, opened or used"
	switch out.Kind {
	case reviewlog.AskOpened:
		what = "a review would be opened; " + what
		a.ReviewID = ""
	case reviewlog.AskApproved:
		what = "the approval of review " + a.ReviewID + " would be used; " + what
	}
	a.DryRun, a.ReceiptID = true, ""
	if a.Reservation != nil {
		a.Reservation = nil
	}
	a.Reasons = append([]guard.Reason{{Rule: RuleDryRun, Detail: "dry run: this is what the guard would answer now; " + what}}, a.Reasons...)
	return a
}

// RuleDryRun is the first reason of a dry run's answer.
const RuleDryRun = "dry_run"

// integrity logs (and counts) what the log and the signatures disagree on.
func (e *Engine) integrity(r reviewlog.Review) {
	for _, w := range r.Integrity {
		e.cfg.Logger.Warn("review integrity", "review_id", r.ID, "finding", w)
		if e.cfg.OnIntegrity != nil {
			e.cfg.OnIntegrity()
		}
	}
}

// shape is the answer an Ask outcome gives. The history line stays last.
func (e *Engine) shape(dec guard.Decision, out reviewlog.AskOutcome) Answer {
	hist := dec.Reasons[len(dec.Reasons)-1]
	rv := out.Review
	switch out.Kind {
	case reviewlog.AskOpened, reviewlog.AskReused:
		return Answer{Decision: guard.Review, Reasons: dec.Reasons, ReviewID: rv.ID}
	case reviewlog.AskApproved:
		detail := fmt.Sprintf("review %s was approved by %s at %s", rv.ID, rv.DecidedBy, rv.DecidedAt)
		if rv.Note != "" {
			detail += fmt.Sprintf(" (note: %s)", rv.Note)
		}
		detail += "; the approval is used by this answer and only once: the next identical question follows the rules again"
		return Answer{Decision: guard.Allow, Reasons: []guard.Reason{{Rule: reviewlog.RuleHumanApproved, Detail: detail}, hist}, ReviewID: rv.ID}
	case reviewlog.AskRejected:
		detail := fmt.Sprintf("review %s of this same question was rejected by %s at %s", rv.ID, rv.DecidedBy, rv.DecidedAt)
		if rv.Note != "" {
			detail += fmt.Sprintf(" (note: %s)", rv.Note)
		}
		detail += fmt.Sprintf("; the rejection holds for %s after the decision", e.Policy().RejectionHold)
		return Answer{Decision: guard.Block, Reasons: []guard.Reason{{Rule: reviewlog.RuleHumanRejected, Detail: detail}, hist}, ReviewID: rv.ID}
	case reviewlog.AskQueueFull:
		reason := guard.Reason{Rule: RuleQueueFull, Detail: fmt.Sprintf("this caller already has %d pending reviews, the most the policy allows (maxPendingReviewsPerCaller %d); no review is opened until a reviewer decides some or they expire",
			out.Pending, e.Policy().MaxPendingReviews)}
		n := len(dec.Reasons)
		return Answer{Decision: guard.Block, Reasons: append(append([]guard.Reason{reason}, dec.Reasons[:n-1]...), hist)}
	}
	return Answer{Decision: dec.Decision, Reasons: dec.Reasons}
}

// RuleCustom names the reason a custom rule gives (or its failure to run).
const RuleCustom = ruleCustom

// RuleQueueFull names the block given when a caller holds too many pending
// reviews to open another.
const RuleQueueFull = "review_queue_full"

// SinceSource is a HistorySource that can read history for decisions
// only: HistorySince gives a History whose decisions are those of
// History's for every question whose windows start at or after since,
// with the operations no such question reads one by one counted rather
// than listed (guard.Elided), which a restart reads without every run.
type SinceSource interface {
	HistorySince(ctx context.Context, t *receipt.Template, since time.Time) (guard.History, error)
}

// history reads past operations under every template the policy names and
// merges them, worst case first.
func (e *Engine) history(ctx context.Context) (guard.History, error) {
	return e.historyFor(ctx, false)
}

// forDecisions is the start of the earliest window a decision (of any
// agent's policy) or the spend ledger's matching reads, with a minute to
// spare: history read for decisions may leave out what is older.
func (e *Engine) forDecisions() time.Time {
	h := horizon(e.Policy())
	if e.book != nil {
		h = max(h, e.book.Horizon())
	}
	return e.cfg.Now().Add(-h - time.Minute)
}

// historyFor is history; decide says it is read only for decisions
// (guard.Decide, the spend ledger's matching), so that a SinceSource may
// count what no decision reads one by one instead of listing it. History
// read under several templates is merged operation by operation, and is
// read whole.
func (e *Engine) historyFor(ctx context.Context, decide bool) (guard.History, error) {
	names := e.Policy().HistoryTemplates
	hs := make([]guard.History, 0, len(names))
	ov, _ := e.cfg.Templates.(overrider)
	since, partial := e.cfg.History.(SinceSource)
	var from time.Time
	if partial && decide && len(names) == 1 {
		from = e.forDecisions()
	} else {
		partial = false
	}
	for _, name := range names {
		t, err := e.cfg.Templates.Resolve(name)
		if err != nil {
			return guard.History{}, fmt.Errorf("history template %s: %w", name, err)
		}
		var h guard.History
		if partial {
			h, err = since.HistorySince(ctx, t, from)
		} else {
			h, err = e.cfg.History.History(ctx, t)
		}
		if err != nil {
			return guard.History{}, fmt.Errorf("read history under %s: %w", name, err)
		}
		h.Templates = []string{name}
		if ov != nil && ov.Overrides(name) {
			h.Overridden = []string{name}
		}
		hs = append(hs, h)
	}
	return guard.MergeHistories(hs...), nil
}

// notRecorded reports a failure to record a decision. The decision is not
// returned: an answer that was not recorded must not be acted on.
func (e *Engine) notRecorded(what string, err error) error {
	switch {
	case errors.Is(err, reviewlog.ErrLockTimeout):
		return &NotRecordedError{Message: "could not " + what + ": the review log is busy (lock not obtained), so no decision is given; ask again", Err: err}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		e.cfg.Logger.Info("decision not recorded: the caller went away", "what", what)
		return &NotRecordedError{Message: "the request ended before the decision could be recorded, so no decision is given; ask again", Err: err}
	case errors.Is(err, reviewlog.ErrCorrupt):
		e.cfg.Logger.Error("decision not recorded: the review log is damaged", "what", what, "err", err)
		return &NotRecordedError{Message: "could not " + what + ": the review log is damaged, so no decision is given; the operator must look at it", Err: err}
	}
	e.cfg.Logger.Error("decision not recorded", "what", what, "err", err)
	return &NotRecordedError{Message: "could not " + what + ", so no decision is given (fail closed); the operator's log says why", Err: err}
}

func verdictOf(decision string) string {
	switch decision {
	case guard.Allow:
		return noa.VerdictAllowed
	case guard.Review:
		return noa.VerdictDeferred
	default:
		return noa.VerdictBlocked
	}
}

// firstRule names the rule behind a review or block (the first non-history
// reason), or nil for allow.
func firstRule(dec guard.Decision) *string {
	if dec.Decision == guard.Allow {
		return nil
	}
	for _, r := range dec.Reasons {
		if r.Rule != guard.RuleHistory {
			rule := r.Rule
			return &rule
		}
	}
	return nil
}

// assetSymbol is the symbol the policy knows an asset key by ("" if none).
func (e *Engine) assetSymbol(key string) string {
	if a, ok := e.Policy().Assets.Lookup(key); ok {
		return a.Symbol
	}
	return ""
}

// atomicText is the amount in atomic units, "" when it cannot be read in a
// known asset.
func atomicText(req guard.Request) string {
	if req.AssetErr != nil || req.Atomic == nil {
		return ""
	}
	return req.Atomic.String()
}

func clipText(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
