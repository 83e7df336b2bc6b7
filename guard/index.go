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
	// payTos and hosts are, per counterparty, the operations with it;
	// memo is the last one add looked up of each kind (the operations of
	// a run often share their payee).
	payTos, hosts map[string]*counterpartyOps
	memo          [2]struct {
		key string
		c   *counterpartyOps
	}
	// unattributable sums up, per question kind, the operations that cannot
	// be told to be or not to be with a counterparty of that kind: only the
	// open ones are kept, the rest are counted.
	unattributable    map[CounterpartyKind]*unattributed
	settleUnconfirmed int
	// openByHost are the open operations a host can be tied to (by the
	// resource URL their seller declared), in order: those a question
	// naming a host alone counts as possibly with it.
	openByHost []int32
	// n is how many operations are indexed.
	n int
	// paid is, per operation, whether it can show a reservation and the
	// time of its first event (Op.paidAt), parsed once (the latest of
	// those times per counterparty is counterpartyOps.latest).
	paid []paidTime
	// last is, per operation, the time of its last event (Op.lastTime),
	// parsed once: what every window of Decide is judged on.
	//
	// Both are nil while every operation indexed carries its times
	// (CacheTimes): they are read from the operations then (paidOf,
	// lastOf), and a history indexed again for each decision while ingest
	// appends does not allocate them again.
	last []paidTime
	// sortLater are the counterparties' withOps whose spent list an
	// operation came out of order to.
	sortLater []*withOps
	// elided, when set, counts the operations the History leaves out of
	// Ops (see SetElided).
	elided *Elided
}

// counterpartyOps is what the index holds of the operations with one
// counterparty.
type counterpartyOps struct {
	// pos are their positions in order, one for each time an operation
	// names it.
	pos []int32
	// mine is what Decide reads of them.
	mine withOps
	// latest is the latest Op.paidAt of those that can show a reservation
	// (hasLatest: one can): a reservation made after it is shown by none,
	// which Reserve learns without looking at the operations one by one.
	latest    time.Time
	hasLatest bool
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
	ix := &HistoryIndex{payTos: map[string]*counterpartyOps{}, hosts: map[string]*counterpartyOps{}, unattributable: map[CounterpartyKind]*unattributed{}}
	for _, k := range []CounterpartyKind{KindAddress, KindHost} {
		ix.unattributable[k] = &unattributed{why: map[string]int{}}
	}
	for i := range h.Ops {
		ix.add(h.Ops, int32(i))
	}
	ix.sort(h.Ops)
	h.Index = ix
}

// lastOf is Op.lastTime of the operation at position i of ops, the
// operations indexed.
func (ix *HistoryIndex) lastOf(ops []Op, i int32) paidTime {
	if ix.last != nil {
		return ix.last[i]
	}
	return ops[i].lastTime()
}

// paidOf is Op.paidAt of the operation at position i of ops.
func (ix *HistoryIndex) paidOf(ops []Op, i int32) paidTime {
	if ix.paid != nil {
		return ix.paid[i]
	}
	at, ok := ops[i].paidAt()
	return paidTime{at: at, ok: ok}
}

// keepTimes makes the index keep the times of the operations indexed so
// far (ops[:ix.n]) itself: the next one does not carry its own.
func (ix *HistoryIndex) keepTimes(ops []Op) {
	ix.last = make([]paidTime, ix.n, max(len(ops), 1))
	ix.paid = make([]paidTime, ix.n, max(len(ops), 1))
	for i := range int32(ix.n) {
		ix.last[i] = ops[i].lastTime()
		at, ok := ops[i].paidAt()
		ix.paid[i] = paidTime{at: at, ok: ok}
	}
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
	for i := h.Index.n; i < len(h.Ops); i++ {
		h.Index.add(h.Ops, int32(i))
	}
	h.Index.sort(h.Ops)
}

// withOps is what Decide reads of the operations with one counterparty, so
// that it looks at those inside a window, not at every one.
type withOps struct {
	// all are their positions, each once, in order; open those open.
	all, open []int32
	// coarse counts those judged coarsely (no stage roles).
	coarse int
	// spent are the spent ones whose last time reads, in the order of
	// that time (then position); spentBad those whose time does not.
	spent, spentBad []int32
	unsorted        bool
}

// entry is what the index holds of counterparty key of a kind (0 a
// payee address, 1 a host), made when absent.
func (ix *HistoryIndex) entry(kind int, key string) *counterpartyOps {
	memo := &ix.memo[kind]
	if memo.c != nil && memo.key == key {
		return memo.c
	}
	m := ix.payTos
	if kind == 1 {
		m = ix.hosts
	}
	c := m[key]
	if c == nil {
		c = &counterpartyOps{}
		m[key] = c
	}
	memo.key, memo.c = key, c
	return c
}

