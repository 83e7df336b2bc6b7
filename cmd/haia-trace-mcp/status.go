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
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
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
	Root         string           `json:"root"`
	Store        string           `json:"store"`
	Runs         statusRuns       `json:"runs"`
	OpenPayments []statusOpen     `json:"open_payments"`
	Reviews      statusReviews    `json:"reviews"`
	Reservations statusReserved   `json:"reservations"`
	Chains       []statusChain    `json:"chains"`
	Policy       statusPolicy     `json:"policy"`
	Reviewers    statusReviewers  `json:"reviewers"`
	Problems     []string         `json:"problems"`
	GeneratedAt  string           `json:"generated_at"`
	Templates    []string         `json:"history_templates"`
	Unreadable   []statusNotFound `json:"unreadable_runs"`
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
	Counterparty string   `json:"counterparty"`
	Operations   int      `json:"operations"`
	Amounts      []string `json:"amounts"`
}

type statusReviews struct {
	Pending int           `json:"pending"`
	ByAge   []statusCount `json:"by_age"`
	Oldest  string        `json:"oldest_created_at,omitempty"`
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
	To        string `json:"to"`
	Amount    string `json:"amount"`
	Caller    string `json:"caller"`
	ReceiptID string `json:"receipt_id"`
	Until     string `json:"until"`
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
}

type statusReviewers struct {
	File  string   `json:"file"`
	IDs   []string `json:"ids"`
	Error string   `json:"error,omitempty"`
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
	o.dir = dirFlag(flags)
	o.reviewers = reviewersFlag(flags)
	o.guardConfig = guardConfigFlag(flags)
	o.templatesDir = new(string)
	templatesDirFlagVar(flags, o.templatesDir)
	o.asJSON = jsonFlag(flags)
	o.store = storeFlag(flags)
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		return runStatus(ctx, env.stdout, env.stderr, o)
	}
}

// statusFlags are status's flags.
type statusFlags struct {
	dir, reviewers, guardConfig, templatesDir, store *string
	asJSON                                           *bool
}

