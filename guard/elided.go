package guard

import (
	"maps"
	"slices"
	"time"
)

// Elided sums up the operations a History leaves out of Ops because no
// decision reads them one by one: closed (not open), not spent or
// attributable, and with every time a window reads before the History's
// horizon. What a decision still reads of them is counted here: how many
// there are, per counterparty how many (judged coarsely, spent), how many
// name a host and an address together, and why those that cannot be
// attributed cannot be. A History with Elided answers Decide as the
// History of every operation does, for any question whose windows start
// at or after the horizon it was built for (see Keep and Horizon).
type Elided struct {
	Ops               int
	SettleUnconfirmed int
	// Unattributable counts, per question kind, the operations that cannot
	// be told to be or not to be with a counterparty of that kind, by why.
	Unattributable map[CounterpartyKind]map[string]int
	// With counts, per counterparty, the operations with it.
	With map[Counterparty]*ElidedWith
	// Both counts, per pair of counterparties (their keys, see pairKey),
	// the operations that name both.
	Both map[[2]string]int
	// PaidWithoutHost counts the spent operations that name no host.
	PaidWithoutHost int
	// OpenOps counts the open operations counted (AddRun), each with a
	// host and an address; Open counts them per counterparty, with the
	// first of them as evidence, and OpenBoth per pair of counterparties.
	// Unlike the counts above, these are this Elided's own, not its parts'
	// (which are read per part, in order).
	OpenOps  int
	Open     map[Counterparty]*ElidedOpen
	OpenBoth map[[2]string]int
	// Elsewhere are, in order, the open operations that are among the
	// first maxEvidence lacking some host: the evidence of "open with
	// other hosts" for any host asked (see addElsewhere).
	Elsewhere []OpenRef
	// hostsIn counts, per host, the operations of Elsewhere that name it
	// (while AddRun adds them).
	hostsIn map[string]int
	// keys are the counterparties' keys (cpKey) made so far, one copy
	// each: Both and OpenBoth keep them per pair, and a run's pairs are
	// about as many as its operations.
	keys map[Counterparty]string
	// parts are Elideds merged into this one by Merge whose With and Both
	// are read per counterparty when asked, not added up ahead (a
	// restart's first decision reads one or two counterparties of
	// hundreds of runs), each with the place its operations have among
	// the History's Ops.
	parts []elidedPart
}

// elidedPart is an Elided merged into another, whose operations would
// stand just before History.Ops[at].
type elidedPart struct {
	e  *Elided
	at int
}

// ElidedOpen is what Elided keeps of the open operations with one
// counterparty: how many, and the first maxEvidence of them in order.
type ElidedOpen struct {
	N     int
	First []OpenRef
}

// OpenRef is an open operation an Elided keeps as evidence: Seq is its
// place in its run (the order evidence is listed in), Hosts the hosts it
// names (for Elsewhere only).
type OpenRef struct {
	Seq   int
	Ref   Ref
	Hosts []string
}

// ElidedWith is what Elided counts of the operations with one
// counterparty.
type ElidedWith struct {
	N, Coarse, Spent int
}

// Keep says whether an operation must stay in a History's Ops whatever the
// time: an open one (every open operation is read), and a spent one that
// cannot be attributed to a counterparty of some kind (read by the
// unattributable rules).
func Keep(o Op) bool {
	if o.Open {
		return true
	}
	return o.Spent && (o.unattributableFor(KindAddress) != "" || o.unattributableFor(KindHost) != "")
}

// Horizon is the latest time of o that a decision's windows (and the
// spend ledger's matching of payments) read: the time of its last event
// when it is spent, that of its first when it shows a payment. ok is
// false when one of those times cannot be read: such an operation is
// always read one by one. An operation with neither time has the zero
// time.
func Horizon(o Op) (at time.Time, ok bool) {
	if o.Spent {
		t := o.lastTime()
		if !t.ok {
			return time.Time{}, false
		}
		at = t.at
	}
	if o.shows() {
		t, ok := o.firstTime()
		if !ok {
			return time.Time{}, false
		}
		if t.After(at) {
			at = t
		}
	}
	return at, true
}

