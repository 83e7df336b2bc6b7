package reviewlog

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// AuditReport is what Audit found. Findings are one line each; Malformed is
// set when a chain could not even be read as NOA receipts.
type AuditReport struct {
	Chains    int
	Receipts  int
	Reviews   int
	Findings  []string
	Malformed bool
}

// Audit verifies every chain under guard/receipts/ with keyring and
// cross-checks the review log against the signatures: every opened review
// has its DEFERRED receipt, every decision a receipt signed by a trusted
// reviewer, every honoured approval its use receipt; and every contradicting
// line of the log is reported.
func (l *Log) Audit(ctx context.Context, keyring noa.Keyring) (AuditReport, error) {
	var rep AuditReport
	st, err := l.read(ctx)
	if err != nil {
		return rep, err
	}
	g, err := l.openGuardDir()
	if err != nil {
		return rep, err
	}
	if g != nil {
		defer g.Close()
		chains, err := ListChains(g)
		if err != nil {
			return rep, err
		}
		for _, c := range chains {
			rep.Chains++
			rs, err := ReadChainFile(g, c.ID)
			if err != nil {
				rep.Malformed = true
				rep.Findings = append(rep.Findings, fmt.Sprintf("chain %s: MALFORMED: %v", c.ID, err))
				continue
			}
			rep.Receipts += len(rs)
			if len(rs) == 0 {
				continue
			}
			res := noa.VerifyChain(rs, noa.Options{Keyring: keyring, InFileOrder: true})
			if res.Verdict != noa.Valid {
				if res.Verdict == noa.Malformed {
					rep.Malformed = true
				}
				rep.Findings = append(rep.Findings, fmt.Sprintf("chain %s: %s", c.ID, res.Line()))
			}
		}
	}
	for _, f := range st.findings {
		rep.Findings = append(rep.Findings, fmt.Sprintf("%s line %d: %s", FileName, f.Line, f.What))
	}
	v, err := l.newVerifier(g)
	if err != nil {
		return rep, err
	}
	known := map[string]bool{}
	for _, r := range st.reviews {
		rep.Reviews++
		known[ActionID(r.ID)] = true
		s := v.ix.signedFor(r, v.trusted)
		vr := resolve(*r, s, v.now, v.ttl)
		deferred := false
		for _, rc := range v.ix[ActionID(r.ID)] {
			if rc.Agent.Principal == noa.PrincipalService && rc.Governance.Verdict == noa.VerdictDeferred {
				deferred = true
			}
		}
		if !deferred {
			rep.Findings = append(rep.Findings, fmt.Sprintf("review %s: opened in the log, but no chain holds its DEFERRED receipt", r.ID))
		}
		for _, w := range vr.Integrity {
			rep.Findings = append(rep.Findings, fmt.Sprintf("review %s: %s", r.ID, w))
		}
		if r.UsedAt != "" && len(s.uses) == 0 {
			rep.Findings = append(rep.Findings, fmt.Sprintf("review %s: the log says the approval was used at %s, but no chain holds the receipt of that use", r.ID, r.UsedAt))
		}
	}
	var orphans []string
	for action, rs := range v.ix {
		if strings.HasPrefix(action, "review:") && !known[action] {
			orphans = append(orphans, fmt.Sprintf("receipt %s records %s, which the review log never opened", rs[0].ID, action))
		}
	}
	sort.Strings(orphans)
	rep.Findings = append(rep.Findings, orphans...)
	return rep, nil
}
