package ledger

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestMatchMoreAgreesWithWholeMatch feeds two Books the same ledger and
// the same Trace, a payment or a commitment at a time, over a random
// history: one takes in only the new payments when it can (matchMore),
// the other matches everything again each time. They must agree on every
// commitment after every match. The history has what must send the first
// back to a whole match: payments that arrive late or at the time of
// another, payments the Trace loses, payments handed out of order,
// commitments made late that a payment already seen could show,
// releases, and entries let go.
func TestMatchMoreAgreesWithWholeMatch(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { matchMoreAgrees(t, seed) })
	}
}

func matchMoreAgrees(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 40))
	const horizon = 2 * time.Hour
	more, whole := NewBook(testKey, "", horizon), NewBook(testKey, "", horizon)
	whole.noMatchMore = true
	c := &chain{}
	var (
		receipts []string
		kinds    = map[string]string{}
		pays     []Payment
		now      = t0
	)
	payees, hosts, amounts := []string{"0xa11ce", "0xb0b"}, []string{"api.example", "b.example"}, []string{"100", "200"}
	apply := func(e Entry) {
		r := c.add(t, e)
		more.Apply([]Raw{r})
		whole.Apply([]Raw{r})
	}
	late := 0
	for step := range 2500 {
		now = now.Add(time.Duration(1+rng.IntN(300)) * time.Second)
		switch x := rng.IntN(100); {
		case x < 45: // a commitment
			id := fmt.Sprintf("r%d", len(receipts))
			at := now
			if rng.IntN(10) == 0 { // another replica's, committed a while ago
				at = now.Add(-time.Duration(rng.IntN(1200)) * time.Second)
			}
			e := Entry{Kind: KindHold, At: FormatTime(at), Receipt: id, Caller: "agent", Atomic: amounts[rng.IntN(2)], Asset: "usdc"}
			if rng.IntN(5) == 0 {
				e.Host = hosts[rng.IntN(2)]
			} else {
				e.PayTo = payees[rng.IntN(2)]
			}
			switch rng.IntN(6) {
			case 0:
				e.Kind, e.Open, e.Until = KindAuthorization, true, FormatTime(at.Add(horizon))
			case 1:
				e.Kind, e.Until = KindSpend, FormatTime(at.Add(horizon))
			default:
				e.Until = FormatTime(at.Add([]time.Duration{2 * time.Minute, 15 * time.Minute, 90 * time.Minute}[rng.IntN(3)]))
			}
			apply(e)
			receipts = append(receipts, id)
			kinds[id] = e.Kind
		case x < 50 && len(receipts) > 0: // a release
			id := receipts[rng.IntN(len(receipts))]
			outcome := OutcomeNotRun
			if kinds[id] == KindAuthorization {
				outcome = OutcomeUnused
			}
			apply(Entry{Kind: KindRelease, At: FormatTime(now), Caller: "agent", Target: id, Outcome: outcome})
		case x < 52 && len(pays) > 0: // the Trace loses a payment
			i := rng.IntN(len(pays))
			pays = slices.Delete(pays, i, i+1)
		default: // a payment
			p := Payment{Atomic: amounts[rng.IntN(2)], Asset: "usdc", At: now}
			switch rng.IntN(12) {
			case 0:
				p.At = now.Add(-time.Duration(rng.IntN(3600)) * time.Second)
				late++
			case 1:
				if len(pays) > 0 {
					p.At = pays[len(pays)-1].At
				}
			}
			if rng.IntN(4) > 0 {
				p.PayTos = []string{payees[rng.IntN(2)]}
			}
			if rng.IntN(3) > 0 || len(p.PayTos) == 0 {
				p.Hosts = []string{hosts[rng.IntN(2)]}
			}
			pays = append(pays, p)
			slices.SortStableFunc(pays, func(x, y Payment) int { return x.At.Compare(y.At) })
		}
		if step%7 == 6 {
			more.Prune(now)
			whole.Prune(now)
		}
		var in []Payment
		for _, p := range pays {
			if !p.At.Before(now.Add(-horizon)) {
				in = append(in, p)
			}
		}
		if rng.IntN(40) == 0 {
			rng.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		}
		fp := fmt.Sprint(step)
		more.Match(fp, func() []Payment { return slices.Clone(in) })
		whole.Match(fp, func() []Payment { return slices.Clone(in) })
		for _, id := range receipts {
			a, b := more.byReceipt[id], whole.byReceipt[id]
			if (a == nil) != (b == nil) {
				t.Fatalf("step %d: receipt %s held by one Book only", step, id)
			}
			if a != nil && (a.shown != b.shown || a.counts() != b.counts()) {
				t.Fatalf("step %d: receipt %s (%s at %s until %s): shown %v counting %v taking in the new payments, shown %v counting %v matching all again",
					step, id, a.e.Kind, a.e.At, a.e.Until, a.shown, a.counts(), b.shown, b.counts())
			}
		}
		for _, sc := range []string{ScopeAll, ScopePayTo + payees[0], ScopeHost + hosts[1]} {
			ta, tb := more.Tally(sc, "usdc", now.Add(-time.Hour), now, 0), whole.Tally(sc, "usdc", now.Add(-time.Hour), now, 0)
			if ta.Count != tb.Count || ta.Atomic.Cmp(tb.Atomic) != 0 || ta.Open != tb.Open {
				t.Fatalf("step %d, %s: %+v taking in the new payments, %+v matching all again", step, sc, ta, tb)
			}
		}
	}
	// Both paths ran, often: the history is not one the first never
	// takes in part by part, nor one it never has to match whole.
	if more.moreMatches < 1000 || more.wholeMatches < 100 || late == 0 {
		t.Fatalf("%d matches took in only the new payments, %d matched all again (%d late payments)", more.moreMatches, more.wholeMatches, late)
	}
	t.Logf("%d matches took in only the new payments, %d matched all again", more.moreMatches, more.wholeMatches)
}
