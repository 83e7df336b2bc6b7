package guard

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestDecideWithIndexAgreesAtRandom holds Decide with the index (each
// operation's times read once, the operations with the counterparty listed
// by position, those a window counts found by their time), built at once
// or extended, to Decide walking every operation, over random histories
// and questions: addresses, hosts, a host with the payee address beside
// it, operations naming several payees, times out of order or that do not
// read, and every window rule on.
func TestDecideWithIndexAgreesAtRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(40, 2))
	b := strings.ToLower(addrB)
	cfgs := []*Config{
		mustConfig(t, `{"reviewAbove":"100","perCounterpartyLimit":{"amount":"0.50","windowHours":6},"totalLimit":{"amount":"2","windowHours":12},"velocity":{"perCounterparty":{"count":4,"windowMinutes":120},"total":{"count":9,"windowMinutes":300}},"duplicatePayment":{"windowMinutes":600}}`),
		mustConfig(t, `{}`),
	}
	mods := []func(*Op){
		unsettled, toB, badTime, noPayTo, noHost, escrow, sepolia, badAmount, custom,
		func(o *Op) { o.Money.PayTos = append(o.Money.PayTos, b) },
		func(o *Op) { o.Money.PayTos = append(o.Money.PayTos, o.Money.PayTos...) },
		func(o *Op) { o.Money.Resources = []string{"https://api.example.com/x"} },
		// Times in another zone, that read but that Unix nanoseconds
		// cannot hold, and a first event's time (CacheTimes reads both).
		func(o *Op) {
			if t, err := time.Parse(time.RFC3339Nano, o.LastEventAt); err == nil {
				o.LastEventAt = t.In(time.FixedZone("X", -5400)).Format(time.RFC3339Nano)
			}
		},
		func(o *Op) { o.LastEventAt = "2400-01-01T00:00:00Z" },
		func(o *Op) { o.FirstEventAt = o.LastEventAt },
	}
	questions := []RawRequest{
		{Counterparty: addrA, Amount: "0.10", Resource: "https://api.example.com/x"},
		{Counterparty: addrB, Amount: "0.10"},
		{Counterparty: "api.example.com", Amount: "0.10"},
		{Counterparty: "other.example", Amount: "0.10", PayTo: addrA},
		{Counterparty: "api.example.com", Amount: "0.10", PayTo: addrB, Resource: "https://api.example.com/x"},
	}
	for round := range 1000 {
		var ops []Op
		for i := range rng.IntN(40) {
			var opts []func(*Op)
			for range rng.IntN(3) {
				m := mods[rng.IntN(len(mods))]
				opts = append(opts, func(o *Op) {
					if o.Money != nil { // not after escrow
						m(o)
					}
				})
			}
			ops = append(ops, op(fmt.Sprintf("o%d", i), int64(1+rng.IntN(5))*50_000, time.Duration(rng.IntN(48*60))*time.Minute, opts...))
		}
		var reserved []Op
		if rng.IntN(3) == 0 {
			reserved = append(reserved, op("held", 100_000, time.Minute, func(o *Op) { o.Reserved = true }))
		}
		cfg := cfgs[rng.IntN(len(cfgs))]
		req, err := ParseRequest(questions[rng.IntN(len(questions))], cfg)
		if err != nil {
			t.Fatal(err)
		}
		plain := History{Ops: ops, Runs: 1, Reserved: reserved}
		indexed := History{Ops: ops, Runs: 1, Reserved: reserved}
		indexed.BuildIndex()
		// An index built on part of the history and extended to the rest
		// (a replay) is the same index.
		extended := History{Ops: ops[:rng.IntN(len(ops)+1)], Runs: 1, Reserved: reserved}
		extended.BuildIndex()
		extended.Ops = ops
		extended.ExtendIndex()
		d, di := Decide(req, plain, cfg, fixedNow), Decide(req, indexed, cfg, fixedNow)
		// The same operations with their times parsed once beforehand (as
		// the catalog keeps them) decide the same, indexed or walked.
		cachedOps := make([]Op, len(ops))
		for i, o := range ops {
			cachedOps[i] = CacheTimes(o)
		}
		cachedIndexed := History{Ops: cachedOps, Runs: 1, Reserved: reserved}
		cachedIndexed.BuildIndex()
		if dc := Decide(req, cachedIndexed, cfg, fixedNow); !reflect.DeepEqual(dc, di) {
			t.Fatalf("round %d: with times cached:\n%+v\nparsed when read:\n%+v", round, dc, di)
		}
		// Extended, the index keeps the times itself from the first
		// operation that does not carry its own (one that Unix
		// nanoseconds cannot hold).
		cachedExtended := History{Ops: cachedOps[:rng.IntN(len(cachedOps)+1)], Runs: 1, Reserved: reserved}
		cachedExtended.BuildIndex()
		cachedExtended.Ops = cachedOps
		cachedExtended.ExtendIndex()
		if dc := Decide(req, cachedExtended, cfg, fixedNow); !reflect.DeepEqual(dc, di) {
			t.Fatalf("round %d: with times cached, the index extended:\n%+v\nparsed when read:\n%+v", round, dc, di)
		}
		if dc := Decide(req, History{Ops: cachedOps, Runs: 1, Reserved: reserved}, cfg, fixedNow); !reflect.DeepEqual(dc, d) {
			t.Fatalf("round %d: walked with times cached:\n%+v\nparsed when read:\n%+v", round, dc, d)
		}
		for i := range ops {
			at, ok := Horizon(ops[i])
			if cat, cok := Horizon(cachedOps[i]); cok != ok || !cat.Equal(at) {
				t.Fatalf("round %d: Horizon of %+v: %v %v cached, %v %v parsed", round, ops[i], cat, cok, at, ok)
			}
		}
		if de := Decide(req, extended, cfg, fixedNow); !reflect.DeepEqual(de, di) {
			t.Fatalf("round %d: with the index extended:\n%+v\nbuilt at once:\n%+v", round, de, di)
		}
		if req.PayTo != "" {
			// Known, left alone: with a payee address beside a host, the
			// index counts every operation it cannot attribute by address
			// (and every paid one without a host), the walk only those not
			// with the host; the history line says those counts.
			for _, x := range []*Decision{&d, &di} {
				x.Figures.Unattributable, x.Figures.PaidWithoutHost = 0, 0
				x.Reasons[len(x.Reasons)-1].Detail = ""
			}
		}
		if !reflect.DeepEqual(di, d) {
			t.Fatalf("round %d: with the index:\n%+v\nwithout:\n%+v", round, di, d)
		}
	}
}

