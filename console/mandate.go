package console

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// A reviewer approving a review may, in the same passkey gesture, grant a
// standing approval (a mandate, package mandate) for the review's payee:
// the begin request names the bounds, the console proposes the grant
// record (id, time, place after the mandate records' head, the decision's
// hash) and answers the challenge that binds the decision and the grant;
// the finish request returns the record with the assertion, and the
// decider writes both, or nothing.

// Bounds of a grant offered on the console.
const (
	// MaxMandateDuration is the longest a mandate granted here may last.
	MaxMandateDuration = 366 * 24 * time.Hour
	maxMandateCount    = 1_000_000
	// grantSkew is how far a proposed grant's time may be from the
	// finish's: the ceremony's time and a little clock drift between
	// replicas.
	grantSkew = time.Minute
	// grantSource names, in a mandate's source, the console's approvals.
	grantSource = "console approval"
)

// mandateTerms are the bounds a reviewer sets in the approval's "and
// allow this payee" part.
type mandateTerms struct {
	// MaxAmount and Budget are display amounts of the review's asset.
	MaxAmount string `json:"max_amount"`
	Budget    string `json:"budget"`
	// Count is how many payments it allows (0: as many as the budget).
	Count int `json:"count"`
	// Expires is how long it lasts, a Go duration ("168h").
	Expires string `json:"expires"`
	// Host and Agent keep it to the review's host and caller.
	Host  bool `json:"host"`
	Agent bool `json:"agent"`
}

// grantOffer is what a review lets the console offer a mandate for.
type grantOffer struct {
	Payee, PayeeShort, PayeeName, Host, Caller string
	Asset, Symbol                              string
	Decimals                                   int
	// The form's first values: the review's amount, ten payments of it,
	// a week.
	Max, Budget string
	Count       int
}

// offerFor says what mandate review rv lets a reviewer grant with its
// approval, or why none (an error the reviewer reads).
func (c *Console) offerFor(rv reviewlog.Review) (*grantOffer, error) {
	t := rv.Terms
	if t == nil {
		return nil, errors.New("the review carries no terms the server signed")
	}
	o := &grantOffer{Caller: t.Caller, Asset: t.Asset}
	switch {
	case isAddress(t.Counterparty):
		o.Payee = strings.ToLower(t.Counterparty)
	case isAddress(rv.PayTo):
		o.Payee, o.Host = strings.ToLower(rv.PayTo), t.Counterparty
	default:
		return nil, errors.New("the question names no payee address, and a mandate pays one")
	}
	o.PayeeShort = shortAddress(o.Payee)
	if c.cfg.PayeeName != nil {
		o.PayeeName = c.cfg.PayeeName(o.Payee)
	}
	sym, dec, ok := c.cfg.Assets(t.Asset)
	if !ok || sym == "" {
		return nil, fmt.Errorf("the policy does not know the asset %s, so no amount of it can be bounded", t.Asset)
	}
	o.Symbol, o.Decimals = sym, dec
	amount, ok := new(big.Int).SetString(t.AmountAtomic, 10)
	if !ok || amount.Sign() <= 0 {
		return nil, errors.New("the review's amount cannot be read")
	}
	o.Count = 10
	o.Max = guard.FormatDisplay(amount, dec)
	o.Budget = guard.FormatDisplay(new(big.Int).Mul(amount, big.NewInt(int64(o.Count))), dec)
	return o, nil
}

// approvalsFor is how many reviewers must sign a mandate up to max of
// asset under the policy's quorum.
func (c *Console) approvalsFor(max *big.Int, asset string) int {
	if c.cfg.MandateApprovals == nil {
		return 1
	}
	return max1(c.cfg.MandateApprovals(max, asset))
}

func max1(n int) int { return max(n, 1) }

