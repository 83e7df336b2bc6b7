package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Exit codes of `mandate` beyond exitOK, exitFail and exitUsage (as
// review's where they mean the same).
const (
	mandateExitUnknown   = 3 // no mandate with that id
	mandateExitDone      = 4 // revoked already, or signed by this reviewer already
	mandateExitLock      = 5 // the lock was not obtained in time
	mandateExitUntrusted = 6 // the reviewer key is not trusted, or not granted the tenant
	mandateExitRecords   = 8 // the mandate records do not verify; nothing was written
	mandateExitRefused   = 9 // an AP2 mandate asks for a constraint the guard cannot honour
)

const mandateDetails = `A mandate is a standing approval: a reviewer signs, with their own key, that payments to
one payee (--payee, and --host when set) by one caller (--agent, when set) may be allowed
without a review, each up to --max-amount, all together up to --budget and, with --count,
that many times, until --expires. The guard then answers allow, with a "mandate" reason
saying what is left, to a question that only reviewAbove would send to review and that fits
it; a mandate never lifts a block, a list, a limit, velocity, a duplicate, an open payment,
a history that cannot be read or attributed, or a rejection's hold. Each use is charged to the
mandate in the spend ledger, as to every limit.

The reviewer's key must be in the trusted reviewers file (and, for a tenant, granted it),
as for review approve; otherwise nothing is written. A mandate up to an amount past a quorum
threshold of the policy needs as many reviewers: each other one runs mandate sign ID. A
revocation (mandate revoke ID) holds from the next question on, on every replica.

Amounts are in the policy's default asset (USDC unless the policy says otherwise).
import reads an AP2 open payment mandate (vct mandate.payment.open.1) and signs what it can
honour as the reviewer's own mandate; a constraint it cannot honour is refused by name.

exit codes: 0 done, 1 error, 2 usage, 3 unknown mandate id, 4 revoked already or signed by
this reviewer already, 5 lock not obtained, 6 reviewer key not trusted (or not granted the
tenant), 8 the mandate records do not verify (nothing was written), 9 an AP2 constraint the
guard cannot honour (nothing was written)
`

// mandateFlags are the mandate subcommands' flags; nil where the
// subcommand does not take one.
type mandateFlags struct {
	stack                               stackFlags
	asJSON                              *bool
	lockWait                            *time.Duration
	reviewerKey, payee, host, maxAmount *string
	budget, agent, note                 *string
	count                               *int
	expires                             *time.Duration
}

func defineMandate(verb string) func(fs *flag.FlagSet) runFunc {
	return func(fs *flag.FlagSet) runFunc {
		var o mandateFlags
		o.stack.register(fs, false)
		o.stack.tenantScope = true
		o.asJSON = jsonFlag(fs)
		o.lockWait = lockWaitFlag(fs)
		guardConfigFlagVar(fs, &o.stack.guardConfig)
		fs.StringVar(&o.stack.tenant, "tenant", "", "the tenant whose guard honours the mandate: with --tenants-dir its root is DIR/<tenant> (only the reviewers granted it sign); otherwise the server's --tenant (default: the tenant the server records for the root, else haia-trace-mcp)")
		switch verb {
		case "grant":
			o.payee = fs.String("payee", "", "the payee `ADDRESS` (0x and 40 hex digits) the mandate pays (required)")
			o.host = fs.String("host", "", "the only `HOST` the payee is paid for under it (default: any)")
			o.maxAmount = fs.String("max-amount", "", "the most one payment may be, in the policy's default asset (required)")
			o.budget = fs.String("budget", "", "the most all its payments together may be (required)")
			o.count = fs.Int("count", 0, "how many payments it allows (default: as many as the budget)")
			o.expires = fs.Duration("expires", 0, "how long from now it may be used, such as 24h or 720h (required)")
			o.agent = fs.String("agent", "", "the only caller `ID` it allows (default: any caller of the tenant)")
			o.note = fs.String("note", "", "why (kept with the mandate)")
		}
		if verb == "grant" || verb == "revoke" || verb == "sign" || verb == "import" {
			o.reviewerKey = reviewerKeyFlag(fs)
		}
		return func(ctx context.Context, env *cmdEnv, pos []string) error {
			return runMandate(ctx, env.stdout, env.stderr, verb, pos, o)
		}
	}
}

// mandateEnv is what every mandate subcommand works with.
type mandateEnv struct {
	st     *app.Stack
	pol    *guard.Config
	tenant string
	stdout io.Writer
	stderr io.Writer
	verb   string
}

func (m mandateEnv) fail(err error) error {
	fmt.Fprintf(m.stderr, "haia-trace-mcp mandate %s: %s\n", m.verb, termsafe.String(err.Error()))
	switch {
	case errors.Is(err, engine.ErrUnknownMandate):
		return exitCode(mandateExitUnknown)
	case errors.Is(err, engine.ErrMandateDone):
		return exitCode(mandateExitDone)
	case errors.Is(err, reviewlog.ErrLockTimeout):
		return exitCode(mandateExitLock)
	case errors.Is(err, reviewlog.ErrUntrusted):
		return exitCode(mandateExitUntrusted)
	case errors.Is(err, engine.ErrMandateRecords):
		return exitCode(mandateExitRecords)
	case errors.Is(err, errAP2Refused):
		return exitCode(mandateExitRefused)
	case errors.Is(err, reviewlog.ErrBadID), errors.Is(err, reviewlog.ErrBadInput):
		return exitCode(exitUsage)
	}
	return exitCode(exitFail)
}

func runMandate(ctx context.Context, stdout, stderr io.Writer, verb string, pos []string, o mandateFlags) error {
	if verb == "grant" {
		if err := checkGrantFlags(o); err != nil {
			return err
		}
	}
	st, err := o.stack.open(ctx, func(c *app.Config) { c.LockWait = *o.lockWait })
	if err != nil {
		return err
	}
	defer st.Close()
	tenant := o.stack.tenant
	if tenant == "" {
		tenant = st.Tenant()
	}
	if tenant == "" {
		tenant = engine.DefaultTenant
	}
	env := mandateEnv{st: st, pol: st.Policy(), tenant: tenant, stdout: stdout, stderr: stderr, verb: verb}
	switch verb {
	case "list":
		return env.list(ctx, *o.asJSON)
	case "show":
		return env.show(ctx, pos[0], *o.asJSON)
	}
	if !st.PolicyKnown() {
		fmt.Fprintf(stderr, "haia-trace-mcp mandate %s: cannot sign: %s\n", verb, errPolicyUnknown)
		return exitCode(exitFail)
	}
	signer, err := env.signer(*o.reviewerKey)
	if err != nil {
		return err
	}
	switch verb {
	case "grant":
		g, err := env.grantTerms(o)
		if err != nil {
			return err
		}
		return env.grant(ctx, signer, g, *o.asJSON)
	case "import":
		g, err := readAP2File(pos[0], env.pol, time.Now())
		if err != nil {
			return env.fail(err)
		}
		return env.grant(ctx, signer, g, *o.asJSON)
	case "revoke":
		m, err := signer.Revoke(ctx, pos[0])
		if err != nil {
			return env.fail(err)
		}
		if *o.asJSON {
			return exitCode(reviewWriteJSON(stdout, stderr, env.shown(m, nil)))
		}
		fmt.Fprintf(stdout, "mandate %s revoked by %s: nothing is allowed under it from the next question on\n", m.Grant.ID, signer.By)
		return nil
	case "sign":
		m, err := signer.Sign(ctx, pos[0])
		if err != nil {
			return env.fail(err)
		}
		if *o.asJSON {
			return exitCode(reviewWriteJSON(stdout, stderr, env.shown(m, nil)))
		}
		fmt.Fprintf(stdout, "mandate %s signed by %s: %s\n", m.Grant.ID, signer.By, signersText(m))
		return nil
	}
	return usageErrorf("unknown mandate command %q", verb)
}

func checkGrantFlags(o mandateFlags) error {
	switch {
	case *o.payee == "":
		return usageErrorf("--payee is required: the payee address the mandate pays")
	case *o.maxAmount == "":
		return usageErrorf("--max-amount is required: the most one payment may be")
	case *o.budget == "":
		return usageErrorf("--budget is required: the most all its payments together may be")
	case *o.expires <= 0:
		return usageErrorf("--expires is required and must be positive: how long it may be used (24h, 720h)")
	case *o.count < 0:
		return usageErrorf("--count must not be negative")
	}
	return nil
}

// signer loads the reviewer's key and says who the trusted reviewers
// file knows it as; nothing is written when it is not trusted.
func (m mandateEnv) signer(keyFlag string) (engine.MandateSigner, error) {
	keyPath := keyFlag
	if keyPath == "" {
		var err error
		if keyPath, err = defaultKeyPath("--reviewer-key", "reviewer-key.pem"); err != nil {
			fmt.Fprintf(m.stderr, "haia-trace-mcp mandate %s: %v; pass --reviewer-key\n", m.verb, err)
			return engine.MandateSigner{}, exitCode(exitFail)
		}
	}
	key, err := noa.LoadKeyFile(keyPath)
	if err != nil {
		fmt.Fprintf(m.stderr, "haia-trace-mcp mandate %s: --reviewer-key: %v (create one with: haia-trace-mcp reviewer init --id YOUR-ID)\n", m.verb, err)
		return engine.MandateSigner{}, exitCode(exitFail)
	}
	trusted, err := reviewlog.LoadReviewers(m.st.ReviewersPath())
	if err != nil {
		fmt.Fprintf(m.stderr, "haia-trace-mcp mandate %s: %v (haia-trace-mcp reviewer init adds a reviewer to it)\n", m.verb, err)
		return engine.MandateSigner{}, exitCode(mandateExitUntrusted)
	}
	ks := noa.NewKeySigner(key)
	id, ok := trusted.IDOf(ks.PublicKey())
	if !ok {
		fmt.Fprintf(m.stderr, "haia-trace-mcp mandate %s: the key %s (kid %s) is not in the trusted reviewers file %s; nothing was written\n", m.verb, keyPath, ks.KeyID(), m.st.ReviewersPath())
		return engine.MandateSigner{}, exitCode(mandateExitUntrusted)
	}
	return engine.MandateSigner{Log: m.st.Log(), Key: key, By: id, Tenant: m.tenant}, nil
}

// grantTerms reads grant's flags into a mandate's terms.
func (m mandateEnv) grantTerms(o mandateFlags) (mandate.Record, error) {
	payee, err := guard.CanonicalAddress(*o.payee)
	if err != nil {
		return mandate.Record{}, usageErrorf("--payee %q: %v", termsafe.String(*o.payee), err)
	}
	g := mandate.Record{PayTo: payee, Agent: *o.agent, Note: *o.note, Count: *o.count, Asset: m.pol.DefaultAsset.Key,
		Expires: mandate.FormatTime(time.Now().Add(*o.expires))}
	if *o.host != "" {
		if g.Host, err = guard.CanonicalHost(*o.host); err != nil {
			return mandate.Record{}, usageErrorf("--host %q: %v", termsafe.String(*o.host), err)
		}
	}
	for _, a := range []struct {
		flag, text string
		out        *string
	}{{"--max-amount", *o.maxAmount, &g.MaxAtomic}, {"--budget", *o.budget, &g.BudgetAtomic}} {
		v, err := m.amount(a.text)
		if err != nil {
			return mandate.Record{}, usageErrorf("%s %q: %v", a.flag, termsafe.String(a.text), err)
		}
		*a.out = v.String()
	}
	return g, nil
}

// amount reads a display amount of the policy's default asset.
func (m mandateEnv) amount(s string) (*big.Int, error) {
	if err := guard.CheckAmountSyntax(s); err != nil {
		return nil, fmt.Errorf("a plain decimal in %s such as 1.50", m.pol.DefaultAsset.Symbol)
	}
	a, err := guard.ParseAmount(s, m.pol.DefaultAsset.Decimals)
	if err != nil {
		return nil, err
	}
	if a.Sign() <= 0 {
		return nil, errors.New("must be more than zero")
	}
	return a, nil
}

// grant signs g, with as many approvals as the policy's quorum asks of a
// payment of its most, and prints it.
func (m mandateEnv) grant(ctx context.Context, s engine.MandateSigner, g mandate.Record, asJSON bool) error {
	if need := m.pol.ApprovalsFor(g.Max(), g.Asset == m.pol.DefaultAsset.Key); need > 1 {
		g.Approvals = need
	}
	rec, err := s.Grant(ctx, g)
	if err != nil {
		return m.fail(err)
	}
	mm := &mandate.Mandate{Grant: rec, Signers: []string{s.By}}
	if asJSON {
		return exitCode(reviewWriteJSON(m.stdout, m.stderr, m.shown(mm, nil)))
	}
	fmt.Fprintf(m.stdout, "mandate %s granted by %s: %s\n", rec.ID, s.By, m.termsText(&rec))
	if !mm.Complete() {
		fmt.Fprintf(m.stdout, "it needs %s from other trusted reviewers before it can be used (mandate sign %s); the policy's quorum asks %d for %s\n",
			plural(mm.Needs()-1, "more signature", "more signatures"), rec.ID, mm.Needs(), m.money(rec.Max()))
	}
	if rec.Reference != "" {
		fmt.Fprintf(m.stdout, "AP2 payment reference: %s\n", termsafe.String(rec.Reference))
	}
	return nil
}

func (m mandateEnv) money(a *big.Int) string {
	return guard.FormatDisplay(a, m.pol.DefaultAsset.Decimals) + " " + m.pol.DefaultAsset.Symbol
}

// assetMoney writes atomic units of asset key as a person reads them.
func (m mandateEnv) assetMoney(a *big.Int, key string) string {
	if as, ok := m.pol.Assets.Lookup(key); ok {
		return guard.FormatDisplay(a, as.Decimals) + " " + as.Symbol
	}
	return a.String() + " atomic units of " + key
}

func (m mandateEnv) termsText(g *mandate.Record) string {
	s := fmt.Sprintf("up to %s a payment to %s", m.assetMoney(g.Max(), g.Asset), g.PayTo)
	if g.Host != "" {
		s += " for " + g.Host
	}
	if g.Agent != "" {
		s += " by " + termsafe.String(g.Agent)
	} else {
		s += " by any caller"
	}
	s += ", " + m.assetMoney(g.Budget(), g.Asset) + " in all"
	if g.Count > 0 {
		s += " in at most " + plural(g.Count, "payment", "payments")
	}
	if g.NotBefore != "" {
		s += ", from " + g.NotBefore
	}
	return s + ", until " + g.Expires
}

func signersText(m *mandate.Mandate) string {
	return fmt.Sprintf("%d of %d signatures (%s)", len(m.Signers), m.Needs(), strings.Join(m.Signers, ", "))
}

// mandateShown is a mandate as list and show print it.
type mandateShown struct {
	mandate.Record
	Signers []string `json:"signers"`
	Needs   int      `json:"signatures_needed"`
	State   string   `json:"state"`
	// Used and Left are what the spend ledger charged and what remains
	// (nil where the ledger could not be read); Payments/PaymentsLeft
	// the same in payments (PaymentsLeft -1: no count).
	UsedAtomic   string `json:"used_atomic,omitempty"`
	LeftAtomic   string `json:"left_atomic,omitempty"`
	Payments     *int   `json:"payments,omitempty"`
	PaymentsLeft *int   `json:"payments_left,omitempty"`
	RevokedBy    string `json:"revoked_by,omitempty"`
	RevokedAt    string `json:"revoked_at,omitempty"`
}

func (m mandateEnv) shown(mm *mandate.Mandate, spent *mandate.Spent) mandateShown {
	out := mandateShown{Record: mm.Grant, Signers: mm.Signers, Needs: mm.Needs(), State: stateOf(mm, time.Now())}
	if mm.Revoked != nil {
		out.RevokedBy, out.RevokedAt = mm.Revoked.By, mm.Revoked.At
	}
	if spent != nil {
		left, n := mm.Left(*spent)
		out.UsedAtomic, out.LeftAtomic = spent.Atomic.String(), left.String()
		c := spent.Count
		out.Payments, out.PaymentsLeft = &c, &n
	}
	return out
}

func stateOf(m *mandate.Mandate, now time.Time) string {
	exp, _ := mandate.ParseTime(m.Grant.Expires)
	switch {
	case m.Revoked != nil:
		return "revoked"
	case !now.Before(exp):
		return "expired"
	case !m.Complete():
		return "unsigned"
	}
	if nb, err := mandate.ParseTime(m.Grant.NotBefore); err == nil && now.Before(nb) {
		return "not yet"
	}
	return "live"
}

// report reads the mandates and what the spend ledger charged to each.
func (m mandateEnv) report(ctx context.Context) (mandate.Set, map[string]mandate.Spent, string, error) {
	set, err := engine.ReadMandates(ctx, m.st.Log(), m.tenant)
	if err != nil {
		return set, nil, "", err
	}
	raws, err := readLedger(ctx, m.st)
	if err != nil {
		return set, nil, "", err
	}
	key := ledgerKey(raws)
	note := ""
	if key == nil {
		note = "the server's params key is not at hand here, so what each mandate used is as the ledger's lines say, their seals unchecked"
	}
	rep := ledger.Audit(raws, key, m.tenant, nil)
	spent := map[string]mandate.Spent{}
	for _, en := range rep.Mandated {
		s := spent[en.Mandate]
		if s.Atomic == nil {
			s.Atomic = new(big.Int)
		}
		a, _ := new(big.Int).SetString(en.Atomic, 10)
		s.Count++
		s.Atomic.Add(s.Atomic, a)
		spent[en.Mandate] = s
	}
	return set, spent, note, nil
}

func (m mandateEnv) list(ctx context.Context, asJSON bool) error {
	set, spent, note, err := m.report(ctx)
	if err != nil {
		return m.fail(err)
	}
	var out []mandateShown
	for _, id := range set.Order {
		s := spentOf(spent, id)
		out = append(out, m.shown(set.Mandates[id], &s))
	}
	if asJSON {
		if out == nil {
			out = []mandateShown{}
		}
		return exitCode(reviewWriteJSON(m.stdout, m.stderr, struct {
			Mandates []mandateShown `json:"mandates"`
			Findings []string       `json:"findings,omitempty"`
			Note     string         `json:"note,omitempty"`
		}{out, set.Findings, note}))
	}
	m.notes(set, note)
	if len(out) == 0 {
		fmt.Fprintln(m.stdout, "no mandates")
		return nil
	}
	tw := tabwriter.NewWriter(m.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tPAYEE\tMAX\tUSED\tLEFT\tEXPIRES\tSIGNED BY")
	for _, s := range out {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.State, s.PayTo, m.assetMoney(s.Max(), s.Asset), m.usedText(s), m.leftText(s), s.Expires, strings.Join(s.Signers, ", "))
	}
	return tw.Flush()
}

func spentOf(spent map[string]mandate.Spent, id string) mandate.Spent {
	s, ok := spent[id]
	if !ok {
		return mandate.Spent{Atomic: new(big.Int)}
	}
	return s
}

func (m mandateEnv) usedText(s mandateShown) string {
	used, _ := new(big.Int).SetString(s.UsedAtomic, 10)
	return m.assetMoney(used, s.Asset) + " in " + plural(*s.Payments, "payment", "payments")
}

func (m mandateEnv) leftText(s mandateShown) string {
	left, _ := new(big.Int).SetString(s.LeftAtomic, 10)
	if *s.PaymentsLeft < 0 {
		return m.assetMoney(left, s.Asset)
	}
	return m.assetMoney(left, s.Asset) + " and " + plural(*s.PaymentsLeft, "payment", "payments")
}

func (m mandateEnv) notes(set mandate.Set, note string) {
	for _, f := range set.Findings {
		fmt.Fprintf(m.stderr, "haia-trace-mcp mandate %s: DOES NOT VERIFY: %s; the guard honours no mandate of a payee while this stands (haia-trace-mcp audit)\n", m.verb, termsafe.String(f))
	}
	if note != "" {
		fmt.Fprintf(m.stderr, "haia-trace-mcp mandate %s: note: %s\n", m.verb, note)
	}
}

func (m mandateEnv) show(ctx context.Context, id string, asJSON bool) error {
	if err := mandate.CheckID(id); err != nil {
		return usageErrorf("%v", err)
	}
	set, spent, note, err := m.report(ctx)
	if err != nil {
		return m.fail(err)
	}
	mm := set.Mandates[id]
	if mm == nil {
		return m.fail(fmt.Errorf("%w: %s", engine.ErrUnknownMandate, id))
	}
	s := spentOf(spent, id)
	sh := m.shown(mm, &s)
	if asJSON {
		return exitCode(reviewWriteJSON(m.stdout, m.stderr, sh))
	}
	m.notes(set, note)
	w := m.stdout
	fmt.Fprintf(w, "mandate      %s\n", sh.ID)
	fmt.Fprintf(w, "state        %s\n", sh.State)
	fmt.Fprintf(w, "tenant       %s\n", termsafe.String(sh.Tenant))
	fmt.Fprintf(w, "terms        %s\n", m.termsText(&mm.Grant))
	fmt.Fprintf(w, "used         %s\n", m.usedText(sh))
	fmt.Fprintf(w, "left         %s\n", m.leftText(sh))
	fmt.Fprintf(w, "signed by    %s (granted %s)\n", signersText(mm), sh.At)
	if sh.RevokedBy != "" {
		fmt.Fprintf(w, "revoked      by %s at %s\n", sh.RevokedBy, sh.RevokedAt)
	}
	if sh.Note != "" {
		fmt.Fprintf(w, "note         %s\n", termsafe.String(sh.Note))
	}
	if sh.Reference != "" {
		fmt.Fprintf(w, "reference    %s (%s)\n", termsafe.String(sh.Reference), termsafe.String(sh.Source))
	}
	fmt.Fprintf(w, "terms hash   %s\n", mm.TermsHash)
	return nil
}

// readLedger reads the whole spend ledger of the stack's store.
func readLedger(ctx context.Context, st *app.Stack) ([]ledger.Raw, error) {
	var raws []ledger.Raw
	err := st.Store().View(ctx, func(r reviewlog.Reader) error {
		var err error
		raws, err = r.Ledger().Since(ctx, nil)
		return err
	})
	return raws, err
}

// ledgerKey is the params key, among those found here, that sealed the
// ledger (nil: none).
func ledgerKey(raws []ledger.Raw) []byte {
	keys, err := foundParamsKeys()
	if err != nil {
		return nil
	}
	for _, k := range keys {
		if ledger.Sealed(raws, k) {
			return k
		}
	}
	return nil
}

// errAP2Refused: see mandate.ErrAP2Refused.
var errAP2Refused = mandate.ErrAP2Refused

// readAP2File reads an AP2 open payment mandate's terms, in the policy's
// default asset.
func readAP2File(path string, pol *guard.Config, now time.Time) (mandate.Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return mandate.Record{}, fmt.Errorf("read the AP2 mandate: %w", err)
	}
	return mandate.ParseAP2(data, pol.DefaultAsset, now)
}
