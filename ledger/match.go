package ledger

import (
	"slices"
	"sort"
	"time"
)

// Payment is one payment the Trace shows: whom it paid, how much of what,
// and when its payment was first seen.
type Payment struct {
	PayTos []string
	Hosts  []string
	Atomic string
	Asset  string
	At     time.Time
}

// termsKey is what a payment must share with a commitment to show it: the
// payee address (or, for a commitment that names none, the host), the
// asset and the amount.
func termsKey(kind, whom, asset, atomic string) string {
	return kind + "\x00" + whom + "\x00" + asset + "\x00" + atomic
}

func (r *rec) terms() string {
	if r.e.PayTo != "" {
		return termsKey("p", r.e.PayTo, r.e.Asset, r.e.Atomic)
	}
	return termsKey("h", r.e.Host, r.e.Asset, r.e.Atomic)
}

// addTerms files a counting commitment under its terms (take).
func (b *Book) addTerms(r *rec) {
	k := r.terms()
	b.byTerms[k] = append(b.byTerms[k], r)
}

func (b *Book) dropTerms(r *rec) {
	if b.shownSet[r] {
		// Its payment is free to show another commitment: only a whole
		// match says which.
		b.rematch = true
	}
	k := r.terms()
	list := b.byTerms[k]
	for i, x := range list {
		if x == r {
			b.byTerms[k] = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(b.byTerms[k]) == 0 {
		delete(b.byTerms, k)
	}
	delete(b.shownSet, r)
}

// matchNew sees whether a commitment just taken in could be shown by a
// payment the Book already matched (one at or after its time, of its
// terms): then the next Match matches again.
func (b *Book) matchNew(r *rec) {
	b.addTerms(r)
	ats := b.payIdx[r.terms()]
	for i := len(ats) - 1; i >= 0; i-- {
		if !ats[i].Before(r.at) {
			b.matchedFP = ""
			b.rematch = true
			return
		}
	}
}

// paid is one payment a Match took in: its terms keys (by address, then
// by host) and the commitment it shows, if any.
type paid struct {
	p    Payment
	keys []string
	by   *rec
}

// paymentKeys are the terms keys a payment can show a commitment under,
// in the order Match tries them (addresses first).
func paymentKeys(p *Payment) []string {
	keys := make([]string, 0, len(p.PayTos)+len(p.Hosts))
	for _, a := range p.PayTos {
		keys = append(keys, termsKey("p", a, p.Asset, p.Atomic))
	}
	for _, h := range p.Hosts {
		keys = append(keys, termsKey("h", h, p.Asset, p.Atomic))
	}
	return keys
}

// remember keeps what a whole match found, for matchMore: only when the
// payments were in time order.
func (b *Book) remember(ps []Payment, keys [][]string, by []*rec) {
	b.paid = b.paid[:0]
	b.paidOK = slices.IsSortedFunc(ps, func(x, y Payment) int { return x.At.Compare(y.At) })
	if !b.paidOK {
		b.paid = nil
		return
	}
	for i := range ps {
		b.paid = append(b.paid, paid{p: ps[i], keys: keys[i], by: by[i]})
	}
}

// samePayment says whether two payments are the same one.
func samePayment(x, y *Payment) bool {
	return x.At.Equal(y.At) && x.Atomic == y.Atomic && x.Asset == y.Asset && slices.Equal(x.PayTos, y.PayTos) && slices.Equal(x.Hosts, y.Hosts)
}

// matchMore is Match taking in only what changed since the last match,
// when that gives what a whole match gives; it reports whether it did
// (when not, nothing was changed).
//
// The payments last matched, in time order, must still lead ps, less some
// of the earliest; those that follow must each be later than every other
// (a payment later than every other can only show one more commitment:
// the first, in the order a whole match tries them, that nothing shows
// and whose span holds it). A payment let go may only have shown a
// commitment that no payment left could show; nothing since the last
// match may have freed a payment (a release or let-go of a commitment
// shown) or made a new commitment that a payment already matched could
// show. Otherwise the whole match runs.
func (b *Book) matchMore(ps []Payment) bool {
	if !b.paidOK || b.rematch || b.noMatchMore {
		return false
	}
	old := b.paid
	k := len(old)
	if len(ps) > 0 {
		k = sort.Search(len(old), func(i int) bool { return !old[i].p.At.Before(ps[0].At) })
	}
	kept := len(old) - k
	if len(ps) < kept {
		return false
	}
	for j := range kept {
		if !samePayment(&old[k+j].p, &ps[j]) {
			return false
		}
	}
	fresh := ps[kept:]
	for j := range fresh {
		if j+kept > 0 && !fresh[j].At.After(ps[j+kept-1].At) {
			return false
		}
	}
	// A commitment shown by a payment let go is shown by none only if no
	// payment kept of its terms falls in its span: the kept ones are all
	// after its time, so the earliest of them decides.
	gone := old[:k]
	var dropped map[string]int
	for i := range gone {
		if gone[i].by == nil {
			continue
		}
		if dropped == nil {
			dropped = map[string]int{}
			for j := range gone {
				for _, key := range gone[j].keys {
					dropped[key]++
				}
			}
		}
		r := gone[i].by
		ats, n := b.payIdx[r.terms()], dropped[r.terms()]
		if n > len(ats) {
			return false
		}
		if ats = ats[n:]; len(ats) > 0 && (r.until.IsZero() || ats[0].Before(r.until)) {
			return false
		}
	}
	for i := range gone {
		for _, key := range gone[i].keys {
			if ats := b.payIdx[key]; len(ats) > 1 {
				b.payIdx[key] = ats[1:]
			} else {
				delete(b.payIdx, key)
			}
		}
		if r := gone[i].by; r != nil {
			delete(b.shownSet, r)
			b.setCounts(r, func() { r.shown = false })
		}
	}
	clear(old[:k])
	kept2 := old[k:]
	for i := range fresh {
		p := paid{p: fresh[i], keys: paymentKeys(&fresh[i])}
		for _, key := range p.keys {
			if p.by == nil {
				p.by = b.firstToShow(key, p.p.At)
			}
			b.payIdx[key] = append(b.payIdx[key], p.p.At)
		}
		if r := p.by; r != nil {
			b.shownSet[r] = true
			b.setCounts(r, func() { r.shown = true })
		}
		kept2 = append(kept2, p)
	}
	b.paid = kept2
	b.moreMatches++
	return true
}

// firstToShow is the commitment of terms key that a payment at at, later
// than every other, shows: the first in time order that no payment shows,
// not released, made at or before at and still counting on its own then.
func (b *Book) firstToShow(key string, at time.Time) *rec {
	recs := b.byTerms[key]
	if !slices.IsSortedFunc(recs, func(x, y *rec) int { return x.at.Compare(y.at) }) {
		recs = append([]*rec(nil), recs...)
		sort.SliceStable(recs, func(x, y int) bool { return recs[x].at.Before(recs[y].at) })
	}
	for _, r := range recs {
		if r.at.After(at) {
			break
		}
		if r.released || r.shown {
			continue
		}
		if r.until.IsZero() || at.Before(r.until) {
			return r
		}
	}
	return nil
}

// Match marks the commitments the Trace's payments show: those then count
// once, as the payment the Trace holds, and no longer as commitments. fp
// names the set of payments: when it is the one matched last, and no
// commitment that a payment could show was taken in since, nothing is done.
//
// A payment shows a commitment of its terms made at or before it, while
// the commitment still counted on its own (before its Until); each payment
// shows at most one commitment, the oldest it can, and each commitment is
// shown by at most one payment. Commitments that name a payee address are
// matched first, by address; those that name only a host are matched by
// host with the payments left.
func (b *Book) Match(fp string, payments func() []Payment) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if fp != "" && fp == b.matchedFP {
		return
	}
	ps := payments()
	if b.matchMore(ps) {
		b.matchedFP = fp
		return
	}
	byKey := map[string][]int{}
	idx := map[string][]time.Time{}
	add := func(k string, i int) {
		byKey[k] = append(byKey[k], i)
		idx[k] = append(idx[k], ps[i].At)
	}
	keys := make([][]string, len(ps))
	for i := range ps {
		keys[i] = paymentKeys(&ps[i])
		for _, k := range keys[i] {
			add(k, i)
		}
	}
	for k := range byKey {
		list := byKey[k]
		sort.SliceStable(list, func(x, y int) bool { return ps[list[x]].At.Before(ps[list[y]].At) })
	}
	shown := map[*rec]bool{}
	used := make([]bool, len(ps))
	by := make([]*rec, len(ps))
	for _, phase := range []string{"p", "h"} {
		for k, list := range byKey {
			if k[0] != phase[0] {
				continue
			}
			recs := b.byTerms[k]
			if len(recs) == 0 {
				continue
			}
			// Commitments are filed in the order taken, nearly always
			// their time order: then none is copied or sorted.
			sorted := recs
			if !slices.IsSortedFunc(recs, func(x, y *rec) int { return x.at.Compare(y.at) }) {
				sorted = append([]*rec(nil), recs...)
				sort.SliceStable(sorted, func(x, y int) bool { return sorted[x].at.Before(sorted[y].at) })
			}
			for _, r := range sorted {
				if r.released {
					continue
				}
				// list is in time order: the payments before r.at are
				// passed over at once, and none from the first at or
				// past r.until on can show it.
				from := sort.Search(len(list), func(j int) bool { return !ps[list[j]].At.Before(r.at) })
				for _, i := range list[from:] {
					if !r.until.IsZero() && !ps[i].At.Before(r.until) {
						break
					}
					if used[i] {
						continue
					}
					used[i] = true
					by[i] = r
					shown[r] = true
					break
				}
			}
		}
	}
	for r := range b.shownSet {
		if !shown[r] {
			b.setCounts(r, func() { r.shown = false })
		}
	}
	for r := range shown {
		if !r.shown {
			b.setCounts(r, func() { r.shown = true })
		}
	}
	b.shownSet = shown
	b.payIdx = idx
	b.matchedFP = fp
	b.remember(ps, keys, by)
	b.rematch = false
	b.wholeMatches++
}
