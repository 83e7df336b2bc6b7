package reviewlog

import (
	"context"
	"fmt"
	"sort"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// AuditReport is what Audit found. Findings are one line each: what only
// tampering (or a chain that does not verify) makes. Incomplete are what a
// crash can leave on the file store, where a receipt is committed before
// its log line: receipts of a review whose opened, decided or used line was
// never written. Malformed is set when a chain could not even be read as
// NOA receipts.
type AuditReport struct {
	Chains     int
	Receipts   int
	Reviews    int
	Archives   int
	Findings   []string
	Incomplete []string
	Malformed  bool
}

// Audit verifies every chain under guard/receipts/ with keyring and
// cross-checks the review log against the signatures: every opened review
// has its DEFERRED receipt, every decision a receipt signed by a trusted
// reviewer, every honoured approval its use receipt; and every contradicting
// line of the log is reported.
func (l *Log) Audit(ctx context.Context, keyring noa.Keyring) (AuditReport, error) {
	var rep AuditReport
	err := l.view(ctx, func(g Reader, st *state) error {
		{
			chains, err := ListChains(ctx, g)
			if err != nil {
				return err
			}
			for _, c := range chains {
				rep.Chains++
				res, n, err := verifyChainFile(ctx, g, c.ID, keyring)
				if err != nil {
					rep.Malformed = true
					rep.Findings = append(rep.Findings, fmt.Sprintf("chain %s: MALFORMED: %v", c.ID, err))
					continue
				}
				rep.Receipts += n
				if n > 0 && res.Verdict != noa.Valid {
					if res.Verdict == noa.Malformed {
						rep.Malformed = true
					}
					rep.Findings = append(rep.Findings, fmt.Sprintf("chain %s: %s", c.ID, res.Line()))
				}
			}
		}
		for _, f := range st.findings {
			where := fmt.Sprintf("%s line %d", FileName, f.Line)
			if f.Line == 0 {
				where = FileName
			}
			rep.Findings = append(rep.Findings, fmt.Sprintf("%s: %s", where, f.What))
		}
		if more := st.findingCount - len(st.findings); more > 0 {
			rep.Findings = append(rep.Findings, fmt.Sprintf("%s: %d more contradicting lines not listed", FileName, more))
		}
		v, err := l.newFoldVerifier(ctx, g)
		if err != nil {
			return err
		}
		known := map[string]bool{}
		check := func(st *state, e *entry) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if known[ActionID(e.id)] {
				return nil // in the log and an archive: an archive cut short by a crash
			}
			rep.Reviews++
			known[ActionID(e.id)] = true
			r, err := st.review(e)
			if err != nil {
				return err
			}
			s, err := v.signed(&r)
			if err != nil {
				return err
			}
			keys, err := v.keyring(s)
			if err != nil {
				return err
			}
			_, fs := resolve(r, s, keys, v.now, v.ttl)
			deferred := false
			for _, rc := range s.receipts {
				if rc.Agent.Principal == noa.PrincipalService && rc.Governance.Verdict == noa.VerdictDeferred {
					deferred = true
				}
			}
			if !deferred {
				rep.Findings = append(rep.Findings, fmt.Sprintf("review %s: opened in the log, but no chain holds its DEFERRED receipt", r.ID))
			}
			for _, f := range fs {
				line := fmt.Sprintf("review %s: %s", r.ID, f.what)
				if f.crash {
					rep.Incomplete = append(rep.Incomplete, line)
				} else {
					rep.Findings = append(rep.Findings, line)
				}
			}
			if r.UsedAt != "" && len(s.uses) == 0 {
				rep.Findings = append(rep.Findings, fmt.Sprintf("review %s: the log says the approval was used at %s, but no chain holds the receipt of that use", r.ID, r.UsedAt))
			}
			return nil
		}
		for _, e := range st.entries {
			if err := check(st, e); err != nil {
				return err
			}
		}
		{
			names, err := g.Archives(ctx)
			if err != nil {
				return err
			}
			for _, name := range names {
				ast, err := foldArchive(ctx, g, name)
				if err != nil {
					rep.Findings = append(rep.Findings, fmt.Sprintf("archive %s: %v", name, err))
					continue
				}
				rep.Archives++
				for _, f := range ast.findings {
					rep.Findings = append(rep.Findings, fmt.Sprintf("%s line %d: %s", name, f.Line, f.What))
				}
				for _, e := range ast.entries {
					if err := check(ast, e); err != nil {
						return err
					}
				}
			}
		}
		var orphans, leftovers []string
		for _, action := range v.rx.actions() {
			if known[action] {
				continue
			}
			rcs, err := v.rx.receipts(ctx, g, action)
			if err != nil {
				return err
			}
			if openingOnly(rcs) {
				// The receipts of one opening whose line was never
				// written: what a writer killed between the two leaves.
				leftovers = append(leftovers, fmt.Sprintf("receipts record %s, which the review log never opened: only the receipts of its opening, as a crash before the log line was written leaves them", action))
				continue
			}
			orphans = append(orphans, fmt.Sprintf("receipts record %s, which the review log does not hold, though they show it was read and answered since it was opened (a line was removed)", action))
		}
		if v.trusted.passkeys != nil {
			clones, err := signCountFindings(ctx, v.rx, g, v.trusted.passkeys)
			if err != nil {
				return err
			}
			rep.Findings = append(rep.Findings, clones...)
		}
		sort.Strings(orphans)
		sort.Strings(leftovers)
		rep.Findings = append(rep.Findings, orphans...)
		rep.Incomplete = append(rep.Incomplete, leftovers...)
		return nil
	})
	return rep, err
}

// verifyChainFile verifies one chain, every segment and each link between
// them, streaming: memory does not grow with the chain.
func verifyChainFile(ctx context.Context, g Reader, id string, keyring noa.Keyring) (noa.Result, int, error) {
	res, err := VerifySegments(ctx, g, id, noa.Options{Keyring: keyring, InFileOrder: true})
	if err != nil {
		return noa.Result{}, 0, err
	}
	return res, res.Count, nil
}

// openingOnly says whether rcs are no more than what one opening writes:
// the server's DEFERRED receipts (its signed terms and its answer). Any
// later receipt of a review — a decision, a use, a hold — was written by
// someone who read its opened line.
func openingOnly(rcs []noa.Receipt) bool {
	for _, rc := range rcs {
		if rc.Agent.Principal != noa.PrincipalService || rc.Governance.Verdict != noa.VerdictDeferred {
			return false
		}
	}
	return true
}
