package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

const policyDetails = `check tells the two kinds of policy file apart — a guard policy (the server's
--guard-config, haia-guard.config.json as init writes it) and a noa.policy/0.2
rule file (one that names "spec" or "rules", what a guard policy's "policy"
names) — and validates each with the loader the server reads it with. A good
file prints what it sets: for a guard policy the asset, the review threshold,
the limits, the lists, the history it reads, the windows, its tenant and agent
layers and its custom rules (checked too); for a rule file its id, rules,
required paths, policyHash and readSetHash. A bad one prints every problem as
FILE:LINE:COLUMN: JSON-PATH: what, on stderr. A guard policy's history
templates must exist among the bundled ones and those of --dir (or
--templates-dir), as the server requires. --json prints one object either way.
exit 0 valid, 1 invalid or unreadable, 2 usage.
eval evaluates a rule file over an input snapshot (a JSON object of scalars)
and prints {"verdict", "ruleFired"}; every failure is a DENY with the
specification's ruleFired (policy-invalid, eval-error, ...) and the reason
on stderr; exit 0 when a verdict is printed, 1 when a file cannot be read,
2 usage.
`

// definePolicyCheck is `policy check FILE`.
func definePolicyCheck(fs *flag.FlagSet) runFunc {
	dir := dirFlag(fs)
	var templatesDir string
	templatesDirFlagVar(fs, &templatesDir)
	asJSON := jsonFlag(fs)
	return func(_ context.Context, env *cmdEnv, pos []string) error {
		templates, where, err := policyTemplates(*dir, templatesDir)
		if err != nil {
			return err
		}
		chk := app.CheckPolicyFile(pos[0], templates)
		if *asJSON {
			if err := policyPrint(env.stdout, policyCheckJSON(chk, where)); err != nil {
				return err
			}
			if len(chk.Problems) > 0 {
				return exitCode(exitFail)
			}
			return nil
		}
		if len(chk.Problems) > 0 {
			kind := chk.Kind
			if kind == "" {
				kind = "policy file"
			}
			fmt.Fprintf(env.stderr, "haia-trace-mcp policy check: %s: a %s with %s:\n", termsafe.String(chk.File), kind, count(len(chk.Problems), "problem", "problems"))
			for _, p := range chk.Problems {
				fmt.Fprintf(env.stderr, "  %s\n", termsafe.String(p.String()))
			}
			return exitCode(exitFail)
		}
		printPolicySummary(env.stdout, chk, where)
		return nil
	}
}

// policyTemplates are the templates a guard policy's history is read
// under: the bundled ones and those of --templates-dir, else of --dir's
// templates/ when --dir is a Trace root; where says which.
func policyTemplates(dir, templatesDir string) (receipt.TemplateSource, string, error) {
	quiet := slog.New(slog.DiscardHandler)
	if templatesDir == "" {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return receipt.Resolver{}, "the bundled templates (no Trace root at " + dir + ")", nil
		}
	}
	st, err := app.Open(context.Background(), app.Config{Dir: dir, TemplatesDir: templatesDir, ReadOnly: true, Logger: quiet})
	if err != nil {
		var re *app.RootError
		if errors.As(err, &re) && templatesDir == "" {
			return receipt.Resolver{}, "the bundled templates (" + dir + " cannot be opened)", nil
		}
		return nil, "", err
	}
	defer st.Close()
	where := "the bundled templates and " + filepath.Join(st.Root().Path(), "templates")
	if templatesDir != "" {
		where = "the bundled templates and " + templatesDir
	}
	return st.Templates().Current(), where, nil
}

