package console

import (
	"context"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// What a reviewer reads: each review as the question it asks — the
// amount with its symbol, to whom, for what, asked by whom and how long
// ago — and each reason in words with the policy setting that fired it.
// The identifiers (the review's UUID, the asset's CAIP id, the full
// address, the terms hash) stay on the page, below, as the server signed
// them.

// questionView is one review as a question.
type questionView struct {
	ID string
	// Amount is the amount with its symbol ("0.25 USDC"), or with the
	// asset's id when the policy does not name it.
	Amount string
	// Payee is the address paid ("" when the question named a host only),
	// PayeeShort its first and last characters; Host the host the question
	// named ("" when none).
	Payee, PayeeShort, Host string
	// PayeeName is the policy's name of Payee ("" when none).
	PayeeName string
	// Headline is the question in words, without its question mark:
	// "Pay 0.25 USDC to 0xb0b0…0002".
	Headline string
	Caller   string
	Resource string
	Opened   timeView
	// Rules are the rules that asked, in words.
	Rules []ruleView
	// The state.
	Status, DecidedBy, DecidedWith string
	Decided, Used                  timeView
	Tampered                       bool
	// Quorum says how far a review that needs several reviewers'
	// approvals is: "1 of 2 approvals (alice)" ("" when one suffices).
	Quorum string
}

// timeView is an instant as a person reads it: how long ago (server-side,
// refreshed by the page's script), the UTC instant (on hover, and as the
// text where no script runs) and the machine form the script reads to
// show the reviewer's local time.
type timeView struct {
	ISO, UTC, Age string
}

// ruleView is one rule in words and the policy setting behind it ("" when
// no setting turns it on or off).
type ruleView struct {
	ID, Title, Setting string
}

func (t timeView) Set() bool { return t.ISO != "" }

// newTime reads an RFC 3339 instant of the log; the zero timeView when it
// cannot be read.
func newTime(s string, now time.Time) timeView {
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return timeView{}
	}
	at = at.UTC()
	return timeView{ISO: at.Format(time.RFC3339Nano), UTC: at.Format("2006-01-02 15:04:05") + " UTC", Age: age(at, now)}
}

// age says how long before now at was ("just now", "1 minute ago", "3
// hours ago", "2 days ago"); a time ahead of now reads "in …". The page's
// script words it the same way.
func age(at, now time.Time) string {
	d := now.Sub(at)
	future := d < 0
	if future {
		d = -d
	}
	var s string
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		s = plural(int(d/time.Minute), "minute", "minutes")
	case d < 48*time.Hour:
		s = plural(int(d/time.Hour), "hour", "hours")
	default:
		s = plural(int(d/(24*time.Hour)), "day", "days")
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// shortAddress is an address's first six and last four characters
// ("0xb0b0…0002"); anything shorter than 14 characters as it is.
func shortAddress(a string) string {
	if len(a) < 14 {
		return a
	}
	return a[:6] + "…" + a[len(a)-4:]
}

// isAddress reports whether s is a 0x address (the canonical payee form).
func isAddress(s string) bool {
	if len(s) != 42 || !strings.HasPrefix(s, "0x") {
		return false
	}
	for _, r := range s[2:] {
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			return false
		}
	}
	return true
}

// symbol is the asset's symbol where the policy names it ("" when not).
func (c *Console) symbol(asset string) string {
	if sym, _, ok := c.cfg.Assets(asset); ok && sym != "" {
		return sym
	}
	return c.cfg.AssetSymbol(asset)
}

// amountText is a decimal amount of asset as the CLI prints it: with the
// symbol, at least two decimals ("0.40 USDC"); of an asset the policy does
// not name, as given with the asset's id.
func (c *Console) amountText(amount, asset string) string {
	sym := c.symbol(asset)
	if sym == "" {
		return amount + " of " + asset
	}
	if _, dec, ok := c.cfg.Assets(asset); ok {
		if n, err := guard.ParseAmount(amount, dec); err == nil {
			return guard.FormatDisplay(n, dec) + " " + sym
		}
	}
	return amount + " " + sym
}

