package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// releasePolicy lets 2.00 go to one counterparty; a call of 1.50 reserves
// most of it for ten minutes.
const releasePolicy = `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "2.00"}, "reservationMinutes": 10}`

func payCall(amount, memo string) (Question, Call) {
	to := strings.ToLower(sellerA)
	return Question{Counterparty: to, Amount: amount},
		Call{Tool: "send_usdc", Arguments: []byte(`{"amount":"` + amount + `","memo":"` + memo + `","to":"` + to + `"}`)}
}

func checkCall(t *testing.T, e *Engine, amount, memo string) Answer {
	t.Helper()
	q, c := payCall(amount, memo)
	a, err := e.CheckCall(context.Background(), "bot", q, c)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The outcome of a forwarded call releases its reservation only when it
// says for certain that the payment was not made; the next call under the
// limit is then allowed, whichever replica answers it. A timeout, a lost
// upstream or an executed call keeps the reservation until it lapses.
func TestOutcomeReleasesTheReservation(t *testing.T) {
	for _, kind := range stores(t) {
		for _, tc := range []struct {
			outcome  Outcome
			released bool
		}{
			{OutcomeToolError, true},
			{OutcomeToolErrorUnknown, false},
			{OutcomeRefused, true},
			{OutcomeErrorUnknown, false},
			{OutcomeTimeout, false},
			{OutcomeLost, false},
			{OutcomeExecuted, false},
		} {
			t.Run(string(kind)+"/"+string(tc.outcome), func(t *testing.T) {
				f := newFleet(t, kind, 2, releasePolicy)
				a := checkCall(t, f.engines[0], "1.50", "first")
				if a.Decision != guard.Allow || a.Reservation == nil {
					t.Fatalf("first: %+v", a)
				}
				rec, err := f.engines[0].RecordOutcome(context.Background(), "bot", a, tc.outcome)
				if err != nil {
					t.Fatal(err)
				}
				if rec.Released != tc.released || rec.ReceiptID == "" {
					t.Fatalf("outcome %s: %+v, want released %v", tc.outcome, rec, tc.released)
				}
				b := checkCall(t, f.engines[1], "1.50", "second")
				want := guard.Review
				if tc.released {
					want = guard.Allow
				}
				if b.Decision != want {
					t.Fatalf("the next call after %s: %s (%+v), want %s", tc.outcome, b.Decision, b.Reasons, want)
				}
				if reasonOf(b, guard.RuleReservationUnverified) != "" {
					t.Fatalf("a problem with the reservations: %+v", b.Reasons)
				}
				// What status lists agrees.
				held, problems, err := f.engines[1].Reservations(context.Background())
				if err != nil || len(problems) > 0 {
					t.Fatalf("reservations: %v %v", problems, err)
				}
				for _, h := range held {
					if h.ReceiptID == a.ReceiptID && tc.released {
						t.Fatalf("the released reservation is still listed: %+v", h)
					}
				}
			})
		}
	}
}

// An authorization's hold is never released by an outcome: the payment
// was signed.
func TestOutcomeNeverReleasesAHold(t *testing.T) {
	f := newFleet(t, fileKind, 1, releasePolicy)
	e := f.engines[0]
	a, err := e.Authorize(context.Background(), "bot", Question{Counterparty: sellerA, Amount: "1.50"})
	if err != nil || a.Decision != guard.Allow {
		t.Fatalf("authorize: %+v %v", a, err)
	}
	rec, err := e.RecordOutcome(context.Background(), "bot", a, OutcomeToolError)
	if err != nil || rec.Released {
		t.Fatalf("a hold was released: %+v %v", rec, err)
	}
	if b := checkCall(t, e, "1.50", "next"); b.Decision == guard.Allow {
		t.Fatalf("the hold stopped counting: %+v", b)
	}
	// An outcome needs an allow.
	rv := a
	rv.Decision = guard.Review
	if _, err := e.RecordOutcome(context.Background(), "bot", rv, OutcomeToolError); err == nil {
		t.Fatal("an outcome of a review was recorded")
	}
}

// The seal cache answers only for the very record that verified: any
// field changed, or another seal, is checked afresh and refused.
func TestSealCacheChecksEveryField(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	r := reviewlog.Reservation{ReceiptID: "rcpt_1", Caller: "bot", PayTo: "0xabc", Atomic: "1500000", Asset: "usdc", Until: "2026-07-24T10:15:00.000Z", At: "2026-07-24T10:00:00.000Z"}
	r.MAC = reservationMAC(key, &r, r.At)
	var c sealCache
	want, err := toGuard(r, r.At)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a miss, then a hit
		g, ok, err := c.check(key, &r)
		if !ok || err != nil {
			t.Fatalf("a sealed record did not verify: %v %v", ok, err)
		}
		if g.ReceiptID != want.ReceiptID || !g.At.Equal(want.At) || !g.Until.Equal(want.Until) || g.Atomic.Cmp(want.Atomic) != 0 || g.PayTo != want.PayTo || g.Caller != want.Caller {
			t.Fatalf("the cache read %+v, the record reads %+v", g, want)
		}
	}
	for name, edit := range map[string]func(*reviewlog.Reservation){
		"amount":   func(x *reviewlog.Reservation) { x.Atomic = "1" },
		"payee":    func(x *reviewlog.Reservation) { x.PayTo = "0xdef" },
		"caller":   func(x *reviewlog.Reservation) { x.Caller = "other" },
		"until":    func(x *reviewlog.Reservation) { x.Until = "2026-07-24T10:01:00.000Z" },
		"at":       func(x *reviewlog.Reservation) { x.At = "2026-07-24T09:00:00.000Z" },
		"open":     func(x *reviewlog.Reservation) { x.Open = true },
		"seal":     func(x *reviewlog.Reservation) { x.MAC = strings.Repeat("0", 64) },
		"receipt":  func(x *reviewlog.Reservation) { x.ReceiptID = "rcpt_2" },
		"resource": func(x *reviewlog.Reservation) { x.Resource = "https://x.example/" },
		"host":     func(x *reviewlog.Reservation) { x.Host = "x.example" },
		"asset":    func(x *reviewlog.Reservation) { x.Asset = "eth" },
		"review":   func(x *reviewlog.Reservation) { x.ReviewID = "rv_1" },
	} {
		x := r
		edit(&x)
		if _, ok, _ := c.check(key, &x); ok {
			t.Errorf("%s changed: the cache verified it", name)
		}
	}
	// A sealed record whose amount does not read is no reservation, and
	// is not remembered as one.
	bad := r
	bad.Atomic = "-1"
	bad.MAC = reservationMAC(key, &bad, bad.At)
	for range 2 {
		if _, ok, err := c.check(key, &bad); !ok || err == nil {
			t.Fatalf("a sealed record of amount -1: ok %v, err %v", ok, err)
		}
	}
	c.trim(0)
	if len(c.ok) > 256 {
		t.Fatalf("the cache kept %d records", len(c.ok))
	}
}
