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
	for _, t := range b.payIdx[r.terms()] {
		if !t.Before(r.at) {
			b.matchedFP = ""
			return
		}
	}
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
	byKey := map[string][]int{}
	idx := map[string][]time.Time{}
	add := func(k string, i int) {
		byKey[k] = append(byKey[k], i)
		idx[k] = append(idx[k], ps[i].At)
	}
	for i, p := range ps {
		for _, a := range p.PayTos {
			add(termsKey("p", a, p.Asset, p.Atomic), i)
		}
		for _, h := range p.Hosts {
			add(termsKey("h", h, p.Asset, p.Atomic), i)
		}
	}
	for k := range byKey {
		list := byKey[k]
		sort.SliceStable(list, func(x, y int) bool { return ps[list[x]].At.Before(ps[list[y]].At) })
	}
	shown := map[*rec]bool{}
	used := make([]bool, len(ps))
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
}
