package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/auth"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
)

// Guard is what the pre-payment tools need: the one decision engine, and
// who the caller is over stdio.
type Guard struct {
	Engine *engine.Engine
	// AgentID names the caller over stdio; over HTTP the token's subject does.
	AgentID string
	// Payments, when set, signs x402 payments the engine allows
	// (authorize_payment).
	Payments *payment.Authorizer
	// NoCheckTool leaves check_before_pay out (get_review_status stays):
	// the guard proxy asks the engine itself before each paying call.
	NoCheckTool bool
}

// CallerID is who asked: the verified token subject over HTTP, the
// configured agent id over stdio — never anything a tool argument says.
func (s *Server) CallerID(ctx context.Context) string { return s.callerID(ctx) }

func (s *Server) guardTools() []toolDef {
	tools := []toolDef{
		{
			name:  "check_before_pay",
			title: "Check before paying",
			description: "Ask before every new payment whether it should go ahead: allow, review (a human decides) or block, " +
				"with the reasons and the receipts they rest on. Advisory: it never moves funds. A review is recorded in the review log; " +
				"asking the same question again returns the same pending review until a human decides it or it expires. An allow reserves its payment: it counts " +
				"against every limit until the Trace shows it or the reservation lapses. Naming a host? Pass the 402's payee address as pay_to too. " +
				"dry_run: true answers without recording anything.",
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
	if s.guard != nil && s.guard.Payments != nil {
		tools = append(tools, s.paymentTool(), s.receiptTool())
	}
	if s.guard != nil && s.guard.NoCheckTool {
		tools = tools[1:]
	}
	return tools
}

// EnableGuard registers the guard's tools.
func (s *Server) EnableGuard(g *Guard) error {
	if g == nil || g.Engine == nil || g.AgentID == "" {
		return errors.New("server: the guard needs a decision engine and an agent id")
	}
	s.guard = g
	return s.addTools(s.guardTools())
}

// callerID is who asked: the verified token subject over HTTP, the
// configured id over stdio — never anything a tool argument says.
func (s *Server) callerID(ctx context.Context) string {
	if sub, ok := auth.SubjectFrom(ctx); ok && sub != "" {
		return sub
	}
	return s.guard.AgentID
}

func (s *Server) checkBeforePay(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	a := newArgs(raw, append(guard.QuestionArgNames(), "dry_run")...)
	var q engine.Question
	for _, arg := range guard.QuestionArgs() {
		*q.Field(arg.Name) = a.question(arg)
	}
	dry := a.boolean("dry_run")
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	kept, retried := s.retriedAnswer(ctx, "check_before_pay")
	if kept != nil {
		return kept, nil
	}
	ans, err := s.guard.Engine.CheckWith(ctx, s.callerID(ctx), q, engine.CheckOptions{DryRun: dry})
	if err != nil {
		return nil, engineError(err)
	}
	if s.guard.Payments != nil && !dry {
		// The decision just listed the Trace: a settlement the recorder
		// wrote since the last sweep is bound now (its hold closed, its
		// findings told), not at the next authorize_payment. Nothing is
		// read while no run file changed.
		if _, err := s.guard.Payments.SettleFromTraceSeen(ctx); err != nil {
			s.cfg.Logger.Warn("the Trace's settlements could not be read", "err", err)
		}
	}
	res := structured(ans, renderCheck(ans))
	if ans.Decision == guard.Review && !ans.DryRun {
		return s.askToShowLink(ctx, "check_before_pay", ans.ReviewID, ans.ReviewURL, retried, res), nil
	}
	return res, nil
}

// engineError passes the engine's caller-facing messages through and keeps
// everything else for the operator's log.
func engineError(err error) error {
	var refused *engine.RefusedError
	var notRecorded *engine.NotRecordedError
	switch {
	case errors.As(err, &refused):
		return userErrorf("%s", refused.Message)
	case errors.As(err, &notRecorded):
		return userErrorf("%s", notRecorded.Message)
	}
	return err
}

// renderCheck is the text of a check_before_pay answer: the structured
// answer, and nothing it does not say. The sentence about the review
// follows the decision: only a "review" answer has a pending review to
// poll; an allow or a block that names a review is a human's decision
// already taken (human_approved, human_rejected).
func renderCheck(res engine.Answer) string {
	var b strings.Builder
	if res.DryRun {
		b.WriteString("DRY RUN (nothing was recorded, reserved, opened or used) — ")
	}
	fmt.Fprintf(&b, "Decision: %s", strings.ToUpper(res.Decision))
	if clause := reviewClause(res.Decision, res.ReviewID); clause != "" && !res.DryRun {
		fmt.Fprintf(&b, " (%s)", clause)
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
	if res.DryRun {
		b.WriteString("Not recorded: a dry run signs no receipt.\n")
		return b.String()
	}
	if res.Decision == guard.Review && res.ReviewURL != "" {
		fmt.Fprintf(&b, "A reviewer decides at %s\n", res.ReviewURL)
	}
	fmt.Fprintf(&b, "Recorded as signed receipt %s.\n", res.ReceiptID)
	return b.String()
}

// reviewClause says what the review named by an answer is, given the
// answer's decision: pending for "review", a human's approval for
// "allow", a human's rejection for "block"; nothing without a review.
func reviewClause(decision, reviewID string) string {
	if reviewID == "" {
		return ""
	}
	switch decision {
	case guard.Review:
		return fmt.Sprintf("review %s is pending a human decision; poll get_review_status", reviewID)
	case guard.Allow:
		return fmt.Sprintf("review %s was approved by a human reviewer; this answer uses the approval", reviewID)
	case guard.Block:
		return fmt.Sprintf("review %s was rejected by a human reviewer", reviewID)
	}
	return fmt.Sprintf("review %s", reviewID)
}

func (s *Server) getReviewStatus(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	a := newArgs(raw, "review_id")
	id := a.str("review_id", true, "", 64)
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	out, err := s.guard.Engine.ReviewStatus(ctx, id)
	if errors.Is(err, engine.ErrUnknownReview) {
		return nil, userErrorf("no review %q (check_before_pay returns the review_id to ask about)", id)
	}
	if err != nil {
		return nil, err
	}
	rv := out.Review
	text := fmt.Sprintf("Review %s is %s", rv.ID, rv.Status)
	if rv.DecidedAt != "" {
		text += fmt.Sprintf(" (decided %s by %s)", rv.DecidedAt, rv.DecidedBy)
	}
	if out.Quorum != "" {
		text += fmt.Sprintf("; %s", out.Quorum)
	}
	if rv.Note != "" {
		text += fmt.Sprintf("; note: %s", rv.Note)
	}
	asset := rv.Asset
	if rv.AssetSymbol != "" {
		asset = rv.AssetSymbol + " (" + rv.Asset + ")"
	}
	// The policy's names stand beside the addresses (display only).
	pol := s.guard.Engine.Policy()
	to := pol.Label(rv.Counterparty)
	if rv.PayTo != "" {
		to += " (pay_to " + pol.Label(rv.PayTo) + ")"
	}
	question := fmt.Sprintf("pay %s %s to %s", rv.Amount, asset, to)
	if rv.Resource != "" {
		question += " for " + rv.Resource
	}
	text += fmt.Sprintf(". Question: %s. Receipts: %s.", question, strings.Join(out.Receipts, ", "))
	if rv.Tampered {
		text += " TAMPERED: the review log disagrees with what the server or a reviewer signed; this review is not decided on and no approval of it is honoured."
	}
	if out.Moot {
		text += " MOOT: this question would now be answered without review; it no longer counts towards the caller's pending reviews, and a reviewer may still decide it."
	}
	for _, r := range out.Reservations {
		text += fmt.Sprintf(" Reserved: %s %s to %s by %s (receipt %s)", r.Amount, r.Asset, reservedTo(r), r.Caller, r.ReceiptID)
		switch {
		case r.Until != "":
			text += " until " + r.Until + "."
		case r.ValidBefore != "":
			text += ", open until the Trace shows it or, after its validBefore " + r.ValidBefore + ", the asset contract says it was never used."
		default:
			text += ", open until the Trace shows it."
		}
	}
	text += fmt.Sprintf(" Reservations held to anyone: %d.", out.ReservedTotal)
	for _, p := range out.ReservationProblems {
		text += " RESERVATIONS UNVERIFIED: " + p + "."
	}
	return structured(out, text), nil
}

func reservedTo(r *engine.ReservationInfo) string {
	switch {
	case r.Host != "" && r.PayTo != "":
		return r.Host + " (pay_to " + r.PayTo + ")"
	case r.Host != "":
		return r.Host
	}
	return r.PayTo
}
