package mandate

import (
	"fmt"
	"math/big"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
)

// Audit holds every use of a mandate the spend ledger records (entries
// naming one, in the order committed, releases excluded: see
// ledger.AuditReport.Mandated) to the mandate as its signed records
// grant it: a trusted grant, with the signatures it needs, not revoked
// before the use, whose terms and bounds cover the use after the uses
// before it. It returns what does not hold, with what the records
// themselves do not verify.
func Audit(set Set, uses []ledger.Entry) []string {
	out := append([]string(nil), set.Findings...)
	spent := map[string]Spent{}
	for _, en := range uses {
		m := set.Mandates[en.Mandate]
		if m == nil {
			out = append(out, fmt.Sprintf("receipt %s (%s, caller %q) is charged to mandate %s, which no signed record of a trusted reviewer grants", en.Receipt, en.At, clip(en.Caller), en.Mandate))
			continue
		}
		at, _ := ledger.ParseTime(en.At)
		a, ok := new(big.Int).SetString(en.Atomic, 10)
		if !ok {
			a = nil
		}
		view := *m
		if m.Revoked != nil {
			if rt, _ := ParseTime(m.Revoked.At); rt.After(at) {
				view.Revoked = nil // revoked after this use
			}
		}
		s := spent[en.Mandate]
		if s.Atomic == nil {
			s.Atomic = new(big.Int)
		}
		// The ledger holds each entry to its store's tenant; an entry
		// written without one is the store's own.
		tenant := en.Tenant
		if tenant == "" {
			tenant = m.Grant.Tenant
		}
		use := Use{Tenant: tenant, Caller: en.Caller, PayTo: en.PayTo, Host: en.Host, Asset: en.Asset, Atomic: a, At: at}
		if why := view.Refuses(use, s); why != "" {
			out = append(out, fmt.Sprintf("receipt %s (%s, caller %q) was allowed under mandate %s, which does not cover it: %s", en.Receipt, en.At, clip(en.Caller), en.Mandate, why))
		}
		if a != nil {
			s.Atomic.Add(s.Atomic, a)
		}
		s.Count++
		spent[en.Mandate] = s
	}
	return out
}
