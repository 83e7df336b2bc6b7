package reviewlog

import (
	"context"
	"fmt"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Rule ids the guard's receipts carry for honoured human decisions.
const (
	RuleHumanApproved = "human_approved"
	RuleHumanRejected = "human_rejected"
	RuleHumanReview   = "human_review"
)

// ActionID is the action id every receipt about a review carries.
func ActionID(reviewID string) string { return "review:" + reviewID }

// signed is what the chains prove about one review.
type signed struct {
	receipts []noa.Receipt // every receipt of the review, in chain order
	ids      []string
	human    *noa.Receipt // the first receipt of a trusted reviewer's decision
	uses     []noa.Receipt
	problems []string
}

// signedFor reads the receipts of review r: its trusted human decision, the
// honoured uses of an approval, and every human receipt that does not hold.
func signedFor(rcs []noa.Receipt, r *Review, trusted Reviewers) signed {
	s := signed{receipts: rcs}
	for i, rc := range rcs {
		s.ids = append(s.ids, rc.ID)
		g := rc.Governance
		switch {
		case rc.Agent.Principal == noa.PrincipalHuman:
			if why := humanProblem(rc, r, trusted); why != "" {
				s.problems = append(s.problems, fmt.Sprintf("human receipt %s does not count: %s", rc.ID, why))
				continue
			}
			if s.human == nil {
				s.human = &rcs[i]
			} else if s.human.Governance.Verdict != g.Verdict {
				s.problems = append(s.problems, fmt.Sprintf("human receipt %s contradicts the earlier decision %s; the earlier one stands", rc.ID, s.human.ID))
			}
		case g.Verdict == noa.VerdictAllowed && g.RuleID != nil && *g.RuleID == RuleHumanApproved:
			s.uses = append(s.uses, rc)
		}
	}
	return s
}

// humanProblem says why a HUMAN receipt is no trusted decision on r ("" when
// it is one).
func humanProblem(rc noa.Receipt, r *Review, trusted Reviewers) string {
	g := rc.Governance
	if g.Verdict != noa.VerdictAllowed && g.Verdict != noa.VerdictBlocked {
		return "its verdict " + g.Verdict + " is no decision"
	}
	if g.Approval == nil || g.Approval.By != rc.Agent.ID {
		return "its approval does not name the reviewer that signed it"
	}
	key, ok := trusted[rc.Agent.ID]
	if !ok {
		return fmt.Sprintf("reviewer %q is not in the trusted reviewers file", clip(rc.Agent.ID))
	}
	if err := noa.VerifySignature(rc, key); err != nil {
		return fmt.Sprintf("not signed by reviewer %q's trusted key (%v)", clip(rc.Agent.ID), err)
	}
	if r.ParamsHash != "" && rc.Action.ParamsHash != r.ParamsHash {
		return "its paramsHash is not the question's"
	}
	return ""
}

// resolve is a review as the signatures prove it: approved or rejected only
// with a trusted reviewer's receipt, unverified where the log alone says
// so, expired when pending past ttl.
func resolve(r Review, s signed, now time.Time, ttl time.Duration) Review {
	out := r
	out.Integrity = nil
	if s.human != nil {
		status := Rejected
		if s.human.Governance.Verdict == noa.VerdictAllowed {
			status = Approved
		}
		if r.Status != status {
			if r.Status == Pending {
				out.Integrity = append(out.Integrity, fmt.Sprintf("the log does not record the %s decision that receipt %s signs", status, s.human.ID))
			} else {
				out.Integrity = append(out.Integrity, fmt.Sprintf("the log says %s, but the signed decision (receipt %s) is %s", r.Status, s.human.ID, status))
			}
			out.Note = ""
		}
		out.Status, out.DecidedBy, out.DecidedAt = status, s.human.Agent.ID, s.human.Governance.Approval.At
	} else if r.Status == Approved || r.Status == Rejected {
		out.Integrity = append(out.Integrity, fmt.Sprintf("the log says %s by %s, but no receipt signed by a trusted reviewer records it", r.Status, clip(r.DecidedBy)))
		out.Status = Unverified
	} else if ttl > 0 {
		if t, err := parseTime(r.CreatedAt); err == nil && !now.Before(t.Add(ttl)) {
			out.Status = Expired
		}
	}
	if len(s.uses) > 0 && out.UsedAt == "" {
		out.UsedAt = s.uses[0].TS
		out.Integrity = append(out.Integrity, fmt.Sprintf("the log does not record the use that receipt %s signs", s.uses[0].ID))
	}
	if out.UsedAt != "" && out.Status != Approved {
		out.Integrity = append(out.Integrity, "an approval was used that no trusted reviewer signed")
	}
	out.Integrity = append(out.Integrity, s.problems...)
	return out
}

// verifier resolves reviews against the chains of one guard/ directory.
type verifier struct {
	ctx     context.Context
	r       Reader
	rx      *receiptIndex
	trusted Reviewers
	now     time.Time
	ttl     time.Duration
	// problem is set when the trusted reviewers could not be read.
	problem string
}

// newVerifier brings the receipt index up to date and reads the trusted
// reviewers.
func (l *Log) newVerifier(ctx context.Context, r Reader) (*verifier, error) {
	if err := l.rx.refresh(ctx, r); err != nil {
		return nil, fmt.Errorf("read decision chains: %w", err)
	}
	v := &verifier{ctx: ctx, r: r, rx: &l.rx, trusted: Reviewers{}, now: l.now(), ttl: l.reviewTTL}
	if l.reviewers != nil {
		// A trusted reviewers file that cannot be read trusts no one: every
		// decision then reads unverified (fail closed), and says why.
		rs, err := l.reviewers()
		if err != nil {
			v.problem = fmt.Sprintf("the trusted reviewers file cannot be read, so no decision can be verified: %v", err)
		} else {
			v.trusted = rs
		}
	}
	return v, nil
}

// signed reads what the chains prove about r.
func (v *verifier) signed(r *Review) (signed, error) {
	rcs, err := v.rx.receipts(v.ctx, v.r, ActionID(r.ID))
	if err != nil {
		return signed{}, err
	}
	s := signedFor(rcs, r, v.trusted)
	if v.problem != "" && (r.Status != Pending || len(s.problems) > 0) {
		s.problems = append(s.problems, v.problem)
	}
	return s, nil
}

// resolve is r as the signatures prove it, with its receipt ids.
func (v *verifier) resolve(r *Review) (Review, []string, error) {
	s, err := v.signed(r)
	if err != nil {
		return Review{}, nil, err
	}
	ids := s.ids
	if ids == nil {
		ids = []string{}
	}
	return resolve(*r, s, v.now, v.ttl), ids, nil
}

// Verified is one review as the signatures prove it, with the ids of the
// receipts that record it.
func (l *Log) Verified(ctx context.Context, id string) (Review, []string, error) {
	if err := checkID(id); err != nil {
		return Review{}, nil, err
	}
	var out Review
	var ids []string
	err := l.view(ctx, func(g Reader, st *state) error {
		e := st.byID[id]
		if e == nil {
			return fmt.Errorf("%w: %s", ErrUnknownReview, id)
		}
		r, err := st.review(e)
		if err != nil {
			return err
		}
		v, err := l.newVerifier(ctx, g)
		if err != nil {
			return err
		}
		out, ids, err = v.resolve(&r)
		return err
	})
	return out, ids, err
}

// Findings are the log's contradicting lines, for the audit (at most
// maxFindings of them; total counts them all).
func (l *Log) Findings(ctx context.Context) (findings []Finding, err error) {
	err = l.view(ctx, func(_ Reader, st *state) error {
		findings = append([]Finding(nil), st.findings...)
		return nil
	})
	return findings, err
}
