package ledger

import (
	"fmt"
	"sort"
	"time"
)

// Commitment is a signed receipt that commits a payment (or starts the
// ledger: Genesis), as the decision chains hold it.
type Commitment struct {
	ID      string
	TS      time.Time
	Genesis bool
}

// AuditReport is what Audit found.
type AuditReport struct {
	// Entries is how many lines the ledger holds, Lanes how many lanes.
	Entries, Lanes int
	// Sealed says whether every seal was checked (a key was given).
	Sealed bool
	// Findings are what only tampering makes: a line that does not verify
	// or does not link, a gap, a replay, an approval used twice, a signed
	// commitment without its entry, a start without its entry.
	Findings []string
	// Incomplete is what a crash between an entry and its receipt leaves:
	// an entry whose receipt no chain holds.
	Incomplete []string
	// Mandated are the entries charged to a mandate and not released, in
	// the order they were committed.
	Mandated []Entry
	// Authorizations are the authorization entries by the receipt of the
	// decision they commit: what an authorized line of the review log must
	// stand on (see the audit command).
	Authorizations map[string]Entry
}

// Audit checks a whole ledger (every lane, from its start) against the
// commitment receipts of the decision chains. Under a nil key the seals are
// not checked (the lines are read as they say), everything else is.
func Audit(raws []Raw, key []byte, tenant string, receipts []Commitment) AuditReport {
	var rep AuditReport
	b := NewBook(key, tenant, 0)
	b.noSeal = key == nil
	rep.Sealed = key != nil
	lanes := map[int]bool{}
	for _, r := range raws {
		if r.Line != nil {
			lanes[r.Lane] = true
			rep.Entries++
		}
	}
	rep.Lanes = len(lanes)
	rep.Findings = append(rep.Findings, b.Apply(raws)...)
	signed := map[string]bool{}
	gen, at, started := b.Genesis()
	for _, c := range receipts {
		signed[c.ID] = true
		switch {
		case c.Genesis:
			if !started || gen != c.ID {
				rep.Findings = append(rep.Findings, fmt.Sprintf("receipt %s started the spend ledger, but the ledger does not hold that start: the ledger was emptied or replaced", c.ID))
			}
		case started && !c.TS.Before(at) && !b.Has(c.ID):
			rep.Findings = append(rep.Findings, fmt.Sprintf("receipt %s (signed %s) commits a payment the spend ledger holds no entry of: the entry was removed", c.ID, c.TS.UTC().Format(time.RFC3339)))
		}
	}
	var missing []string
	b.mu.Lock()
	for id, r := range b.byReceipt {
		if !signed[id] && !r.carried(at) {
			missing = append(missing, fmt.Sprintf("the ledger entry of receipt %s (lane %d, entry %d, %s) has no receipt in any chain: a writer stopped between the two (the commitment counts until %s)", id, r.e.Lane, r.e.Seq, r.e.At, untilText(r.e.Until)))
		}
	}
	if b.genesis != nil && !signed[b.genesis.Receipt] {
		missing = append(missing, fmt.Sprintf("the ledger's start (receipt %s) has no receipt in any chain: a writer stopped between the two", b.genesis.Receipt))
	}
	rep.Authorizations = map[string]Entry{}
	for id, r := range b.byReceipt {
		if r.e.Mandate != "" && !r.released {
			rep.Mandated = append(rep.Mandated, r.e)
		}
		if r.e.Kind == KindAuthorization {
			rep.Authorizations[id] = r.e
		}
	}
	b.mu.Unlock()
	sort.Slice(rep.Mandated, func(i, j int) bool {
		if rep.Mandated[i].At != rep.Mandated[j].At {
			return rep.Mandated[i].At < rep.Mandated[j].At
		}
		return rep.Mandated[i].Receipt < rep.Mandated[j].Receipt
	})
	sort.Strings(missing)
	rep.Incomplete = missing
	return rep
}

// carried says whether an entry was carried into the ledger at its start
// (an earlier build's reservation record, whose receipt may be archived or
// gone): it is older than the start.
func (r *rec) carried(genesis time.Time) bool {
	return !genesis.IsZero() && r.at.Before(genesis)
}

func untilText(u string) string {
	if u == "" {
		return "the Trace shows it"
	}
	return u
}

// Unsealed reads a whole ledger without the server's key, for a reader
// that may not hold it (status, review show): the lines' links and order
// are checked, their seals are not, so what it gives is what the lines say
// and is never to be decided on. It gives the entries that count at now on
// their own (not released, not lapsed; whether the Trace shows them is not
// judged) and what does not hold together.
func Unsealed(raws []Raw, tenant string, now time.Time) ([]Entry, []string) {
	b := NewBook(nil, tenant, 0)
	b.noSeal = true
	found := b.Apply(raws)
	return b.Live(now), found
}

// Sealed says whether key seals the ledger: some line of it verifies under
// the key (a reader that holds several candidate keys picks the one the
// server used, and then checks every line under it).
func Sealed(raws []Raw, key []byte) bool {
	for _, r := range raws {
		if r.Line == nil {
			continue
		}
		if _, err := Parse(r.Line, key); err == nil {
			return true
		}
	}
	return false
}
