package reviewlog

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// maxApprovals bounds a review's quorum (the policy allows at most 20).
const maxApprovals = 20

// RuleReviewTerms is the rule id of the receipt the server signs when it
// opens a review: its paramsHash is the TermsHash of the review's terms.
const RuleReviewTerms = "review_terms"

// Terms are the question a review asks a human, as the server stated it
// when it opened the review. The review log carries them in the review's
// opened line; the server signs their hash (TermsHash) in a receipt of the
// review (rule review_terms), and the reviewer signs a hash of them
// (DecisionHash) in the decision receipt. Any other record that disagrees
// with them is tampering.
type Terms struct {
	ReviewID string `json:"review_id"`
	// Caller is who asked (the token subject or the stdio agent id), and
	// Tenant the tenant whose chains and policy answered.
	Caller string `json:"caller"`
	Tenant string `json:"tenant"`
	// Counterparty is the canonical counterparty (lower-case address or
	// host).
	Counterparty string `json:"counterparty"`
	// Amount is the amount as the question gave it, in display units
	// (normalised where the asset is known); AmountAtomic is the same in
	// the asset's atomic units ("" when it cannot be read).
	Amount       string `json:"amount"`
	AmountAtomic string `json:"amount_atomic"`
	// Asset is the asset's registry key (or the caller's words when the
	// policy does not know it).
	Asset string `json:"asset"`
	// Resource is the canonical URL being bought ("" when none was named).
	Resource string `json:"resource"`
	Template string `json:"template"`
	// Rules are the rules that asked for the review, sorted, each once.
	Rules []string `json:"rules"`
	// ParamsHash is the keyed hash of the question the server's answers
	// carry; beside binding the terms to those answers it is a secret salt:
	// without the server's key no one can guess the terms from their hash.
	ParamsHash string `json:"params_hash"`
	// Approvals is the review's quorum: how many distinct trusted
	// reviewers must approve it (the policy key quorum, fixed when the
	// review opened); 0 or 1 is one approval, and is then left out of the
	// JSON and of the hash, so terms opened before the key hash as they did.
	Approvals int `json:"approvals,omitempty"`
}

// Quorum is how many distinct trusted reviewers must approve the review:
// Approvals, at least 1.
func (t Terms) Quorum() int { return max(t.Approvals, 1) }

// TermsHash is the one hash that stands for the terms of a review:
// "sha256:" and the hex SHA-256 of the JCS (RFC 8785) canonical JSON of the
// Terms object, every member present (an absent value is ""). The server
// signs it when it opens the review; a reviewer's CLI, a passkey console or
// a payment signer computes it from the terms it shows or acts on, never
// takes it from a record.
func TermsHash(t Terms) (string, error) {
	if err := t.check(); err != nil {
		return "", err
	}
	rules := make([]any, 0, len(t.Rules))
	for _, r := range t.Rules {
		rules = append(rules, r)
	}
	m := map[string]any{
		"review_id": t.ReviewID, "caller": t.Caller, "tenant": t.Tenant, "counterparty": t.Counterparty,
		"amount": t.Amount, "amount_atomic": t.AmountAtomic, "asset": t.Asset, "resource": t.Resource,
		"template": t.Template, "rules": rules, "params_hash": t.ParamsHash,
	}
	if t.Approvals > 1 {
		// A number in JCS is its shortest form; 2 to 20 are plain integers.
		m["approvals"] = t.Approvals
	}
	return hashOf(m)
}

