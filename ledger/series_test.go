package ledger

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// TestSeriesInsertsLateEntries holds the series' running sums to a sum
// over its entries one by one while entries arrive late (as replicas'
// do, a few places behind the newest, and now and then far behind),
// interleaved with entries shown and shown back: an insert rebuilds the
// trees from its place on only, and what it leaves must still add up.
func TestSeriesInsertsLateEntries(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := &series{dur: -1}
	var all []*rec
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	newest := base
	for i := range 2000 {
		at := newest.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
		switch rng.IntN(10) {
		case 0, 1, 2:
			at = newest.Add(-time.Duration(rng.IntN(40)) * time.Millisecond) // a few behind
		case 3:
			at = base.Add(time.Duration(rng.Int64N(int64(newest.Sub(base)) + 1))) // anywhere
		}
		if at.After(newest) {
			newest = at
		}
		r := &rec{e: Entry{Open: rng.IntN(3) == 0}, at: at, atomic: big.NewInt(int64(1 + rng.IntN(1000)))}
		s.add(r)
		all = append(all, r)
		if rng.IntN(4) == 0 {
			// The Trace shows one of them (or a release takes it back).
			x := all[rng.IntN(len(all))]
			before := x.counts()
			x.shown = !x.shown
			s.set(x, before, x.counts())
		}
		if i%50 != 0 {
			continue
		}
		for range 5 {
			from := base.Add(time.Duration(rng.Int64N(int64(newest.Sub(base)) + 1)))
			var tl tally
			tl.sum = new(big.Int)
			s.window(from, newest, 0, &tl)
			n, open, sum := 0, 0, new(big.Int)
			for _, r := range all {
				if r.counts() && !r.at.Before(from.Truncate(time.Millisecond)) {
					n++
					sum.Add(sum, r.atomic)
					if r.e.Open {
						open++
					}
				}
			}
			if tl.count != n || tl.open != open || tl.sum.Cmp(sum) != 0 {
				t.Fatalf("after %d entries, from %v: got count %d open %d sum %s, want %d %d %s", i+1, from, tl.count, tl.open, tl.sum, n, open, sum)
			}
		}
	}
}
