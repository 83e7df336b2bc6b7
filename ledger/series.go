package ledger

import (
	"math/big"
	"sort"
	"time"
)

// series is the commitments of one group (a scope, an asset, how long each
// counts on its own) in the order of their time, with running sums kept in
// Fenwick trees: a window's count, amount and open payments are read in
// O(log n) however many entries the group holds, and an entry the Trace
// comes to show (or a release lets go) is taken out in O(log n).
//
// Within a group every entry counts for the same span after its time (dur),
// so the entries still counting at a moment are a suffix of the order, and
// a window's are a range: no entry has to be looked at one by one.
type series struct {
	dur   time.Duration // how long an entry counts on its own; <0: until shown
	at    []int64       // unix milliseconds, ascending
	recs  []*rec
	count fenwickInt
	open  fenwickInt
	sum   fenwickBig
}

// add puts r in time order; an entry older than the newest (another
// replica's, committed while this one wrote its own) is inserted, and the
// trees are made again from its place on only: the nodes before it sum
// entries that did not move. Replicas' entries arrive at most a few
// decisions late, so that is a few pushes, not the whole series.
func (s *series) add(r *rec) {
	ms := r.at.UnixMilli()
	i := len(s.at)
	if i > 0 && s.at[i-1] > ms {
		i = sort.Search(len(s.at), func(k int) bool { return s.at[k] > ms })
		s.at = append(s.at, 0)
		s.recs = append(s.recs, nil)
		copy(s.at[i+1:], s.at[i:])
		copy(s.recs[i+1:], s.recs[i:])
		s.at[i], s.recs[i] = ms, r
		s.rebuildFrom(i)
		return
	}
	s.at = append(s.at, ms)
	s.recs = append(s.recs, r)
	s.count.push(r.weight())
	s.open.push(r.openWeight())
	s.sum.push(r.amount())
}

// set changes whether the entry at its place counts (shown, released).
func (s *series) set(r *rec, before, after bool) {
	if before == after {
		return
	}
	i := s.index(r)
	if i < 0 {
		return
	}
	sign := int64(1)
	if !after {
		sign = -1
	}
	s.count.add(i, sign)
	if r.e.Open {
		s.open.add(i, sign)
	}
	a := r.atomic
	if !after {
		a = new(big.Int).Neg(a)
	}
	s.sum.add(i, a)
}

// unopen stops r, which counts and is open, from counting as open.
func (s *series) unopen(r *rec) {
	if i := s.index(r); i >= 0 {
		s.open.add(i, -1)
	}
}

// index finds r's place (entries of one millisecond are few).
func (s *series) index(r *rec) int {
	ms := r.at.UnixMilli()
	i := sort.Search(len(s.at), func(k int) bool { return s.at[k] >= ms })
	for ; i < len(s.at) && s.at[i] == ms; i++ {
		if s.recs[i] == r {
			return i
		}
	}
	return -1
}

// rebuild makes the trees again from the entries.
func (s *series) rebuild() {
	s.count, s.open, s.sum = fenwickInt{}, fenwickInt{}, fenwickBig{}
	s.rebuildFrom(0)
}

// rebuildFrom makes the trees' nodes again from entry i on. A node k
// (1-based) sums entries (k - lowbit(k), k], so the first i nodes read
// only entries before i and stay as they are.
func (s *series) rebuildFrom(i int) {
	s.count.t, s.open.t, s.sum.t = s.count.t[:i], s.open.t[:i], s.sum.t[:i]
	for _, r := range s.recs[i:] {
		s.count.push(r.weight())
		s.open.push(r.openWeight())
		s.sum.push(r.amount())
	}
}

// from is the first index whose entry is at or after t (unix ms).
func (s *series) from(ms int64) int {
	return sort.Search(len(s.at), func(k int) bool { return s.at[k] >= ms })
}

// window reads the entries at or after from that still count at now: their
// number, amount and open payments, and the newest of them.
func (s *series) window(from, now time.Time, refs int, t *tally) {
	lo := from.UnixMilli()
	if s.dur >= 0 {
		// Still counting at now: at + dur > now.
		if c := now.Add(-s.dur).UnixMilli() + 1; c > lo {
			lo = c
		}
	}
	i := s.from(lo)
	n := len(s.at)
	if i >= n {
		return
	}
	t.count += s.count.rangeSum(i, n)
	t.open += s.open.rangeSum(i, n)
	s.sum.rangeAdd(i, n, t.sum)
	for k := n - 1; k >= i && (len(t.refs) < refs || len(t.openRefs) < refs); k-- {
		r := s.recs[k]
		if !r.counts() {
			continue
		}
		if len(t.refs) < refs {
			t.refs = append(t.refs, r)
		}
		if r.e.Open && len(t.openRefs) < refs {
			t.openRefs = append(t.openRefs, r)
		}
		if t.open == len(t.openRefs) && len(t.refs) >= refs {
			break
		}
	}
}

// prune drops the entries at the front that can no longer count at now
// in any window of at most horizon, once they are half the series.
func (s *series) prune(now time.Time, horizon time.Duration) []*rec {
	cut := now.Add(-horizon).UnixMilli()
	if s.dur >= 0 {
		if c := now.Add(-s.dur).UnixMilli(); c < cut {
			cut = c
		}
	}
	i := s.from(cut)
	if i < 64 || i*2 < len(s.at) {
		return nil
	}
	gone := s.recs[:i:i]
	s.at = append([]int64(nil), s.at[i:]...)
	s.recs = append([]*rec(nil), s.recs[i:]...)
	s.rebuild()
	return gone
}

// fenwickInt is a Fenwick tree of counts that grows at its end.
type fenwickInt struct{ t []int64 }

func (f *fenwickInt) push(v int64) {
	i := len(f.t) + 1
	// The new node covers (i - lowbit(i), i]: the sum of the nodes that
	// cover its left part, plus v.
	sum := v
	for j := i - 1; j > i-(i&-i); j -= j & -j {
		sum += f.t[j-1]
	}
	f.t = append(f.t, sum)
}

func (f *fenwickInt) add(i int, v int64) {
	for j := i + 1; j <= len(f.t); j += j & -j {
		f.t[j-1] += v
	}
}

func (f *fenwickInt) prefix(n int) int64 {
	var s int64
	for j := n; j > 0; j -= j & -j {
		s += f.t[j-1]
	}
	return s
}

func (f *fenwickInt) rangeSum(i, n int) int { return int(f.prefix(n) - f.prefix(i)) }

// fenwickBig is a Fenwick tree of amounts.
type fenwickBig struct{ t []*big.Int }

func (f *fenwickBig) push(v *big.Int) {
	i := len(f.t) + 1
	sum := new(big.Int).Set(v)
	for j := i - 1; j > i-(i&-i); j -= j & -j {
		sum.Add(sum, f.t[j-1])
	}
	f.t = append(f.t, sum)
}

func (f *fenwickBig) add(i int, v *big.Int) {
	for j := i + 1; j <= len(f.t); j += j & -j {
		f.t[j-1].Add(f.t[j-1], v)
	}
}

// rangeAdd adds the amounts of [i, n) to out.
func (f *fenwickBig) rangeAdd(i, n int, out *big.Int) {
	for j := n; j > 0; j -= j & -j {
		out.Add(out, f.t[j-1])
	}
	for j := i; j > 0; j -= j & -j {
		out.Sub(out, f.t[j-1])
	}
}