// question is rv as a question, at now.
func (c *Console) question(rv reviewlog.Review, now time.Time) questionView {
	q := questionView{ID: rv.ID, Caller: rv.Caller, Resource: rv.Resource, Status: rv.Status, DecidedBy: rv.DecidedBy,
		DecidedWith: rv.DecidedWith, Tampered: rv.Tampered, Quorum: reviewlog.QuorumText(rv),
		Opened: newTime(rv.CreatedAt, now), Decided: newTime(rv.DecidedAt, now), Used: newTime(rv.UsedAt, now)}
	q.Amount = c.amountText(rv.Amount, rv.Asset)
	switch {
	case isAddress(rv.Counterparty):
		q.Payee = rv.Counterparty
	case rv.Counterparty != "":
		q.Host = rv.Counterparty
		if isAddress(rv.PayTo) {
			q.Payee = rv.PayTo
		}
	}
	q.PayeeShort = shortAddress(q.Payee)
	if q.Payee != "" && c.cfg.PayeeName != nil {
		q.PayeeName = c.cfg.PayeeName(q.Payee)
	}
	to := q.PayeeShort
	if q.PayeeName != "" {
		to += " (" + q.PayeeName + ")"
	}
	if to == "" {
		to = q.Host
	} else if q.Host != "" {
		to += " at " + q.Host
	}
	q.Headline = "Pay " + q.Amount + " to " + to
	rules := reviewlog.ReviewRules(rv.Reasons)
	if rv.Terms != nil {
		rules = rv.Terms.Rules
	}
	for _, r := range rules {
		q.Rules = append(q.Rules, describeRule(r))
	}
	return q
}

// knownFor lists what the Trace knows beside the question's payee or
// host: for an address, the hosts of the operations that paid it; for a
// host, the addresses its operations paid. At most 10, sorted.
func knownFor(h guard.History, q questionView) []string {
	var out []string
	for _, set := range [][]guard.Op{h.Ops, h.Reserved} {
		for _, op := range set {
			if op.Money == nil {
				continue
			}
			var found []string
			switch {
			case q.Payee != "" && slices.Contains(op.Money.PayTos, q.Payee):
				found = op.Money.Hosts
			case q.Payee == "" && q.Host != "" && slices.Contains(op.Money.Hosts, q.Host):
				found = op.Money.PayTos
			}
			for _, f := range found {
				if f != "" && f != q.Host && !slices.Contains(out, f) {
					out = append(out, f)
				}
			}
		}
	}
	slices.Sort(out)
	if len(out) > 10 {
		out = out[:10]
	}
	return out
}

