package receipt

import (
	"fmt"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// StageRoles returns which stage of a bundled template means "money moved"
// (paid) and which means "outcome confirmed" (SPEC §3). ok is false for any
// other (custom) template, which has no roles.
func StageRoles(template string) (paid, outcome string, ok bool) {
	switch template {
	case "x402-buyer":
		return "payment", "settlement", true
	case "x402-seller", "x402-facilitator":
		return "verification", "settlement", true
	case "escrow-arc":
		return "deposit", "disposition", true
	}
	return "", "", false
}

// stagePhrase names a stage of a bundled template in plain words, and any
// other stage by its id.
func stagePhrase(template, id string) string {
	if p := StagePhrase(template, id); p != "" {
		return p
	}
	return fmt.Sprintf("stage %q", id)
}

// StagePhrase names a stage of a bundled template in plain words; it is ""
// for any other stage.
func StagePhrase(template, id string) string {
	switch template + "/" + id {
	case "x402-buyer/challenge":
		return "the 402 payment challenge"
	case "x402-buyer/payment":
		return "the payment leaving the buyer"
	case "x402-buyer/settlement":
		return "a successful settlement answer"
	case "x402-seller/request":
		return "the protected request"
	case "x402-seller/verification":
		return "verification of the payment"
	case "x402-seller/settlement":
		return "settlement of the payment"
	case "x402-facilitator/verification":
		return "the facilitator's verification"
	case "x402-facilitator/settlement":
		return "the facilitator's settlement"
	case "escrow-arc/agreement":
		return "the escrow agreement"
	case "escrow-arc/deposit":
		return "the deposit into the escrow contract"
	case "escrow-arc/delivery":
		return "delivery of the work"
	case "escrow-arc/criteria":
		return "an evaluation against the acceptance criteria"
	case "escrow-arc/review":
		return "a human review decision"
	case "escrow-arc/disposition":
		return "the release or refund of the escrowed funds"
	}
	return ""
}

// Explain describes a receipt in one paragraph built by fixed rules, so the
// same receipt always gives the same text: what was seen, what was not, the
// missing stages with the template's reasons, the faults, and, where money
// moved but no outcome was recorded, what the observer cannot know.
func Explain(runID string, r *Receipt) string {
	t := r.Operation.Template
	var b strings.Builder
	fmt.Fprintf(&b, "Operation %q in run %q, read with the %s template (version %s) from %s, is %s",
		r.Operation.OperationID, runID, t, jsjson.FormatNumber(r.Operation.Version), plural(len(r.Events), "event", "events"), r.Completeness)
	switch {
	case r.Completeness == Full:
		b.WriteString(": every required stage was observed and no fault was recorded.")
	case len(r.Exceptions) > 0 && len(r.Missing) == 0:
		b.WriteString(": every required stage was observed, but a fault was recorded.")
	default:
		b.WriteString(".")
	}

	var seen, unseenOptional []string
	for _, s := range r.Stages {
		if s.State == Confirmed {
			seen = append(seen, fmt.Sprintf("%s (%s)", stagePhrase(t, s.ID), strings.Join(s.Events, ", ")))
		} else if !s.Required {
			unseenOptional = append(unseenOptional, stagePhrase(t, s.ID))
		}
	}
	if len(seen) > 0 {
		fmt.Fprintf(&b, " Seen: %s.", joinList(seen))
	} else {
		b.WriteString(" None of the events this template looks for was seen.")
	}
	for _, m := range r.Missing {
		fmt.Fprintf(&b, " Not seen: %s (required stage %q, expected %s)", stagePhrase(t, m.Stage), m.Stage, joinList(m.ExpectedEvents))
		if m.Why != "" {
			fmt.Fprintf(&b, "; %s", m.Why)
		}
		b.WriteString(".")
	}
	if len(unseenOptional) > 0 {
		fmt.Fprintf(&b, " Optional and not seen: %s.", joinList(unseenOptional))
	}
	if len(r.Exceptions) > 0 {
		faults := make([]string, len(r.Exceptions))
		for i, f := range r.Exceptions {
			faults[i] = fmt.Sprintf("%s (%s)", f.EventType, f.EventID)
		}
		label := "Fault recorded"
		if len(faults) > 1 {
			label = "Faults recorded"
		}
		fmt.Fprintf(&b, " %s: %s.", label, joinList(faults))
	}
	if paid, outcome, ok := StageRoles(t); ok && hasStage(r, paid) && hasStage(r, outcome) &&
		r.StageConfirmed(paid) && !r.StageConfirmed(outcome) {
		b.WriteString(" ")
		b.WriteString(blindSpot(t))
	}
	return b.String()
}

// blindSpot states what an observer cannot tell when money moved and no
// outcome was recorded.
func blindSpot(template string) string {
	switch template {
	case "x402-buyer":
		return "The payment left the buyer but no settlement answer was recorded: from the buyer's side a payment whose " +
			"settlement answer never arrived and one that settled silently look the same, so the money may have reached " +
			"the seller without the paid work being confirmed; check the chain or the seller before paying them again."
	case "x402-seller", "x402-facilitator":
		return "The payment was verified but no settlement was recorded: from this side a settlement that never ran and " +
			"one that ran without being recorded look the same, so whether the buyer's money moved is unknown; check the chain."
	case "escrow-arc":
		return "Funds were deposited but neither a release nor a refund was recorded: the money may still be locked in the " +
			"escrow contract, or it was settled without this trace seeing it; check the contract."
	}
	return ""
}

func hasStage(r *Receipt, id string) bool {
	for _, s := range r.Stages {
		if s.ID == id {
			return true
		}
	}
	return false
}

// plural writes "1 event" or "3 events".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// joinList joins "a", "a and b", "a, b and c".
func joinList(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}
