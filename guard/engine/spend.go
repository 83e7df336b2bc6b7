package engine

import (
	"context"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
)

// LimitUse is what one limit's window holds now: what the Trace shows
// paid and what the spend ledger holds, against the limit. Amounts are in
// the policy's default asset, with at least two decimals ("1.25 USDC",
// "0.30 USDC"); a velocity limit counts
// payments instead (Paid, Held, Used and Max are then counts).
type LimitUse struct {
	// Limit is the policy key: perCounterpartyLimit, totalLimit,
	// velocity.perCounterparty or velocity.total.
	Limit  string `json:"limit"`
	Window string `json:"window"`
	Paid   string `json:"paid"`
	Held   string `json:"held"`
	Used   string `json:"used"`
	Max    string `json:"max"`
	// Percent is Used of Max, rounded down (100 or more: the next payment
	// goes to review).
	Percent int `json:"percent"`
	// Unsummed counts the paid operations in the window whose amount
	// cannot be added (another asset, an amount or time that cannot be
	// read): each sends a question to review on its own.
	Unsummed int `json:"unsummed,omitempty"`
}

// PayeeSpend is one counterparty's use of the per-counterparty limits.
type PayeeSpend struct {
	Counterparty string     `json:"counterparty"`
	Name         string     `json:"name,omitempty"`
	Limits       []LimitUse `json:"limits"`
}

// SpendView is the spend against the limits of the policy in force, per
// counterparty and in total: the figures a question's decision computes
// (guard.Decide's), with the held part read from the spend ledger's
// running totals.
type SpendView struct {
	At     string `json:"at"`
	Policy string `json:"policy"`
	// Counterparties are those paid or held in a window, and those the
	// policy names, the most used first; More says how many more there are.
	Counterparties []PayeeSpend `json:"counterparties"`
	More           int          `json:"more,omitempty"`
	Total          []LimitUse   `json:"total"`
	// Problems are the spend ledger's findings: while there are any, what
	// is held is unknown and every question answers review.
	Problems []string `json:"problems,omitempty"`
}

// maxSpendRows bounds the counterparties a SpendView lists.
const maxSpendRows = 50

// nobody stands for the counterparty of the decision the total limits are
// read from when no counterparty was paid: the total figures do not depend
// on it.
const nobody = "0x0000000000000000000000000000000000000000"

