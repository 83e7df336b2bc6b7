package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const statusDetails = `The state at a glance, for a person or a monitoring script: runs and their
operations (full or partial), open payments by counterparty, pending reviews
by age, reservations, every decision chain's head and whether it verifies
(against the store's keyring), the policy in force (the one the server
recorded in the store; its source and SHA-256), a policy file on disk that
is not it, the trusted reviewers, and what a guard proxy serving the root
does with each upstream tool (guard/proxy-tools.json, which the proxy
writes). Nothing is written. --json prints one JSON object.

exit codes: 0 everything verifies, 1 error, 2 usage, 3 a chain does not verify,
a run cannot be read, a reservation is unverified, the policy on disk is not
the one in force, or the guard proxy refuses an upstream tool as new, forwards
one that looks like a payment unchecked, or refuses every call
`

// statusReport is what status prints; its JSON form is for scripts.
type statusReport struct {
	Root  string `json:"root"`
	Store string `json:"store"`
	// Tenant is the tenant its server serves the store as ("" for a
	// single root).
	Tenant       string         `json:"tenant,omitempty"`
	Runs         statusRuns     `json:"runs"`
	OpenPayments []statusOpen   `json:"open_payments"`
	Reviews      statusReviews  `json:"reviews"`
	Reservations statusReserved `json:"reservations"`
	// Spend is the spend against the policy's limits, per counterparty
	// and in total (absent when the spend ledger's seals cannot be
	// checked here: SpendNotShown says why).
	Spend         *engine.SpendView `json:"spend,omitempty"`
	SpendNotShown string            `json:"spend_not_shown,omitempty"`
	Chains        []statusChain     `json:"chains"`
	Policy        statusPolicy      `json:"policy"`
	Reviewers     statusReviewers   `json:"reviewers"`
	Problems      []string          `json:"problems"`
	GeneratedAt   string            `json:"generated_at"`
	Templates     []string          `json:"history_templates"`
	Unreadable    []statusNotFound  `json:"unreadable_runs"`
	// Proxy is what a guard proxy serving this root wrote of its
	// upstream's tools (absent when none has).
	Proxy *statusProxy `json:"proxy,omitempty"`
}

type statusRuns struct {
	Runs       int `json:"runs"`
	Operations int `json:"operations"`
	Full       int `json:"full"`
	Partial    int `json:"partial"`
	Unreadable int `json:"unreadable"`
}

type statusOpen struct {
	Counterparty string `json:"counterparty"`
	// Name is the policy's name of the counterparty (payees), if any.
	Name       string   `json:"name,omitempty"`
	Operations int      `json:"operations"`
	Amounts    []string `json:"amounts"`
}

type statusReviews struct {
	Pending int           `json:"pending"`
	ByAge   []statusCount `json:"by_age"`
	Oldest  string        `json:"oldest_created_at,omitempty"`
	// Approving are the pending reviews that need several reviewers'
	// approvals and have some: how far each is.
	Approving []statusApproving `json:"approving,omitempty"`
}

// statusApproving is a pending review part-way through its quorum.
type statusApproving struct {
	ReviewID   string   `json:"review_id"`
	Needed     int      `json:"approvals_needed"`
	ApprovedBy []string `json:"approved_by"`
	Text       string   `json:"text"`
}

type statusCount struct {
	Age   string `json:"age"`
	Count int    `json:"count"`
}

// statusReserved is what allows hold now: each reservation a signed
// ALLOWED receipt backs, and where records and receipts disagree.
type statusReserved struct {
	Held     int                 `json:"held"`
	Items    []statusReservation `json:"items"`
	Problems []string            `json:"problems"`
}

type statusReservation struct {
	To string `json:"to"`
	// Name is the policy's name of To (payees), if any.
	Name      string `json:"name,omitempty"`
	Amount    string `json:"amount"`
	Caller    string `json:"caller"`
	ReceiptID string `json:"receipt_id"`
	Until     string `json:"until"`
	// ValidBefore is a signed authorization's validBefore (UTC), when
	// recorded; Expired: it has passed, and the hold is kept with its
	// outcome unknown here.
	ValidBefore string `json:"valid_before,omitempty"`
	Expired     bool   `json:"expired,omitempty"`
}