func (ix *HistoryIndex) push(c *withOps, ops []Op, n int32, last paidTime) {
	o := &ops[n]
	if k := len(c.all); k > 0 && c.all[k-1] == n {
		return // the operation names it twice
	}
	c.all = append(c.all, n)
	if o.Open {
		c.open = append(c.open, n)
	}
	if !o.RolesKnown {
		c.coarse++
	}
	if !o.Spent {
		return
	}
	if !last.ok {
		c.spentBad = append(c.spentBad, n)
		return
	}
	if k := len(c.spent); k > 0 && last.at.Before(ix.lastOf(ops, c.spent[k-1]).at) && !c.unsorted {
		c.unsorted = true
		ix.sortLater = append(ix.sortLater, c)
	}
	c.spent = append(c.spent, n)
}

// sort puts back in time order the spent lists operations came to out of
// order.
func (ix *HistoryIndex) sort(ops []Op) {
	for _, c := range ix.sortLater {
		slices.SortStableFunc(c.spent, func(a, b int32) int { return ix.lastOf(ops, a).at.Compare(ix.lastOf(ops, b).at) })
		c.unsorted = false
	}
	ix.sortLater = ix.sortLater[:0]
}

// mine is what the index holds of the operations with c (nil: none).
func (ix *HistoryIndex) mine(c Counterparty) *withOps {
	if e := ix.of(c); e != nil {
		return &e.mine
	}
	return nil
}

// of is what the index holds of the operations with c (nil: none).
func (ix *HistoryIndex) of(c Counterparty) *counterpartyOps {
	switch c.Kind {
	case KindAddress:
		return ix.payTos[c.Value]
	case KindHost:
		return ix.hosts[c.Value]
	}
	return nil
}

// spentFrom are the positions, in order, of the spent operations with c
// whose last time is at or after from or does not read: those a window
// from from counts. ops are the operations indexed.
func (c *withOps) spentFrom(ix *HistoryIndex, ops []Op, from time.Time) []int32 {
	lo, _ := slices.BinarySearchFunc(c.spent, from, func(i int32, t time.Time) int {
		if ix.lastOf(ops, i).at.Before(t) {
			return -1
		}
		return 1
	})
	in := append(make([]int32, 0, len(c.spent)-lo+len(c.spentBad)), c.spent[lo:]...)
	in = append(in, c.spentBad...)
	slices.Sort(in)
	return in
}

// add indexes the operation at position n of ops (the next one).
func (ix *HistoryIndex) add(ops []Op, n int32) {
	o := &ops[n]
	if !o.times.set && ix.last == nil {
		ix.keepTimes(ops)
	}
	ix.n++
	var pt paidTime
	last := o.lastTime()
	if ix.last != nil {
		ix.last = append(ix.last, last)
	}
	if o.Money != nil {
		at, shows := o.paidAt()
		pt = paidTime{at: at, ok: shows}
		for kind, keys := range [2][]string{o.Money.PayTos, o.Money.Hosts} {
			for _, key := range keys {
				c := ix.entry(kind, key)
				ix.push(&c.mine, ops, n, last)
				c.pos = append(c.pos, n)
				if shows && (!c.hasLatest || at.After(c.latest)) {
					c.latest, c.hasLatest = at, true
				}
			}
		}
	}
	if ix.paid != nil {
		ix.paid = append(ix.paid, pt)
	}
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
	if o.Open && o.unattributableFor(KindHost) == "" {
		ix.openByHost = append(ix.openByHost, n)
	}
}

// openElsewhere is, for a question naming a host alone whose own
// operations are mine, how many open operations tied to other hosts the
// index holds and the first maxEvidence of them in order: their count is
// taken from the list's length less the open ones of mine, so a decision
// reads no more of them than it lists.
func (ix *HistoryIndex) openElsewhere(mine *withOps) (n int, first []int32) {
	n = len(ix.openByHost)
	for _, i := range mine.open {
		if _, ok := slices.BinarySearch(ix.openByHost, i); ok {
			n--
		}
	}
	for _, i := range ix.openByHost {
		if len(first) == maxEvidence {
			break
		}
		if _, ok := slices.BinarySearch(mine.all, i); !ok {
			first = append(first, i)
		}
	}
	return n, first
}

// with returns the positions of the operations with counterparty c.
func (ix *HistoryIndex) with(c Counterparty) []int32 {
	if e := ix.of(c); e != nil {
		return e.pos
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
	if e := ix.of(c); e != nil && e.hasLatest {
		return e.latest, true
	}
	return time.Time{}, false
}