// printPolicySummary says what a valid file sets.
func printPolicySummary(w io.Writer, chk app.PolicyCheck, templatesFrom string) {
	s := termsafe.String
	if chk.Kind == app.KindRules {
		fmt.Fprintf(w, "%s: a %s, valid\n", s(chk.File), chk.Kind)
		printRulesSummary(w, chk.Rules, "")
		return
	}
	pol := chk.Guard
	fmt.Fprintf(w, "%s: a %s, valid — what the server puts in force with it:\n", s(chk.File), chk.Kind)
	line := func(label, text string) { fmt.Fprintf(w, "  %-13s %s\n", label, s(text)) }
	if pol.Hash != "" {
		line("sha256", pol.Hash)
	}
	line("asset", pol.DefaultAsset.Describe()+fmt.Sprintf(", %d decimals: every amount below is in it", pol.DefaultAsset.Decimals))
	line("review above", policyAmount(pol, pol.ReviewAbove)+" (a larger payment goes to a person)")
	line("quorum", policyQuorum(pol))
	line("new payees", policyNewPayee(pol))
	line("payees", policyPayees(pol))
	line("limits", policyLimits(pol))
	line("velocity", policyVelocity(pol))
	line("duplicates", policyDuplicates(pol))
	line("lists", policyLists(pol))
	line("history", fmt.Sprintf("read under %s (found among %s); an unreadable run: %s; an unattributable open payment: %s",
		strings.Join(pol.HistoryTemplates, ", "), templatesFrom, pol.UnreadableHistory, pol.UnattributableHistory))
	line("windows", fmt.Sprintf("a review expires after %s; an approval is honoured for %s; a rejection holds for %s; an allow holds its amount for up to %s (until the Trace shows the payment); an authorization is valid for at most %s; at most %s per caller",
		policyDuration(pol.ReviewTTL), policyDuration(pol.ApprovalTTL), policyDuration(pol.RejectionHold), policyDuration(pol.ReservationTTL),
		count(pol.MaxAuthorizationSeconds, "second", "seconds"), count(pol.MaxPendingReviews, "pending review", "pending reviews")))
	layers := policyLayers(pol)
	if len(layers) == 0 {
		line("layers", "none: every tenant and caller has this policy")
	}
	for i, l := range layers {
		label := ""
		if i == 0 {
			label = "layers"
		}
		line(label, l)
	}
	if chk.Rules != nil {
		line("custom rules", chk.RulesFile+", valid:")
		printRulesSummary(w, chk.Rules, "  ")
	} else {
		line("custom rules", "none")
	}
}

// printRulesSummary says what a valid rule file holds.
func printRulesSummary(w io.Writer, p *policy.Policy, indent string) {
	line := func(label, text string) { fmt.Fprintf(w, "%s  %-13s %s\n", indent, label, termsafe.String(text)) }
	line("id", p.ID())
	ids := p.RuleIDs()
	line("rules", count(len(ids), "rule", "rules")+" in order: "+strings.Join(ids, ", "))
	req := p.RequiredPaths()
	if len(req) == 0 {
		line("required", "no input path")
	} else {
		line("required", strings.Join(req, ", "))
	}
	line("reads", strings.Join(p.ReadSet(), ", "))
	line("policyHash", p.Hash())
	line("readSetHash", p.ReadSetHash())
}

func policyAmount(pol *guard.Config, atomic *big.Int) string {
	return amountText(atomic, pol.DefaultAsset.Key, pol.Assets)
}

// policyPer is "per day", "per 2 hours".
func policyPer(d time.Duration) string {
	s := policyDuration(d)
	if rest, ok := strings.CutPrefix(s, "1 "); ok {
		return "per " + rest
	}
	return "per " + s
}

func policyDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "no time"
	case d%(24*time.Hour) == 0:
		return count(int(d/(24*time.Hour)), "day", "days")
	case d%time.Hour == 0:
		return count(int(d/time.Hour), "hour", "hours")
	case d%time.Minute == 0:
		return count(int(d/time.Minute), "minute", "minutes")
	}
	return d.String()
}

func policyLimits(pol *guard.Config) string {
	out := fmt.Sprintf("%s to one counterparty %s", policyAmount(pol, pol.Limit.Amount), policyPer(pol.Limit.Window))
	if pol.TotalLimit != nil {
		out += fmt.Sprintf("; %s to all together %s", policyAmount(pol, pol.TotalLimit.Amount), policyPer(pol.TotalLimit.Window))
	} else {
		out += "; no total limit"
	}
	return out + fmt.Sprintf("; %s whose outcome is not confirmed tolerated per counterparty", count(pol.MaxOpenPartial, "payment", "payments"))
}