// TestHostAloneCountsOpenElsewhereWithTheIndex holds the index's reading of
// the open operations with other hosts, for a question naming a host
// alone, to the walk's, where there are more of them than the evidence
// lists, interleaved with open operations of the host asked about and open
// ones no host can be tied to.
func TestHostAloneCountsOpenElsewhereWithTheIndex(t *testing.T) {
	cfg := mustConfig(t, `{}`)
	req, err := ParseRequest(RawRequest{Counterparty: "api.example.com", Amount: "0.10"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ops []Op
	elsewhere := 0
	for i := range 90 {
		opts := []func(*Op){unsettled}
		switch i % 3 {
		case 0:
			opts = append(opts, toB)
			elsewhere++
		case 1:
			if i%2 == 1 {
				opts = append(opts, noHost)
			}
		case 2:
			if i%4 == 0 {
				opts = []func(*Op){toB} // settled: not open
			}
		}
		ops = append(ops, op(fmt.Sprintf("o%d", i), 50_000, time.Duration(i)*time.Minute, opts...))
	}
	plain := History{Ops: ops, Runs: 1}
	indexed := History{Ops: ops, Runs: 1}
	indexed.BuildIndex()
	d, di := Decide(req, plain, cfg, fixedNow), Decide(req, indexed, cfg, fixedNow)
	if !reflect.DeepEqual(d, di) {
		t.Fatalf("with the index:\n%+v\nwalking:\n%+v", di, d)
	}
	var found bool
	for _, r := range di.Reasons {
		if r.Rule == RuleUnattributable && strings.Contains(r.Detail, "attributed to other hosts") {
			found = true
			if want := fmt.Sprintf("%d operations paid and not settled are attributed to other hosts", elsewhere); !strings.HasPrefix(r.Detail, want) {
				t.Errorf("detail %q, want it to start %q", r.Detail, want)
			}
			if len(r.Evidence) != maxEvidence || r.Evidence[0].OperationID != "o0" || r.Evidence[1].OperationID != "o3" {
				t.Errorf("evidence %+v, want the first %d in order from o0, o3", r.Evidence, maxEvidence)
			}
		}
	}
	if !found {
		t.Fatalf("no reason names the open operations with other hosts: %+v", di.Reasons)
	}
}

// CacheTimes parses an operation's times as reading them later would:
// the same instant where they read, none where they do not, and nothing
// cached where Unix nanoseconds cannot hold a time that reads (such a time
// is parsed when read, as before).
func TestCacheTimes(t *testing.T) {
	for _, tc := range []struct {
		first, last string
		set         bool
	}{
		{"2026-07-25T11:00:00.123456789Z", "2026-07-25T11:00:01Z", true},
		{"2026-07-25T12:30:00+01:30", "2026-07-25T11:00:00.5-00:00", true},
		{"", "not a time", true},
		{"2026-07-25T11:00:00Z", "2400-01-01T00:00:00Z", false},
		{"1600-01-01T00:00:00Z", "2026-07-25T11:00:00Z", false},
		{"0001-01-01T00:00:00Z", "", false},
	} {
		plain := Op{FirstEventAt: tc.first, LastEventAt: tc.last}
		c := CacheTimes(plain)
		if c.times.set != tc.set {
			t.Errorf("%q %q: cached %v, want %v", tc.first, tc.last, c.times.set, tc.set)
		}
		pf, pok := plain.firstTime()
		cf, cok := c.firstTime()
		pl, cl := plain.lastTime(), c.lastTime()
		if pok != cok || !pf.Equal(cf) || pl.ok != cl.ok || !pl.at.Equal(cl.at) {
			t.Errorf("%q %q: cached first %v %v last %+v; parsed first %v %v last %+v", tc.first, tc.last, cf, cok, cl, pf, pok, pl)
		}
	}
}