// amount reads a display amount of the offer's asset, more than zero.
func (o *grantOffer) amount(name, s string) (*big.Int, error) {
	if guard.CheckAmountSyntax(s) != nil {
		return nil, fail(http.StatusBadRequest, "the mandate's %s %q is not a plain decimal in %s such as 1.50", name, clip(s), o.Symbol)
	}
	a, err := guard.ParseAmount(s, o.Decimals)
	if err != nil {
		return nil, fail(http.StatusBadRequest, "the mandate's %s %q: %v", name, clip(s), err)
	}
	if a.Sign() <= 0 {
		return nil, fail(http.StatusBadRequest, "the mandate's %s must be more than zero", name)
	}
	return a, nil
}

// proposeGrant is the grant the reviewer who signs with the decision of
// hash dh on review rv: the bounds m, after the mandate records as they
// stand now.
func (c *Console) proposeGrant(ctx context.Context, rv reviewlog.Review, who, dh string, m mandateTerms) (mandate.Record, error) {
	o, err := c.offerFor(rv)
	if err != nil {
		return mandate.Record{}, fail(http.StatusConflict, "no mandate can be granted with review %s: %v", rv.ID, err)
	}
	max, err := o.amount("most per payment", m.MaxAmount)
	if err != nil {
		return mandate.Record{}, err
	}
	budget, err := o.amount("budget", m.Budget)
	if err != nil {
		return mandate.Record{}, err
	}
	if m.Count < 0 || m.Count > maxMandateCount {
		return mandate.Record{}, fail(http.StatusBadRequest, "the mandate's count must be from 0 (as many as the budget) to %d", maxMandateCount)
	}
	d, err := time.ParseDuration(m.Expires)
	if err != nil || d <= 0 || d > MaxMandateDuration {
		return mandate.Record{}, fail(http.StatusBadRequest, "the mandate's duration %q must be a positive duration such as 24h, at most %s", clip(m.Expires), MaxMandateDuration)
	}
	tenant := c.cfg.Decider.MandateTenant()
	set, err := engine.ReadMandates(ctx, c.cfg.Log, tenant)
	if err != nil {
		return mandate.Record{}, fmt.Errorf("read the mandate records: %w", err)
	}
	if len(set.Findings) > 0 {
		return mandate.Record{}, fail(http.StatusConflict, "the mandate records do not verify (%s), so no mandate can be added; the operator runs haia-trace-mcp audit", set.Findings[0])
	}
	id, err := mandate.NewID()
	if err != nil {
		return mandate.Record{}, err
	}
	now := c.cfg.Now()
	g := mandate.Record{Kind: mandate.KindGrant, ID: id, Prev: set.Head, Tenant: tenant, PayTo: o.Payee, Asset: o.Asset,
		MaxAtomic: max.String(), BudgetAtomic: budget.String(), Count: m.Count,
		Expires: mandate.FormatTime(now.Add(d)), Source: grantSource, Reference: rv.ID, Decision: dh,
		At: mandate.FormatTime(now), By: who, KID: mandate.PasskeyKID}
	if m.Host {
		if o.Host == "" {
			return mandate.Record{}, fail(http.StatusBadRequest, "the question names no host to keep the mandate to")
		}
		g.Host = o.Host
	}
	if m.Agent {
		g.Agent = o.Caller
	}
	if need := c.approvalsFor(max, o.Asset); need > 1 {
		g.Approvals = need
	}
	if _, err := g.Digest(); err != nil {
		return mandate.Record{}, fail(http.StatusBadRequest, "the mandate: %v", err)
	}
	return g, nil
}