// describeRule is a rule in words, with the policy setting (the key of the
// guard policy file, docs/rules.md) that fired it.
func describeRule(rule string) ruleView {
	v := ruleView{ID: rule}
	switch rule {
	case guard.RuleDenylist:
		v.Title, v.Setting = "The payee is on the denylist", "denylist"
	case guard.RuleAllowlist:
		v.Title, v.Setting = "The payee is not on the allowlist", "allowlist"
	case guard.RuleOpenPartial:
		v.Title, v.Setting = "Earlier payments to this payee are still open", "maxOpenPartialPerCounterparty"
	case guard.RuleUnattributable:
		v.Title, v.Setting = "Payments in the Trace the guard cannot attribute", "unattributableHistory"
	case guard.RuleUnreadable:
		v.Title, v.Setting = "Part of the Trace cannot be read", "unreadableHistory"
	case guard.RuleUnknownAsset:
		v.Title, v.Setting = "An asset the policy does not know", "assets"
	case guard.RuleUnparseableAmount:
		v.Title, v.Setting = "The amount cannot be read", "defaultAsset"
	case guard.RuleAssetMismatch:
		v.Title, v.Setting = "Not the asset the limits are in", "defaultAsset"
	case guard.RulePerCounterparty:
		v.Title, v.Setting = "Over the limit for this payee", "perCounterpartyLimit"
	case guard.RuleMixedAssets:
		v.Title, v.Setting = "Payments in another asset cannot be added to a limit", "defaultAsset"
	case guard.RuleUnparseableHistory:
		v.Title, v.Setting = "Payments whose amount or time cannot be read", "perCounterpartyLimit, totalLimit"
	case guard.RuleTotalLimit:
		v.Title, v.Setting = "Over the total limit", "totalLimit"
	case guard.RuleVelocity:
		v.Title, v.Setting = "Too many payments in a short time", "velocity"
	case guard.RuleDuplicatePayment:
		v.Title, v.Setting = "This resource was already paid for", "duplicatePayment"
	case guard.RuleSignedOffer:
		v.Title, v.Setting = "The seller's signed offer is missing, differs, or is signed by a key not trusted", "requireSignedOffers, sellerKeys"
	case guard.RuleNewPayee:
		v.Title, v.Setting = "A first payment to a new payee", "reviewNewPayee"
	case guard.RuleReviewAbove:
		v.Title, v.Setting = "More than a payment may be without a review", "reviewAbove"
	case guard.RuleReservationUnverified:
		v.Title = "What earlier allows hold cannot be checked"
	case guard.RuleReserved:
		v.Title, v.Setting = "An amount held by an earlier allow", "reservationMinutes"
	case ruleCustom:
		v.Title, v.Setting = "A custom rule", "policy"
	case engine.RuleQueueFull:
		v.Title, v.Setting = "The caller holds too many pending reviews", "maxPendingReviewsPerCaller"
	default:
		v.Title = strings.ReplaceAll(rule, "_", " ")
	}
	return v
}

// ruleCustom is the rule the engine names a custom rule's answer by.
const ruleCustom = "custom_rule"

// spendView is the spend against the limits as the queue shows it.
type spendView struct {
	Rows  []spendRow
	Total []limitView
	More  int
	// Problems are the spend ledger's findings.
	Problems []string
}

// spendRow is one counterparty: its short address (the full one on
// hover), its name, and each per-counterparty limit.
type spendRow struct {
	Who, Full, Name string
	Limits          []limitView
}

// limitView is one limit in words: "0.30 USDC of 5.00 USDC in 24 hours"
// with the paid and held parts, and a bar (Percent, at most 100).
type limitView struct {
	Title, Used, Max, Window, Paid, Held string
	Percent, Bar                         int
	Over                                 bool
	Unsummed                             int
}

// limitTitles are the limits' names in words.
var limitTitles = map[string]string{
	"perCounterpartyLimit":     "Limit per payee",
	"velocity.perCounterparty": "Payments per payee",
	"totalLimit":               "Total limit",
	"velocity.total":           "Payments in all",
}

func limitOf(u engine.LimitUse) limitView {
	title := limitTitles[u.Limit]
	if title == "" {
		title = u.Limit
	}
	return limitView{Title: title, Used: u.Used, Max: u.Max, Window: u.Window, Paid: u.Paid, Held: u.Held,
		Percent: u.Percent, Bar: min(u.Percent, 100), Over: u.Percent >= 100, Unsummed: u.Unsummed}
}

// spendData fills the queue's spend panel (nothing when not configured).
func (c *Console) spendData(ctx context.Context, d *pageData) {
	if c.cfg.Spend == nil {
		return
	}
	v, err := c.cfg.Spend(ctx)
	if err != nil {
		c.cfg.Logger.Warn("console: the spend against the limits cannot be read", "err", err)
		d.SpendProblem = "The spend against the limits cannot be read now; the server's log says why."
		return
	}
	sv := &spendView{More: v.More, Problems: v.Problems}
	for _, p := range v.Counterparties {
		row := spendRow{Who: shortAddress(p.Counterparty), Full: p.Counterparty, Name: p.Name}
		for _, u := range p.Limits {
			row.Limits = append(row.Limits, limitOf(u))
		}
		sv.Rows = append(sv.Rows, row)
	}
	for _, u := range v.Total {
		sv.Total = append(sv.Total, limitOf(u))
	}
	d.Spend = sv
}

