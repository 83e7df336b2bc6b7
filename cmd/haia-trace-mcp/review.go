package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Exit codes of `review` beyond exitOK, exitFail and exitUsage.
const (
	reviewExitUnknown   = 3 // no review with that id
	reviewExitDecided   = 4 // the review was already decided
	reviewExitLock      = 5 // the review log's lock was not obtained in time
	reviewExitUntrusted = 6 // the reviewer key is not in the trusted reviewers file
	reviewExitExpired   = 7 // the review expired before it was decided
	reviewExitTampered  = 8 // the log disagrees with the terms the server signed
)

const reviewDetails = `A decision is signed with the reviewer's own key (made by "haia-trace-mcp reviewer init");
the key must be in the trusted reviewers file, and --by (default: the key's reviewer id) must
name it. A status reads approved or rejected only where a trusted reviewer's signed receipt
says so; a decision the log alone claims reads unverified, and a pending review past
reviewTtlMinutes reads expired.

What a review asks — caller, tenant, counterparty, amount, asset, resource, template and
the rules that asked — is shown as the server signed it when it opened the review; where an
unsigned record disagrees, the review reads TAMPERED and cannot be decided. A decision signs
a hash the CLI computes itself from those terms, the decision and the note; --terms HASH
(the terms hash review show printed) refuses the decision unless the terms are still those.
With --console-url (the server's), list and show give each review's console page (review_url).

exit codes: 0 done, 1 error, 2 usage (or --dir is not a Trace root), 3 unknown review id,
4 already decided, 5 review log lock not obtained, 6 reviewer key not trusted, 7 review expired,
8 tampered (the log disagrees with the signed terms; nothing was written)
`

// reviewFlags are the review subcommands' flags; a pointer is nil where
// the subcommand does not take the flag.
type reviewFlags struct {
	stack                                          stackFlags
	note, by, reviewerKey, expectTerms, consoleURL *string
	asJSON, all                                    *bool
	lockWait, olderThan                            *time.Duration
}

// defineReview is the human's side of the guard: list the reviews the
// guard opened and approve or reject them (verb). No MCP tool can do this.
func defineReview(verb string) func(fs *flag.FlagSet) runFunc {
	return func(fs *flag.FlagSet) runFunc {
		var o reviewFlags
		o.stack.register(fs, false)
		o.stack.tenantScope = true
		o.asJSON = jsonFlag(fs)
		o.lockWait = lockWaitFlag(fs)
		guardConfigFlagVar(fs, &o.stack.guardConfig)
		fs.StringVar(&o.stack.tenant, "tenant", "", "the tenant: with --tenants-dir its root is DIR/<tenant>, read as the server serving those tenants reads it (only the reviewers granted it decide); written as scope.tenant into decision receipts (default: the tenant the server records for the root, else haia-trace-mcp)")
		switch verb {
		case "archive":
			o.olderThan = fs.Duration("older-than", 90*24*time.Hour, "archive final reviews whose last line is older than this")
		case "list":
			o.all = fs.Bool("all", false, "include decided reviews")
			o.consoleURL = fs.String("console-url", "", "the reviewer console's `URL`, as the server's --console-url: print each review's console page (review_url)")
		case "show":
			o.consoleURL = fs.String("console-url", "", "the reviewer console's `URL`, as the server's --console-url: print each review's console page (review_url)")
		case "approve", "reject":
			o.note = fs.String("note", "", "why (kept in the log)")
			o.by = fs.String("by", "", "who decides (default, and it must be: the reviewer id of --reviewer-key)")
			o.reviewerKey = reviewerKeyFlag(fs)
			o.expectTerms = fs.String("terms", "", "the terms `HASH` review show printed: decide only if the signed terms are still those")
		}
		return func(ctx context.Context, env *cmdEnv, pos []string) error {
			return runReview(ctx, env.stdout, env.stderr, verb, pos, o)
		}
	}
}

