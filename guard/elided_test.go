package guard

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
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

// TestCountedRunsDecideAsTheWholeHistory holds Decide on a history whose
// old runs are counted whole, their open operations too (Elided.AddRun:
// what a restart reads of a run with no recent operation), to Decide on
// every operation: runs in order, each counted, read as its kept
// operations and counts (Add), or listed, over random histories with many
// open operations to a few hosts and addresses (so that evidence is cut
// at maxEvidence inside and across runs), every window rule on and off.
func TestCountedRunsDecideAsTheWholeHistory(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 9))
	b := strings.ToLower(addrB)
	cfgs := []*Config{
		mustConfig(t, `{"reviewAbove":"100","perCounterpartyLimit":{"amount":"0.50","windowHours":6},"totalLimit":{"amount":"2","windowHours":12},"velocity":{"perCounterparty":{"count":4,"windowMinutes":120},"total":{"count":9,"windowMinutes":300}},"duplicatePayment":{"windowMinutes":600},"reviewNewPayee":true}`),
		mustConfig(t, `{"reviewNewPayee":true,"maxOpenPartialPerCounterparty":3}`),
		mustConfig(t, `{}`),
		mustConfig(t, `{"unattributableHistory":"ignore"}`),
	}
	mods := []func(*Op){
		unsettled, unsettled, unsettled, toB, badTime, noPayTo, noHost, escrow, sepolia, badAmount, custom, faulted,
		func(o *Op) { o.Money.PayTos = append(o.Money.PayTos, b) },
		func(o *Op) { o.Money.PayTos = append(o.Money.PayTos, o.Money.PayTos...) },
		func(o *Op) { o.Money.Hosts = append(o.Money.Hosts, o.Money.Hosts...) },
		func(o *Op) { o.Money.Resources = []string{"https://api.example.com/x"} },
		func(o *Op) { o.Money.Hosts = append(o.Money.Hosts, "other.example") },
		func(o *Op) { o.Money.Hosts = []string{"third.example"} },
		func(o *Op) { o.Money.Hosts = []string{"third.example", "other.example"} },
		func(o *Op) { o.Spent = false },
		func(o *Op) { o.SettlementUnconfirmed = true },
		func(o *Op) { o.FirstEventAt = "" },
	}
	questions := []RawRequest{
		{Counterparty: addrA, Amount: "0.10", Resource: "https://api.example.com/x"},
		{Counterparty: addrB, Amount: "0.10"},
		{Counterparty: "api.example.com", Amount: "0.10"},
		{Counterparty: "other.example", Amount: "0.10"},
		{Counterparty: "third.example", Amount: "0.10"},
		{Counterparty: "other.example", Amount: "0.10", PayTo: addrA},
		{Counterparty: "api.example.com", Amount: "0.10", PayTo: addrB, Resource: "https://api.example.com/x"},
		{Counterparty: "third.example", Amount: "0.10", PayTo: addrA},
		{Counterparty: "nobody.example", Amount: "0.10"},
	}
	counted, cut := 0, 0
	for round := range 2000 {
		cfg := cfgs[rng.IntN(len(cfgs))]
		since := fixedNow.Add(-longestWindow(cfg) - time.Minute)
		nRuns := 1 + rng.IntN(5)
		whole := History{Runs: nRuns}
		part := History{Runs: nRuns}
		el := NewElided()
		countedOpen := 0
		for r := range nRuns {
			var ops []Op
			recent := rng.IntN(3) == 0
			// A clean run draws from the modifications that leave every
			// operation countable (the first three open it).
			pool := mods
			if rng.IntN(2) == 0 {
				pool = slices.Concat(mods[:4], mods[8:10], mods[11:21])
			}
			for i := range rng.IntN(80) {
				var opts []func(*Op)
				for range rng.IntN(3) {
					m := pool[rng.IntN(len(pool))]
					opts = append(opts, func(o *Op) {
						if o.Money != nil { // not after escrow
							m(o)
						}
					})
				}
				age := 14*24*time.Hour + time.Duration(rng.IntN(6*24*60))*time.Minute
				if recent && rng.IntN(8) == 0 {
					age = time.Duration(rng.IntN(24*60)) * time.Minute
				}
				o := op(fmt.Sprintf("r%d-o%d", r, i), int64(1+rng.IntN(5))*50_000, age, append([]func(*Op){inRun(fmt.Sprintf("run-%d", r)), func(o *Op) { o.FirstEventAt = o.LastEventAt }}, opts...)...)
				ops = append(ops, o)
			}
			whole.Ops = append(whole.Ops, ops...)
			// As HistorySince reads a run: listed whole when an operation
			// it would count is recent; counted whole when every one is old
			// and countable (and the run is not read the older way, at
			// random); else its kept operations listed and the rest counted.
			elidable, countable := true, rng.IntN(4) != 0
			for _, o := range ops {
				at, ok := Horizon(o)
				old := ok && at.Before(since)
				if !Keep(o) && !old {
					elidable = false
				}
				if !old || !Countable(o) {
					countable = false
				}
			}
			switch {
			case !elidable:
				part.Ops = append(part.Ops, ops...)
			case countable:
				c := NewElided()
				for i, o := range ops {
					c.AddRun(o, i)
				}
				countedOpen += c.OpenOps
				el.MergeAt(c, len(part.Ops))
			default:
				c := NewElided()
				for _, o := range ops {
					if Keep(o) {
						part.Ops = append(part.Ops, o)
					} else {
						c.Add(o)
					}
				}
				el.Merge(c)
			}
		}
		whole.BuildIndex()
		part.BuildIndex()
		part.SetElided(el)
		if countedOpen > 0 {
			counted++
		}
		if countedOpen > maxEvidence {
			cut++
		}
		for _, q := range questions {
			req, err := ParseRequest(q, cfg)
			if err != nil {
				t.Fatal(err)
			}
			dw, dp := Decide(req, whole, cfg, fixedNow), Decide(req, part, cfg, fixedNow)
			if !reflect.DeepEqual(dp, dw) {
				t.Fatalf("round %d, %+v (%d of %d operations counted, %d open):\nfrom the counts:\n%+v\nfrom every operation:\n%+v", round, q, el.Ops, len(whole.Ops), countedOpen, dp.Text(), dw.Text())
			}
		}
	}
	if counted < 1000 || cut < 100 {
		t.Fatalf("%d of 2000 histories counted an open operation, %d more than %d: the test proves little", counted, cut, maxEvidence)
	}
}
