package ledger

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func authorization(receipt string, at, validBefore time.Time) Entry {
	return Entry{Kind: KindAuthorization, At: FormatTime(at), Until: FormatTime(at.Add(24 * time.Hour)), Receipt: receipt, Caller: "agent",
		PayTo: "0xb0b", Atomic: "250000", Asset: "usdc", Open: true,
		Payer: "0x" + strings.Repeat("ab", 20), Nonce: fmt.Sprintf("0x%064x", len(receipt)+int(validBefore.Unix()%1000)), ValidBefore: FormatTime(validBefore)}
}

// An authorization's terms are all three or none, each written one way,
// and on an authorization only; a release names none.
func TestAuthorizationTerms(t *testing.T) {
	good := authorization("rcpt_1", t0, t0.Add(time.Minute))
	if _, err := good.Seal(testKey); err != nil {
		t.Fatalf("good terms: %v", err)
	}
	for name, edit := range map[string]func(*Entry){
		"no payer":            func(e *Entry) { e.Payer = "" },
		"no nonce":            func(e *Entry) { e.Nonce = "" },
		"no validBefore":      func(e *Entry) { e.ValidBefore = "" },
		"payer in upper case": func(e *Entry) { e.Payer = strings.ToUpper(e.Payer) },
		"short nonce":         func(e *Entry) { e.Nonce = "0x01" },
		"validBefore unix":    func(e *Entry) { e.ValidBefore = "1800000000" },
		"terms on a hold":     func(e *Entry) { e.Kind = KindHold },
		"terms on a release": func(e *Entry) {
			e.Kind, e.Target, e.Outcome, e.PayTo, e.Atomic, e.Asset = KindRelease, "rcpt_0", OutcomeUnused, "", "", ""
		},
		"nonce not hex":        func(e *Entry) { e.Nonce = "0x" + strings.Repeat("zz", 32) },
		"payer without prefix": func(e *Entry) { e.Payer = strings.Repeat("ab", 21) },
	} {
		t.Run(name, func(t *testing.T) {
			e := good
			edit(&e)
			if _, err := e.Seal(testKey); err == nil {
				t.Fatalf("sealed %+v", e)
			}
		})
	}
	none := good
	none.Payer, none.Nonce, none.ValidBefore = "", "", ""
	if _, err := none.Seal(testKey); err != nil {
		t.Fatalf("an authorization without terms (an earlier entry): %v", err)
	}
}

// Expired offers the authorizations past a cutoff, earliest first, that
// still count and were not set aside; a release, the Trace showing it or
// SetAside stop it being offered.
func TestExpired(t *testing.T) {
	var c chain
	b := NewBook(testKey, "", 48*time.Hour)
	late := authorization("rcpt_late", t0, t0.Add(10*time.Minute))
	early := authorization("rcpt_early", t0.Add(time.Second), t0.Add(time.Minute))
	mid := authorization("rcpt_mid", t0.Add(2*time.Second), t0.Add(5*time.Minute))
	old := authorization("rcpt_old", t0, t0.Add(time.Minute))
	old.Payer, old.Nonce, old.ValidBefore = "", "", ""
	for _, e := range []Entry{late, early, mid, old, hold("rcpt_hold", "0xb0b", "1", t0, time.Minute)} {
		c.add(t, e)
	}
	if f := b.Apply(c.raws); len(f) > 0 {
		t.Fatal(f)
	}
	names := func(es []Entry) string {
		var out []string
		for _, e := range es {
			out = append(out, e.Receipt)
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		cutoff time.Time
		n      int
		want   string
	}{
		{t0.Add(time.Minute), 8, ""},
		{t0.Add(time.Minute + time.Millisecond), 8, "rcpt_early"},
		{t0.Add(time.Hour), 8, "rcpt_early,rcpt_mid,rcpt_late"},
		{t0.Add(time.Hour), 2, "rcpt_early,rcpt_mid"},
	} {
		if got := names(b.Expired(tc.cutoff, tc.n)); got != tc.want {
			t.Fatalf("Expired(%s, %d) = %s, want %s", tc.cutoff, tc.n, got, tc.want)
		}
	}
	b.SetAside("rcpt_mid")
	c.add(t, Entry{Kind: KindRelease, At: FormatTime(t0.Add(time.Hour)), Caller: "agent", Target: "rcpt_early", Outcome: OutcomeUnused})
	if f := b.Apply(c.raws); len(f) > 0 {
		t.Fatal(f)
	}
	if got := names(b.Expired(t0.Add(time.Hour), 8)); got != "rcpt_late" {
		t.Fatalf("after a release and a set-aside: %s", got)
	}
	if _, counting, _ := b.Get("rcpt_early"); counting {
		t.Fatal("the released authorization counts")
	}
	if _, counting, _ := b.Get("rcpt_mid"); !counting {
		t.Fatal("an authorization set aside stopped counting")
	}
}