// checkGrant holds the grant a finish request returns to what the
// console proposes for review rv and reviewer who with decision hash dh:
// the passkey signs whatever the page sends, so the console refuses, as
// the CLI's grant would, a grant for another payee, asset, host, caller,
// tenant or reviewer, another decision, fewer signatures than the quorum
// asks, or a time that is not now.
func (c *Console) checkGrant(rv reviewlog.Review, who, dh string, g mandate.Record) error {
	o, err := c.offerFor(rv)
	if err != nil {
		return fail(http.StatusConflict, "no mandate can be granted with review %s: %v", rv.ID, err)
	}
	at, err := mandate.ParseTime(g.At)
	now := c.cfg.Now()
	bad := func(what string) error {
		return fail(http.StatusBadRequest, "the mandate is not the one this console proposed for review %s: %s; nothing was written", rv.ID, what)
	}
	switch {
	case g.Kind != mandate.KindGrant || g.Sig != "" || g.Terms != "" || g.NotBefore != "" || g.Note != "":
		return bad("not a new grant")
	case g.By != who || g.KID != mandate.PasskeyKID:
		return bad("another signer")
	case g.Tenant != c.cfg.Decider.MandateTenant():
		return bad("another tenant")
	case !strings.EqualFold(g.PayTo, o.Payee) || g.Asset != o.Asset:
		return bad("another payee or asset")
	case g.Host != "" && g.Host != o.Host:
		return bad("another host")
	case g.Agent != "" && g.Agent != o.Caller:
		return bad("another caller")
	case g.Source != grantSource || g.Reference != rv.ID || g.Decision != dh:
		return bad("another review or decision")
	case err != nil || at.Before(now.Add(-ceremonyTTL-grantSkew)) || at.After(now.Add(grantSkew)):
		return bad("its time is not now")
	}
	if err := g.Check(); err != nil {
		return bad(err.Error())
	}
	exp, _ := mandate.ParseTime(g.Expires)
	if !exp.After(at) || exp.Sub(at) > MaxMandateDuration {
		return bad("its duration is more than " + MaxMandateDuration.String())
	}
	need := c.approvalsFor(g.Max(), g.Asset)
	if max1(g.Approvals) != need {
		return bad(fmt.Sprintf("it asks %d signatures, and the policy's quorum asks %d", max1(g.Approvals), need))
	}
	return nil
}

// grantedView is a mandate granted with a review, as its page shows it.
type grantedView struct {
	ID, Terms, State, Signers string
	// More is how many more signatures it needs (0: none).
	More int
}

// grantedWith lists the mandates granted with review id's approval.
func (c *Console) grantedWith(ctx context.Context, id string) ([]grantedView, error) {
	set, err := engine.ReadMandates(ctx, c.cfg.Log, c.cfg.Decider.MandateTenant())
	if err != nil {
		return nil, err
	}
	var out []grantedView
	for _, mid := range set.Order {
		m := set.Mandates[mid]
		g := &m.Grant
		if g.Source != grantSource || g.Reference != id {
			continue
		}
		v := grantedView{ID: g.ID, Terms: c.grantText(g), Signers: strings.Join(m.Signers, ", "), More: m.Needs() - len(m.Signers)}
		exp, _ := mandate.ParseTime(g.Expires)
		switch {
		case m.Revoked != nil:
			v.State = "revoked by " + m.Revoked.By
		case !c.cfg.Now().Before(exp):
			v.State = "expired"
		case !m.Complete():
			v.State = fmt.Sprintf("signed by %d of the %d reviewers it needs", len(m.Signers), m.Needs())
		default:
			v.State = "live"
		}
		out = append(out, v)
	}
	if len(set.Findings) > 0 {
		return out, fmt.Errorf("the mandate records do not verify: %s", set.Findings[0])
	}
	return out, nil
}

func (c *Console) grantText(g *mandate.Record) string {
	money := func(a *big.Int) string {
		if sym, dec, ok := c.cfg.Assets(g.Asset); ok && sym != "" {
			return guard.FormatDisplay(a, dec) + " " + sym
		}
		return a.String() + " atomic units of " + g.Asset
	}
	s := "up to " + money(g.Max()) + " a payment to " + g.PayTo
	if g.Host != "" {
		s += " for " + g.Host
	}
	if g.Agent != "" {
		s += " by " + g.Agent
	} else {
		s += " by any caller"
	}
	s += ", " + money(g.Budget()) + " in all"
	if g.Count > 0 {
		s += " in at most " + plural(g.Count, "payment", "payments")
	}
	return s + ", until " + g.Expires
}
