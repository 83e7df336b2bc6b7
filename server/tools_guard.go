package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Guard is what the pre-payment tools need. All of it is fixed at start:
// nothing a tool call or an event says can change the policy.
type Guard struct {
	Policy *guard.Config
	// Rules are the operator's custom rules (noa.policy/0.2), or nil.
	Rules *policy.Policy
	Log   *reviewlog.Log
	// Chains signs every answer into the decision chain.
	Chains *reviewlog.Chains
	// ParamsKey keys the HMAC that stands for the request in receipts.
	ParamsKey []byte
	// AgentID names the caller over stdio; over HTTP the token's subject does.
	AgentID string
}

// Receipt vocabulary for guard decisions.
const (
	actionCanonical = "x402.payment"
	governanceMode  = "approvals_on"
	ruleCustom      = "custom_rule"
)

func (s *Server) guardTools() []toolDef {
	return []toolDef{
		{
			name:  "check_before_pay",
			title: "Check before paying",
			description: "Ask before every new payment whether it should go ahead: allow, review (a human decides) or block, " +
				"with the reasons and the receipts they rest on. Advisory: it never moves funds. A review is recorded in the review log; " +
				"asking the same question again within 10 minutes returns the same pending review.",
			readOnly: false, idempotent: true,
			handler: s.checkBeforePay,
		},
		{
			name:  "get_review_status",
			title: "Get a review's status",
			description: "Read the state of a review check_before_pay opened: pending, approved or rejected, with the reviewer's note " +
				"and the signed receipts that record it. Only a human, from the command line, can decide a review.",
			readOnly: true, idempotent: true,
			handler: s.getReviewStatus,
		},
	}
}

// callerID is who asked: the verified token subject over HTTP, the
// configured id over stdio — never anything a tool argument says.
func (s *Server) callerID(ctx context.Context) string {
	if sub, ok := auth.SubjectFrom(ctx); ok && sub != "" {
		return sub
	}
	return s.cfg.Guard.AgentID
}

type checkResult struct {
	Decision  string         `json:"decision"`
	Reasons   []guard.Reason `json:"reasons"`
	ReviewID  string         `json:"review_id,omitempty"`
	ReceiptID string         `json:"receipt_id"`
}

