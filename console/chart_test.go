package console

import (
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

const usdc = "eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"

func usdcInfo(asset string) (string, int, bool) {
	if asset == usdc {
		return "USDC", 6, true
	}
	return "", 0, false
}

func op(id string, at time.Time, atomic int64, payTo string, set func(*guard.Op)) guard.Op {
	o := guard.Op{RunID: "run-1", OperationID: id, FirstEventAt: at.Format(time.RFC3339Nano),
		Money: &guard.Money{PayTos: []string{payTo}, Atomic: big.NewInt(atomic), Asset: usdc}}
	if set != nil {
		set(&o)
	}
	return o
}

func TestBuildChart(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	seller := "0xb0b0000000000000000000000000000000000002"
	other := "0xcafe000000000000000000000000000000000003"
	rv := reviewlog.Review{ID: "r-1", Counterparty: seller, CreatedAt: t0.Add(4 * time.Hour).Format(time.RFC3339Nano)}
	h := guard.History{
		Ops: []guard.Op{
			op("op-c", t0.Add(2*time.Hour), 500000, seller, func(o *guard.Op) { o.Open = true }),
			op("op-a", t0, 250000, other, nil),
			op("op-b", t0.Add(time.Hour), 1000000, other, func(o *guard.Op) { o.Faulted = true; o.Open = true }),
			{RunID: "run-1", OperationID: "op-unattributable", FirstEventAt: t0.Format(time.RFC3339Nano), Unattributable: "no requirements"},
			op("op-bad-time", t0, 1, seller, func(o *guard.Op) { o.FirstEventAt = "yesterday" }),
		},
		Reserved: []guard.Op{op("reservation", t0.Add(3*time.Hour), 100000, seller, func(o *guard.Op) { o.Reserved = true })},
	}
	v := buildChart(h, rv, usdcInfo)
	if v == nil {
		t.Fatal("no chart")
	}
	want := []struct {
		class, label string
	}{
		{"paid", "2026-11-30 10:00 UTC: 0.25 USDC, settled (run-1/op-a)"},
		{"faulted", "2026-11-30 11:00 UTC: 1.00 USDC, faulted (run-1/op-b)"},
		{"open same", "2026-11-30 12:00 UTC: 0.50 USDC, open (paid, outcome not confirmed), to this review's payee (run-1/op-c)"},
		{"reserved same", "2026-11-30 13:00 UTC: 0.10 USDC, reserved (allowed, not yet in the Trace), to this review's payee (run-1/reservation)"},
	}
	if len(v.Bars) != len(want) {
		t.Fatalf("%d bars: %+v", len(v.Bars), v.Bars)
	}
	tallest := chartBase - chartTop
	for i, w := range want {
		b := v.Bars[i]
		if b.Class != w.class || b.Label != w.label {
			t.Errorf("bar %d: %q %q, want %q %q", i, b.Class, b.Label, w.class, w.label)
		}
		if b.Y+b.H != chartBase || b.X < chartPadX || b.X+b.W > chartWidth-chartPadX {
			t.Errorf("bar %d off the axis or the chart: %+v", i, b)
		}
		if i > 0 && b.X <= v.Bars[i-1].X {
			t.Errorf("bar %d is not right of bar %d: %d ≤ %d", i, i-1, b.X, v.Bars[i-1].X)
		}
	}
	// Heights are linear in the amount: 1 USDC is the tallest.
	for i, amount := range []int64{250000, 1000000, 500000, 100000} {
		if got, want := v.Bars[i].H, int(int64(tallest)*amount/1000000); got != want {
			t.Errorf("bar %d height %d, want %d", i, got, want)
		}
	}
	// Time is linear: the bars are an hour apart, the review opened an
	// hour after the last, at the right end.
	step := v.Bars[1].X - v.Bars[0].X
	for i := 2; i < len(v.Bars); i++ {
		if d := v.Bars[i].X - v.Bars[i-1].X; d < step-1 || d > step+1 {
			t.Errorf("bars %d and %d are %d apart, not %d", i-1, i, d, step)
		}
	}
	if v.Opened == nil || v.Opened.X != chartWidth-chartPadX-barWidth+barWidth/2 || !strings.Contains(v.Opened.Label, "2026-11-30 14:00 UTC") {
		t.Errorf("opened mark %+v", v.Opened)
	}
	if v.Payments != 4 || v.Open != 3 || v.Same != 2 || v.From != "2026-11-30 10:00 UTC" || v.To != "2026-11-30 14:00 UTC" {
		t.Errorf("summary %d %d %d %s %s", v.Payments, v.Open, v.Same, v.From, v.To)
	}
	if !strings.Contains(v.Desc, "4 payments from 2026-11-30 10:00 UTC to 2026-11-30 14:00 UTC; 3 open, faulted or reserved; 2 to this review's payee") {
		t.Errorf("desc %q", v.Desc)
	}

	// A host's review: the outlined bars are to this review's host; one
	// payment is one.
	hv := buildChart(guard.History{Ops: h.Ops[:1]}, reviewlog.Review{ID: "r-2", Counterparty: "b.example.net", CreatedAt: rv.CreatedAt}, usdcInfo)
	if hv == nil || !strings.HasPrefix(hv.Desc, "1 payment from ") || !strings.HasSuffix(hv.Desc, "0 to this review's host.") {
		t.Errorf("a host's chart: %+v", hv)
	}

	// No payment: no chart. An unknown asset is shown in atomic units.
	if v := buildChart(guard.History{Ops: h.Ops[3:4]}, rv, usdcInfo); v != nil {
		t.Errorf("a chart without payments: %+v", v)
	}
	unknown := op("op-x", t0, 42, other, func(o *guard.Op) { o.Money.Asset = "eip155:1/0xdead" })
	if v := buildChart(guard.History{Ops: []guard.Op{unknown}}, rv, usdcInfo); v == nil || !strings.Contains(v.Bars[0].Label, ": 42 eip155:1/0xdead, settled") {
		t.Errorf("unknown asset: %+v", v)
	}
	// Only the latest chartMaxBars are drawn.
	var many []guard.Op
	for i := range chartMaxBars + 10 {
		many = append(many, op(fmt.Sprintf("op-%02d", i), t0.Add(time.Duration(i)*time.Minute), int64(1+i*1000000), other, nil))
	}
	v = buildChart(guard.History{Ops: many}, rv, usdcInfo)
	if len(v.Bars) != chartMaxBars || !strings.Contains(v.Bars[0].Label, "(run-1/op-10)") {
		t.Errorf("capped chart: %d bars, first %+v", len(v.Bars), v.Bars[0])
	}
}
