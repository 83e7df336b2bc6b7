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
	// unattributable are, per question kind, the operations that cannot be
	// told to be or not to be with a counterparty of that kind.
	unattributable    map[CounterpartyKind][]int32
	settleUnconfirmed int
}

// BuildIndex indexes h.Ops; h must not change afterwards.
func (h *History) BuildIndex() {
	ix := &HistoryIndex{byPayTo: map[string][]int32{}, byHost: map[string][]int32{}, unattributable: map[CounterpartyKind][]int32{}}
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
			if o.unattributableFor(k) != "" {
				ix.unattributable[k] = append(ix.unattributable[k], n)
			}
		}
		if o.SettlementUnconfirmed {
			ix.settleUnconfirmed++
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