// NewElided is an empty Elided.
func NewElided() *Elided {
	return &Elided{Unattributable: map[CounterpartyKind]map[string]int{KindAddress: {}, KindHost: {}},
		With: map[Counterparty]*ElidedWith{}, Both: map[[2]string]int{}, Open: map[Counterparty]*ElidedOpen{}, OpenBoth: map[[2]string]int{}}
}

// Countable says whether AddRun can count o: an open operation must be
// attributable to a counterparty of either kind (the unattributable rule
// reads those one by one).
func Countable(o Op) bool {
	return !o.Open || (o.unattributableFor(KindAddress) == "" && o.unattributableFor(KindHost) == "")
}

// AddRun counts o, the operation at place seq of a run every operation of
// which is counted (and Countable), in order: unlike Add it takes open
// operations, and those spent that cannot be attributed, whose times are
// before the horizon (see Horizon) like every other's. An Elided of such
// runs is merged with MergeAt, so that its open operations' evidence
// keeps its place in the history.
func (e *Elided) AddRun(o Op, seq int) {
	e.Add(o)
	if o.Spent && (o.Money == nil || len(o.Money.Hosts) == 0) {
		e.PaidWithoutHost++
	}
	if !o.Open || o.Money == nil {
		return
	}
	e.OpenOps++
	r := OpenRef{Seq: seq, Ref: o.ref()}
	var keys []string
	add := func(c Counterparty) {
		k := e.key(c)
		if slices.Contains(keys, k) {
			return // the operation names it twice
		}
		w := e.Open[c]
		if w == nil {
			w = &ElidedOpen{}
			e.Open[c] = w
		}
		w.N++
		if len(w.First) < maxEvidence {
			w.First = append(w.First, r)
		}
		keys = append(keys, k)
	}
	for _, p := range o.Money.PayTos {
		add(Counterparty{Kind: KindAddress, Value: p})
	}
	for _, h := range o.Money.Hosts {
		add(Counterparty{Kind: KindHost, Value: h})
	}
	countPairs(keys, e.OpenBoth)
	e.addElsewhere(OpenRef{Seq: seq, Ref: r.Ref, Hosts: o.Money.Hosts})
}

// addElsewhere keeps r in Elsewhere when it is among the first
// maxEvidence open operations that lack some host: the first
// maxEvidence kept are, and a later one when for a host it lacks fewer
// than maxEvidence of those kept lack it too. By induction the kept hold,
// for every host, the first maxEvidence open operations lacking it (a
// host no kept operation names is lacked by every one kept).
func (e *Elided) addElsewhere(r OpenRef) {
	keep := len(e.Elsewhere) < maxEvidence
	for h, n := range e.hostsIn {
		if keep {
			break
		}
		keep = len(e.Elsewhere)-n < maxEvidence && !slices.Contains(r.Hosts, h)
	}
	if !keep {
		return
	}
	e.Elsewhere = append(e.Elsewhere, r)
	if e.hostsIn == nil {
		e.hostsIn = map[string]int{}
	}
	for i, h := range r.Hosts {
		if !slices.Contains(r.Hosts[:i], h) {
			e.hostsIn[h]++
		}
	}
}

// Add counts o, which must not be one to Keep.
func (e *Elided) Add(o Op) {
	e.Ops++
	if o.SettlementUnconfirmed {
		e.SettleUnconfirmed++
	}
	for _, k := range []CounterpartyKind{KindAddress, KindHost} {
		if why := o.unattributableFor(k); why != "" {
			e.Unattributable[k][why]++
		}
	}
	if o.Money == nil {
		return
	}
	count := func(c Counterparty, seen []string, v string) {
		for _, s := range seen {
			if s == v {
				return // the operation names it twice
			}
		}
		w := e.With[c]
		if w == nil {
			w = &ElidedWith{}
			e.With[c] = w
		}
		w.N++
		if !o.RolesKnown {
			w.Coarse++
		}
		if o.Spent {
			w.Spent++
		}
	}
	for i, p := range o.Money.PayTos {
		count(Counterparty{Kind: KindAddress, Value: p}, o.Money.PayTos[:i], p)
	}
	for i, h := range o.Money.Hosts {
		count(Counterparty{Kind: KindHost, Value: h}, o.Money.Hosts[:i], h)
	}
	var buf [4]string
	keys := buf[:0]
	for _, p := range o.Money.PayTos {
		keys = append(keys, e.key(Counterparty{Kind: KindAddress, Value: p}))
	}
	for _, h := range o.Money.Hosts {
		keys = append(keys, e.key(Counterparty{Kind: KindHost, Value: h}))
	}
	countPairs(keys, e.Both)
}