func (s *Server) checkBeforePay(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	g := s.cfg.Guard
	a := newArgs(raw, "counterparty", "amount", "asset", "template")
	rr := guard.RawRequest{
		Counterparty: a.str("counterparty", true, "", 2048),
		Amount:       a.str("amount", true, "", 64),
		Asset:        a.str("asset", false, "", 200),
		Template:     a.str("template", false, DefaultTemplate, 64),
	}
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	req, err := guard.ParseRequest(rr, g.Policy)
	if err != nil {
		return nil, userErrorf("%s", strings.TrimPrefix(err.Error(), guard.ErrRequest.Error()+": "))
	}
	t, err := s.template(req.Template)
	if err != nil {
		return nil, err
	}
	listing, err := s.index.List(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	hist := guard.History{Runs: len(listing.Runs)}
	for _, rv := range listing.Runs {
		for _, it := range rv.Items {
			hist.Ops = append(hist.Ops, it.Guard)
		}
	}
	for _, u := range listing.Unreadable {
		hist.Unreadable = append(hist.Unreadable, guard.UnreadableRun{RunID: u.RunID, Error: s.relative(u.Err.Error())})
	}
	now := s.cfg.Now()
	dec := guard.Decide(req, hist, g.Policy, now)
	var compliance *noa.Compliance
	if g.Rules != nil {
		compliance = s.applyRules(&dec, req)
	}
	paramsHash, err := s.paramsHash(req)
	if err != nil {
		return nil, err
	}
	draft := noa.Draft{
		TS:    now,
		Agent: noa.Agent{ID: s.callerID(ctx), Principal: noa.PrincipalService},
		Action: noa.Action{
			Canonical: actionCanonical, RiskClass: "IRREVERSIBLE", ParamsHash: paramsHash, Reversible: false,
		},
		Governance: noa.Governance{Mode: governanceMode, Verdict: verdictOf(dec.Decision), RuleID: firstRule(dec), Compliance: compliance},
	}
	res := checkResult{Decision: dec.Decision, Reasons: dec.Reasons}
	record := func(actionID string) reviewlog.Hook {
		return func(tx reviewlog.Tx) error {
			d := draft
			d.Action.ID = actionID
			if actionID == "" {
				d.Action.ID = "review:" + tx.Review.ID
			}
			r, err := g.Chains.Append(ctx, tx.Guard, d)
			if err != nil {
				return err
			}
			res.ReceiptID = r.ID
			return nil
		}
	}
	if dec.Decision == "review" {
		rv, _, err := g.Log.OpenReview(ctx, req.Question(), dec.Reasons, record(""))
		if err != nil {
			return nil, s.guardError("open the review", err)
		}
		res.ReviewID = rv.ID
	} else {
		id, err := randomID("check")
		if err != nil {
			return nil, err
		}
		if err := g.Log.WithLock(ctx, record(id)); err != nil {
			return nil, s.guardError("record the decision", err)
		}
	}
	s.cfg.Logger.Info("check_before_pay", "decision", res.Decision, "review_id", res.ReviewID, "receipt_id", res.ReceiptID, "caller", draft.Agent.ID)
	return structured(res, renderCheck(res)), nil
}

// guardError reports a failure to record a decision. The decision is not
// returned: an answer that was not recorded must not be acted on.
func (s *Server) guardError(what string, err error) error {
	switch {
	case errors.Is(err, reviewlog.ErrLockTimeout):
		return userErrorf("could not %s: the review log is busy (lock not obtained); ask again", what)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		s.cfg.Logger.Info("decision not recorded: the caller went away", "what", what)
		return userErrorf("the request ended before the decision could be recorded, so no decision is given; ask again")
	case errors.Is(err, reviewlog.ErrCorrupt):
		return userErrorf("could not %s: the review log is damaged; the operator must look at it", what)
	}
	s.cfg.Logger.Error("decision not recorded", "what", what, "err", err)
	return userErrorf("could not %s, so no decision is given (fail closed); the operator's log says why", what)
}

// applyRules evaluates the operator's custom rules over the snapshot of
// this request. A DENY blocks; a snapshot that cannot be built blocks too.
func (s *Server) applyRules(dec *guard.Decision, req guard.Request) *noa.Compliance {
	rules := s.cfg.Guard.Rules
	snap, err := ruleSnapshot(req, dec)
	var reason *guard.Reason
	var comp *noa.Compliance
	if err != nil {
		reason = &guard.Reason{Rule: ruleCustom, Detail: "custom rules could not be evaluated (" + err.Error() + "), so the payment is blocked"}
	} else {
		c, r, err := rules.Commit(snap)
		switch {
		case err != nil:
			reason = &guard.Reason{Rule: ruleCustom, Detail: "custom rules could not be evaluated (" + r.Reason + "), so the payment is blocked"}
		case r.Verdict == policy.Deny:
			fired := r.RuleFired
			if fired == "" {
				fired = "(none)"
			}
			detail := fmt.Sprintf("custom rule %q of policy %q denies this payment", fired, rules.ID())
			if r.Failed() {
				detail = fmt.Sprintf("custom rules of policy %q failed closed (%s: %s)", rules.ID(), fired, r.Reason)
			}
			reason = &guard.Reason{Rule: ruleCustom, Detail: detail}
			comp = &noa.Compliance{PolicyHash: c.PolicyHash, ReadSetHash: c.ReadSetHash, InputsHash: c.InputsHash, Verdict: c.Verdict}
		default:
			comp = &noa.Compliance{PolicyHash: c.PolicyHash, ReadSetHash: c.ReadSetHash, InputsHash: c.InputsHash, Verdict: c.Verdict}
		}
	}
	if reason != nil {
		dec.Decision = "block"
		// The history line stays last.
		n := len(dec.Reasons)
		dec.Reasons = append(dec.Reasons[:n-1:n-1], *reason, dec.Reasons[n-1])
	}
	return comp
}

// ruleSnapshot is the flat set of scalars custom rules read. Every key is
// documented in the README.
func ruleSnapshot(req guard.Request, dec *guard.Decision) (policy.Snapshot, error) {
	f := dec.Figures
	snap := policy.Snapshot{
		"args.counterparty":          policy.String(req.Counterparty.Value),
		"args.counterpartyKind":      policy.String(string(req.Counterparty.Kind)),
		"args.amount":                policy.String(req.AmountText),
		"args.asset":                 policy.String(req.Question().Asset),
		"args.template":              policy.String(req.Template),
		"guard.decision":             policy.String(dec.Decision),
		"history.matchedOperations":  policy.Int(int64(f.Matched)),
		"history.openPartial":        policy.Int(int64(f.OpenPartial)),
		"history.windowOperations":   policy.Int(int64(f.WindowOperations)),
		"history.mixedAssets":        policy.Int(int64(f.MixedAssets)),
		"history.unparseableHistory": policy.Int(int64(f.UnparseableHistory)),
		"history.operations":         policy.Int(int64(f.Operations)),
		"history.runs":               policy.Int(int64(f.Runs)),
		"history.unattributable":     policy.Int(int64(f.Unattributable)),
		"history.unreadableRuns":     policy.Int(int64(f.UnreadableRuns)),
		"history.coarse":             policy.Bool(f.Coarse),
		"history.denylisted":         policy.Bool(f.Denylisted),
		"history.allowlisted":        policy.Bool(f.Allowlisted),
		"history.settledOperations":  policy.Int(int64(f.Matched - f.OpenPartial)),
	}
	for key, v := range map[string]*big.Int{
		"amountAtomic":                  f.Amount,
		"history.spendInWindowAtomic":   f.Spend,
		"history.spendWithAmountAtomic": f.SpendWithAmount,
	} {
		if v == nil {
			continue // absent: the amount could not be read in the policy's asset
		}
		if !v.IsInt64() || v.Int64() > policy.MaxSafeInteger {
			return nil, fmt.Errorf("%s is larger than 2^53-1 atomic units", key)
		}
		snap[key] = policy.Int(v.Int64())
	}
	return snap, nil
}

// paramsHash stands for the request in a receipt without revealing it: an
// HMAC under the operator's key, so amounts cannot be brute-forced.
func (s *Server) paramsHash(req guard.Request) (string, error) {
	return ParamsHash(s.cfg.Guard.ParamsKey, req.Question())
}

// ParamsHash is the keyed hash of a question as receipts carry it; the
// guard's answer and the human's decision on it carry the same value.
func ParamsHash(key []byte, q guard.Question) (string, error) {
	h, err := noa.ParamsHash(key, map[string]any{
		"counterparty": q.Counterparty, "amount": q.Amount, "asset": q.Asset, "template": q.Template,
	})
	if err != nil {
		return "", fmt.Errorf("params hash: %w", err)
	}
	return h, nil
}

// HumanDecisionDraft maps a reviewer's decision to a receipt: approval →
// ALLOWED, rejection → BLOCKED, with approval {by, at}; the reviewer is the
// agent, with principal HUMAN.
func HumanDecisionDraft(rv reviewlog.Review, paramsKey []byte) (noa.Draft, error) {
	ph, err := ParamsHash(paramsKey, guard.Question{Counterparty: rv.Counterparty, Amount: rv.Amount, Asset: rv.Asset, Template: rv.Template})
	if err != nil {
		return noa.Draft{}, err
	}
	at, err := time.Parse(time.RFC3339Nano, rv.DecidedAt)
	if err != nil {
		return noa.Draft{}, fmt.Errorf("review %s: decided_at %q: %w", rv.ID, rv.DecidedAt, err)
	}
	verdict := noa.VerdictBlocked
	if rv.Status == reviewlog.Approved {
		verdict = noa.VerdictAllowed
	}
	rule := "human_review"
	return noa.Draft{
		TS:    at,
		Agent: noa.Agent{ID: rv.DecidedBy, Principal: noa.PrincipalHuman},
		Action: noa.Action{
			ID: "review:" + rv.ID, Canonical: actionCanonical, RiskClass: "IRREVERSIBLE", ParamsHash: ph, Reversible: false,
		},
		Governance: noa.Governance{
			Mode: governanceMode, Verdict: verdict, RuleID: &rule,
			Approval: &noa.Approval{By: rv.DecidedBy, At: noa.FormatTS(at)},
		},
	}, nil
}

// ParamsKeyFrom derives the paramsHash key from signing-key material, so
// that one secret serves both (a key of its own can be passed instead).
func ParamsKeyFrom(secret []byte) []byte {
	m := hmac.New(sha256.New, []byte("haia-trace-mcp/paramsHash/v1"))
	m.Write(secret)
	return m.Sum(nil)
}

func verdictOf(decision string) string {
	switch decision {
	case "allow":
		return noa.VerdictAllowed
	case "review":
		return noa.VerdictDeferred
	default:
		return noa.VerdictBlocked
	}
}

// firstRule names the rule behind a review or block (the first non-history
// reason), or nil for allow.
func firstRule(dec guard.Decision) *string {
	if dec.Decision == "allow" {
		return nil
	}
	for _, r := range dec.Reasons {
		if r.Rule != "history" {
			rule := r.Rule
			return &rule
		}
	}
	return nil
}

func randomID(prefix string) (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return prefix + ":" + hex.EncodeToString(b[:]), nil
}

func renderCheck(res checkResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Decision: %s", strings.ToUpper(res.Decision))
	if res.ReviewID != "" {
		fmt.Fprintf(&b, " (review %s is pending a human decision; poll get_review_status)", res.ReviewID)
	}
	b.WriteString("\n")
	for _, r := range res.Reasons {
		fmt.Fprintf(&b, "- %s: %s", r.Rule, r.Detail)
		for i, e := range r.Evidence {
			if i == 0 {
				b.WriteString(" [")
			} else {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s/%s", e.RunID, e.OperationID)
			if i == len(r.Evidence)-1 {
				b.WriteString("]")
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Recorded as signed receipt %s.\n", res.ReceiptID)
	return b.String()
}

type reviewStatus struct {
	reviewlog.Review
	Receipts []string `json:"receipts"`
}

func (s *Server) getReviewStatus(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	a := newArgs(raw, "review_id")
	id := a.str("review_id", true, "", 64)
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	rv, err := s.cfg.Guard.Log.Get(ctx, id)
	switch {
	case errors.Is(err, reviewlog.ErrUnknownReview), errors.Is(err, reviewlog.ErrBadID):
		return nil, userErrorf("no review %q (check_before_pay returns the review_id to ask about)", id)
	case err != nil:
		return nil, fmt.Errorf("read review %s: %w", id, err)
	}
	out := reviewStatus{Review: rv, Receipts: []string{}}
	if gdir, err := s.cfg.Root.OpenDir(reviewlog.DirName); err == nil {
		ids, err := reviewlog.ReceiptsForAction(gdir, "review:"+rv.ID)
		gdir.Close()
		if err != nil {
			return nil, fmt.Errorf("read decision receipts: %w", err)
		}
		if ids != nil {
			out.Receipts = ids
		}
	}
	text := fmt.Sprintf("Review %s is %s", rv.ID, rv.Status)
	if rv.DecidedAt != "" {
		text += fmt.Sprintf(" (decided %s by %s)", rv.DecidedAt, rv.DecidedBy)
	}
	if rv.Note != "" {
		text += fmt.Sprintf("; note: %s", rv.Note)
	}
	text += fmt.Sprintf(". Question: pay %s %s to %s. Receipts: %s.", rv.Amount, rv.Asset, rv.Counterparty, strings.Join(out.Receipts, ", "))
	return structured(out, text), nil
}
