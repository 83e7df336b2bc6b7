package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const auditDetails = `Verifies every decision chain under the Trace root and cross-checks the review
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
such a review as the receipts say. An authorization's authorized line is synced
beside its two receipts, after its ledger entry: a crash of the host there can
leave the line without its receipts, which is INCOMPLETE when the ledger holds
the sealed entry of its decision with its nonce, and TAMPERED when it does not.

The spend ledger is checked whole: every lane links without a gap from its
start, each entry is sealed by the server's params key (found where the server
keeps it: params-key.pem, else signing-key.pem; without one the seals are not
checked, and a note says so), no receipt has two entries, no approval is used
twice, and every commitment receipt signed since the ledger started has its
entry (LEDGER findings, exit 2). An entry whose receipt no chain holds is what
a crash between the two leaves (INCOMPLETE, exit 4): it counts, as it should.

Every use of a mandate the ledger records is held to the mandate's signed
records: a grant by a trusted reviewer (granted the tenant), with the
signatures its quorum asks for, linked in order, not revoked before the use,
whose payee, host, caller, asset, amount, budget, count and dates cover it
after the uses before it (MANDATE findings, exit 2).

With --tenants-dir DIR --tenant NAME the root is DIR/NAME, read as the server
serving those tenants reads it: a decision counts only by a reviewer the
trusted reviewers file grants NAME, and a review whose signed terms name
another tenant is TAMPERED.

exit codes: 0 CONSISTENT, 2 INCONSISTENT (a disagreement only tampering makes, or a chain that
does not verify; also usage), 3 MALFORMED (a chain cannot be read), 4 INCOMPLETE (only what a
crash leaves), 1 error
`

// auditExitIncomplete: only what a crash can leave was found.
const auditExitIncomplete = 4

// defineAudit is `audit`: every chain verified, the review log
// cross-checked against the signatures.
func defineAudit(fs *flag.FlagSet) runFunc {
	var f stackFlags
	f.register(fs, true)
	keyringPath := keyringFlag(fs)
	guardConfigFlagVar(fs, &f.guardConfig)
	var keys paramsKeyFlags
	keys.register(fs)
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		return runAudit(ctx, env.stdout, env.stderr, &f, *keyringPath, &keys)
	}
}

func runAudit(ctx context.Context, stdout, stderr io.Writer, f *stackFlags, keyringPath string, keys *paramsKeyFlags) error {
	// The keys the server's signatures are verified against: --keyring's,
	// else the store's; the reviewers' keys come from the trusted file,
	// whatever the volume's keyring copy says.
	var kr noa.Keyring
	if keyringPath != "" {
		data, err := os.ReadFile(keyringPath)
		if err == nil {
			kr, err = noa.ParseKeyring(data)
		}
		if err != nil {
			return fmt.Errorf("--keyring: %w", err)
		}
	}
	st, err := f.open(ctx, func(c *app.Config) { c.ServerKeys = kr })
	if err != nil {
		return err
	}
	defer st.Close()
	if kr == nil {
		err := st.Store().View(ctx, func(r reviewlog.Reader) (err error) {
			kr, err = r.Keyring(ctx)
			return err
		})
		if err != nil {
			return err
		}
	}
	if kr == nil {
		kr = noa.Keyring{}
	}
	trusted, err := reviewlog.LoadReviewers(st.ReviewersPath())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, pub := range trusted {
		kr.Add(noa.KeyID(pub), pub)
	}
	if !st.PolicyKnown() {
		fmt.Fprintln(stderr, "haia-trace-mcp audit: note: the policy the server runs with is not recorded in the guard's store; expiry is judged under the built-in reviewTtlMinutes")
	}
	log := st.Log()
	var rep reviewlog.AuditReport
	err = newProgress(stderr, "audit").during("verifying every chain and the review log against the signatures", func() (err error) {
		rep, err = log.Audit(ctx, kr)
		return err
	})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp audit: %s\n", termsafe.String(err.Error()))
		if errors.Is(err, reviewlog.ErrCorrupt) {
			return exitCode(exitUsage)
		}
		return exitCode(exitFail)
	}
	// The spend ledger, against the chains' commitment receipts.
	signedAs := st.Tenant()
	if signedAs == "" {
		signedAs = "haia-trace-mcp"
	}
	paramsKeys, err := keys.keys()
	if err != nil {
		return usageErrorf("%v", err)
	}
	lrep, note, err := auditLedger(ctx, st, signedAs, paramsKeys, keys.given())
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp audit: the spend ledger: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	if note != "" {
		fmt.Fprintf(stderr, "haia-trace-mcp audit: note: %s\n", note)
	}
	for _, f := range lrep.Findings {
		rep.Findings = append(rep.Findings, "LEDGER "+f)
	}
	for _, f := range lrep.Incomplete {
		rep.Incomplete = append(rep.Incomplete, "ledger: "+f)
	}
	// Every authorized line, against its receipts and its ledger entry.
	found, incomplete, err := auditAuthorized(ctx, st, lrep.Authorizations)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp audit: the authorized records: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	rep.Findings = append(rep.Findings, found...)
	rep.Incomplete = append(rep.Incomplete, incomplete...)
	// Every use of a mandate, against the signed records that grant it.
	mandates, err := engine.ReadMandates(ctx, log, signedAs)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp audit: the mandate records: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	for _, f := range mandate.Audit(mandates, lrep.Mandated) {
		rep.Findings = append(rep.Findings, "MANDATE "+f)
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
		return exitCode(3)
	case len(rep.Findings) > 0:
		fmt.Fprintf(stdout, "INCONSISTENT: %d chains, %d receipts, %d reviews; %d findings, %d incomplete; records disagree with the signed receipts in ways only tampering makes\n", rep.Chains, rep.Receipts, rep.Reviews, len(rep.Findings), len(rep.Incomplete))
		return exitCode(2)
	case len(rep.Incomplete) > 0:
		fmt.Fprintf(stdout, "INCOMPLETE: %d chains, %d receipts, %d reviews; %d leftovers of writes a crash cut short (a receipt whose log line was never written), no sign of tampering\n", rep.Chains, rep.Receipts, rep.Reviews, len(rep.Incomplete))
		return exitCode(auditExitIncomplete)
	}
	fmt.Fprintf(stdout, "CONSISTENT: %d chains, %d receipts, %d reviews; every review matches its signed receipts; %d ledger entries, every commitment receipt has its entry; %s, every use within a signed mandate\n", rep.Chains, rep.Receipts, rep.Reviews, lrep.Entries, plural(mandates.Lines, "mandate record", "mandate records"))
	return nil
}

