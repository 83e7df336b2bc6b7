package engine

import (
	"fmt"
	"math/big"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// applyRules evaluates the operator's custom rules over the snapshot of
// this request. A DENY blocks; a snapshot that cannot be built blocks too.
func applyRules(rules *policy.Policy, dec *guard.Decision, req guard.Request) *noa.Compliance {
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
		dec.Decision = guard.Block
		// The history line stays last.
		n := len(dec.Reasons)
		dec.Reasons = append(dec.Reasons[:n-1:n-1], *reason, dec.Reasons[n-1])
	}
	return comp
}

// ruleSnapshot is the flat set of scalars custom rules read. Every key is
// documented in docs/rules.md (custom rules).
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
		"history.unattributableOpen": policy.Int(int64(f.UnattributableOpen)),
		"history.unreadableRuns":     policy.Int(int64(f.UnreadableRuns)),
		"history.coarse":             policy.Bool(f.Coarse),
		"history.denylisted":         policy.Bool(f.Denylisted),
		"history.allowlisted":        policy.Bool(f.Allowlisted),
		"history.settledOperations":  policy.Int(int64(f.Matched - f.OpenPartial)),
		"policy.agent":               policy.String(f.Agent),
	}
	if req.Resource != "" {
		snap["args.resource"] = policy.String(req.Resource)
	}
	for key, v := range map[string]*int{
		"history.paymentsInWindow":      f.PaymentsInWindow,
		"history.paymentsTotalInWindow": f.PaymentsTotalInWindow,
		"history.duplicatePayments":     f.DuplicatePayments,
		"history.paidWithoutResource":   f.PaidWithoutResource,
	} {
		if v != nil {
			snap[key] = policy.Int(int64(*v))
		}
	}
	amounts := map[string]*big.Int{
		"amountAtomic":                  f.Amount,
		"history.spendInWindowAtomic":   f.Spend,
		"history.spendWithAmountAtomic": f.SpendWithAmount,
	}
	if t := f.Total; t != nil {
		amounts["history.spendTotalInWindowAtomic"] = t.Spend
		amounts["history.spendTotalWithAmountAtomic"] = t.SpendWithAmount
		snap["history.totalWindowOperations"] = policy.Int(int64(t.WindowOperations))
		snap["history.totalMixedAssets"] = policy.Int(int64(t.MixedAssets))
		snap["history.totalUnparseableHistory"] = policy.Int(int64(t.UnparseableHistory))
	}
	for key, v := range amounts {
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