func policyVelocity(pol *guard.Config) string {
	var parts []string
	if v := pol.Velocity.PerCounterparty; v != nil {
		parts = append(parts, fmt.Sprintf("%s to one counterparty %s", count(v.Count, "payment", "payments"), policyPer(v.Window)))
	}
	if v := pol.Velocity.Total; v != nil {
		parts = append(parts, fmt.Sprintf("%s in all %s", count(v.Count, "payment", "payments"), policyPer(v.Window)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

func policyDuplicates(pol *guard.Config) string {
	if pol.DuplicateWindow == 0 {
		return "not checked"
	}
	return "a payment for a resource already paid within " + policyDuration(pol.DuplicateWindow) + " goes to a person"
}

func policyLists(pol *guard.Config) string {
	names := func(l []guard.Counterparty) string {
		out := make([]string, len(l))
		for i, c := range l {
			out[i] = c.String()
		}
		return strings.Join(out, ", ")
	}
	allow := "no allowlist (any counterparty may be paid)"
	if pol.Allowlisting {
		allow = "allowlist " + count(len(pol.Allowlist), "counterparty", "counterparties")
		if len(pol.Allowlist) > 0 {
			allow += " (" + names(pol.Allowlist) + "); every other goes to a person"
		}
	}
	deny := "no denylist"
	if len(pol.Denylist) > 0 {
		deny = "denylist " + count(len(pol.Denylist), "counterparty", "counterparties") + " (" + names(pol.Denylist) + ")"
	}
	return allow + "; " + deny
}

// policyLayers names each tenant's and caller's layer with what it
// changes from the policy it composes over.
func policyLayers(pol *guard.Config) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(pol.Agents)) {
		out = append(out, "agent "+id+": "+policyLayerDiff(pol, pol.Agents[id]))
	}
	for _, t := range slices.Sorted(maps.Keys(pol.Tenants)) {
		tc := pol.Tenants[t]
		out = append(out, "tenant "+t+": "+policyLayerDiff(pol, tc))
		for _, id := range slices.Sorted(maps.Keys(tc.Agents)) {
			out = append(out, "tenant "+t+" agent "+id+": "+policyLayerDiff(tc, tc.Agents[id]))
		}
	}
	return out
}

// policyQuorum says who must approve a review: "one reviewer" or "2
// distinct reviewers above 50 USDC, 3 above 100 USDC".
func policyQuorum(pol *guard.Config) string {
	if len(pol.Quorum) == 0 {
		return "one reviewer's approval suffices"
	}
	var parts []string
	for _, t := range pol.Quorum {
		parts = append(parts, fmt.Sprintf("%d distinct reviewers above %s", t.Approvals, policyAmount(pol, t.Above)))
	}
	return strings.Join(parts, ", ") + "; one rejection rejects"
}

// policyNewPayee says what a first payment to a new payee does.
func policyNewPayee(pol *guard.Config) string {
	if pol.ReviewNewPayee {
		return "a payment to a payee the Trace and the spend ledger have not seen goes to a person once"
	}
	return "no review of its own (the other rules decide)"
}

// policyPayees lists the payees the policy names, "0x… Weather API".
func policyPayees(pol *guard.Config) string {
	if len(pol.Payees) == 0 {
		return "none named"
	}
	addrs := slices.Sorted(maps.Keys(pol.Payees))
	parts := make([]string, 0, len(addrs))
	for _, a := range addrs {
		parts = append(parts, pol.Label(a))
	}
	return strings.Join(parts, ", ")
}

// policyPayeeNames is the payees' names by address, never nil.
func policyPayeeNames(pol *guard.Config) map[string]string {
	out := make(map[string]string, len(pol.Payees))
	maps.Copy(out, pol.Payees)
	return out
}

// policyLayerDiff says what layer sets that base does not.
func policyLayerDiff(base, layer *guard.Config) string {
	var parts []string
	if layer.ReviewAbove.Cmp(base.ReviewAbove) != 0 {
		parts = append(parts, "review above "+policyAmount(layer, layer.ReviewAbove))
	}
	if a, b := policyQuorum(base), policyQuorum(layer); a != b {
		parts = append(parts, "quorum "+b)
	}
	if a, b := policyNewPayee(base), policyNewPayee(layer); a != b {
		parts = append(parts, "new payees: "+b)
	}
	if a, b := policyPayees(base), policyPayees(layer); a != b {
		parts = append(parts, "payees: "+b)
	}
	if a, b := policyLimits(base), policyLimits(layer); a != b {
		parts = append(parts, "limits "+b)
	}
	if a, b := policyVelocity(base), policyVelocity(layer); a != b {
		parts = append(parts, "velocity "+b)
	}
	if a, b := policyDuplicates(base), policyDuplicates(layer); a != b {
		parts = append(parts, "duplicates "+b)
	}
	if a, b := policyLists(base), policyLists(layer); a != b {
		parts = append(parts, "lists: "+b)
	}
	if len(parts) == 0 {
		return "as above"
	}
	return strings.Join(parts, "; ")
}

// policyCheckJSON is policy check --json's object.
func policyCheckJSON(chk app.PolicyCheck, templatesFrom string) any {
	type rules struct {
		File          string   `json:"file,omitempty"`
		ID            string   `json:"id"`
		Rules         []string `json:"rules"`
		RequiredPaths []string `json:"requiredPaths"`
		PolicyHash    string   `json:"policyHash"`
		ReadSetHash   string   `json:"readSetHash"`
	}
	rulesOf := func(p *policy.Policy, file string) *rules {
		if p == nil {
			return nil
		}
		return &rules{File: file, ID: p.ID(), Rules: p.RuleIDs(), RequiredPaths: p.RequiredPaths(), PolicyHash: p.Hash(), ReadSetHash: p.ReadSetHash()}
	}
	out := struct {
		File     string              `json:"file"`
		Kind     string              `json:"kind"`
		Valid    bool                `json:"valid"`
		Problems []app.PolicyProblem `json:"problems"`
		// A valid rule file: its hashes at the top, as before.
		PolicyHash  string         `json:"policyHash,omitempty"`
		ReadSetHash string         `json:"readSetHash,omitempty"`
		Rules       *rules         `json:"rules,omitempty"`
		Guard       map[string]any `json:"guard,omitempty"`
	}{File: chk.File, Kind: chk.Kind, Valid: len(chk.Problems) == 0, Problems: chk.Problems}
	if out.Problems == nil {
		out.Problems = []app.PolicyProblem{}
	}
	if !out.Valid {
		return out
	}
	if chk.Kind == app.KindRules {
		out.PolicyHash, out.ReadSetHash = chk.Rules.Hash(), chk.Rules.ReadSetHash()
		out.Rules = rulesOf(chk.Rules, "")
		return out
	}
	pol := chk.Guard
	out.Rules = rulesOf(chk.Rules, chk.RulesFile)
	out.Guard = map[string]any{
		"sha256":                     pol.Hash,
		"asset":                      pol.DefaultAsset.Key,
		"reviewAbove":                policyAmount(pol, pol.ReviewAbove),
		"quorum":                     policyQuorum(pol),
		"reviewNewPayee":             pol.ReviewNewPayee,
		"payees":                     policyPayeeNames(pol),
		"limits":                     policyLimits(pol),
		"velocity":                   policyVelocity(pol),
		"duplicates":                 policyDuplicates(pol),
		"lists":                      policyLists(pol),
		"historyTemplates":           pol.HistoryTemplates,
		"historyTemplatesFoundIn":    templatesFrom,
		"reviewTtlMinutes":           int(pol.ReviewTTL / time.Minute),
		"approvalTtlMinutes":         int(pol.ApprovalTTL / time.Minute),
		"rejectionHoldHours":         int(pol.RejectionHold / time.Hour),
		"reservationMinutes":         int(pol.ReservationTTL / time.Minute),
		"maxAuthorizationSeconds":    pol.MaxAuthorizationSeconds,
		"maxPendingReviewsPerCaller": pol.MaxPendingReviews,
		"layers":                     policyLayers(pol),
	}
	return out
}

// definePolicyEval is `policy eval FILE --input INPUT.json`.
func definePolicyEval(fs *flag.FlagSet) runFunc {
	input := fs.String("input", "", "the input snapshot `INPUT.json`, a JSON object of scalars (required)")
	return func(_ context.Context, env *cmdEnv, pos []string) error {
		if *input == "" {
			return usageErrorf("--input INPUT.json is required")
		}
		policyDoc, err := policyReadFile(pos[0])
		if err != nil {
			return err
		}
		inputDoc, err := policyReadFile(*input)
		if err != nil {
			return err
		}
		r := policy.EvaluateJSON(policyDoc, inputDoc)
		if r.Failed() {
			fmt.Fprintf(env.stderr, "haia-trace-mcp policy eval: %s (step %d): %s\n", r.RuleFired, r.Step, r.Reason)
		}
		out := struct {
			Verdict   string  `json:"verdict"`
			RuleFired *string `json:"ruleFired"`
		}{Verdict: r.Verdict}
		if r.RuleFired != "" {
			out.RuleFired = &r.RuleFired
		}
		return policyPrint(env.stdout, out)
	}
}

// policyReadFile reads a document, refusing one larger than the evaluator
// accepts before reading it whole.
func policyReadFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, policy.MaxDocumentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(data) > policy.MaxDocumentBytes {
		return nil, fmt.Errorf("%s: larger than the %d-byte limit of a policy or input document", name, policy.MaxDocumentBytes)
	}
	return data, nil
}

func policyPrint(stdout io.Writer, v any) error {
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}