type statusChain struct {
	ID       string `json:"id"`
	Receipts int    `json:"receipts"`
	Segments int    `json:"segments"`
	Head     string `json:"head"`
	Verdict  string `json:"verdict"`
	Reason   string `json:"reason,omitempty"`
}

type statusPolicy struct {
	Source string `json:"source"`
	SHA256 string `json:"sha256"`
	// Refused is the last reload the server refused since it recorded
	// the policy in force (which stays in force).
	Refused *reviewlog.RefusedPolicy `json:"refused,omitempty"`
}

// statusReviewers are the trusted reviewers: every one, whether it signs
// with a key, passkeys or both, and the tenants it is granted.
type statusReviewers struct {
	File    string           `json:"file"`
	IDs     []string         `json:"ids"`
	Entries []statusReviewer `json:"entries"`
	Error   string           `json:"error,omitempty"`
}

type statusReviewer struct {
	ID string `json:"id"`
	// SignsWith are the kinds of key it decides with: "key" (an Ed25519
	// key, the CLI's), "passkey" (the console's).
	SignsWith []string `json:"signs_with"`
	// KeyID is the kid of its Ed25519 key ("" without one).
	KeyID    string `json:"key_id,omitempty"`
	Passkeys int    `json:"passkeys"`
	// Tenants are the tenants it is granted ("*": every tenant).
	Tenants []string `json:"tenants"`
	// Decides says whether its decisions count in this store: on a
	// tenant's, only a reviewer granted the tenant's do.
	Decides bool `json:"decides"`
}

type statusNotFound struct {
	RunID string `json:"run_id"`
	Error string `json:"error"`
}

// statusAges are the buckets pending reviews are counted in.
var statusAges = []struct {
	label string
	upTo  time.Duration
}{{"< 1h", time.Hour}, {"1h–24h", 24 * time.Hour}, {"1d–7d", 7 * 24 * time.Hour}, {"> 7d", 0}}

// defineStatus is `status`: the state at a glance.
func defineStatus(flags *flag.FlagSet) runFunc {
	var o statusFlags
	o.stack.register(flags, true)
	o.guardConfig = guardConfigFlag(flags)
	templatesDirFlagVar(flags, &o.stack.templatesDir)
	o.asJSON = jsonFlag(flags)
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		return runStatus(ctx, env.stdout, env.stderr, o)
	}
}

// statusFlags are status's flags.
type statusFlags struct {
	stack       stackFlags
	guardConfig *string
	asJSON      *bool
}

