package guard

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestElidedHistoryDecidesAsTheWholeHistory holds Decide on a history
// that counts, rather than lists, the operations no window from its
// horizon reads (Elided: what a restart reads from the saved index's
// digests) to Decide on every operation, over random histories and
// questions (addresses, hosts, a host with a payee address, several
// payees, coarse, unattributable, unsettled, times that do not read, old
// and recent operations), every window rule on and off, new payees
// reviewed.
func TestElidedHistoryDecidesAsTheWholeHistory(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 7))
	b := strings.ToLower(addrB)
	cfgs := []*Config{
		mustConfig(t, `{"reviewAbove":"100","perCounterpartyLimit":{"amount":"0.50","windowHours":6},"totalLimit":{"amount":"2","windowHours":12},"velocity":{"perCounterparty":{"count":4,"windowMinutes":120},"total":{"count":9,"windowMinutes":300}},"duplicatePayment":{"windowMinutes":600},"reviewNewPayee":true}`),
		mustConfig(t, `{"reviewNewPayee":true}`),
		mustConfig(t, `{}`),
	}
	mods := []func(*Op){
		unsettled, toB, badTime, noPayTo, noHost, escrow, sepolia, badAmount, custom,
		func(o *Op) { o.Money.PayTos = append(o.Money.PayTos, b) },
		func(o *Op) { o.Money.PayTos = append(o.Money.PayTos, o.Money.PayTos...) },
		func(o *Op) { o.Money.Resources = []string{"https://api.example.com/x"} },
		func(o *Op) { o.Money.Hosts = append(o.Money.Hosts, "other.example") },
		func(o *Op) { o.Spent = false },
		func(o *Op) { o.SettlementUnconfirmed = true },
	}
	questions := []RawRequest{
		{Counterparty: addrA, Amount: "0.10", Resource: "https://api.example.com/x"},
		{Counterparty: addrB, Amount: "0.10"},
		{Counterparty: "api.example.com", Amount: "0.10"},
		{Counterparty: "other.example", Amount: "0.10", PayTo: addrA},
		{Counterparty: "api.example.com", Amount: "0.10", PayTo: addrB, Resource: "https://api.example.com/x"},
		{Counterparty: "nobody.example", Amount: "0.10"},
	}
	elidedSome := 0
	for round := range 2000 {
		var ops []Op
		for i := range rng.IntN(60) {
			var opts []func(*Op)
			for range rng.IntN(3) {
				m := mods[rng.IntN(len(mods))]
				opts = append(opts, func(o *Op) {
					if o.Money != nil { // not after escrow
						m(o)
					}
				})
			}
			age := time.Duration(rng.IntN(20*24*60)) * time.Minute
			if rng.IntN(3) == 0 {
				age = time.Duration(rng.IntN(24*60)) * time.Minute
			}
			ops = append(ops, op(fmt.Sprintf("o%d", i), int64(1+rng.IntN(5))*50_000, age, opts...))
		}
		cfg := cfgs[rng.IntN(len(cfgs))]
		since := fixedNow.Add(-longestWindow(cfg) - time.Minute)
		whole := History{Ops: ops, Runs: 3}
		whole.BuildIndex()
		part := History{Runs: 3}
		// Counted in three runs' digests, merged as a restart does.
		runs := []*Elided{NewElided(), NewElided(), NewElided()}
		for _, o := range ops {
			at, ok := Horizon(o)
			if Keep(o) || !ok || !at.Before(since) {
				part.Ops = append(part.Ops, o)
				continue
			}
			runs[rng.IntN(len(runs))].Add(o)
		}
		el := NewElided()
		el.Merge(runs[0])
		runs[1].Merge(runs[2])
		el.Merge(runs[1])
		if el.Ops > 0 {
			elidedSome++
		}
		part.SetElided(el)
		for _, q := range questions {
			req, err := ParseRequest(q, cfg)
			if err != nil {
				t.Fatal(err)
			}
			dw, dp := Decide(req, whole, cfg, fixedNow), Decide(req, part, cfg, fixedNow)
			if !reflect.DeepEqual(dp, dw) {
				t.Fatalf("round %d, %+v (%d of %d operations counted, not listed):\nfrom the digest:\n%+v\nfrom every operation:\n%+v", round, q, el.Ops, len(ops), dp, dw)
			}
		}
	}
	if elidedSome < 1000 {
		t.Fatalf("only %d of 2000 histories left an operation out: the test proves little", elidedSome)
	}
}

// longestWindow is the longest window cfg reads (as the engine's horizon).
func longestWindow(cfg *Config) time.Duration {
	h := max(cfg.Limit.Window, cfg.DuplicateWindow, cfg.ReservationTTL)
	if cfg.TotalLimit != nil {
		h = max(h, cfg.TotalLimit.Window)
	}
	for _, v := range []*CountLimit{cfg.Velocity.PerCounterparty, cfg.Velocity.Total} {
		if v != nil {
			h = max(h, v.Window)
		}
	}
	return h
}