// maxFindings bounds the settlements with findings the queue page lists.
const maxFindings = 50

// findingView is one settlement whose seller's answer (or the Trace's)
// disagrees with its authorization: what a reviewer must weigh. The
// finding page shows the whole of it; the queue its first lines.
type findingView struct {
	Nonce, Short, Payee, PayeeFull, Amount, Source, At, Transaction string
	HoldKept                                                        bool
	Items                                                           []findingItem
	// Known says the authorization it settles is in the log (its
	// dossier can be built); the fields below are its.
	Known                                       bool
	Network, Payer, Resource, ReviewID          string
	DecisionReceipt, AuthorizationReceipt, Line string
	SettlementReceipt                           string
	Recorded, SignedAt                          timeView
}

// findingItem is one finding: the field it names, and what it says.
type findingItem struct{ Field, Text string }

// settlementsWithFindings reads the review log's settlements that carry a
// finding, newest first, and the authorizations of the log by nonce.
func (c *Console) settlementsWithFindings(ctx context.Context) ([]reviewlog.SettledLine, map[string]reviewlog.AuthorizedLine, error) {
	sts, err := c.cfg.Log.Settlements(ctx)
	var auths []reviewlog.AuthorizedLine
	if err == nil {
		auths, err = c.cfg.Log.Authorizations(ctx)
	}
	if err != nil {
		return nil, nil, err
	}
	byNonce := map[string]reviewlog.AuthorizedLine{}
	for _, a := range auths {
		byNonce[strings.ToLower(a.Nonce)] = a
	}
	var out []reviewlog.SettledLine
	for i := len(sts) - 1; i >= 0; i-- {
		if len(sts[i].Findings) > 0 {
			out = append(out, sts[i])
		}
	}
	return out, byNonce, nil
}

// findingsData fills the queue's list of seller findings from the review
// log's settlements and the authorizations they settle.
func (c *Console) findingsData(ctx context.Context, d *pageData) {
	if c.cfg.Log == nil {
		return
	}
	sts, byNonce, err := c.settlementsWithFindings(ctx)
	if err != nil {
		c.cfg.Logger.Warn("console: the settlements cannot be read", "err", err)
		d.FindingsProblem = "The settlements cannot be read now; the server's log says why (haia-trace-mcp status)."
		return
	}
	for _, st := range sts {
		if len(d.Findings) == maxFindings {
			d.FindingsMore++
			continue
		}
		d.Findings = append(d.Findings, c.finding(st, byNonce))
	}
	ams, err := c.cfg.Log.Ambiguities(ctx)
	if err != nil {
		c.cfg.Logger.Warn("console: the ambiguous settlements cannot be read", "err", err)
		d.FindingsProblem = "The settlements cannot be read now; the server's log says why (haia-trace-mcp status)."
		return
	}
	settled := map[string]bool{}
	if len(ams) > 0 {
		all, err := c.cfg.Log.Settlements(ctx)
		if err == nil {
			for _, s := range all {
				settled[strings.ToLower(s.Nonce)] = true
			}
		}
	}
	for i := len(ams) - 1; i >= 0; i-- {
		if len(d.Ambiguities) == maxFindings {
			d.FindingsMore++
			continue
		}
		d.Ambiguities = append(d.Ambiguities, c.ambiguity(ams[i], byNonce, settled))
	}
}

// ambiguityView is a settlement of the Trace bound to no one
// authorization: the authorizations it could be the payment of (or the
// settlements one authorization could be paid by), for a person to hand
// the right one in.
type ambiguityView struct {
	Kind, Text, Run, At string
	Line                int
	Recorded            timeView
	Authorizations      []ambiguousAuth
	Transactions        []string
}

// ambiguousAuth is one authorization an ambiguity names.
type ambiguousAuth struct {
	Nonce, Short, Amount, Payee, PayeeFull string
	// Settled: a settlement of it was recorded since.
	Settled bool
}

