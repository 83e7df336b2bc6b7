package ledger

import (
	"strings"
	"testing"
	"time"
)

// A settlement of an authorization keeps it counting as spend and stops it
// counting as open; it is no longer offered as expired. A settlement of
// anything but an authorization is a finding and changes nothing.
func TestSettledAuthorization(t *testing.T) {
	var c chain
	b := NewBook(testKey, "", 48*time.Hour)
	a := authorization("rcpt_a", t0, t0.Add(time.Minute))
	h := hold("rcpt_hold", "0xb0b", "1", t0, time.Hour)
	for _, e := range []Entry{a, h} {
		c.add(t, e)
	}
	if f := b.Apply(c.raws); len(f) > 0 {
		t.Fatal(f)
	}
	now := t0.Add(2 * time.Minute)
	before := b.Tally(ScopeAll, "usdc", t0.Add(-time.Hour), now, 5)
	if before.Open != 1 || before.Count != 2 {
		t.Fatalf("before: %+v", before)
	}
	n := len(c.raws)
	c.add(t, Entry{Kind: KindRelease, At: FormatTime(now), Caller: "agent", Target: "rcpt_a", Outcome: OutcomeSettled})
	c.add(t, Entry{Kind: KindRelease, At: FormatTime(now), Caller: "agent", Target: "rcpt_hold", Outcome: OutcomeSettled})
	f := b.Apply(c.raws[n:])
	if len(f) != 1 || !strings.Contains(f[0], "not an authorization") {
		t.Fatalf("findings %v", f)
	}
	after := b.Tally(ScopeAll, "usdc", t0.Add(-time.Hour), now, 5)
	if after.Open != 0 || after.Count != 2 || after.Atomic.Cmp(before.Atomic) != 0 || len(after.OpenRefs) != 0 {
		t.Fatalf("after: %+v (before %+v)", after, before)
	}
	if e, counting, _ := b.Get("rcpt_a"); !counting || e.Open {
		t.Fatalf("the settled authorization: counting %v, open %v", counting, e.Open)
	}
	if ex := b.Expired(now.Add(time.Hour), 5); len(ex) != 0 {
		t.Fatalf("a settled authorization is offered as expired: %+v", ex)
	}
}
