package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const auditUsage = `usage:
  haia-trace-mcp audit [--dir .trace] [--reviewers F] [--keyring K] [--guard-config C]

Verifies every decision chain under the Trace root and cross-checks the review
log against the signatures: every opened review has the terms the server signed
and its DEFERRED receipt, every decision a receipt signed by a trusted reviewer
(--reviewers, default reviewers.json in the user configuration directory) over
those terms and its note, every honoured approval its use receipt. Prints one
line per finding; a line that only tampering with an unsigned record makes
says TAMPERED.

What a crash can leave is told apart: on the file store a receipt is committed
before its log line, so a writer killed between the two leaves receipts whose
line was never written (an opening, a decision, a use). Those are listed as
INCOMPLETE, with their own exit code: nothing was forged, and the guard reads
such a review as the receipts say.

  --keyring K   keys that verify the chains (default: the store's keyring, guard/keyring.json for files)
  --store URL   the guard's store: file: (default) or postgres://… (default $HAIA_STORE)

exit codes: 0 CONSISTENT, 2 INCONSISTENT (a disagreement only tampering makes, or a chain that
does not verify; also usage), 3 MALFORMED (a chain cannot be read), 4 INCOMPLETE (only what a
crash leaves), 1 error
`

// auditExitIncomplete: only what a crash can leave was found.
const auditExitIncomplete = 4

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("audit", auditUsage, stdout, stderr)
	dir := c.fs.String("dir", ".trace", "the Trace root")
	reviewers := c.fs.String("reviewers", "", "the trusted reviewers file (default: reviewers.json in the user configuration directory)")
	keyringPath := c.fs.String("keyring", "", "keys that verify the chains (default: the Trace root's guard/keyring.json)")
	guardConfig := c.fs.String("guard-config", "", "the guard policy, for reviewTtlMinutes (default: the policy the server recorded in the store; a different file is refused)")
	storeFlag := addStoreFlag(c.fs)
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 0, 0, "no arguments"); !ok {
		return code
	}
	g, code := openCLIGuard(ctx, "audit", *dir, *storeFlag, *reviewers, *guardConfig, stderr)
	if g == nil {
		return code
	}
	defer g.Close()
	st := g.store
	trusted, err := g.loadReviewers()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stderr, "haia-trace-mcp audit: %v\n", err)
		return exitFail
	}
	var kr noa.Keyring
	if *keyringPath != "" {
		data, err := os.ReadFile(*keyringPath)
		if err == nil {
			kr, err = noa.ParseKeyring(data)
		}
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp audit: --keyring: %v\n", err)
			return exitFail
		}
	} else {
		err := st.View(ctx, func(r reviewlog.Reader) (err error) {
			kr, err = r.Keyring(ctx)
			return err
		})
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp audit: %v\n", err)
			return exitFail
		}
	}
	if kr == nil {
		kr = noa.Keyring{}
	}
	// Reviewer keys come from the trusted file, whatever the volume's
	// keyring copy says.
	for _, pub := range trusted {
		kr.Add(noa.KeyID(pub), pub)
	}
	if !g.policyKnown {
		fmt.Fprintln(stderr, "haia-trace-mcp audit: note: the policy the server runs with is not recorded in the guard's store; expiry is judged under the built-in reviewTtlMinutes")
	}
	log := reviewlog.OpenStore(st, reviewlog.Options{ReviewTTL: g.policy.ReviewTTL, ServerKeys: kr,
		Reviewers: func() (reviewlog.Reviewers, error) { return trusted, nil },
		Passkeys: func() (reviewlog.Passkeys, error) {
			pk, err := g.loadPasskeys()
			if errors.Is(err, os.ErrNotExist) {
				return reviewlog.Passkeys{}, nil // as for the keys: no file trusts no one
			}
			return pk, err
		}})
	var rep reviewlog.AuditReport
	err = newProgress(stderr, "audit").during("verifying every chain and the review log against the signatures", func() (err error) {
		rep, err = log.Audit(ctx, kr)
		return err
	})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp audit: %s\n", termsafe.String(err.Error()))
		if errors.Is(err, reviewlog.ErrCorrupt) {
			return exitUsage
		}
		return exitFail
	}
	for _, f := range rep.Findings {
		fmt.Fprintln(stdout, termsafe.String(f))
	}
	for _, f := range rep.Incomplete {
		fmt.Fprintln(stdout, "INCOMPLETE "+termsafe.String(f))
	}
	switch {
	case rep.Malformed:
		fmt.Fprintf(stdout, "MALFORMED: %d chains, %d receipts, %d reviews; %d findings, %d incomplete\n", rep.Chains, rep.Receipts, rep.Reviews, len(rep.Findings), len(rep.Incomplete))
		return 3
	case len(rep.Findings) > 0:
		fmt.Fprintf(stdout, "INCONSISTENT: %d chains, %d receipts, %d reviews; %d findings, %d incomplete; records disagree with the signed receipts in ways only tampering makes\n", rep.Chains, rep.Receipts, rep.Reviews, len(rep.Findings), len(rep.Incomplete))
		return 2
	case len(rep.Incomplete) > 0:
		fmt.Fprintf(stdout, "INCOMPLETE: %d chains, %d receipts, %d reviews; %d leftovers of writes a crash cut short (a receipt whose log line was never written), no sign of tampering\n", rep.Chains, rep.Receipts, rep.Reviews, len(rep.Incomplete))
		return auditExitIncomplete
	}
	fmt.Fprintf(stdout, "CONSISTENT: %d chains, %d receipts, %d reviews; every review matches its signed receipts\n", rep.Chains, rep.Receipts, rep.Reviews)
	return exitOK
}