// TermsKey is the hex key of terms without their review id: two reviews
// with the same key ask the same question of the same caller for the same
// rules. The PostgreSQL store keeps at most one open review per key; its
// migration computes the same key in SQL (SHA-256 of each member, length
// first, rules last, cut to 16 bytes).
func TermsKey(t Terms) string {
	h := sha256.New()
	for _, s := range []string{t.Caller, t.Tenant, t.Counterparty, t.Amount, t.AmountAtomic, t.Asset, t.Resource, t.Template, t.ParamsHash} {
		fmt.Fprintf(h, "%d:%s;", len(s), s)
	}
	fmt.Fprintf(h, "rules:%d;", len(t.Rules))
	for _, r := range t.Rules {
		fmt.Fprintf(h, "%d:%s;", len(r), r)
	}
	if t.Approvals > 1 {
		// Only when set, so the key of terms without a quorum (and the
		// migration's SQL, which knows none) is as it was: a review opened
		// under a larger quorum than a pending one is a question of its own.
		fmt.Fprintf(h, "approvals:%d;", t.Approvals)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// DecisionHash is what a reviewer signs as the paramsHash of a decision
// receipt: "sha256:" and the hex SHA-256 of JCS({"decision", "note",
// "terms_hash"}), decision being "approved" or "rejected". It binds the
// decision to the exact terms the reviewer was shown and to the note.
func DecisionHash(termsHash, decision, note string) (string, error) {
	if decision != Approved && decision != Rejected {
		return "", fmt.Errorf("%w: decision %q is neither approved nor rejected", ErrBadInput, clip(decision))
	}
	if termsHash == "" {
		return "", fmt.Errorf("%w: no terms hash", ErrBadInput)
	}
	return hashOf(map[string]any{"decision": decision, "note": note, "terms_hash": termsHash})
}

func hashOf(v map[string]any) (string, error) {
	b, err := jcs.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// check refuses terms no server would open a review on.
func (t Terms) check() error {
	if err := checkID(t.ReviewID); err != nil {
		return fmt.Errorf("terms: %w", err)
	}
	if t.Counterparty == "" {
		return fmt.Errorf("%w: terms need a counterparty", ErrBadInput)
	}
	if t.Approvals < 0 || t.Approvals > maxApprovals {
		return fmt.Errorf("%w: terms ask for %d approvals; between 1 and %d are possible", ErrBadInput, t.Approvals, maxApprovals)
	}
	return nil
}

// SameQuestion says whether two terms ask the same question of the same
// caller (every member but the review id and the rules).
func (t Terms) SameQuestion(o Terms) bool {
	return t.Caller == o.Caller && t.Tenant == o.Tenant && t.Counterparty == o.Counterparty && t.Amount == o.Amount &&
		t.AmountAtomic == o.AmountAtomic && t.Asset == o.Asset && t.Resource == o.Resource && t.Template == o.Template &&
		t.ParamsHash == o.ParamsHash
}

// Covers says whether every rule of want is among t's rules.
func (t Terms) Covers(want []string) bool {
	for _, r := range want {
		if !slices.Contains(t.Rules, r) {
			return false
		}
	}
	return true
}

// ReviewRules are the rules of reasons that asked for a review (every
// reason but the history line), sorted, each once.
func ReviewRules(reasons []guard.Reason) []string {
	out := []string{}
	for _, r := range reasons {
		if r.Rule != guard.RuleHistory && !slices.Contains(out, r.Rule) {
			out = append(out, r.Rule)
		}
	}
	slices.Sort(out)
	return out
}

// Receipt vocabulary shared by the guard's receipts.
const (
	ActionCanonical = "x402.payment"
	GovernanceMode  = "approvals_on"
)

// TermsDraft is the receipt the server signs when it opens review r: the
// caller as agent, paramsHash the TermsHash of r's terms, verdict DEFERRED,
// rule review_terms. It is appended in the same locked section as the
// opened line (the Ask hook), before the answer's receipt.
func TermsDraft(r Review, at time.Time) (noa.Draft, error) {
	if r.Terms == nil {
		return noa.Draft{}, errors.New("review has no terms to sign")
	}
	h, err := TermsHash(*r.Terms)
	if err != nil {
		return noa.Draft{}, err
	}
	rule := RuleReviewTerms
	return noa.Draft{
		TS:         at,
		Agent:      noa.Agent{ID: r.Terms.Caller, Principal: noa.PrincipalService},
		Action:     noa.Action{ID: ActionID(r.ID), Canonical: ActionCanonical, RiskClass: "IRREVERSIBLE", ParamsHash: h},
		Governance: noa.Governance{Mode: GovernanceMode, Verdict: noa.VerdictDeferred, RuleID: &rule},
	}, nil
}

// DecisionParamsHash is the paramsHash a reviewer's receipt of decision
// status on r carries: the DecisionHash of r's terms and note. A review
// without terms (opened by an earlier version) cannot be decided.
func DecisionParamsHash(r Review, status string) (string, error) {
	if r.Terms == nil {
		return "", fmt.Errorf("%w: review %s carries no terms the server signed (opened by an earlier version); the agent must ask again", ErrTampered, r.ID)
	}
	th, err := TermsHash(*r.Terms)
	if err != nil {
		return "", err
	}
	return DecisionHash(th, status, r.Note)
}