// auditLedger checks the whole spend ledger against every commitment
// receipt of the chains: under the server's params key where one found
// here seals it (serverParamsKeys), else with the seals unchecked (note
// says so).
func auditLedger(ctx context.Context, st *app.Stack, tenant string, keys [][]byte, explicit bool) (ledger.AuditReport, string, error) {
	var raws []ledger.Raw
	var commits []ledger.Commitment
	err := st.Store().View(ctx, func(r reviewlog.Reader) error {
		var tail reviewlog.ReceiptTail
		rs, err := tail.Next(ctx, r)
		if err != nil {
			return err
		}
		for _, c := range rs {
			commits = append(commits, ledger.Commitment{ID: c.ID, TS: c.TS, Genesis: c.Canonical == reviewlog.CanonicalLedgerGenesis})
		}
		raws, err = r.Ledger().Since(ctx, nil)
		return err
	})
	if err != nil {
		return ledger.AuditReport{}, "", err
	}
	for _, key := range keys {
		if ledger.Sealed(raws, key) {
			return ledger.Audit(raws, key, tenant, commits), "", nil
		}
	}
	if explicit {
		// The key the operator named seals no line: every line is checked
		// under it, and each is a finding.
		return ledger.Audit(raws, keys[0], tenant, commits), "", nil
	}
	rep := ledger.Audit(raws, nil, tenant, commits)
	if rep.Entries == 0 {
		return rep, "", nil
	}
	return rep, "no params key found here seals the spend ledger (give the server's --key-file, or its --params-key-file): its links, order and receipts were checked, its seals were not", nil
}

// auditAuthorized holds every authorized line of the review log to the
// receipts it names. On the file store the line is synced in the same wait
// as its decision's and its own receipt, after the decision's ledger entry
// is on disk, so a crash of the host in that wait can leave the line with
// one or both receipts missing: that is incomplete (exit 4) when the spend
// ledger holds the sealed authorization entry of its decision with its
// nonce — the section that signed it had begun, and it never answered. A
// line whose receipts are missing and whose decision has no such entry was
// written by no section of the server: a finding.
func auditAuthorized(ctx context.Context, st *app.Stack, entries map[string]ledger.Entry) (findings, incomplete []string, err error) {
	auths, err := st.Log().Authorizations(ctx)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]string, 0, 2*len(auths))
	for _, a := range auths {
		ids = append(ids, a.DecisionReceipt, a.Receipt)
	}
	if len(ids) == 0 {
		return nil, nil, nil
	}
	have, err := findReceipts(ctx, st.Store(), ids...)
	if err != nil {
		return nil, nil, err
	}
	for _, a := range auths {
		var missing []string
		for _, id := range []string{a.DecisionReceipt, a.Receipt} {
			if _, ok := have[id]; !ok {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			continue
		}
		en, ok := entries[a.DecisionReceipt]
		if ok && (en.Nonce == "" || strings.EqualFold(en.Nonce, a.Nonce)) {
			incomplete = append(incomplete, fmt.Sprintf("%s line %d: the authorization of nonce %s (decision %s) has no receipt %s in any chain: a crash before they reached the disk, its answer never given; its ledger entry counts",
				reviewlog.FileName, a.Line, a.Nonce, a.DecisionReceipt, strings.Join(missing, " nor ")))
			continue
		}
		findings = append(findings, fmt.Sprintf("TAMPERED %s line %d: the authorization of nonce %s names receipts no chain holds (%s), and the spend ledger holds no authorization entry of decision %s: a line no section of the server wrote",
			reviewlog.FileName, a.Line, a.Nonce, strings.Join(missing, ", "), a.DecisionReceipt))
	}
	return findings, incomplete, nil
}
