package guard

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"
)

// showingByScan is the definition of which recorded payment shows a
// reservation, one operation at a time with its time parsed there: the
// reference Reserve's index must agree with.
func showingByScan(h *History, r Reservation, used map[int]bool) (int, bool) {
	best, bestAt := -1, ""
	for i, o := range h.Ops {
		if used[i] || !o.Spent || o.Money == nil || o.Money.Atomic == nil || o.Money.Problem != "" {
			continue
		}
		if o.Money.Asset != r.Asset || o.Money.Atomic.Cmp(r.Atomic) != 0 {
			continue
		}
		if r.PayTo != "" && !slices.Contains(o.Money.PayTos, r.PayTo) || r.PayTo == "" && !slices.Contains(o.Money.Hosts, r.Host) {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, o.FirstEventAt)
		if err != nil || t.Before(r.At) {
			continue
		}
		if best < 0 || o.FirstEventAt < bestAt {
			best, bestAt = i, o.FirstEventAt
		}
	}
	return best, best >= 0
}

func reserveByScan(h *History, rs []Reservation, now time.Time) (shown int) {
	rs = slices.Clone(rs)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].At.Before(rs[j].At) })
	used := map[int]bool{}
	for _, r := range rs {
		if !r.Holds(now) {
			continue
		}
		if i, ok := showingByScan(h, r, used); ok {
			used[i] = true
			shown++
			continue
		}
		h.Reserved = append(h.Reserved, r.op())
	}
	return shown
}

// Reserve shows the same reservations with the index (times parsed once,
// the latest payment per counterparty) as without it and as the scan that
// defines it, over random histories: payments before, at and after each
// reservation, to addresses and hosts, other amounts and assets, times
// that do not parse, operations not paid or whose amount is unknown, and
// several reservations competing for one payment.
func TestReserveIndexAgreesWithScan(t *testing.T) {
	base := time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)
	payTos := []string{"0x0000000000000000000000000000000000000a01", "0x0000000000000000000000000000000000000a02"}
	hosts := []string{"a.example", "b.example"}
	assets := []string{USDCBase, "eip155:1/erc20:0x0000000000000000000000000000000000000bad"}
	rng := rand.New(rand.NewPCG(28, 1))
	stamp := func() string {
		switch rng.IntN(12) {
		case 0:
			return "not a time"
		case 1:
			return ""
		case 2: // another zone, the same instant as a minute of base
			return base.Add(time.Duration(rng.IntN(20)) * time.Minute).In(time.FixedZone("X", 3600)).Format(time.RFC3339Nano)
		case 3: // reads, but Unix nanoseconds cannot hold it (CacheTimes leaves it)
			return "2400-01-01T00:00:00Z"
		}
		return base.Add(time.Duration(rng.IntN(20))*time.Minute + time.Duration(rng.IntN(3))*time.Millisecond).Format(time.RFC3339Nano)
	}
	for round := range 400 {
		var ops []Op
		for i := range rng.IntN(30) {
			o := Op{RunID: "r", OperationID: fmt.Sprintf("op-%d", i), Spent: rng.IntN(5) > 0, FirstEventAt: stamp()}
			if rng.IntN(8) > 0 {
				o.Money = &Money{Asset: assets[rng.IntN(4)/3], PayTos: []string{payTos[rng.IntN(2)]}, Hosts: []string{hosts[rng.IntN(2)]}}
				if rng.IntN(6) > 0 {
					o.Money.Atomic = big.NewInt(int64(1 + rng.IntN(2)))
				}
				if rng.IntN(10) == 0 {
					o.Money.Problem = "unreadable amount"
				}
			}
			ops = append(ops, o)
		}
		var rs []Reservation
		for i := range rng.IntN(12) {
			r := Reservation{ReceiptID: fmt.Sprintf("rcpt-%d", i), At: base.Add(time.Duration(rng.IntN(22)-1) * time.Minute),
				Atomic: big.NewInt(int64(1 + rng.IntN(2))), Asset: assets[rng.IntN(4)/3]}
			if rng.IntN(3) > 0 {
				r.PayTo = payTos[rng.IntN(2)]
			} else {
				r.Host = hosts[rng.IntN(2)]
			}
			if rng.IntN(5) == 0 {
				r.Until = base.Add(10 * time.Minute) // lapsed at now
			}
			rs = append(rs, r)
		}
		now := base.Add(30 * time.Minute)
		want := History{Ops: ops}
		wantShown := reserveByScan(&want, rs, now)
		// Each way with the operations' times parsed when read, and with
		// them parsed once beforehand (CacheTimes, as the catalog keeps them).
		cached := make([]Op, len(ops))
		for i, o := range ops {
			cached[i] = CacheTimes(o)
		}
		for _, indexed := range []bool{false, true} {
			for _, hops := range [][]Op{ops, cached} {
				h := History{Ops: hops}
				if indexed {
					h.BuildIndex()
				}
				if shown := h.Reserve(rs, now); shown != wantShown || !slices.EqualFunc(h.Reserved, want.Reserved, func(a, b Op) bool { return a.OperationID == b.OperationID }) {
					t.Fatalf("round %d, indexed %v, times cached %v: shown %d, reserved %v; the scan shows %d, reserves %v", round, indexed, hops[0].times.set, shown, ids(h.Reserved), wantShown, ids(want.Reserved))
				}
			}
		}
	}
}

func ids(ops []Op) []string {
	var out []string
	for _, o := range ops {
		out = append(out, o.OperationID)
	}
	return out
}

// BenchmarkReserve: 1,000 reservations held, newer than a Trace of 50 paid
// operations to each of their 16 payees (storebench's shape after a few
// seconds of allows): the scan parses each payment's time for each
// reservation; the index knows at once that none shows them.
func BenchmarkReserve(b *testing.B) {
	base := time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)
	var ops []Op
	var payees []string
	for p := range 16 {
		payee := fmt.Sprintf("0x%040x", p+1)
		payees = append(payees, payee)
		for i := range 50 {
			ops = append(ops, Op{RunID: "r", OperationID: fmt.Sprintf("op-%d-%d", p, i), Spent: true,
				FirstEventAt: base.Add(time.Duration(i) * time.Minute).Format(time.RFC3339Nano),
				Money:        &Money{Asset: USDCBase, Atomic: big.NewInt(10000), PayTos: []string{payee}}})
		}
	}
	now := base.Add(100 * 24 * time.Hour)
	var rs []Reservation
	for i := range 1000 {
		rs = append(rs, Reservation{ReceiptID: fmt.Sprintf("rcpt-%d", i), At: now.Add(-time.Duration(i) * time.Second), Until: now.Add(time.Hour),
			PayTo: payees[i%16], Atomic: big.NewInt(10000), Asset: USDCBase})
	}
	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			h := History{Ops: ops}
			reserveByScan(&h, rs, now)
		}
	})
	b.Run("index", func(b *testing.B) {
		h := History{Ops: ops}
		h.BuildIndex()
		for b.Loop() {
			hh := h
			hh.Reserved = nil
			hh.Reserve(rs, now)
		}
	})
}