// Spend is the spend against the limits of the policy in force now (the
// tenant's; an agent with its own layer has its own limits, not shown).
func (e *Engine) Spend(ctx context.Context) (SpendView, error) {
	h, now, err := e.judgedNow(ctx, false)
	if err != nil {
		return SpendView{}, err
	}
	pol := e.Policy()
	v := SpendView{At: now.UTC().Format(time.RFC3339), Policy: pol.Name(), Counterparties: []PayeeSpend{}, Problems: h.ReservationProblems}

	// Who: paid in the longest per-counterparty window, held now, or named.
	window := pol.Limit.Window
	if vl := pol.Velocity.PerCounterparty; vl != nil {
		window = max(window, vl.Window)
	}
	from := now.Add(-window)
	who := map[string]bool{}
	for _, o := range h.Ops {
		if !o.Spent || o.Money == nil {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, o.LastEventAt); err == nil && t.Before(from) {
			continue
		}
		for _, p := range o.Money.PayTos {
			who[p] = true
		}
	}
	for _, en := range e.book.Live(now) {
		switch {
		case en.PayTo != "":
			who[en.PayTo] = true
		case en.Host != "":
			who[en.Host] = true
		}
	}
	for a := range pol.Payees {
		who[a] = true
	}

	asset := pol.DefaultAsset.Key
	held := func(scope string, w time.Duration) ledger.Tally {
		return e.book.Tally(scope, asset, now.Add(-w), now, 0)
	}
	var rows []PayeeSpend
	used := map[string]*big.Int{}
	var totals guard.Figures
	for _, c := range slices.Sorted(maps.Keys(who)) {
		cp, err := guard.ParseCounterparty(c)
		if err != nil {
			continue
		}
		f := guard.Decide(guard.Request{Counterparty: cp, Asset: pol.DefaultAsset, Atomic: new(big.Int)}, h, pol, now).Figures
		totals = f
		scope := ledger.ScopePayTo + cp.Value
		if cp.Kind == guard.KindHost {
			scope = ledger.ScopeHost + cp.Value
		}
		row := PayeeSpend{Counterparty: cp.Value, Name: pol.PayeeName(cp.Value)}
		if f.Spend != nil {
			t := held(scope, pol.Limit.Window)
			row.Limits = append(row.Limits, amountUse(pol, "perCounterpartyLimit", pol.Limit.Window, f.Spend, t.Atomic, pol.Limit.Amount, f.MixedAssets+f.UnparseableHistory))
			used[cp.Value] = f.Spend
		}
		if vl := pol.Velocity.PerCounterparty; vl != nil && f.PaymentsInWindow != nil {
			row.Limits = append(row.Limits, countUse("velocity.perCounterparty", vl, *f.PaymentsInWindow, held(scope, vl.Window).Count))
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		cp := guard.Counterparty{Kind: guard.KindAddress, Value: nobody}
		totals = guard.Decide(guard.Request{Counterparty: cp, Asset: pol.DefaultAsset, Atomic: new(big.Int)}, h, pol, now).Figures
	}
	v.Total = []LimitUse{}
	if lim := pol.TotalLimit; lim != nil && totals.Total != nil {
		t := held(ledger.ScopeAll, lim.Window)
		v.Total = append(v.Total, amountUse(pol, "totalLimit", lim.Window, totals.Total.Spend, t.Atomic, lim.Amount, totals.Total.MixedAssets+totals.Total.UnparseableHistory))
	}
	if vl := pol.Velocity.Total; vl != nil && totals.PaymentsTotalInWindow != nil {
		v.Total = append(v.Total, countUse("velocity.total", vl, *totals.PaymentsTotalInWindow, held(ledger.ScopeAll, vl.Window).Count))
	}
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := used[rows[i].Counterparty], used[rows[j].Counterparty]
		if a == nil || b == nil {
			return a != nil
		}
		return a.Cmp(b) > 0
	})
	if len(rows) > maxSpendRows {
		v.More = len(rows) - maxSpendRows
		rows = rows[:maxSpendRows]
	}
	v.Counterparties = append(v.Counterparties, rows...)
	return v, nil
}

// amountUse is an amount limit's use: used is what the decision adds up
// (paid and held), held the ledger's part of it.
func amountUse(pol *guard.Config, key string, window time.Duration, used, held, limit *big.Int, unsummed int) LimitUse {
	if held == nil {
		held = new(big.Int)
	}
	paid := new(big.Int).Sub(used, held)
	money := func(n *big.Int) string {
		return guard.FormatDisplay(n, pol.DefaultAsset.Decimals) + " " + pol.DefaultAsset.Symbol
	}
	u := LimitUse{Limit: key, Window: windowText(window), Paid: money(paid), Held: money(held),
		Used: money(used), Max: money(limit), Unsummed: unsummed}
	if limit.Sign() > 0 {
		pct := new(big.Int).Mul(used, big.NewInt(100))
		u.Percent = int(pct.Quo(pct, limit).Int64())
	} else if used.Sign() > 0 {
		u.Percent = 100
	}
	return u
}

// countUse is a velocity limit's use: n payments in the window, held of
// them held by the ledger.
func countUse(key string, lim *guard.CountLimit, n, held int) LimitUse {
	u := LimitUse{Limit: key, Window: windowText(lim.Window), Paid: payments(n - held), Held: payments(held), Used: payments(n), Max: payments(lim.Count)}
	if lim.Count > 0 {
		u.Percent = n * 100 / lim.Count
	}
	return u
}

func payments(n int) string {
	if n == 1 {
		return "1 payment"
	}
	return fmt.Sprintf("%d payments", n)
}

// windowText is a window for people: "24 hours", "1 hour", "90 minutes".
func windowText(d time.Duration) string {
	unit := func(n int64, one string) string {
		if n == 1 {
			return "1 " + one
		}
		return fmt.Sprintf("%d %ss", n, one)
	}
	switch {
	case d%time.Hour == 0:
		return unit(int64(d/time.Hour), "hour")
	case d%time.Minute == 0:
		return unit(int64(d/time.Minute), "minute")
	}
	return strings.TrimSuffix(d.String(), "0s")
}