// Seal says no operation will be added to e: it lets go of the copies of
// counterparty keys it held only to share them while it counted.
func (e *Elided) Seal() { e.keys = nil }

// key is cpKey(c), one copy per counterparty for all of e's counts.
func (e *Elided) key(c Counterparty) string {
	if k, ok := e.keys[c]; ok {
		return k
	}
	if e.keys == nil {
		e.keys = map[Counterparty]string{}
	}
	k := cpKey(c)
	e.keys[c] = k
	return k
}

// countPairs adds one to into for each pair of distinct counterparties
// among keys, counting a pair once however often it repeats: one
// operation names each pair of its counterparties once.
func countPairs(keys []string, into map[[2]string]int) {
	if len(keys) < 2 {
		return
	}
	if len(keys) == 2 {
		// The usual operation (one address, one host): one pair at most,
		// without a set to count it once.
		if keys[0] != keys[1] {
			into[pairKey(keys[0], keys[1])]++
		}
		return
	}
	pairs := map[[2]string]bool{}
	for i, a := range keys {
		for _, b := range keys[i+1:] {
			if a != b {
				pairs[pairKey(a, b)] = true
			}
		}
	}
	for k := range pairs {
		into[k]++
	}
}

// cpKey names a counterparty in Elided.Both.
func cpKey(c Counterparty) string { return string(c.Kind) + ":" + c.Value }

