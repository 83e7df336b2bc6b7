package guard

import (
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"
)

func ruleNames(d Decision) []string {
	var out []string
	for _, r := range d.Reasons {
		if r.Rule != RuleHistory {
			out = append(out, r.Rule)
		}
	}
	return out
}

func decideRaw(t *testing.T, cfg *Config, raw RawRequest, h History) Decision {
	t.Helper()
	req, err := ParseRequest(raw, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return Decide(req, h, cfg, fixedNow)
}

// A seller that never settled declared another company's host: a question
// naming the seller's real host is not allow on that declaration; with the
// 402's pay_to it is judged by where the money went.
func TestHostQuestionsCannotBeSteered(t *testing.T) {
	cfg := mustConfig(t, `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "100"}}`)
	// addrA is the lying seller: it never settled, and declared innocent.example.
	lie := op("o1", 1_000_000, time.Hour, unsettled, func(o *Op) { o.Money.Hosts = []string{"innocent.example"} })
	for _, indexed := range []bool{false, true} {
		h := History{Ops: []Op{lie}, Runs: 1}
		if indexed {
			h.BuildIndex()
		}
		d := decideRaw(t, cfg, RawRequest{Counterparty: "https://seller.example/buy", Amount: "0.10"}, h)
		if d.Decision != Review || !slices.Contains(ruleNames(d), RuleUnattributable) || !strings.Contains(d.Reasons[0].Detail, "pass pay_to") {
			t.Fatalf("indexed %v: host alone: %s %+v", indexed, d.Decision, d.Reasons)
		}
		// With the seller's real pay_to, its open payment is matched.
		d = decideRaw(t, cfg, RawRequest{Counterparty: "seller.example", PayTo: addrA, Amount: "0.10"}, h)
		if d.Decision != Review || !slices.Contains(ruleNames(d), RuleOpenPartial) {
			t.Fatalf("indexed %v: host with its pay_to: %s %+v", indexed, d.Decision, d.Reasons)
		}
		// Another payee's host with its own pay_to: nothing bears on it.
		d = decideRaw(t, cfg, RawRequest{Counterparty: "fresh.example", PayTo: strings.TrimPrefix(strings.ToLower(addrB), "0x"), Amount: "0.10"}, h)
		if d.Decision != Allow {
			t.Fatalf("indexed %v: another host with its pay_to (40 hex, no 0x): %s %+v", indexed, d.Decision, d.Reasons)
		}
	}
	if _, err := ParseRequest(RawRequest{Counterparty: addrA, PayTo: addrB, Amount: "1"}, cfg); err == nil {
		t.Fatal("a pay_to that differs from an address counterparty was accepted")
	}
	if _, err := ParseRequest(RawRequest{Counterparty: "a.example", PayTo: "0x12", Amount: "1"}, cfg); err == nil || !strings.Contains(err.Error(), "pay_to") {
		t.Fatalf("a pay_to that is no address: %v", err)
	}
}

// Settled payments no one can attribute count at worst towards a
// counterparty's limit and velocity, and always towards the total.
func TestUnattributableSettledCountsAtWorst(t *testing.T) {
	cfg := mustConfig(t, `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "5"}, "totalLimit": {"amount": "100"},
		"velocity": {"perCounterparty": {"count": 2}}}`)
	noOne := func(o *Op) { o.Money.PayTos, o.Money.Hosts, o.Unattributable = nil, nil, whyNoCounter }
	h := History{Ops: []Op{op("u1", 4_500_000, time.Hour, noOne)}, Runs: 1}
	d := decideRaw(t, cfg, RawRequest{Counterparty: addrB, Amount: "1"}, h)
	if d.Decision != Review || !slices.Contains(ruleNames(d), RuleUnattributable) {
		t.Fatalf("4.5 unattributable + 1 over 5: %s %+v", d.Decision, d.Reasons)
	}
	if d.Figures.Total == nil || d.Figures.Total.Spend.Int64() != 4_500_000 {
		t.Fatalf("the unattributable payment is not in the total: %+v", d.Figures.Total)
	}
	if d := decideRaw(t, cfg, RawRequest{Counterparty: addrB, Amount: "0.5"}, h); d.Decision != Allow {
		t.Fatalf("4.5 + 0.5 is the limit: %s %+v", d.Decision, d.Reasons)
	}
	// Velocity: one payment to addrB, one no one can attribute, this one.
	h = History{Ops: []Op{op("b1", 1, 10*time.Minute, toB), op("u1", 1, 10*time.Minute, noOne)}, Runs: 1}
	if d := decideRaw(t, cfg, RawRequest{Counterparty: addrB, Amount: "0.01"}, h); d.Decision != Review || !slices.Contains(ruleNames(d), RuleUnattributable) {
		t.Fatalf("velocity at worst: %s %+v", d.Decision, d.Reasons)
	}
	if d := decideRaw(t, mustConfig(t, `{"reviewAbove": "100", "unattributableHistory": "ignore", "velocity": {"perCounterparty": {"count": 2}}}`),
		RawRequest{Counterparty: addrB, Amount: "0.01"}, h); d.Decision != Allow {
		t.Fatalf("ignored by the policy: %s %+v", d.Decision, d.Reasons)
	}
}

// A reservation is counted until a recorded payment shows it: paid, first
// event after it, same payee, amount and asset.
func TestReservationShownByPayment(t *testing.T) {
	cfg := mustConfig(t, `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "2"}}`)
	rAt := fixedNow.Add(-30 * time.Minute)
	res := Reservation{ReceiptID: "rcpt_1", Caller: "bot", At: rAt, Until: fixedNow.Add(time.Hour), PayTo: strings.ToLower(addrA), Atomic: bigInt(1_500_000), Asset: USDCBase}
	paidAfter := op("p1", 1_500_000, 10*time.Minute, func(o *Op) { o.FirstEventAt = at(11 * time.Minute) })
	paidBefore := op("p0", 1_500_000, 10*time.Minute, func(o *Op) { o.FirstEventAt = at(40 * time.Minute) })
	for _, tc := range []struct {
		name  string
		ops   []Op
		shown int
		want  string
	}{
		{"nothing recorded: the reservation counts", nil, 0, Allow},
		{"the payment shows it: counted once", []Op{paidAfter}, 1, Allow},
		{"a payment under way before it does not show it", []Op{paidBefore}, 0, Review},
		{"another amount does not show it", []Op{op("p2", 1_000_000, 10*time.Minute, func(o *Op) { o.FirstEventAt = at(11 * time.Minute) })}, 0, Review},
	} {
		h := History{Ops: tc.ops, Runs: 1}
		h.BuildIndex()
		if n := h.Reserve([]Reservation{res}, fixedNow); n != tc.shown {
			t.Errorf("%s: shown %d, want %d", tc.name, n, tc.shown)
		}
		d := decideRaw(t, cfg, RawRequest{Counterparty: addrA, Amount: "0.5"}, h)
		if d.Decision != tc.want {
			t.Errorf("%s: %s %+v", tc.name, d.Decision, d.Reasons)
		}
	}
	h := History{}
	if h.Reserve([]Reservation{{ReceiptID: "old", At: rAt, Until: fixedNow, PayTo: "0x1", Atomic: bigInt(1), Asset: USDCBase}}, fixedNow); len(h.Reserved) != 0 {
		t.Fatal("a lapsed reservation still counts")
	}
}

func bigInt(n int64) *big.Int { return big.NewInt(n) }