func runReview(ctx context.Context, stdout, stderr io.Writer, verb string, pos []string, o reviewFlags) error {
	asJSON, lockWait, all, note, by, reviewerKey, expectTerms := o.asJSON, o.lockWait, o.all, o.note, o.by, o.reviewerKey, o.expectTerms
	olderThan, consoleURL := o.olderThan, o.consoleURL
	var pageOf func(id string) string
	if consoleURL != nil && *consoleURL != "" {
		u, err := console.ParseURL(*consoleURL)
		if err != nil {
			return usageErrorf("--console-url: %v", err)
		}
		pageOf = func(id string) string { return console.PageOf(u, id) }
	}
	st, err := o.stack.open(ctx, func(c *app.Config) {
		c.LockWait = *lockWait
		c.ProgressOf = func(string) func(done, total int) { return newProgress(stderr, "review "+verb+": index").runs }
	})
	if err != nil {
		return err
	}
	defer st.Close()
	if !st.PolicyKnown() {
		if verb == "approve" || verb == "reject" || verb == "archive" {
			fmt.Fprintf(stderr, "haia-trace-mcp review %s: cannot decide: %s\n", verb, errPolicyUnknown)
			return exitCode(exitFail)
		}
		fmt.Fprintln(stderr, "haia-trace-mcp review "+verb+": note: the policy the server runs with is not recorded in the guard's store; expiry is judged under the built-in reviewTtlMinutes")
	}
	// scope.tenant of the decisions: --tenant, else the tenant the store
	// is served as, else the server's default.
	signedAs := o.stack.tenant
	if signedAs == "" {
		signedAs = st.Tenant()
	}
	if signedAs == "" {
		signedAs = "haia-trace-mcp"
	}
	root, pol, log := st.Root(), st.Policy(), st.Log()

	switch verb {
	case "archive":
		if *olderThan <= 0 {
			return usageErrorf("--older-than must be positive")
		}
		res, err := log.Archive(ctx, time.Now().Add(-*olderThan))
		if err != nil {
			return exitCode(reviewFailed(stderr, verb, err))
		}
		if *asJSON {
			return exitCode(reviewWriteJSON(stdout, stderr, res))
		}
		if res.Reviews == 0 {
			fmt.Fprintf(stdout, "nothing to archive: no final review is older than %s\n", *olderThan)
			return nil
		}
		fmt.Fprintf(stdout, "archived %d reviews (%d lines) to %s/%s/%s; audit still checks them\n", res.Reviews, res.Lines, root.Path(), reviewlog.DirName, res.File)
		return nil
	case "list":
		reviews, err := log.List(ctx, *all)
		if err != nil {
			return exitCode(reviewFailed(stderr, verb, err))
		}
		if pageOf != nil {
			for i := range reviews {
				reviews[i].ReviewURL = pageOf(reviews[i].ID)
			}
		}
		moot, why := reviewMoot(ctx, st, signedAs, reviews)
		if *asJSON {
			listed := make([]reviewListed, len(reviews))
			for i, r := range reviews {
				listed[i] = reviewListed{Review: r, Moot: moot[r.ID]}
			}
			return exitCode(reviewWriteJSON(stdout, stderr, struct {
				Reviews       []reviewListed `json:"reviews"`
				MootNotJudged string         `json:"moot_not_judged,omitempty"`
			}{listed, why}))
		}
		reviewPrintList(stdout, reviews, *all, pol, moot)
		reviewPrintCaps(stdout, reviews, pol.MaxPendingReviews, moot)
		if why != "" {
			fmt.Fprintf(stderr, "haia-trace-mcp review list: note: which pending reviews are moot is not shown: %s\n", why)
		}
		return nil
	case "show":
		r, err := log.Get(ctx, pos[0])
		if err != nil {
			return exitCode(reviewFailed(stderr, verb, err))
		}
		if pageOf != nil {
			r.ReviewURL = pageOf(r.ID)
		}
		// The commitments that bear on it: what the spend ledger holds to
		// its payee, verified as the server verifies it.
		rv, err := committedView(ctx, st, signedAs, pol)
		if err != nil {
			return exitCode(reviewFailed(stderr, verb, err))
		}
		bearing := reservationsBearing(rv, r)
		moot, why := reviewMoot(ctx, st, signedAs, []reviewlog.Review{r})
		if *asJSON {
			return exitCode(reviewWriteJSON(stdout, stderr, struct {
				reviewlog.Review
				Moot                bool                    `json:"moot,omitempty"`
				MootNotJudged       string                  `json:"moot_not_judged,omitempty"`
				Reservations        []reviewlog.Reservation `json:"reservations"`
				ReservedTotal       int                     `json:"reserved_total"`
				ReservationProblems []string                `json:"reservation_problems,omitempty"`
			}{r, moot[r.ID], why, bearing, len(rv.Held), rv.Problems}))
		}
		// The evidence is explained through the catalog the server reads,
		// under the template the guard judged by; a catalog that cannot be
		// opened leaves the review itself readable.
		explain := func(ref guard.Ref) string { return explainRef(ctx, st.Catalog(), r.Template, ref) }
		reviewPrintOne(stdout, r, pol, explain)
		if r.ReviewURL != "" {
			fmt.Fprintf(stdout, "console: %s\n", r.ReviewURL)
		}
		switch {
		case moot[r.ID]:
			fmt.Fprintln(stdout, "MOOT: this question would now be answered without review; it no longer counts towards the caller's pending reviews, and you may still decide it.")
		case why != "":
			fmt.Fprintf(stdout, "moot: not judged here: %s\n", why)
		}
		reviewPrintReservations(stdout, bearing, rv, pol.Assets)
		return nil
	}

	// The reviewer's own key signs the decision; it must be trusted, and
	// that is checked before anything is written.
	keyPath := *reviewerKey
	if keyPath == "" {
		var err error
		if keyPath, err = defaultKeyPath("--reviewer-key", "reviewer-key.pem"); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp review %s: %v; pass --reviewer-key\n", verb, err)
			return exitCode(exitFail)
		}
	}
	key, err := noa.LoadKeyFile(keyPath)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp review %s: --reviewer-key: %v (create one with: haia-trace-mcp reviewer init --id YOUR-ID)\n", verb, err)
		return exitCode(exitFail)
	}
	trusted, err := reviewlog.LoadReviewers(st.ReviewersPath())
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp review %s: %v (haia-trace-mcp reviewer init adds a reviewer to it)\n", verb, err)
		return exitCode(reviewExitUntrusted)
	}
	signer := noa.NewKeySigner(key)
	id, ok := trusted.IDOf(signer.PublicKey())
	if !ok {
		fmt.Fprintf(stderr, "haia-trace-mcp review %s: the key %s (kid %s) is not in the trusted reviewers file %s; nothing was written\n", verb, keyPath, signer.KeyID(), st.ReviewersPath())
		return exitCode(reviewExitUntrusted)
	}
	if *by != "" && *by != id {
		fmt.Fprintf(stderr, "haia-trace-mcp review %s: --by %s, but the key %s belongs to reviewer %s; nothing was written\n", verb, termsafe.String(*by), keyPath, termsafe.String(id))
		return exitCode(reviewExitUntrusted)
	}
	status := reviewlog.Approved
	if verb == "reject" {
		status = reviewlog.Rejected
	}
	// The decision is signed into the reviewer's chain inside the log's
	// lock; if it cannot be signed, it is not recorded at all (fail closed).
	chains := &reviewlog.Chains{Signer: signer, Tenant: signedAs}
	r, err := engine.Decider{Log: log, Chains: chains, ExpectTermsHash: *expectTerms}.Decide(ctx, pos[0], status, *note, id)
	if err != nil {
		return exitCode(reviewFailed(stderr, verb, err))
	}
	if *asJSON {
		return exitCode(reviewWriteJSON(stdout, stderr, r))
	}
	if r.Status == reviewlog.Pending && r.Approvals > 1 {
		// An approval that does not complete the review's quorum.
		fmt.Fprintf(stdout, "review %s approved by %s: %s; it needs %s from another trusted reviewer\n", r.ID, id,
			reviewlog.QuorumText(r), plural(r.Approvals-len(r.ApprovedBy), "more approval", "more approvals"))
	} else {
		fmt.Fprintf(stdout, "review %s %s by %s at %s\n", r.ID, r.Status, r.DecidedBy, r.DecidedAt)
		if q := reviewlog.QuorumText(r); q != "" {
			fmt.Fprintf(stdout, "approvals: %s\n", q)
		}
	}
	fmt.Fprintf(stdout, "signed: %s\n", reviewQuestion(r, pol))
	fmt.Fprintf(stdout, "terms %s (signed by the server in receipt %s)\n", r.TermsHash, r.TermsReceipt)
	return nil
}

