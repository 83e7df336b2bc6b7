package console

import (
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// The timeline chart of a review page: the recent payments in the history
// the guard reads (the history templates' operations with an amount, and
// the reservations the Trace does not show yet), drawn by the server as
// inline SVG. One bar per payment at the time of its first event, its
// height the amount (linear, against the largest shown); open payments
// (money moved, outcome not confirmed), faulted ones and reservations are
// told apart by class and in each bar's title; payments to the review's
// counterparty are marked; a line marks when the review opened.
const (
	chartWidth   = 640
	chartHeight  = 160
	chartPadX    = 8
	chartTop     = 12
	chartBase    = 136 // y of the time axis
	chartMaxBars = 40
	barWidth     = 6
)

// chartView is what the template draws.
type chartView struct {
	Width, Height, Base, Right int
	Title, Desc                string
	Bars                       []barView
	Opened                     *markView
	From, To                   string
	Payments, Open, Same       int
}

type barView struct {
	X, Y, W, H int
	Class      string
	Label      string
}

type markView struct {
	X     int
	Label string
}

// AssetInfo names an asset for the chart: its symbol and decimals.
type AssetInfo func(asset string) (symbol string, decimals int, ok bool)

type payment struct {
	at                      time.Time
	atomic                  *big.Int
	amount, asset           string
	open, faulted, reserved bool
	same                    bool
	ref                     string
}

// buildChart draws the latest chartMaxBars payments of h beside review
// rv; nil when h holds no payment with an amount and a time.
func buildChart(h guard.History, rv reviewlog.Review, assets AssetInfo) *chartView {
	var ps []payment
	for _, set := range [][]guard.Op{h.Ops, h.Reserved} {
		for _, op := range set {
			if op.Money == nil || op.Money.Atomic == nil || op.Money.Atomic.Sign() <= 0 {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, op.FirstEventAt)
			if err != nil {
				continue
			}
			p := payment{at: at.UTC(), atomic: op.Money.Atomic, open: op.Open, faulted: op.Faulted, reserved: op.Reserved,
				same: slices.Contains(op.Money.PayTos, rv.Counterparty) || slices.Contains(op.Money.Hosts, rv.Counterparty),
				ref:  op.RunID + "/" + op.OperationID}
			p.amount, p.asset = op.Money.Atomic.String(), op.Money.Asset
			if sym, dec, ok := assets(op.Money.Asset); ok {
				p.amount, p.asset = guard.FormatDisplay(op.Money.Atomic, dec), sym
			}
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return nil
	}
	slices.SortStableFunc(ps, func(a, b payment) int { return a.at.Compare(b.at) })
	if len(ps) > chartMaxBars {
		ps = ps[len(ps)-chartMaxBars:]
	}
	from, to := ps[0].at, ps[len(ps)-1].at
	opened, err := time.Parse(time.RFC3339Nano, rv.CreatedAt)
	hasOpened := err == nil && !opened.Before(from)
	if hasOpened && opened.After(to) {
		to = opened.UTC()
	}
	span := to.Sub(from)
	inner := chartWidth - 2*chartPadX - barWidth
	x := func(t time.Time) int {
		if span <= 0 {
			return chartPadX + inner/2
		}
		return chartPadX + int(int64(inner)*int64(t.Sub(from))/int64(span))
	}
	largest := new(big.Int)
	for _, p := range ps {
		if p.atomic.Cmp(largest) > 0 {
			largest = p.atomic
		}
	}
	// same names what the outlined bars share with the review.
	same := "host"
	if isAddress(rv.Counterparty) {
		same = "payee"
	}
	tallest := chartBase - chartTop
	v := &chartView{Width: chartWidth, Height: chartHeight, Base: chartBase, Right: chartWidth - chartPadX,
		From: utcMinute(from), To: utcMinute(to)}
	for _, p := range ps {
		// height = tallest × amount / largest, at least 2 px to be seen.
		hgt := new(big.Int).Mul(p.atomic, big.NewInt(int64(tallest)))
		hgt.Quo(hgt, largest)
		bh := max(int(hgt.Int64()), 2)
		class, state := "paid", "settled"
		switch {
		case p.reserved:
			class, state = "reserved", "reserved (allowed, not yet in the Trace)"
		case p.faulted:
			class, state = "faulted", "faulted"
		case p.open:
			class, state = "open", "open (paid, outcome not confirmed)"
		}
		if p.open || p.reserved || p.faulted {
			v.Open++
		}
		toWhom := ""
		if p.same {
			class += " same"
			toWhom = ", to this review's " + same
			v.Same++
		}
		v.Bars = append(v.Bars, barView{X: x(p.at), Y: chartBase - bh, W: barWidth, H: bh, Class: class,
			Label: fmt.Sprintf("%s: %s %s, %s%s (%s)", utcMinute(p.at), p.amount, p.asset, state, toWhom, p.ref)})
	}
	v.Payments = len(ps)
	if hasOpened {
		v.Opened = &markView{X: x(opened) + barWidth/2, Label: "review opened " + utcMinute(opened)}
	}
	v.Title = "Recent payments in the guard's history"
	var d strings.Builder
	fmt.Fprintf(&d, "%s from %s to %s; %d open, faulted or reserved; %d to this review's %s.",
		plural(v.Payments, "payment", "payments"), v.From, v.To, v.Open, v.Same, same)
	v.Desc = d.String()
	return v
}

// utcMinute is an instant to the minute, in UTC, as a person reads it.
func utcMinute(t time.Time) string { return t.UTC().Format("2006-01-02 15:04") + " UTC" }