func runStatus(ctx context.Context, stdout, stderr io.Writer, o statusFlags) error {
	guardConfig, asJSON := o.guardConfig, o.asJSON
	progress := newProgress(stderr, "status")
	defer progress.done()
	// The policy in effect is the one the server recorded in the store;
	// a file on disk is reported against it, never taken in its place.
	st, err := o.stack.open(ctx, func(c *app.Config) {
		c.ProgressOf = func(string) func(done, total int) {
			return func(done, total int) {
				progress.step(fmt.Sprintf("reading the runs under events/ (%d of %d)", done, total))
			}
		}
	})
	if err != nil {
		return err
	}
	defer st.Close()
	policyPath, policySource := *guardConfig, "--guard-config "+*guardConfig
	if policyPath == "" {
		beside := app.PolicyFileBeside(st.Root().Path())
		if _, err := os.Stat(beside); err == nil {
			policyPath, policySource = beside, beside+" (beside the Trace root)"
		}
	}
	rep := statusReport{Root: st.Root().Path(), Store: st.Store().Describe(), Tenant: st.Tenant(), GeneratedAt: time.Now().UTC().Format(time.RFC3339),
		Problems: []string{}, OpenPayments: []statusOpen{}, Chains: []statusChain{}, Unreadable: []statusNotFound{}}

	// The policy in effect: as the server recorded it, else the file.
	pol := st.Policy()
	builtinSum := func() string {
		def, _ := json.Marshal(guard.DefaultConfig())
		sum := sha256.Sum256(def)
		return hex.EncodeToString(sum[:])
	}
	if st.PolicyKnown() {
		rep.Policy = statusPolicy{Source: pol.Source + ", recorded in the store by the server", SHA256: pol.Hash}
		if pol.Hash == "" {
			rep.Policy.SHA256 = builtinSum()
		}
		if rec, ok := st.RecordedPolicy(); ok && rec.Refused != nil {
			rep.Policy.Refused = rec.Refused
			rep.Problems = append(rep.Problems, fmt.Sprintf("the server refused to reload %s at %s (%s): the policy above stays in force; fix the file and reload again (SIGHUP)", rec.Refused.Source, rec.Refused.At, rec.Refused.Error))
		}
		if policyPath != "" {
			data, err := os.ReadFile(policyPath)
			sum := sha256.Sum256(data)
			if err != nil || hex.EncodeToString(sum[:]) != pol.Hash {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s is not the policy the server runs with (%s): restart or SIGHUP the server to put it in force", policySource, rep.Policy.Source))
			}
		}
	} else if policyPath == "" {
		rep.Policy = statusPolicy{Source: "built-in defaults (no --guard-config and no haia-guard.config.json beside the Trace root); sha256 of their JSON form", SHA256: builtinSum()}
	} else {
		if pol, err = guard.LoadConfig(policyPath); err != nil {
			return err
		}
		if st.Tenant() != "" {
			pol = pol.ForTenant(st.Tenant())
		}
		data, err := os.ReadFile(policyPath)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		rep.Policy = statusPolicy{Source: policySource, SHA256: hex.EncodeToString(sum[:])}
	}
	rep.Templates = pol.HistoryTemplates

	// Runs and open payments, read as the server reads them.
	progress.step("reading the runs under events/")
	if err := statusRunsOf(ctx, st, pol, &rep); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp status: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}

	// Pending reviews by age, in the review log as the server reads it.
	progress.step("reading the review log")
	log := st.Log()
	pending, err := log.List(ctx, false)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp status: the review log: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	rep.Reviews = statusPending(pending, time.Now())
	// What a seller's receipt or settlement said against its authorization
	// (record_receipt's findings) is for a person to weigh.
	if sts, err := log.Settlements(ctx); err != nil {
		rep.Problems = append(rep.Problems, "the settlements cannot be read: "+err.Error())
	} else {
		for _, s := range sts {
			if n := len(s.Findings); n > 0 {
				from := ""
				if s.Source == reviewlog.SourceTrace && s.Trace != nil {
					from = fmt.Sprintf(" (read from the Trace, run %s, line %d", s.Trace.Run, s.Trace.Line)
					if s.HoldKept {
						from += "; its hold still counts as an open payment"
					}
					from += ")"
				}
				rep.Problems = append(rep.Problems, fmt.Sprintf("the seller's settlement of authorization %s disagrees with it (%s; first: %s): haia-trace-mcp authorization show %s%s",
					s.Nonce, count(n, "finding", "findings"), s.Findings[0], s.Nonce, from))
			}
		}
	}

	// What the spend ledger holds now, verified as the server verifies it.
	signedAs := st.Tenant()
	if signedAs == "" {
		signedAs = "haia-trace-mcp"
	}
	rv, err := committedView(ctx, st, signedAs, pol)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp status: the reservations: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	// The spend against the limits: the decision's own figures, the held
	// part from the ledger's running totals, read under the server's key.
	progress.step("adding up the spend against the limits")
	if rep.Spend, rep.SpendNotShown, err = statusSpend(ctx, st, signedAs, pol); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp status: the spend against the limits: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	rep.Reservations = statusReserved{Held: len(rv.Held), Items: []statusReservation{}, Problems: []string{}}
	for _, x := range rv.Held {
		to := x.PayTo
		if x.Host != "" {
			to = x.Host
		}
		amount := x.Atomic + " atomic units of " + x.Asset
		if n, ok := new(big.Int).SetString(x.Atomic, 10); ok {
			amount = amountText(n, x.Asset, pol.Assets)
		}
		until, expired := holdUntil(x, time.Now())
		rep.Reservations.Items = append(rep.Reservations.Items, statusReservation{To: to, Name: pol.PayeeName(to), Amount: amount, Caller: x.Caller, ReceiptID: x.ReceiptID, Until: until,
			ValidBefore: x.ValidBefore, Expired: expired})
	}
	for _, p := range rv.Problems {
		rep.Reservations.Problems = append(rep.Reservations.Problems, p)
		rep.Problems = append(rep.Problems, "reservations unverified: "+p)
	}

	// Chains and whether they verify against the store's keyring.
	err = st.Store().View(ctx, func(r reviewlog.Reader) error {
		chains, err := reviewlog.ListChains(ctx, r)
		if err != nil {
			return err
		}
		kr, err := r.Keyring(ctx)
		if err != nil {
			return fmt.Errorf("the keyring: %w", err)
		}
		for i, ch := range chains {
			progress.step(fmt.Sprintf("verifying chain %d of %d (%d receipts)", i+1, len(chains), ch.Length))
			res, err := reviewlog.VerifySegments(ctx, r, ch.ID, noa.Options{Keyring: kr})
			if err != nil {
				return fmt.Errorf("chain %s: %w", ch.ID, err)
			}
			sc := statusChain{ID: ch.ID, Receipts: ch.Length, Segments: ch.Segments, Head: ch.Head, Verdict: string(res.Verdict)}
			if res.Verdict != noa.Valid {
				sc.Reason = res.Reason
				rep.Problems = append(rep.Problems, fmt.Sprintf("chain %s is %s: %s", ch.ID, res.Verdict, res.Reason))
			}
			rep.Chains = append(rep.Chains, sc)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp status: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}

	// What a guard proxy does with its upstream's tools.
	var proxyProblems []string
	rep.Proxy, proxyProblems = proxyStatusOf(st.Root().Dir())
	rep.Problems = append(rep.Problems, proxyProblems...)

	// The trusted reviewers: every one, with the kinds of key it signs
	// with and the tenants it is granted.
	var rerr error
	if rep.Reviewers, rerr = statusReviewersOf(st.ReviewersPath(), st.Tenant()); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		rep.Problems = append(rep.Problems, "the trusted reviewers file cannot be read: "+rerr.Error())
	}
	progress.done()

	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp status: %v\n", err)
			return exitCode(exitFail)
		}
	} else {
		printStatus(stdout, rep)
	}
	if len(rep.Problems) > 0 {
		return exitCode(3)
	}
	return nil
}

