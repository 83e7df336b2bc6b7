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
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// HistorySource reads every past operation under one template, with the runs
// that could not be read. The server's run index is one; ScanHistory, which
// reads the run files on every call, is another.
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

// Config is what an Engine needs; every part is fixed for its lifetime.
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
	// OnIntegrity, when set, is called once per integrity warning (the log
	// and the signatures disagree about a review), for a metric.
	OnIntegrity func()
}

// Engine answers check_before_pay questions.
type Engine struct {
	cfg Config
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
	if len(cfg.Policy.HistoryTemplates) == 0 {
		return nil, errors.New("engine: the policy names no history templates")
	}
	for _, name := range cfg.Policy.HistoryTemplates {
		if _, err := cfg.Templates.Resolve(name); err != nil {
			return nil, fmt.Errorf("guard config historyTemplates names %q, which cannot be used: %w", name, err)
		}
	}
	return &Engine{cfg: cfg}, nil
}

// Policy is the policy the engine judges by.
func (e *Engine) Policy() *guard.Config { return e.cfg.Policy }

// Question is what a caller asks: check_before_pay's arguments.
type Question = guard.RawRequest

// Answer is the recorded answer to a question.
type Answer struct {
	Decision  string         `json:"decision"`
	Reasons   []guard.Reason `json:"reasons"`
	ReviewID  string         `json:"review_id,omitempty"`
	ReceiptID string         `json:"receipt_id"`
	// ActionID and ParamsHash are the receipt's action.id and
	// action.paramsHash, for a record that follows the decision (the
	// outcome of a proxied call); they are not part of the answer.
	ActionID   string `json:"-"`
	ParamsHash string `json:"-"`
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
// never anything the question says.
func (e *Engine) Check(ctx context.Context, caller string, q Question) (Answer, error) {
	return e.check(ctx, caller, q, nil)
}

func (e *Engine) check(ctx context.Context, caller string, q Question, call *Call) (Answer, error) {
	if caller == "" {
		return Answer{}, errors.New("engine: no caller identity")
	}
	// The caller's own policy under agents, else the default one. Both
	// read history under the same templates: agents set limits only.
	pol := e.cfg.Policy.For(caller)
	if q.Template == "" {
		q.Template = defaultTemplate(pol)
	} else if !slices.Contains(pol.HistoryTemplates, q.Template) {
		return Answer{}, refusedf("template %q cannot be used here: the guard reads history under the policy's history templates (%s), so template may only name one of them",
			clipText(q.Template), strings.Join(pol.HistoryTemplates, ", "))
	}
	if err := guard.CheckAmountSyntax(q.Amount); err != nil {
		return Answer{}, refusedf("%s; an amount is a plain decimal string in display units such as \"0.25\" (digits, optionally a point and digits; no sign, exponent or spaces); nothing was recorded",
			strings.TrimPrefix(err.Error(), guard.ErrAmount.Error()+": "))
	}
	req, err := guard.ParseRequest(q, pol)
	if err != nil {
		return Answer{}, refusedf("%s", strings.TrimPrefix(err.Error(), guard.ErrRequest.Error()+": "))
	}
	hist, err := e.history(ctx)
	if err != nil {
		return Answer{}, err
	}
	now := e.cfg.Now()
	dec := guard.Decide(req, hist, pol, now)
	var compliance *noa.Compliance
	if e.cfg.Rules != nil {
		compliance = applyRules(e.cfg.Rules, &dec, req)
	}
	var paramsHash string
	if call != nil {
		paramsHash, err = CallParamsHash(e.cfg.ParamsKey, *call)
	} else {
		paramsHash, err = QuestionHash(e.cfg.ParamsKey, req.Question(), req.Resource)
	}
	if err != nil {
		return Answer{}, err
	}
	draft := noa.Draft{
		TS:    now,
		Agent: noa.Agent{ID: caller, Principal: noa.PrincipalService},
		Action: noa.Action{
			Canonical: actionCanonical, RiskClass: "IRREVERSIBLE", ParamsHash: paramsHash, Reversible: false,
		},
		Governance: noa.Governance{Mode: governanceMode, Verdict: verdictOf(dec.Decision), RuleID: firstRule(dec), Compliance: compliance},
	}
	ans := Answer{Decision: dec.Decision, Reasons: dec.Reasons}
	plainID, err := randomID("check")
	if err != nil {
		return Answer{}, err
	}
	termsReceipt := ""
	out, err := e.cfg.Log.Ask(ctx, reviewlog.AskRequest{
		Caller: caller, Question: req.Question(), ParamsHash: paramsHash, Decision: dec.Decision, Reasons: dec.Reasons,
		ApprovalTTL: pol.ApprovalTTL, RejectionHold: pol.RejectionHold, MaxPending: pol.MaxPendingReviews,
		ExactParams: call != nil,
		Tenant:      e.cfg.Chains.Tenant, Resource: req.Resource, AmountAtomic: atomicText(req),
	}, func(tx reviewlog.Tx, out reviewlog.AskOutcome) error {
		if out.Kind == reviewlog.AskOpened {
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
		r, err := e.cfg.Chains.Append(ctx, tx.Store, d)
		if err != nil {
			return err
		}
		ans = a
		ans.ReceiptID = r.ID
		ans.ActionID = d.Action.ID
		ans.ParamsHash = paramsHash
		return nil
	})
	if err != nil {
		return Answer{}, e.notRecorded("record the "+dec.Decision+" decision", err)
	}
	e.integrity(out.Review)
	if out.Kind == reviewlog.AskOpened && e.cfg.Notify != nil {
		rv := out.Review
		rv.TermsReceipt = termsReceipt
		rv.AssetSymbol = e.assetSymbol(rv.Asset)
		e.cfg.Notify(rv)
	}
	e.cfg.Logger.Info("check_before_pay", "decision", ans.Decision, "outcome", out.Kind, "review_id", ans.ReviewID, "receipt_id", ans.ReceiptID, "caller", caller)
	return ans, nil
}

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
		detail += fmt.Sprintf("; the rejection holds for %s after the decision", e.cfg.Policy.RejectionHold)
		return Answer{Decision: guard.Block, Reasons: []guard.Reason{{Rule: reviewlog.RuleHumanRejected, Detail: detail}, hist}, ReviewID: rv.ID}
	case reviewlog.AskQueueFull:
		reason := guard.Reason{Rule: RuleQueueFull, Detail: fmt.Sprintf("this caller already has %d pending reviews, the most the policy allows (maxPendingReviewsPerCaller %d); no review is opened until a reviewer decides some or they expire",
			out.Pending, e.cfg.Policy.MaxPendingReviews)}
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

func defaultTemplate(pol *guard.Config) string {
	if slices.Contains(pol.HistoryTemplates, guard.DefaultTemplate) {
		return guard.DefaultTemplate
	}
	return pol.HistoryTemplates[0]
}

// history reads past operations under every template the policy names and
// merges them, worst case first.
func (e *Engine) history(ctx context.Context) (guard.History, error) {
	names := e.cfg.Policy.HistoryTemplates
	hs := make([]guard.History, 0, len(names))
	ov, _ := e.cfg.Templates.(overrider)
	for _, name := range names {
		t, err := e.cfg.Templates.Resolve(name)
		if err != nil {
			return guard.History{}, fmt.Errorf("history template %s: %w", name, err)
		}
		h, err := e.cfg.History.History(ctx, t)
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
	if a, ok := e.cfg.Policy.Assets.Lookup(key); ok {
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
