package guard

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
}

type unattributed struct {
	n               int
	open            []int32
	spent           []int32
	paidWithoutHost int
	why             map[string]int
}

// BuildIndex indexes h.Ops; h must not change afterwards.
func (h *History) BuildIndex() {
	ix := &HistoryIndex{byPayTo: map[string][]int32{}, byHost: map[string][]int32{}, unattributable: map[CounterpartyKind]*unattributed{}}
	for _, k := range []CounterpartyKind{KindAddress, KindHost} {
		ix.unattributable[k] = &unattributed{why: map[string]int{}}
	}
	for i, o := range h.Ops {
		n := int32(i)
		if o.Money != nil {
			for _, p := range o.Money.PayTos {
				ix.byPayTo[p] = append(ix.byPayTo[p], n)
			}
			for _, host := range o.Money.Hosts {
				ix.byHost[host] = append(ix.byHost[host], n)
			}
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
		if o.Open {
			ix.open = append(ix.open, n)
		}
	}
	h.Index = ix
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