// reviewFailed prints err and maps it to the documented exit code.
func reviewFailed(stderr io.Writer, verb string, err error) int {
	fmt.Fprintf(stderr, "haia-trace-mcp review %s: %v\n", verb, err)
	switch {
	case errors.Is(err, reviewlog.ErrUnknownReview):
		return reviewExitUnknown
	case errors.Is(err, reviewlog.ErrAlreadyDecided):
		return reviewExitDecided
	case errors.Is(err, reviewlog.ErrLockTimeout):
		return reviewExitLock
	case errors.Is(err, reviewlog.ErrExpired):
		return reviewExitExpired
	case errors.Is(err, reviewlog.ErrUntrusted):
		return reviewExitUntrusted
	case errors.Is(err, reviewlog.ErrTampered):
		return reviewExitTampered
	case errors.Is(err, reviewlog.ErrBadID), errors.Is(err, reviewlog.ErrBadInput):
		return exitUsage
	}
	return exitFail
}

func reviewUserName() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

func reviewWriteJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp review: write: %v\n", err)
		return exitFail
	}
	return exitOK
}

// reviewListed is a review as review list --json prints it.
type reviewListed struct {
	reviewlog.Review
	// Moot: pending, but its question would now be answered without
	// review (see reviewMoot).
	Moot bool `json:"moot,omitempty"`
}