// pairKey is the key of two counterparties' keys in Elided.Both, in
// either order.
func pairKey(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// matched is how many operations e counts with c or with pay (each once),
// and whether any of them is judged coarsely.
func (e *Elided) matched(c Counterparty, pay *Counterparty) (n int, coarse bool) {
	w := e.with(c)
	n, coarse = w.N, w.Coarse > 0
	if pay != nil && *pay != c {
		v := e.with(*pay)
		n += v.N
		coarse = coarse || v.Coarse > 0
		if e != nil {
			n -= e.both(pairKey(cpKey(c), cpKey(*pay)))
		}
	}
	return n, coarse
}

// Merge adds what f counts to e; f must not change afterwards (its
// counts by counterparty are read from it when asked).
func (e *Elided) Merge(f *Elided) {
	e.MergeAt(f, 0)
}

// MergeAt is Merge for an Elided of whole runs (AddRun) whose operations
// stand just before the History's Ops[at] (at is len(Ops) when they are
// the last read): their open operations are listed as evidence in that
// place.
func (e *Elided) MergeAt(f *Elided, at int) {
	e.parts = append(e.parts, elidedPart{e: f, at: at})
	for _, p := range f.parts {
		e.parts = append(e.parts, elidedPart{e: p.e, at: at})
	}
	e.Ops += f.Ops
	e.SettleUnconfirmed += f.SettleUnconfirmed
	e.PaidWithoutHost += f.PaidWithoutHost
	for k, why := range f.Unattributable {
		if e.Unattributable[k] == nil {
			e.Unattributable[k] = map[string]int{}
		}
		for w, n := range why {
			e.Unattributable[k][w] += n
		}
	}
}

// with is what e counts of the operations with c (zero when none).
func (e *Elided) with(c Counterparty) ElidedWith {
	if e == nil {
		return ElidedWith{}
	}
	var out ElidedWith
	for _, f := range e.all() {
		if w := f.With[c]; w != nil {
			out.N, out.Coarse, out.Spent = out.N+w.N, out.Coarse+w.Coarse, out.Spent+w.Spent
		}
	}
	return out
}

// both counts the operations that name both counterparties (keys).
func (e *Elided) both(k [2]string) int {
	n := e.Both[k]
	for _, f := range e.parts {
		n += f.e.Both[k]
	}
	return n
}

// all are e's parts and e.
func (e *Elided) all() []*Elided {
	out := make([]*Elided, 0, len(e.parts)+1)
	for _, p := range e.parts {
		out = append(out, p.e)
	}
	return append(out, e)
}

// SetElided records, in h's index (built here when h has none), the
// operations h leaves out; h must not change afterwards.
func (h *History) SetElided(e *Elided) {
	if h.Index == nil {
		h.BuildIndex()
	}
	ix := h.Index
	ix.elided = e
	ix.settleUnconfirmed += e.SettleUnconfirmed
	if u := ix.unattributable[KindHost]; u != nil {
		u.paidWithoutHost += e.PaidWithoutHost
	}
	for k, why := range e.Unattributable {
		u := ix.unattributable[k]
		if u == nil {
			continue
		}
		if len(why) > 0 {
			u.why = maps.Clone(u.why)
		}
		for w, n := range why {
			u.n += n
			u.why[w] += n
		}
	}
}

// ElidedOps is how many operations h leaves out of Ops (see Elided).
func (h History) ElidedOps() int {
	if h.Index == nil || h.Index.elided == nil {
		return 0
	}
	return h.Index.elided.Ops
}

// placedRef is an open operation a merged Elided lists as evidence, with
// its place: just before History.Ops[at], seq in its run.
type placedRef struct {
	at, seq int
	ref     Ref
}

// parted are e's parts with their places, e itself first (its own
// operations stand before every listed one).
func (e *Elided) parted() []elidedPart {
	return append([]elidedPart{{e: e}}, e.parts...)
}

// openWith counts the open operations e's runs hold with c or with pay
// (each once), and lists the first maxEvidence of them in order.
func (e *Elided) openWith(c Counterparty, pay *Counterparty) (n int, first []placedRef) {
	if e == nil {
		return 0, nil
	}
	for _, p := range e.parted() {
		f := p.e
		a := f.Open[c]
		var b *ElidedOpen
		if pay != nil && *pay != c {
			b = f.Open[*pay]
		}
		if a == nil && b == nil {
			continue
		}
		var x, y []OpenRef
		if a != nil {
			n, x = n+a.N, a.First
		}
		if b != nil {
			n, y = n+b.N, b.First
			if a != nil {
				n -= f.OpenBoth[pairKey(cpKey(c), cpKey(*pay))]
			}
		}
		for (len(x) > 0 || len(y) > 0) && len(first) < maxEvidence {
			var r OpenRef
			switch {
			case len(y) == 0 || (len(x) > 0 && x[0].Seq < y[0].Seq):
				r, x = x[0], x[1:]
			case len(x) == 0 || y[0].Seq < x[0].Seq:
				r, y = y[0], y[1:]
			default: // the operation names both
				r, x, y = x[0], x[1:], y[1:]
			}
			first = append(first, placedRef{at: p.at, seq: r.Seq, ref: r.Ref})
		}
	}
	return n, first
}

// openElsewhere counts the open operations e's runs hold that do not
// name the host, and lists the first maxEvidence of them in order.
func (e *Elided) openElsewhere(host string) (n int, first []placedRef) {
	if e == nil {
		return 0, nil
	}
	c := Counterparty{Kind: KindHost, Value: host}
	for _, p := range e.parted() {
		f := p.e
		n += f.OpenOps
		if w := f.Open[c]; w != nil {
			n -= w.N
		}
		for _, r := range f.Elsewhere {
			if len(first) == maxEvidence {
				break
			}
			if !slices.Contains(r.Hosts, host) {
				first = append(first, placedRef{at: p.at, seq: r.Seq, ref: r.Ref})
			}
		}
	}
	return n, first
}

// placedOps are the operations at positions idx of h.Ops (in order) and
// those placed, in the history's order; a placed one is an Op naming its
// run and operation only (it is listed as evidence, nothing else).
func placedOps(h *History, idx []int32, placed []placedRef) []Op {
	out := make([]Op, 0, len(idx)+len(placed))
	for len(idx) > 0 || len(placed) > 0 {
		if len(placed) > 0 && (len(idx) == 0 || placed[0].at <= int(idx[0])) {
			out = append(out, Op{RunID: placed[0].ref.RunID, OperationID: placed[0].ref.OperationID})
			placed = placed[1:]
			continue
		}
		out = append(out, h.Ops[idx[0]])
		idx = idx[1:]
	}
	return out
}
