package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

const policySimulateDetails = `simulate replays every question the guard recorded, in the order asked, under
the candidate policy --guard-config NEW.json: each against the Trace and the
spend ledger's holds as they stood at its time, through the server's decision
engine, and prints the decisions that would change (time, caller, payee,
amount, from → to, the rule) and a summary. It writes nothing.

A question is kept beside its signed receipt since this version, sealed with
the server's params key and bound to the receipt's paramsHash: both are
verified, and a question that does not verify is listed as unverifiable, not
replayed. Decisions signed before questions were kept are counted as
skipped. The params key is read as audit reads it (--key-file,
--params-key-file, else the server's default files).

--since 30d replays only the questions of the last 30 days (a Go duration or
a number of days, 30d); earlier ones still count in the Trace and the ledger.
--json prints one object. exit 0 done (whether or not anything would
change), 1 error, 2 usage or a bad --guard-config.
`

// definePolicySimulate is `policy simulate --guard-config NEW.json`.
func definePolicySimulate(fs *flag.FlagSet) runFunc {
	var f stackFlags
	f.register(fs, true)
	templatesDirFlagVar(fs, &f.templatesDir)
	var candidate string
	fs.StringVar(&candidate, "guard-config", "", "the candidate guard policy `FILE` to try on history (required)")
	since := fs.String("since", "", "replay only the questions asked in the last `DURATION` (30d, 12h; default: every one)")
	asJSON := jsonFlag(fs)
	var keys paramsKeyFlags
	keys.register(fs)
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		if candidate == "" {
			return usageErrorf("--guard-config NEW.json is required: the candidate policy to try on history")
		}
		var from time.Time
		if *since != "" {
			d, err := parseSince(*since)
			if err != nil {
				return usageErrorf("--since %q: %v", *since, err)
			}
			from = time.Now().Add(-d)
		}
		return runPolicySimulate(ctx, env.stdout, env.stderr, &f, candidate, from, *asJSON, &keys)
	}
}

// parseSince reads a Go duration or a whole number of days ("30d").
func parseSince(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 36500 {
			return 0, errors.New("a number of days is a whole number from 1 to 36500, such as 30d")
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, errors.New("not a positive duration (30d, 12h, 90m)")
	}
	return d, nil
}

func runPolicySimulate(ctx context.Context, stdout, stderr io.Writer, f *stackFlags, candidate string, from time.Time, asJSON bool, keys *paramsKeyFlags) error {
	st, err := f.open(ctx, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	chk := app.CheckPolicyFile(candidate, st.Templates().Current())
	if len(chk.Problems) > 0 {
		fmt.Fprintf(stderr, "haia-trace-mcp policy simulate: --guard-config %s: %s:\n", termsafe.String(candidate), count(len(chk.Problems), "problem", "problems"))
		for _, p := range chk.Problems {
			fmt.Fprintf(stderr, "  %s\n", termsafe.String(p.String()))
		}
		return exitCode(exitUsage)
	}
	if chk.Kind != app.KindGuard {
		return usageErrorf("--guard-config %s is a %s, not a guard policy: give the guard policy file that would name it (\"policy\")", candidate, chk.Kind)
	}
	pol := chk.Guard
	if f.tenant != "" {
		pol = pol.ForTenant(f.tenant)
	}
	signedAs := st.Tenant()
	if signedAs == "" {
		signedAs = "haia-trace-mcp"
	}
	key, err := simulateKey(ctx, st, keys)
	if err != nil {
		return err
	}
	sim, err := engine.Simulate(ctx, engine.SimulateConfig{Policy: pol, Rules: chk.Rules, Templates: st.Templates(), History: st.Catalog(),
		Log: st.Log(), Tenant: signedAs, ParamsKey: key, Since: from})
	if err != nil {
		return fmt.Errorf("try the policy on history: %w", err)
	}
	if asJSON {
		return policyPrint(stdout, simulateJSON{Policy: candidate, Simulation: sim})
	}
	printSimulation(stdout, candidate, sim)
	return nil
}

// simulateKey is the server's params key: the one given, else the one of
// the server's default files that seals the spend ledger (the first found
// when the ledger is empty).
func simulateKey(ctx context.Context, st *app.Stack, keys *paramsKeyFlags) ([]byte, error) {
	found, err := keys.keys()
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	if len(found) == 0 {
		return nil, usageErrorf("no params key: neither default key file of the server exists here; give the server's --key-file (or, when it signs through --signer, its --params-key-file): the kept questions and the ledger are sealed with it")
	}
	var raws []ledger.Raw
	err = st.Store().View(ctx, func(r reviewlog.Reader) error {
		var err error
		raws, err = r.Ledger().Since(ctx, nil)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(raws) == 0 {
		return found[0], nil
	}
	for _, k := range found {
		if ledger.Sealed(raws, k) {
			return k, nil
		}
	}
	return nil, usageErrorf("the spend ledger is not sealed by the params key found here: give the server's --key-file (or its --params-key-file)")
}

type simulateJSON struct {
	Policy string `json:"policy"`
	*engine.Simulation
}

// printSimulation prints the changes, one a line, then the summary.
func printSimulation(w io.Writer, file string, sim *engine.Simulation) {
	s := termsafe.String
	for _, c := range sim.Changes {
		payee := c.Counterparty
		if c.PayTo != "" {
			payee += " (pay_to " + c.PayTo + ")"
		}
		fmt.Fprintf(w, "%s  %s  %s  %s  %s → %s  %s: %s\n", c.At.UTC().Format(time.RFC3339), s(c.Caller), s(payee), s(c.Amount), c.From, c.To, s(c.Rule), s(c.Detail))
	}
	if len(sim.Changes) > 0 {
		fmt.Fprintln(w)
	}
	line := fmt.Sprintf("%s replayed under %s", count(sim.Replayed, "question", "questions"), s(file))
	switch len(sim.Changes) {
	case 0:
		line += ", none would change"
	default:
		ts := make([]string, 0, len(sim.Transitions))
		for k, n := range sim.Transitions {
			ts = append(ts, fmt.Sprintf("%d %s", n, k))
		}
		sort.Strings(ts)
		line += fmt.Sprintf(", %d would change: %s", len(sim.Changes), strings.Join(ts, ", "))
	}
	fmt.Fprintln(w, line)
	if sim.WithoutQuestion > 0 {
		fmt.Fprintf(w, "%s skipped: signed before questions were kept (or too long to keep), so no question to ask again\n", count(sim.WithoutQuestion, "decision", "decisions"))
	}
	if n := len(sim.Unverifiable); n > 0 {
		fmt.Fprintf(w, "%s not replayed, unverifiable:\n", count(n, "kept question", "kept questions"))
		for _, u := range sim.Unverifiable {
			fmt.Fprintf(w, "  %s: %s\n", s(u.Receipt), s(u.Why))
		}
	}
	if sim.Orphans > 0 {
		fmt.Fprintf(w, "%s without a receipt in any decision chain (a crash between the receipt and its question), not replayed\n", count(sim.Orphans, "kept question", "kept questions"))
	}
	for _, f := range sim.LedgerFindings {
		fmt.Fprintf(w, "spend ledger: %s\n", s(f))
	}
}