func runStatus(ctx context.Context, stdout, stderr io.Writer, o statusFlags) error {
	dir, reviewers, guardConfig, templatesDir, asJSON, storeFlag := o.dir, o.reviewers, o.guardConfig, o.templatesDir, o.asJSON, o.store
	policyPath, policySource := *guardConfig, "--guard-config "+*guardConfig
	if policyPath == "" {
		beside := filepath.Join(filepath.Dir(filepath.Clean(*dir)), "haia-guard.config.json")
		if _, err := os.Stat(beside); err == nil {
			policyPath, policySource = beside, beside+" (beside the Trace root)"
		}
	}
	// The policy in effect is the one the server recorded in the store;
	// a file on disk is reported against it, never taken in its place.
	g, code := openCLIGuard(ctx, "status", *dir, *storeFlag, *reviewers, "", stderr)
	if g == nil {
		return exitCode(code)
	}
	defer g.Close()
	rep := statusReport{Root: g.root.Path(), Store: g.store.Describe(), GeneratedAt: time.Now().UTC().Format(time.RFC3339),
		Problems: []string{}, OpenPayments: []statusOpen{}, Chains: []statusChain{}, Unreadable: []statusNotFound{}}
	progress := newProgress(stderr, "status")
	defer progress.done()

	// The policy in effect: as the server recorded it, else the file.
	builtinSum := func() string {
		def, _ := json.Marshal(guard.DefaultConfig())
		sum := sha256.Sum256(def)
		return hex.EncodeToString(sum[:])
	}
	if g.policyKnown {
		rep.Policy = statusPolicy{Source: g.policy.Source + ", recorded in the store by the server", SHA256: g.policy.Hash}
		if g.policy.Hash == "" {
			rep.Policy.SHA256 = builtinSum()
		}
		if policyPath != "" {
			data, err := os.ReadFile(policyPath)
			sum := sha256.Sum256(data)
			if err != nil || hex.EncodeToString(sum[:]) != g.policy.Hash {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s is not the policy the server runs with (%s): restart or SIGHUP the server to put it in force", policySource, rep.Policy.Source))
			}
		}
	} else if policyPath == "" {
		def, _ := json.Marshal(guard.DefaultConfig())
		sum := sha256.Sum256(def)
		rep.Policy = statusPolicy{Source: "built-in defaults (no --guard-config and no haia-guard.config.json beside the Trace root); sha256 of their JSON form", SHA256: hex.EncodeToString(sum[:])}
	} else {
		pol, err := guard.LoadConfig(policyPath)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp status: %v\n", err)
			return exitCode(exitFail)
		}
		g.policy = pol
		data, err := os.ReadFile(policyPath)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp status: %v\n", err)
			return exitCode(exitFail)
		}
		sum := sha256.Sum256(data)
		rep.Policy = statusPolicy{Source: policySource, SHA256: hex.EncodeToString(sum[:])}
	}
	rep.Templates = g.policy.HistoryTemplates

	// Runs and open payments, read as the server reads them.
	progress.step("reading the runs under events/")
	if err := statusRunsOf(ctx, g, *templatesDir, &rep, func(done, total int) {
		progress.step(fmt.Sprintf("reading the runs under events/ (%d of %d)", done, total))
	}); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp status: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}

	// Pending reviews by age.
	progress.step("reading the review log")
	log := reviewlog.OpenStore(g.store, reviewlog.Options{ReviewTTL: g.policy.ReviewTTL, Reviewers: g.loadReviewers})
	pending, err := log.List(ctx, false)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp status: the review log: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	rep.Reviews = statusPending(pending, time.Now())

	// No reservation is kept by this build.
	// What allows hold now, checked against the decision chain.
	rv, err := log.Reservations(ctx, g.policy.ReservationTTL)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp status: the reservations: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	rep.Reservations = statusReserved{Held: len(rv.Held), Items: []statusReservation{}, Problems: []string{}}
	for _, x := range rv.Held {
		to := x.PayTo
		if x.Host != "" {
			to = x.Host
		}
		amount := x.Atomic + " atomic units of " + x.Asset
		if a, ok := g.policy.Assets.Lookup(x.Asset); ok {
			if n, ok := new(big.Int).SetString(x.Atomic, 10); ok {
				amount = guard.FormatAmount(n, a.Decimals) + " " + a.Symbol
			}
		}
		until := "until the Trace shows it"
		if x.Until != "" {
			until += " or " + x.Until
		}
		rep.Reservations.Items = append(rep.Reservations.Items, statusReservation{To: to, Amount: amount, Caller: x.Caller, ReceiptID: x.ReceiptID, Until: until})
	}
	for _, p := range rv.Problems {
		rep.Reservations.Problems = append(rep.Reservations.Problems, p)
		rep.Problems = append(rep.Problems, "reservations unverified: "+p)
	}

	// Chains and whether they verify against the store's keyring.
	err = g.store.View(ctx, func(r reviewlog.Reader) error {
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
	rep.Proxy, proxyProblems = proxyStatusOf(g.root)
	rep.Problems = append(rep.Problems, proxyProblems...)

	// The trusted reviewers.
	rep.Reviewers.File = g.reviewersPath
	rep.Reviewers.IDs = []string{}
	if trusted, err := g.loadReviewers(); err != nil {
		rep.Reviewers.Error = err.Error()
		if !errors.Is(err, fs.ErrNotExist) {
			rep.Problems = append(rep.Problems, "the trusted reviewers file cannot be read: "+err.Error())
		}
	} else {
		for id := range trusted {
			rep.Reviewers.IDs = append(rep.Reviewers.IDs, id)
		}
		sort.Strings(rep.Reviewers.IDs)
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

// statusRunsOf reads every run under the policy's history templates the
// way the server does (its own index) and fills the runs, the unreadable
// runs and the open payments.
func statusRunsOf(ctx context.Context, g *cliGuard, templatesDir string, rep *statusReport, progress func(done, total int)) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cat, closeCat, err := openCatalog(g.root, templatesDir, quiet, progress)
	if err != nil {
		return err
	}
	defer closeCat()
	seen := map[string]bool{}
	open := map[string]*statusOpen{}
	sums := map[string]map[string]*big.Int{}
	runs := map[string]bool{}
	for _, name := range g.policy.HistoryTemplates {
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
				o = &statusOpen{Counterparty: who}
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
			amount := sums[who][asset].String() + " atomic units of " + asset
			if a, ok := g.policy.Assets.Lookup(asset); ok {
				amount = guard.FormatAmount(sums[who][asset], a.Decimals) + " " + a.Symbol
			}
			o.Amounts = append(o.Amounts, amount)
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
	}
	return out
}

func printStatus(w io.Writer, rep statusReport) {
	s := termsafe.String
	fmt.Fprintf(w, "Trace root  %s\nstore       %s\n\n", s(rep.Root), s(rep.Store))
	fmt.Fprintf(w, "runs        %d runs, %d operations (%d full, %d partial) under %s\n", rep.Runs.Runs, rep.Runs.Operations, rep.Runs.Full, rep.Runs.Partial, strings.Join(rep.Templates, ", "))
	for _, u := range rep.Unreadable {
		fmt.Fprintf(w, "            run %s cannot be read: %s\n", s(u.RunID), s(u.Error))
	}
	if len(rep.OpenPayments) == 0 {
		fmt.Fprintf(w, "open        no open payment\n")
	} else {
		fmt.Fprintf(w, "open        payments whose outcome is not confirmed, by counterparty:\n")
		for _, o := range rep.OpenPayments {
			fmt.Fprintf(w, "            %-44s %d  %s\n", s(o.Counterparty), o.Operations, s(strings.Join(o.Amounts, " + ")))
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
	fmt.Fprintf(w, "reserved    %d held by allows (they count towards the limits until the Trace shows the payment)\n", rep.Reservations.Held)
	for _, x := range rep.Reservations.Items {
		fmt.Fprintf(w, "            %s to %s by %s, receipt %s, %s\n", s(x.Amount), s(x.To), s(x.Caller), s(x.ReceiptID), s(x.Until))
	}
	if len(rep.Chains) == 0 {
		fmt.Fprintf(w, "chains      none yet (no decision recorded)\n")
	}
	for i, ch := range rep.Chains {
		label := "chains     "
		if i > 0 {
			label = "           "
		}
		fmt.Fprintf(w, "%s %s  %s  %d receipts, %d segments, head %s\n", label, ch.Verdict, s(ch.ID), ch.Receipts, ch.Segments, s(ch.Head))
		if ch.Reason != "" {
			fmt.Fprintf(w, "              %s\n", s(ch.Reason))
		}
	}
	fmt.Fprintf(w, "policy      %s\n            sha256 %s\n", s(rep.Policy.Source), rep.Policy.SHA256)
	printStatusProxy(w, rep.Proxy)
	switch {
	case rep.Reviewers.Error != "":
		fmt.Fprintf(w, "reviewers   %s: %s\n", s(rep.Reviewers.File), s(rep.Reviewers.Error))
	case len(rep.Reviewers.IDs) == 0:
		fmt.Fprintf(w, "reviewers   none trusted in %s\n", s(rep.Reviewers.File))
	default:
		fmt.Fprintf(w, "reviewers   %s (%s)\n", s(strings.Join(rep.Reviewers.IDs, ", ")), s(rep.Reviewers.File))
	}
	if len(rep.Problems) > 0 {
		fmt.Fprintf(w, "\n%d problem(s):\n", len(rep.Problems))
		for _, p := range rep.Problems {
			fmt.Fprintf(w, "  - %s\n", s(p))
		}
	}
}
