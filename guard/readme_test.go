package guard

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The documented example guard config (docs/rules.md, which the README
// links as the policy reference) loads and sets every key there is, and the
// page's rule table names every rule.
func TestReadmeExampleConfig(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "rules.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	const intro = "`--guard-config haia-guard.config.json`"
	i := strings.Index(text, intro)
	if i < 0 {
		t.Fatal("docs/rules.md has no guard config section")
	}
	start := strings.Index(text[i:], "```json\n")
	end := strings.Index(text[i+start+8:], "```")
	if start < 0 || end < 0 {
		t.Fatal("the guard config section has no JSON example")
	}
	example := text[i+start+8 : i+start+8+end]
	c, err := ParseConfig([]byte(example), "/etc/haia")
	if err != nil {
		t.Fatalf("docs/rules.md's example config does not load: %v", err)
	}
	for _, k := range ConfigKeys() {
		if !strings.Contains(example, `"`+k+`"`) {
			t.Errorf("docs/rules.md's example config does not set %s", k)
		}
	}
	if c.For("research-bot").TotalLimit.Amount.String() != "5000000" || c.For("batch-job").Velocity != (Velocity{}) {
		t.Errorf("agents of the example: %+v", c.Agents)
	}
	ts := strings.Index(text, "| # | rule")
	if ts < 0 {
		t.Fatal("docs/rules.md has no rule table")
	}
	table := text[ts:]
	table = table[:strings.Index(table, "\n\n")]
	for _, rule := range []string{RuleDenylist, RuleAllowlist, RuleOpenPartial, RuleUnattributable, RuleUnreadable, RuleUnknownAsset,
		RuleUnparseableAmount, RuleAssetMismatch, RulePerCounterparty, RuleMixedAssets, RuleUnparseableHistory, RuleTotalLimit,
		RuleVelocity, RuleDuplicatePayment, RuleReviewAbove} {
		if !strings.Contains(table, "`"+rule+"`") {
			t.Errorf("docs/rules.md's rule table does not name %s", rule)
		}
	}
}
