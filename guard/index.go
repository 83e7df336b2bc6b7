package guard

import (
	"slices"
	"time"
)

// HistoryIndex partitions a History's operations once, so that a decision
// touches only the operations with the counterparty asked about and those
// that cannot be attributed, not every operation ever recorded. A caller
// that keeps a History between questions (the server, while no run
// changed) builds it once with BuildIndex; Decide uses it when present and
// scans otherwise, with the same result.
type HistoryIndex struct {
	byPayTo map[string][]int32
	byHost  map[string][]int32
	// unattributable sums up, per question kind, the operations that cannot
	// be told to be or not to be with a counterparty of that kind: only the
	// open ones are kept, the rest are counted.
	unattributable    map[CounterpartyKind]*unattributed
	settleUnconfirmed int
	// open are every open operation, attributed or not.
	open []int32
	// paid is, per operation, whether it can show a reservation and the
	// time of its first event (Op.paidAt), parsed once. latestPayTo and
	// latestHost are, per counterparty, the latest of those times: a
	// reservation made after it is shown by none, which Reserve learns
	// without looking at the operations one by one.
	paid []paidTime
	// last is, per operation, the time of its last event (Op.lastTime),
	// parsed once: what every window of Decide is judged on.
	last        []paidTime
	latestPayTo map[string]time.Time
	latestHost  map[string]time.Time
}

// paidTime is Op.paidAt's answer, or Op.lastTime's.
type paidTime struct {
	at time.Time
	ok bool
}

type unattributed struct {
	n               int
	open            []int32
	spent           []int32
	paidWithoutHost int
	why             map[string]int
}

// BuildIndex indexes h.Ops; h must not change afterwards (but see
// ExtendIndex).
func (h *History) BuildIndex() {
	ix := &HistoryIndex{byPayTo: map[string][]int32{}, byHost: map[string][]int32{}, unattributable: map[CounterpartyKind]*unattributed{},
		paid: make([]paidTime, 0, len(h.Ops)), last: make([]paidTime, 0, len(h.Ops)), latestPayTo: map[string]time.Time{}, latestHost: map[string]time.Time{}}
	for _, k := range []CounterpartyKind{KindAddress, KindHost} {
		ix.unattributable[k] = &unattributed{why: map[string]int{}}
	}
	for i, o := range h.Ops {
		ix.add(int32(i), o)
	}
	h.Index = ix
}

// ExtendIndex indexes the operations appended to h.Ops since its index was
// built or last extended, for a reader that reveals history in order (a
// replay of past questions, each judged on the Trace as it stood): the
// operations already indexed must be unchanged, and a History handed out
// before shares the index and must no longer be read.
func (h *History) ExtendIndex() {
	if h.Index == nil {
		h.BuildIndex()
		return
	}
	for i := len(h.Index.paid); i < len(h.Ops); i++ {
		h.Index.add(int32(i), h.Ops[i])
	}
}

// add indexes operation o at position n (the next one).
func (ix *HistoryIndex) add(n int32, o Op) {
	var pt paidTime
	if o.Money != nil {
		at, shows := o.paidAt()
		pt = paidTime{at: at, ok: shows}
		for _, p := range o.Money.PayTos {
			ix.byPayTo[p] = append(ix.byPayTo[p], n)
			if l, seen := ix.latestPayTo[p]; shows && (!seen || at.After(l)) {
				ix.latestPayTo[p] = at
			}
		}
		for _, host := range o.Money.Hosts {
			ix.byHost[host] = append(ix.byHost[host], n)
			if l, seen := ix.latestHost[host]; shows && (!seen || at.After(l)) {
				ix.latestHost[host] = at
			}
		}
	}
	ix.paid = append(ix.paid, pt)
	ix.last = append(ix.last, o.lastTime())
	for _, k := range []CounterpartyKind{KindAddress, KindHost} {
		why := o.unattributableFor(k)
		if why == "" {
			continue
		}
		u := ix.unattributable[k]
		u.n++
		u.why[why]++
		if o.Open {
			u.open = append(u.open, n)
		}
		if o.Spent {
			u.spent = append(u.spent, n)
		}
		if o.Spent && (o.Money == nil || len(o.Money.Hosts) == 0) {
			u.paidWithoutHost++
		}
	}
	if o.SettlementUnconfirmed {
		ix.settleUnconfirmed++
	}
	if o.Open {
		ix.open = append(ix.open, n)
	}
}

// with returns the positions of the operations with counterparty c.
func (ix *HistoryIndex) with(c Counterparty) []int32 {
	switch c.Kind {
	case KindAddress:
		return ix.byPayTo[c.Value]
	case KindHost:
		return ix.byHost[c.Value]
	}
	return nil
}

// ours is the positions of the operations with c or, when set, with pay,
// in order and each once (as a walk of every operation finds them), and
// whether a position is one of them. The lists by counterparty are in
// order of position.
func (ix *HistoryIndex) ours(c Counterparty, pay *Counterparty) (list []int32, has func(int32) bool) {
	a := ix.with(c)
	var b []int32
	if pay != nil {
		b = ix.with(*pay)
	}
	list = make([]int32, 0, len(a)+len(b))
	for x, y := a, b; len(x) > 0 || len(y) > 0; {
		var i int32
		if len(y) == 0 || (len(x) > 0 && x[0] <= y[0]) {
			i, x = x[0], x[1:]
		} else {
			i, y = y[0], y[1:]
		}
		// An operation that names c twice, or c and pay, is listed twice.
		if n := len(list); n == 0 || list[n-1] != i {
			list = append(list, i)
		}
	}
	return list, func(i int32) bool {
		_, ok := slices.BinarySearch(list, i)
		return ok
	}
}

// latest is the time of the latest payment with counterparty c that can
// show a reservation (Op.paidAt), and whether there is one.
func (ix *HistoryIndex) latest(c Counterparty) (time.Time, bool) {
	m := ix.latestHost
	if c.Kind == KindAddress {
		m = ix.latestPayTo
	}
	t, ok := m[c.Value]
	return t, ok
}
