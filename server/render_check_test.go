package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// parsedCheck is a check_before_pay text read back.
type parsedCheck struct {
	decision string
	clause   string
	reasons  []string
	receipt  string
}

// parseCheckText reads renderCheck's text back into its parts, failing on
// any line it cannot place.
func parseCheckText(text string) (parsedCheck, error) {
	var p parsedCheck
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) < 2 {
		return p, fmt.Errorf("%d lines", len(lines))
	}
	head, ok := strings.CutPrefix(lines[0], "Decision: ")
	if !ok {
		return p, fmt.Errorf("first line %q", lines[0])
	}
	p.decision, p.clause, _ = strings.Cut(head, " (")
	p.clause = strings.TrimSuffix(p.clause, ")")
	last := lines[len(lines)-1]
	rec, ok := strings.CutPrefix(last, "Recorded as signed receipt ")
	if !ok || !strings.HasSuffix(rec, ".") {
		return p, fmt.Errorf("last line %q", last)
	}
	p.receipt = strings.TrimSuffix(rec, ".")
	for _, l := range lines[1 : len(lines)-1] {
		r, ok := strings.CutPrefix(l, "- ")
		if !ok {
			return p, fmt.Errorf("reason line %q", l)
		}
		p.reasons = append(p.reasons, r)
	}
	return p, nil
}

// textMismatches lists what text says that the answer does not.
func textMismatches(ans engine.Answer, text string) []string {
	p, err := parseCheckText(text)
	if err != nil {
		return []string{fmt.Sprintf("text %q: %v", text, err)}
	}
	var bad []string
	if p.decision != strings.ToUpper(ans.Decision) {
		bad = append(bad, fmt.Sprintf("text says %s, the answer %s", p.decision, ans.Decision))
	}
	pending := strings.Contains(p.clause, "pending") || strings.Contains(p.clause, "poll")
	switch {
	case ans.ReviewID == "" && p.clause != "":
		bad = append(bad, fmt.Sprintf("no review in the answer, but the text says %q", p.clause))
	case ans.ReviewID != "" && !strings.Contains(p.clause, ans.ReviewID):
		bad = append(bad, fmt.Sprintf("the answer names review %s, the text %q", ans.ReviewID, p.clause))
	case ans.Decision == guard.Review && ans.ReviewID != "" && !pending:
		bad = append(bad, fmt.Sprintf("a pending review, but the text says %q", p.clause))
	case ans.Decision != guard.Review && pending:
		bad = append(bad, fmt.Sprintf("decision %s: the text %q speaks of a pending review", ans.Decision, p.clause))
	case ans.Decision == guard.Allow && ans.ReviewID != "" && !strings.Contains(p.clause, "approved"):
		bad = append(bad, fmt.Sprintf("an allow naming a review, but the text says %q", p.clause))
	case ans.Decision == guard.Block && ans.ReviewID != "" && !strings.Contains(p.clause, "rejected"):
		bad = append(bad, fmt.Sprintf("a block naming a review, but the text says %q", p.clause))
	}
	if len(p.reasons) != len(ans.Reasons) {
		return append(bad, fmt.Sprintf("text has %d reasons, the answer %d", len(p.reasons), len(ans.Reasons)))
	}
	for i, r := range ans.Reasons {
		want := r.Rule + ": " + r.Detail
		if len(r.Evidence) > 0 {
			refs := make([]string, len(r.Evidence))
			for j, e := range r.Evidence {
				refs[j] = e.RunID + "/" + e.OperationID
			}
			want += " [" + strings.Join(refs, ", ") + "]"
		}
		if p.reasons[i] != want {
			bad = append(bad, fmt.Sprintf("reason %d: text %q, answer %q", i, p.reasons[i], want))
		}
	}
	if p.receipt != ans.ReceiptID {
		bad = append(bad, fmt.Sprintf("text names receipt %q, the answer %q", p.receipt, ans.ReceiptID))
	}
	return bad
}

// everyRule is every rule an answer can name: the policy's, the engine's
// and the human's.
func everyRule() []string {
	return append(guard.Rules(), engine.RuleQueueFull, engine.RuleCustom,
		reviewlog.RuleHumanApproved, reviewlog.RuleHumanRejected, reviewlog.RuleHumanReview)
}

// Every rule under every decision, with and without a review and evidence:
// the text says what the structure says, and a pending review is spoken of
// only in a "review" answer.
func TestCheckTextSaysWhatTheStructureSays(t *testing.T) {
	hist := guard.Reason{Rule: guard.RuleHistory, Detail: "2 runs, 3 operations read"}
	for _, rule := range everyRule() {
		for _, decision := range []string{guard.Allow, guard.Review, guard.Block} {
			for _, reviewID := range []string{"", "rv_0123456789abcdef"} {
				ans := engine.Answer{Decision: decision, ReviewID: reviewID, ReceiptID: "rcpt-1",
					Reasons: []guard.Reason{{Rule: rule, Detail: "detail of " + rule,
						Evidence: []guard.Ref{{RunID: "run-1", OperationID: "op-1"}, {RunID: "run-2", OperationID: "op-2"}}}, hist}}
				t.Run(fmt.Sprintf("%s/%s/review=%v", rule, decision, reviewID != ""), func(t *testing.T) {
					if bad := textMismatches(ans, renderCheck(ans)); len(bad) > 0 {
						t.Errorf("%s\n%s", strings.Join(bad, "\n"), renderCheck(ans))
					}
				})
			}
		}
	}
}

// The checker itself catches the message the text used to give for a
// human's approval and rejection, and a reason the text leaves out.
func TestCheckTextCheckerCatchesLies(t *testing.T) {
	for _, decision := range []string{guard.Allow, guard.Block} {
		ans := engine.Answer{Decision: decision, ReviewID: "rv_1", ReceiptID: "r",
			Reasons: []guard.Reason{{Rule: reviewlog.RuleHumanApproved, Detail: "d"}}}
		lie := "Decision: " + strings.ToUpper(decision) + " (review rv_1 is pending a human decision; poll get_review_status)\n- human_approved: d\nRecorded as signed receipt r.\n"
		if len(textMismatches(ans, lie)) == 0 {
			t.Errorf("%s: the checker accepted a pending review in a decided answer", decision)
		}
		short := "Decision: " + strings.ToUpper(decision) + " (" + reviewClause(decision, "rv_1") + ")\nRecorded as signed receipt r.\n"
		if len(textMismatches(ans, short)) == 0 {
			t.Errorf("%s: the checker accepted a text without the answer's reason", decision)
		}
	}
}