func (c *Console) ambiguity(am reviewlog.AmbiguityLine, byNonce map[string]reviewlog.AuthorizedLine, settled map[string]bool) ambiguityView {
	v := ambiguityView{Kind: am.Kind, Text: am.Text, Run: am.TraceRun, Line: am.TraceLine, At: am.At, Recorded: newTime(am.At, c.cfg.Now()),
		Transactions: am.Transactions}
	for _, n := range am.Nonces {
		x := ambiguousAuth{Nonce: n, Short: shortHex(n), Settled: settled[n]}
		if a, ok := byNonce[n]; ok {
			x.Payee, x.PayeeFull = shortAddress(a.To), a.To
			x.Amount = c.amountOf(a.Authorized)
		}
		v.Authorizations = append(v.Authorizations, x)
	}
	return v
}

// finding is one settlement with findings as the console shows it.
func (c *Console) finding(st reviewlog.SettledLine, byNonce map[string]reviewlog.AuthorizedLine) findingView {
	nonce := strings.ToLower(st.Nonce)
	v := findingView{Nonce: nonce, Short: shortHex(nonce), At: st.At, Transaction: st.Transaction, HoldKept: st.HoldKept,
		Source: "handed in by the agent (record_receipt)", Payer: st.Payer, SettlementReceipt: st.Receipt, Line: strconv.Itoa(st.Line),
		Recorded: newTime(st.At, c.cfg.Now())}
	if st.Source == reviewlog.SourceTrace && st.Trace != nil {
		v.Source = fmt.Sprintf("read from the Trace (run %s, operation %s, line %d)", st.Trace.Run, st.Trace.Operation, st.Trace.Line)
	}
	if a, ok := byNonce[nonce]; ok {
		v.Known = true
		v.Payee, v.PayeeFull = shortAddress(a.To), a.To
		v.Network, v.Resource, v.ReviewID, v.SignedAt = a.Network, a.Resource, a.ReviewID, newTime(a.At, c.cfg.Now())
		v.DecisionReceipt, v.AuthorizationReceipt = a.DecisionReceipt, a.Receipt
		v.Amount = c.amountOf(a.Authorized)
	}
	for _, f := range st.Findings {
		// "payer: the settlement names …" reads as its field, then the
		// rest; a finding that names no field is shown whole.
		field, rest, ok := strings.Cut(f, ": ")
		if !ok || strings.ContainsAny(field, " '\"") || len(field) > 32 {
			field, rest = "finding", f
		}
		v.Items = append(v.Items, findingItem{Field: field, Text: rest})
	}
	return v
}

// amountOf is an authorization's amount with its asset's symbol ("0.25
// USDC"), or in atomic units when the asset is not one the server knows.
func (c *Console) amountOf(a reviewlog.Authorized) string {
	if key, _, err := guard.AssetKey(a.Network, a.Token); err == nil && c.cfg.Assets != nil {
		if sym, dec, ok := c.cfg.Assets(key); ok && sym != "" {
			if n, ok := new(big.Int).SetString(a.Value, 10); ok {
				return guard.FormatDisplay(n, dec) + " " + sym
			}
		}
	}
	return a.Value + " atomic units"
}

// findingFor is the newest settlement with findings of authorization
// nonce, or ok false when the log holds none.
func (c *Console) findingFor(ctx context.Context, nonce string) (findingView, reviewlog.AuthorizedLine, bool, error) {
	sts, byNonce, err := c.settlementsWithFindings(ctx)
	if err != nil {
		return findingView{}, reviewlog.AuthorizedLine{}, false, err
	}
	nonce = strings.ToLower(nonce)
	for _, st := range sts {
		if strings.ToLower(st.Nonce) == nonce {
			return c.finding(st, byNonce), byNonce[nonce], true, nil
		}
	}
	return findingView{}, reviewlog.AuthorizedLine{}, false, nil
}

// shortHex is a long hex value cut for a line: 0x1234…abcd.
func shortHex(h string) string {
	if len(h) <= 14 {
		return h
	}
	return h[:6] + "…" + h[len(h)-4:]
}
