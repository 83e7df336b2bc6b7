package guard

import (
	"maps"
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
	// parts are Elideds merged into this one by Merge whose With and Both
	// are read per counterparty when asked, not added up ahead (a
	// restart's first decision reads one or two counterparties of
	// hundreds of runs).
	parts []*Elided
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
		t, err := time.Parse(time.RFC3339Nano, o.FirstEventAt)
		if err != nil {
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
		With: map[Counterparty]*ElidedWith{}, Both: map[[2]string]int{}}
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
	var keys []string
	for _, p := range o.Money.PayTos {
		keys = append(keys, cpKey(Counterparty{Kind: KindAddress, Value: p}))
	}
	for _, h := range o.Money.Hosts {
		keys = append(keys, cpKey(Counterparty{Kind: KindHost, Value: h}))
	}
	if len(keys) > 1 {
		pairs := map[[2]string]bool{}
		for i, a := range keys {
			for _, b := range keys[i+1:] {
				if a != b {
					pairs[pairKey(a, b)] = true
				}
			}
		}
		for k := range pairs {
			e.Both[k]++
		}
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
	e.parts = append(append(e.parts, f), f.parts...)
	e.Ops += f.Ops
	e.SettleUnconfirmed += f.SettleUnconfirmed
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
	for _, f := range append(e.parts, e) {
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
		n += f.Both[k]
	}
	return n
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