// statusSpend is the spend against the limits as the server adds it up.
// With no ledger line yet nothing is held, and no key is needed; with
// lines that no key found here seals, what is held cannot be verified, and
// notShown says so.
func statusSpend(ctx context.Context, st *app.Stack, signedAs string, pol *guard.Config) (_ *engine.SpendView, notShown string, _ error) {
	eng, raws, err := ledgerEngine(ctx, st, signedAs, pol)
	if err != nil {
		return nil, "", err
	}
	if eng == nil {
		for _, r := range raws {
			if r.Line != nil {
				return nil, "no key found here seals the spend ledger (the server's default key files), so what it holds cannot be verified; run status where the server's keys are", nil
			}
		}
		// An empty ledger: any key reads it.
		eng, err = engine.New(engine.Config{Policy: pol, Templates: st.Templates(), History: st.Catalog(), Log: st.Log(),
			Chains: &reviewlog.Chains{Tenant: signedAs}, ParamsKey: []byte("nothing to verify: the ledger is empty"), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, "", err
		}
	}
	v, err := eng.Spend(ctx)
	if err != nil {
		return nil, "", err
	}
	return &v, "", nil
}

// statusRunsOf reads every run under the policy's history templates the
// way the server does (the stack's catalog) and fills the runs, the
// unreadable runs and the open payments.
func statusRunsOf(ctx context.Context, st *app.Stack, pol *guard.Config, rep *statusReport) error {
	cat := st.Catalog()
	seen := map[string]bool{}
	open := map[string]*statusOpen{}
	sums := map[string]map[string]*big.Int{}
	runs := map[string]bool{}
	for _, name := range pol.HistoryTemplates {
		t, err := cat.Templates().Resolve(name)
		if err != nil {
			return fmt.Errorf("history template %s: %w", name, err)
		}
		h, err := cat.History(ctx, t)
		if err != nil {
			return fmt.Errorf("read history under %s: %w", name, err)
		}
		for _, u := range h.Unreadable {
			if !seen["unreadable\x00"+u.RunID] {
				seen["unreadable\x00"+u.RunID] = true
				rep.Unreadable = append(rep.Unreadable, statusNotFound(u))
				rep.Problems = append(rep.Problems, fmt.Sprintf("run %s cannot be read: %s", u.RunID, u.Error))
			}
		}
		for _, op := range h.Ops {
			key := op.RunID + "\x00" + op.OperationID
			if seen[key] {
				continue
			}
			seen[key] = true
			runs[op.RunID] = true
			rep.Runs.Operations++
			if op.Completeness == "full" {
				rep.Runs.Full++
			} else {
				rep.Runs.Partial++
			}
			if !op.Open {
				continue
			}
			who := "(not attributable: " + op.Unattributable + ")"
			if op.Money != nil {
				switch {
				case len(op.Money.PayTos) > 0:
					who = strings.Join(op.Money.PayTos, ",")
				case len(op.Money.Hosts) > 0:
					who = strings.Join(op.Money.Hosts, ",")
				}
			}
			o := open[who]
			if o == nil {
				o = &statusOpen{Counterparty: who, Name: pol.PayeeName(who)}
				open[who] = o
				sums[who] = map[string]*big.Int{}
			}
			o.Operations++
			if op.Money != nil && op.Money.Atomic != nil && op.Money.Asset != "" {
				s := sums[who][op.Money.Asset]
				if s == nil {
					s = new(big.Int)
					sums[who][op.Money.Asset] = s
				}
				s.Add(s, op.Money.Atomic)
			}
		}
	}
	rep.Runs.Runs = len(runs)
	rep.Runs.Unreadable = len(rep.Unreadable)
	for who, o := range open {
		for _, asset := range slices.Sorted(mapKeys(sums[who])) {
			o.Amounts = append(o.Amounts, amountText(sums[who][asset], asset, pol.Assets))
		}
		if o.Amounts == nil {
			o.Amounts = []string{}
		}
		rep.OpenPayments = append(rep.OpenPayments, *o)
	}
	sort.Slice(rep.OpenPayments, func(i, j int) bool {
		a, b := rep.OpenPayments[i], rep.OpenPayments[j]
		if a.Operations != b.Operations {
			return a.Operations > b.Operations
		}
		return a.Counterparty < b.Counterparty
	})
	return nil
}

// statusReviewersOf lists every reviewer the trusted reviewers file at
// path trusts — by an Ed25519 key, passkeys, or both — with the tenants it
// is granted; on tenant's store ("" for a single root, which reads no
// grant) a reviewer not granted it decides nothing.
func statusReviewersOf(path, tenant string) (statusReviewers, error) {
	out := statusReviewers{File: path, IDs: []string{}, Entries: []statusReviewer{}}
	trust, err := reviewlog.LoadReviewerTrust(path, tenant)
	if err != nil {
		out.Error = err.Error()
		return out, err
	}
	ids := map[string]bool{}
	for id := range trust.Reviewers {
		ids[id] = true
	}
	for id, cs := range trust.Passkeys {
		if len(cs) > 0 {
			ids[id] = true
		}
	}
	for _, id := range slices.Sorted(mapKeys(ids)) {
		r := statusReviewer{ID: id, SignsWith: []string{}, Passkeys: len(trust.Passkeys[id]), Tenants: slices.Clone(trust.Grants[id]), Decides: tenant == "" || trust.Grants.Allows(id, tenant)}
		if pub, ok := trust.Reviewers[id]; ok {
			r.SignsWith, r.KeyID = append(r.SignsWith, "key"), noa.KeyID(pub)
		}
		if r.Passkeys > 0 {
			r.SignsWith = append(r.SignsWith, "passkey")
		}
		if r.Tenants == nil {
			r.Tenants = []string{}
		}
		slices.Sort(r.Tenants)
		out.IDs = append(out.IDs, id)
		out.Entries = append(out.Entries, r)
	}
	return out, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// statusPending counts pending reviews by age at now.
func statusPending(pending []reviewlog.Review, now time.Time) statusReviews {
	out := statusReviews{Pending: len(pending), ByAge: make([]statusCount, len(statusAges))}
	for i, a := range statusAges {
		out.ByAge[i].Age = a.label
	}
	for _, r := range pending {
		at, err := time.Parse(time.RFC3339Nano, r.CreatedAt)
		age := time.Duration(0)
		if err == nil {
			age = now.Sub(at)
		}
		for i, a := range statusAges {
			if a.upTo == 0 || age < a.upTo {
				out.ByAge[i].Count++
				break
			}
		}
		if out.Oldest == "" || r.CreatedAt < out.Oldest {
			out.Oldest = r.CreatedAt
		}
		if r.Approvals > 1 && len(r.ApprovedBy) > 0 {
			out.Approving = append(out.Approving, statusApproving{ReviewID: r.ID, Needed: r.Approvals, ApprovedBy: r.ApprovedBy, Text: reviewlog.QuorumText(r)})
		}
	}
	return out
}

func printStatus(w io.Writer, rep statusReport) {
	s := termsafe.String
	fmt.Fprintf(w, "Trace root  %s\nstore       %s\n", s(rep.Root), s(rep.Store))
	if rep.Tenant != "" {
		fmt.Fprintf(w, "tenant      %s (its server serves this store as that tenant: only the reviewers granted it decide)\n", s(rep.Tenant))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "runs        %s, %s (%d full, %d partial) under %s\n", count(rep.Runs.Runs, "run", "runs"), count(rep.Runs.Operations, "operation", "operations"),
		rep.Runs.Full, rep.Runs.Partial, strings.Join(rep.Templates, ", "))
	for _, u := range rep.Unreadable {
		fmt.Fprintf(w, "            run %s cannot be read: %s\n", s(u.RunID), s(u.Error))
	}
	if len(rep.OpenPayments) == 0 {
		fmt.Fprintf(w, "open        no open payment\n")
	} else {
		fmt.Fprintf(w, "open        payments whose outcome is not confirmed, by counterparty:\n")
		for _, o := range rep.OpenPayments {
			fmt.Fprintf(w, "            %-44s %-14s %s\n", s(named(o.Counterparty, o.Name)), count(o.Operations, "operation", "operations"), s(strings.Join(o.Amounts, " + ")))
		}
	}
	fmt.Fprintf(w, "reviews     %d pending", rep.Reviews.Pending)
	if rep.Reviews.Pending > 0 {
		var parts []string
		for _, b := range rep.Reviews.ByAge {
			if b.Count > 0 {
				parts = append(parts, fmt.Sprintf("%s: %d", b.Age, b.Count))
			}
		}
		fmt.Fprintf(w, " (%s; oldest opened %s)", strings.Join(parts, ", "), s(rep.Reviews.Oldest))
	}
	fmt.Fprintln(w)
	for _, a := range rep.Reviews.Approving {
		fmt.Fprintf(w, "            review %s: %s\n", s(a.ReviewID), s(a.Text))
	}
	printSpend(w, rep.Spend, rep.SpendNotShown)
	held := count(rep.Reservations.Held, "amount held by an earlier allow", "amounts held by earlier allows")
	fmt.Fprintf(w, "reserved    %s (counted towards the limits until the Trace shows the payment)\n", held)
	for _, x := range rep.Reservations.Items {
		fmt.Fprintf(w, "            %s to %s by %s, receipt %s, %s\n", s(x.Amount), s(named(x.To, x.Name)), s(x.Caller), s(x.ReceiptID), s(x.Until))
	}
	if len(rep.Chains) == 0 {
		fmt.Fprintf(w, "chains      none yet (no decision recorded)\n")
	}
	for i, ch := range rep.Chains {
		label := "chains     "
		if i > 0 {
			label = "           "
		}
		fmt.Fprintf(w, "%s %s  %s  %s, %s, head %s\n", label, ch.Verdict, s(ch.ID), count(ch.Receipts, "receipt", "receipts"), count(ch.Segments, "segment", "segments"), s(ch.Head))
		if ch.Reason != "" {
			fmt.Fprintf(w, "              %s\n", s(ch.Reason))
		}
	}
	fmt.Fprintf(w, "policy      %s\n            sha256 %s\n", s(rep.Policy.Source), rep.Policy.SHA256)
	if r := rep.Policy.Refused; r != nil {
		fmt.Fprintf(w, "            RELOAD REFUSED at %s: %s: %s; the policy above stays in force\n", s(r.At), s(r.Source), s(r.Error))
	}
	printStatusProxy(w, rep.Proxy)
	switch {
	case rep.Reviewers.Error != "":
		fmt.Fprintf(w, "reviewers   %s: %s\n", s(rep.Reviewers.File), s(rep.Reviewers.Error))
	case len(rep.Reviewers.Entries) == 0:
		fmt.Fprintf(w, "reviewers   none trusted in %s\n", s(rep.Reviewers.File))
	default:
		scope := "a single root: every trusted reviewer decides, no grant is read"
		if rep.Tenant != "" {
			scope = "tenant " + rep.Tenant + ": only the reviewers granted it decide"
		}
		fmt.Fprintf(w, "reviewers   %s trusted in %s (%s)\n", count(len(rep.Reviewers.Entries), "reviewer", "reviewers"), s(rep.Reviewers.File), s(scope))
		width := 0
		for _, r := range rep.Reviewers.Entries {
			width = max(width, len(s(r.ID)))
		}
		for _, r := range rep.Reviewers.Entries {
			fmt.Fprintf(w, "            %-*s  %s\n", width, s(r.ID), s(statusReviewerLine(r, rep.Tenant)))
		}
	}
	if len(rep.Problems) > 0 {
		fmt.Fprintf(w, "\n%s:\n", count(len(rep.Problems), "problem", "problems"))
		for _, p := range rep.Problems {
			fmt.Fprintf(w, "  - %s\n", s(p))
		}
	}
}

// statusReviewerLine says what a reviewer signs with and for which
// tenants: "key haia-1a07…, 2 passkeys; tenants acme, globex".
func statusReviewerLine(r statusReviewer, tenant string) string {
	var keys []string
	if r.KeyID != "" {
		keys = append(keys, "key "+r.KeyID)
	}
	if r.Passkeys > 0 {
		keys = append(keys, count(r.Passkeys, "passkey", "passkeys"))
	}
	line := strings.Join(keys, ", ")
	switch {
	case slices.Contains(r.Tenants, reviewlog.AllTenants):
		line += "; every tenant"
	case len(r.Tenants) > 0:
		line += "; tenants " + strings.Join(r.Tenants, ", ")
	default:
		line += "; no tenant granted"
	}
	if !r.Decides {
		line += fmt.Sprintf(" (not granted %s: its decisions do not count here)", tenant)
	}
	return line
}

// printSpend writes the spend against the limits: per counterparty, then
// in total, each limit's window with what the Trace shows paid and what
// the ledger holds.
func printSpend(w io.Writer, v *engine.SpendView, notShown string) {
	s := termsafe.String
	if v == nil {
		fmt.Fprintf(w, "spend       not shown: %s\n", s(notShown))
		return
	}
	line := func(label string, u engine.LimitUse) {
		fmt.Fprintf(w, "            %-44s %s of %s (%d%%) in %s under %s: %s paid, %s held", s(label), s(u.Used), s(u.Max), u.Percent, s(u.Window), u.Limit, s(u.Paid), s(u.Held))
		if u.Unsummed > 0 {
			fmt.Fprintf(w, "; %s cannot be added", count(u.Unsummed, "payment", "payments"))
		}
		fmt.Fprintln(w)
	}
	if len(v.Counterparties) == 0 && len(v.Total) == 0 {
		fmt.Fprintln(w, "spend       nothing paid or held in any limit's window")
		return
	}
	fmt.Fprintln(w, "spend       against the limits (the Trace's payments and what the spend ledger holds, in each window):")
	for _, c := range v.Counterparties {
		label := named(c.Counterparty, c.Name)
		for _, u := range c.Limits {
			line(label, u)
			label = ""
		}
	}
	if v.More > 0 {
		fmt.Fprintf(w, "            and %s more (status --json lists the first %d)\n", count(v.More, "counterparty", "counterparties"), len(v.Counterparties))
	}
	for _, u := range v.Total {
		line("total (every counterparty)", u)
	}
	for _, p := range v.Problems {
		fmt.Fprintf(w, "            UNVERIFIED %s: what is held is unknown and every question answers review\n", s(p))
	}
}

// named is an address with its name beside it, "0x… (Weather API)".
func named(addr, name string) string {
	if name == "" {
		return addr
	}
	return addr + " (" + name + ")"
}