func reviewPrintList(w io.Writer, reviews []reviewlog.Review, all bool, pol *guard.Config, moot map[string]bool) {
	assets := pol.Assets
	if len(reviews) == 0 {
		if all {
			fmt.Fprintln(w, "no reviews")
		} else {
			fmt.Fprintln(w, "no pending reviews")
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	links := reviews[0].ReviewURL != ""
	if links {
		fmt.Fprintln(tw, "REVIEW ID\tSTATUS\tCREATED\tCALLER\tCOUNTERPARTY\tAMOUNT\tASSET\tRESOURCE\tRULES\tLINK")
	} else {
		fmt.Fprintln(tw, "REVIEW ID\tSTATUS\tCREATED\tCALLER\tCOUNTERPARTY\tAMOUNT\tASSET\tRESOURCE\tRULES")
	}
	tampered, moots := 0, 0
	for _, r := range reviews {
		status := r.Status
		if r.Tampered {
			status += " TAMPERED"
			tampered++
		} else if r.TermsReceipt == "" {
			status += " UNSIGNED"
		}
		if moot[r.ID] {
			status += " MOOT"
			moots++
		}
		t := reviewTermsOf(r)
		resource := t.Resource
		if resource == "" {
			resource = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", r.ID, status, r.CreatedAt, reviewOneLine(reviewCaller(t)), reviewOneLine(reviewPayee(t.Counterparty, r.PayTo, pol)),
			reviewOneLine(displayDecimal(t.Amount, t.Asset, assets)), reviewOneLine(reviewAsset(t.Asset, assets)), reviewOneLine(resource), reviewOneLine(strings.Join(t.Rules, ",")))
		if links {
			fmt.Fprintf(tw, "\t%s", r.ReviewURL)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	if moots > 0 {
		fmt.Fprintf(w, "%d pending reviews are MOOT: their question would now be answered without review; they do not count towards the caller's pending reviews, and you may still decide them\n", moots)
	}
	if tampered > 0 {
		fmt.Fprintf(w, "%d reviews read TAMPERED: their log lines disagree with what the server or a reviewer signed; they cannot be decided (review show says how; audit lists every disagreement)\n", tampered)
	}
}

// reviewTermsOf is what a review asks: its terms as the server signed them,
// or — for a review opened by an earlier version, or one whose line was
// tampered with — what the log says, which the listing marks.
func reviewTermsOf(r reviewlog.Review) reviewlog.Terms {
	if r.Terms != nil {
		return *r.Terms
	}
	return reviewlog.Terms{ReviewID: r.ID, Caller: r.Caller, Tenant: r.Tenant, Counterparty: r.Counterparty, Amount: r.Amount,
		Asset: r.Asset, Resource: r.Resource, Template: r.Template, Rules: reviewRules(r), ParamsHash: r.ParamsHash}
}

// reviewPayee is whom a review's question pays, each address with the
// name the policy gives it beside it: "0x… (Weather API)", and the pay_to
// beside a host.
func reviewPayee(counterparty, payTo string, pol *guard.Config) string {
	to := pol.Label(counterparty)
	if payTo != "" && payTo != counterparty {
		to += " (pay_to " + pol.Label(payTo) + ")"
	}
	return to
}

// reviewCaller is "tenant/caller", or the caller alone without a tenant.
func reviewCaller(t reviewlog.Terms) string {
	if t.Tenant == "" {
		return t.Caller
	}
	return t.Tenant + "/" + t.Caller
}

// reviewAsset names an asset by the symbol the policy knows it by, with
// its registry key (the key alone when the policy does not know it).
func reviewAsset(key string, assets guard.Registry) string {
	if a, ok := assets.Lookup(key); ok && a.Symbol != "" {
		return a.Symbol + " (" + key + ")"
	}
	return key
}

// reviewQuestion is the question in one line.
func reviewQuestion(r reviewlog.Review, pol *guard.Config) string {
	assets := pol.Assets
	t := reviewTermsOf(r)
	q := fmt.Sprintf("pay %s %s to %s", displayDecimal(t.Amount, t.Asset, assets), reviewAsset(t.Asset, assets), reviewPayee(t.Counterparty, r.PayTo, pol))
	if t.AmountAtomic != "" {
		q += fmt.Sprintf(" (%s atomic units)", t.AmountAtomic)
	}
	if t.Resource != "" {
		q += " for " + t.Resource
	}
	return reviewOneLine(q + ", asked by " + reviewCaller(t))
}

func reviewPrintOne(w io.Writer, r reviewlog.Review, pol *guard.Config, explain func(guard.Ref) string) {
	fmt.Fprintf(w, "review       %s\nstatus       %s\ncreated      %s\n", r.ID, r.Status, r.CreatedAt)
	if q := reviewlog.QuorumText(r); q != "" {
		fmt.Fprintf(w, "approvals    %s (each from a distinct trusted reviewer; one rejection rejects)\n", q)
	}
	t := reviewTermsOf(r)
	switch {
	case r.Tampered:
		fmt.Fprintln(w, "TAMPERED     the review log disagrees with what was signed: do not decide on what follows (it is what the log says)")
	case r.TermsReceipt == "":
		fmt.Fprintln(w, "UNSIGNED     no receipt of the server signs these terms: they cannot be decided")
	default:
		fmt.Fprintf(w, "terms        %s, signed by the server in receipt %s\n", r.TermsHash, r.TermsReceipt)
	}
	fmt.Fprintf(w, "asked by     %s\n", reviewOneLine(t.Caller))
	if t.Tenant != "" {
		fmt.Fprintf(w, "tenant       %s\n", reviewOneLine(t.Tenant))
	}
	fmt.Fprintf(w, "question     %s\n", reviewQuestion(r, pol))
	resource := t.Resource
	if resource == "" {
		resource = "(not named by the agent)"
	}
	fmt.Fprintf(w, "resource     %s\n", reviewOneLine(resource))
	if t.Template != "" {
		fmt.Fprintf(w, "template     %s\n", reviewOneLine(t.Template))
	}
	fmt.Fprintf(w, "rules        %s\n", reviewOneLine(strings.Join(t.Rules, ", ")))
	if r.DecidedAt != "" {
		fmt.Fprintf(w, "decided      %s by %s\n", r.DecidedAt, reviewOneLine(r.DecidedBy))
		if r.Note != "" {
			fmt.Fprintf(w, "note         %s\n", reviewOneLine(r.Note))
		}
	}
	if r.UsedAt != "" {
		fmt.Fprintf(w, "used         %s (the approval was honoured once)\n", r.UsedAt)
	}
	for _, f := range r.Integrity {
		fmt.Fprintf(w, "INTEGRITY    %s\n", reviewOneLine(f))
	}
	fmt.Fprintln(w, "reasons")
	for _, reason := range r.Reasons {
		fmt.Fprintf(w, "  %s: %s\n", reviewOneLine(reason.Rule), reviewOneLine(reason.Detail))
		for _, e := range reason.Evidence {
			fmt.Fprintf(w, "    run %s, operation %s\n", reviewOneLine(e.RunID), reviewOneLine(e.OperationID))
			if explain != nil {
				fmt.Fprintf(w, "      %s\n", reviewOneLine(explain(e)))
			}
		}
	}
	if r.Status == reviewlog.Pending && !r.Tampered && r.TermsReceipt != "" {
		fmt.Fprintf(w, "decide with  haia-trace-mcp review approve|reject %s --terms %s\n", r.ID, r.TermsHash)
	}
}

func reviewRules(r reviewlog.Review) []string {
	var out []string
	for _, reason := range r.Reasons {
		if reason.Rule != "history" {
			out = append(out, reason.Rule)
		}
	}
	return out
}

// reviewOneLine keeps text that came from an agent, an event or a file from
// breaking, forging or hiding in lines of the terminal output: control,
// bidi and zero-width characters are escaped visibly.
func reviewOneLine(s string) string { return termsafe.String(s) }

// reviewersFile is --reviewers, or reviewers.json in the user configuration
// directory: outside the Trace root, so a volume writer cannot add a
// reviewer.
func reviewersFile(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	p, err := defaultKeyPath("--reviewers", "reviewers.json")
	if err != nil {
		return "", fmt.Errorf("%w; pass --reviewers", err)
	}
	return p, nil
}

// reservationsBearing are the reservations to the review's counterparty
// (or its pay_to).
func reservationsBearing(v reviewlog.ReservationView, r reviewlog.Review) []reviewlog.Reservation {
	out := []reviewlog.Reservation{}
	for _, x := range v.Held {
		if (x.PayTo != "" && (x.PayTo == r.Counterparty || x.PayTo == r.PayTo)) || (x.Host != "" && x.Host == r.Counterparty) {
			out = append(out, x)
		}
	}
	return out
}

// reviewPrintReservations writes what is reserved beside a review.
func reviewPrintReservations(w io.Writer, bearing []reviewlog.Reservation, v reviewlog.ReservationView, assets guard.Registry) {
	fmt.Fprintf(w, "reservations: %s held to anyone (they count towards the total and velocity limits), %d to this counterparty\n", count(len(v.Held), "amount", "amounts"), len(bearing))
	for _, x := range bearing {
		whom := x.PayTo
		if x.Host != "" {
			whom = x.Host
			if x.PayTo != "" {
				whom += " (pay_to " + x.PayTo + ")"
			}
		}
		until, _ := holdUntil(x, time.Now())
		if x.Until == "" && x.ValidBefore == "" {
			until += " (an authorization, open)"
		}
		amount := x.Atomic + " atomic units of " + x.Asset
		if n, ok := new(big.Int).SetString(x.Atomic, 10); ok {
			amount = amountText(n, x.Asset, assets)
		}
		fmt.Fprintf(w, "  %s to %s by %s, receipt %s, %s\n", termsafe.String(amount), termsafe.String(whom), termsafe.String(x.Caller), termsafe.String(x.ReceiptID), until)
	}
	for _, p := range v.Problems {
		fmt.Fprintf(w, "  RESERVATIONS UNVERIFIED: %s\n", termsafe.String(p))
	}
}
