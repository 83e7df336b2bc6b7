package ledger

import (
	"bytes"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

var t0 = time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)

// chain builds lane lines from entries, linking and sealing each.
type chain struct {
	lane int
	seq  int64
	off  int64
	prev string
	raws []Raw
}

func (c *chain) add(t *testing.T, e Entry) Raw {
	t.Helper()
	e.Lane, e.Seq, e.Prev = c.lane, c.seq, c.prev
	line, err := e.Seal(testKey)
	if err != nil {
		t.Fatalf("seal: %v", err)
	}
	r := Raw{Pos: Pos{Lane: c.lane, Seq: c.seq, Off: c.off}, Line: line}
	c.raws = append(c.raws, r)
	c.seq++
	c.off += int64(len(line)) + 1
	c.prev = Hash(line)
	return r
}

func hold(receipt, payTo string, atomic string, at time.Time, ttl time.Duration) Entry {
	return Entry{Kind: KindHold, At: FormatTime(at), Until: FormatTime(at.Add(ttl)), Receipt: receipt, Caller: "agent",
		PayTo: payTo, Atomic: atomic, Asset: "usdc"}
}

func TestSealParse(t *testing.T) {
	e := hold("rcpt_1", "0xb0b", "250000", t0, 15*time.Minute)
	e.Host, e.Resource = "api.example.com", "https://api.example.com/x"
	line, err := e.Seal(testKey)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(line, testKey)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got != e {
		t.Fatalf("round trip: %+v != %+v", got, e)
	}
	if _, err := Parse(line, []byte("another key")); err != ErrNotSealed {
		t.Fatalf("another key: %v, want ErrNotSealed", err)
	}
	cases := map[string]func([]byte) []byte{
		"amount changed":   func(b []byte) []byte { return bytes.Replace(b, []byte(`"250000"`), []byte(`"250001"`), 1) },
		"payee changed":    func(b []byte) []byte { return bytes.Replace(b, []byte(`0xb0b`), []byte(`0xb0c`), 1) },
		"member repeated":  func(b []byte) []byte { return bytes.Replace(b, []byte(`{"v":1,`), []byte(`{"v":1,"v":1,`), 1) },
		"member in case":   func(b []byte) []byte { return bytes.Replace(b, []byte(`"atomic"`), []byte(`"Atomic"`), 1) },
		"member added":     func(b []byte) []byte { return bytes.Replace(b, []byte(`{"v":1,`), []byte(`{"v":1,"x":2,`), 1) },
		"spaces":           func(b []byte) []byte { return bytes.Replace(b, []byte(`,"kind"`), []byte(`, "kind"`), 1) },
		"seq renumbered":   func(b []byte) []byte { return bytes.Replace(b, []byte(`"seq":0`), []byte(`"seq":1`), 1) },
		"trailing garbage": func(b []byte) []byte { return append(append([]byte(nil), b...), ' ') },
		"not json":         func(b []byte) []byte { return []byte("hello") },
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse(edit(append([]byte(nil), line...)), testKey); err == nil {
				t.Fatal("an edited line parsed")
			}
		})
	}
}

func TestSealRefusesBadEntries(t *testing.T) {
	good := hold("rcpt_1", "0xb0b", "1", t0, time.Minute)
	for name, edit := range map[string]func(*Entry){
		"no receipt":      func(e *Entry) { e.Receipt = "" },
		"no caller":       func(e *Entry) { e.Caller = "" },
		"no payee":        func(e *Entry) { e.PayTo = "" },
		"negative amount": func(e *Entry) { e.Atomic = "-1" },
		"leading zero":    func(e *Entry) { e.Atomic = "01" },
		"bad time":        func(e *Entry) { e.At = "yesterday" },
		"unknown kind":    func(e *Entry) { e.Kind = "gift" },
		"prev at seq 0":   func(e *Entry) { e.Prev = "ab" },
		"release no tgt":  func(e *Entry) { e.Kind = KindRelease },
	} {
		t.Run(name, func(t *testing.T) {
			e := good
			edit(&e)
			if _, err := e.Seal(testKey); err == nil {
				t.Fatal("sealed")
			}
		})
	}
}

func TestBookFindsWhatDoesNotVerify(t *testing.T) {
	build := func(t *testing.T) *chain {
		c := &chain{}
		for i := range 5 {
			c.add(t, hold(fmt.Sprintf("rcpt_%d", i), "0xb0b", "100", t0.Add(time.Duration(i)*time.Second), time.Hour))
		}
		return c
	}
	t.Run("clean", func(t *testing.T) {
		b := NewBook(testKey, "", time.Hour)
		if f := b.Apply(build(t).raws); len(f) != 0 {
			t.Fatalf("findings on a clean lane: %v", f)
		}
		if got := b.Tally(ScopePayTo+"0xb0b", "usdc", time.Time{}, t0.Add(time.Minute), 3); got.Count != 5 || got.Atomic.Int64() != 500 || len(got.Refs) != 3 || got.Refs[0] != "rcpt_4" {
			t.Fatalf("tally %+v", got)
		}
	})
	cases := map[string]struct {
		edit func(c *chain) []Raw
		want string
	}{
		"an entry removed": {func(c *chain) []Raw { return append(c.raws[:2:2], c.raws[3:]...) }, "missing"},
		"two swapped": {func(c *chain) []Raw {
			r := append([]Raw(nil), c.raws...)
			r[1].Line, r[2].Line = r[2].Line, r[1].Line
			return r
		}, "renumbered"},
		"a line replayed": {func(c *chain) []Raw {
			r := append([]Raw(nil), c.raws...)
			x := r[1]
			x.Seq, x.Off = 5, r[4].Off+int64(len(r[4].Line))+1
			return append(r, x)
		}, "renumbered"},
		"a line edited": {func(c *chain) []Raw {
			r := append([]Raw(nil), c.raws...)
			r[3].Line = bytes.Replace(r[3].Line, []byte(`"100"`), []byte(`"001"`), 1)
			return r
		}, "entry 3"},
		"cut short": {func(c *chain) []Raw { return nil }, "ends before"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := build(t)
			b := NewBook(testKey, "", time.Hour)
			raws := tc.edit(c)
			if name == "cut short" {
				// The Book read the lane whole before; the store now holds
				// three entries.
				b.Apply(c.raws)
				raws = []Raw{{Pos: Pos{Lane: 0, Seq: 3}}}
			}
			f := b.Apply(raws)
			if len(f) == 0 || !strings.Contains(strings.Join(f, "; "), tc.want) {
				t.Fatalf("findings %q, want one naming %q", f, tc.want)
			}
			if len(b.Findings()) == 0 {
				t.Fatal("the finding is not kept")
			}
		})
	}
	t.Run("another tenant's entry", func(t *testing.T) {
		c := &chain{}
		e := hold("rcpt_x", "0xb0b", "1", t0, time.Hour)
		e.Tenant = "globex"
		c.add(t, e)
		b := NewBook(testKey, "acme", time.Hour)
		if f := b.Apply(c.raws); len(f) != 1 || !strings.Contains(f[0], "tenant") {
			t.Fatalf("findings %q", f)
		}
	})
	t.Run("an approval used twice", func(t *testing.T) {
		c := &chain{}
		for i := range 2 {
			e := hold(fmt.Sprintf("rcpt_%d", i), "0xb0b", "1", t0, time.Hour)
			e.Review = "rev-1"
			c.add(t, e)
		}
		b := NewBook(testKey, "", time.Hour)
		if f := b.Apply(c.raws); len(f) != 1 || !strings.Contains(f[0], "used twice") {
			t.Fatalf("findings %q", f)
		}
		if r, ok := b.Used("rev-1"); !ok || r != "rcpt_0" {
			t.Fatalf("used: %q %v", r, ok)
		}
	})
	t.Run("lines read twice by two sections", func(t *testing.T) {
		c := build(t)
		b := NewBook(testKey, "", time.Hour)
		b.Apply(c.raws[:4])
		if f := b.Apply(c.raws[2:]); len(f) != 0 {
			t.Fatalf("an overlap is a finding: %v", f)
		}
		if got := b.Tally(ScopeAll, "usdc", time.Time{}, t0, 0); got.Count != 5 {
			t.Fatalf("count %d", got.Count)
		}
	})
}

// naive is the tally computed entry by entry, the reference Tally must
// agree with.
func naive(es []Entry, released, shown map[string]bool, scope, asset string, from, now time.Time) (int, *big.Int, int, int) {
	n, other, open := 0, 0, 0
	sum := new(big.Int)
	for _, e := range es {
		in := false
		for _, s := range scopesOf(&e) {
			if s == scope {
				in = true
			}
		}
		at, _ := ParseTime(e.At)
		if !in || released[e.Receipt] || shown[e.Receipt] || at.Before(from) {
			continue
		}
		if e.Until != "" {
			u, _ := ParseTime(e.Until)
			if !now.Before(u) {
				continue
			}
		}
		n++
		if e.Open {
			open++
		}
		if e.Asset == asset {
			a, _ := new(big.Int).SetString(e.Atomic, 10)
			sum.Add(sum, a)
		} else {
			other++
		}
	}
	return n, sum, other, open
}

func TestTallyAgreesWithEntryByEntry(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	payees := []string{"0xa", "0xb", "0xc"}
	hosts := []string{"", "a.example", "b.example"}
	c := &chain{}
	var es []Entry
	for i := range 3000 {
		at := t0.Add(time.Duration(rng.IntN(48*3600)) * time.Second)
		if i%10 != 0 {
			// Mostly in order, as one writer commits them.
			at = t0.Add(time.Duration(i*50) * time.Second)
		}
		e := Entry{At: FormatTime(at), Receipt: fmt.Sprintf("r%d", i), Caller: "c", Atomic: fmt.Sprint(1 + rng.IntN(1000)), Asset: "usdc"}
		switch rng.IntN(3) {
		case 0:
			e.Kind, e.Until = KindHold, FormatTime(at.Add(15*time.Minute))
		case 1:
			e.Kind, e.Until = KindSpend, FormatTime(at.Add(24*time.Hour))
		default:
			e.Kind, e.Until, e.Open = KindAuthorization, FormatTime(at.Add(24*time.Hour)), true
		}
		e.PayTo = payees[rng.IntN(3)]
		e.Host = hosts[rng.IntN(3)]
		if rng.IntN(5) == 0 {
			e.PayTo = ""
			e.Host = "a.example"
		}
		if rng.IntN(7) == 0 {
			e.Asset = "eurc"
		}
		if rng.IntN(4) == 0 {
			e.Resource = "https://a.example/r" + fmt.Sprint(rng.IntN(3))
		}
		c.add(t, e)
		es = append(es, e)
	}
	b := NewBook(testKey, "", 48*time.Hour)
	if f := b.Apply(c.raws); len(f) != 0 {
		t.Fatal(f)
	}
	released := map[string]bool{}
	for i := 0; i < 3000; i += 13 {
		if es[i].Kind == KindAuthorization {
			continue
		}
		c.add(t, Entry{Kind: KindRelease, At: es[i].At, Caller: "c", Target: es[i].Receipt, Outcome: OutcomeNotRun})
		released[es[i].Receipt] = true
	}
	if f := b.Apply(c.raws); len(f) != 0 {
		t.Fatal(f)
	}
	scopes := []string{ScopeAll, ScopePayTo + "0xa", ScopeHost + "a.example", ScopeNoPayTo, ScopeNoHost, ScopeHostPayTo + "a.example 0xb",
		ScopeResource + "https://a.example/r1", ScopeNoResource, ScopeAnyHost, ScopeHostNoPayTo + "a.example"}
	for q := range 400 {
		now := t0.Add(time.Duration(rng.IntN(60*3600)) * time.Second)
		from := now.Add(-time.Duration(rng.IntN(30*3600)) * time.Second)
		if q%5 == 0 {
			from = time.Time{}
		}
		sc := scopes[rng.IntN(len(scopes))]
		got := b.Tally(sc, "usdc", from, now, 2)
		n, sum, other, open := naive(es, released, nil, sc, "usdc", from, now)
		if got.Count != n || got.Atomic.Cmp(sum) != 0 || got.Other != other || got.Open != open {
			t.Fatalf("query %d %s from %v now %v: got n=%d sum=%s other=%d open=%d, want n=%d sum=%s other=%d open=%d",
				q, sc, from, now, got.Count, got.Atomic, got.Other, got.Open, n, sum, other, open)
		}
	}
}

func TestMatchShowsEachCommitmentOnce(t *testing.T) {
	c := &chain{}
	c.add(t, hold("r1", "0xb0b", "100", t0, time.Hour))
	c.add(t, hold("r2", "0xb0b", "100", t0.Add(time.Minute), time.Hour))
	c.add(t, hold("r3", "0xb0b", "100", t0.Add(2*time.Minute), time.Minute)) // lapses before the payment
	hostOnly := Entry{Kind: KindHold, At: FormatTime(t0), Until: FormatTime(t0.Add(time.Hour)), Receipt: "r4", Caller: "a", Host: "api.example", Atomic: "100", Asset: "usdc"}
	c.add(t, hostOnly)
	b := NewBook(testKey, "", 2*time.Hour)
	b.Apply(c.raws)
	now := t0.Add(10 * time.Minute)
	count := func() int { return b.Tally(ScopeAll, "usdc", time.Time{}, now, 0).Count }
	if got := count(); got != 3 { // r3 lapsed
		t.Fatalf("before: %d", got)
	}
	pay := func(at time.Time, payTos, hosts []string) Payment {
		return Payment{PayTos: payTos, Hosts: hosts, Atomic: "100", Asset: "usdc", At: at}
	}
	// One payment to 0xb0b at +5m (its host api.example): shows r1 only,
	// by address first, and the host-only r4 stays.
	b.Match("v1", func() []Payment {
		return []Payment{pay(t0.Add(5*time.Minute), []string{"0xb0b"}, []string{"api.example"})}
	})
	if got := count(); got != 2 {
		t.Fatalf("after one payment: %d counting, want 2", got)
	}
	if _, counting, _ := b.Get("r1"); counting {
		t.Fatal("r1 is shown by the payment and still counts")
	}
	// The same print: nothing changes.
	b.Match("v1", func() []Payment { t.Fatal("matched again under the same print"); return nil })
	// Two more: one shows r2, the other (host only) r4; none shows a
	// commitment made after it.
	b.Match("v2", func() []Payment {
		return []Payment{pay(t0.Add(5*time.Minute), []string{"0xb0b"}, []string{"api.example"}), pay(t0.Add(6*time.Minute), []string{"0xb0b"}, nil),
			pay(t0.Add(7*time.Minute), nil, []string{"api.example"})}
	})
	if got := count(); got != 0 {
		t.Fatalf("after three payments: %d counting, want 0", got)
	}
	// The Trace loses them (a run became unreadable): they count again.
	b.Match("v3", func() []Payment { return nil })
	if got := count(); got != 3 {
		t.Fatalf("after the payments vanished: %d counting, want 3", got)
	}
}

func FuzzParse(f *testing.F) {
	e := hold("rcpt_1", "0xb0b", "250000", t0, time.Minute)
	line, _ := e.Seal(testKey)
	f.Add(line)
	f.Add([]byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Parse(data, testKey)
		if err != nil {
			return
		}
		// What parses is exactly what Seal writes for it.
		again, err := got.Seal(testKey)
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("parsed %q, which seals to %q (%v)", data, again, err)
		}
	})
}

func TestAudit(t *testing.T) {
	build := func(t *testing.T) (*chain, []Commitment) {
		c := &chain{}
		c.add(t, Entry{Kind: KindGenesis, At: FormatTime(t0), Receipt: "gen", Caller: "haia-trace-mcp"})
		commits := []Commitment{{ID: "gen", TS: t0, Genesis: true}}
		for i := range 4 {
			id := fmt.Sprintf("rcpt_%d", i)
			e := hold(id, "0xb0b", "100", t0.Add(time.Duration(i+1)*time.Second), time.Hour)
			if i == 1 {
				e.Review = "rev-1"
			}
			c.add(t, e)
			commits = append(commits, Commitment{ID: id, TS: t0.Add(time.Duration(i+1) * time.Second)})
		}
		return c, commits
	}
	t.Run("clean", func(t *testing.T) {
		c, commits := build(t)
		rep := Audit(c.raws, testKey, "", commits)
		if len(rep.Findings)+len(rep.Incomplete) != 0 || rep.Entries != 5 || !rep.Sealed {
			t.Fatalf("%+v", rep)
		}
		if rep := Audit(c.raws, nil, "", commits); len(rep.Findings) != 0 || rep.Sealed {
			t.Fatalf("without a key: %+v", rep)
		}
	})
	for name, tc := range map[string]struct {
		edit       func(c *chain, commits []Commitment) ([]Raw, []Commitment)
		finding    string
		incomplete string
	}{
		"the last entry removed": {func(c *chain, cm []Commitment) ([]Raw, []Commitment) { return c.raws[:4], cm }, "no entry", ""},
		"a middle entry removed": {func(c *chain, cm []Commitment) ([]Raw, []Commitment) {
			return append(append([]Raw(nil), c.raws[:2]...), c.raws[3:]...), cm
		}, "missing", ""},
		"the ledger emptied":   {func(c *chain, cm []Commitment) ([]Raw, []Commitment) { return nil, cm }, "emptied", ""},
		"a receipt never made": {func(c *chain, cm []Commitment) ([]Raw, []Commitment) { return c.raws, cm[:4] }, "", "rcpt_3"},
		"an approval used twice": {func(c *chain, cm []Commitment) ([]Raw, []Commitment) {
			e := hold("rcpt_9", "0xb0b", "100", t0.Add(time.Minute), time.Hour)
			e.Review = "rev-1"
			c.add(t, e)
			return c.raws, append(cm, Commitment{ID: "rcpt_9", TS: t0.Add(time.Minute)})
		}, "used twice", ""},
	} {
		t.Run(name, func(t *testing.T) {
			c, commits := build(t)
			raws, cm := tc.edit(c, commits)
			rep := Audit(raws, testKey, "", cm)
			if tc.finding != "" && !strings.Contains(strings.Join(rep.Findings, ";"), tc.finding) {
				t.Fatalf("findings %q, want %q", rep.Findings, tc.finding)
			}
			if tc.finding == "" && len(rep.Findings) != 0 {
				t.Fatalf("findings %q for what a crash leaves", rep.Findings)
			}
			if tc.incomplete != "" && !strings.Contains(strings.Join(rep.Incomplete, ";"), tc.incomplete) {
				t.Fatalf("incomplete %q, want %q", rep.Incomplete, tc.incomplete)
			}
		})
	}
}

// TestOwnRawReadsAsItsLine: an entry this process sealed, taken in as
// OwnRaw (its line not parsed again), counts exactly as its line read by
// another process; one whose text is not valid UTF-8 (which its line
// writes as the replacement character) is read from its line, as every
// other process reads it; and a gap or a broken link is still a finding.
func TestOwnRawReadsAsItsLine(t *testing.T) {
	entries := []Entry{
		hold("rcpt_0", "0xb0b", "100", t0, time.Hour),
		hold("rcpt_1", "0xb0b", "250", t0.Add(time.Second), time.Hour),
		hold("rcpt_2", "0xc0c", "7", t0.Add(2*time.Second), time.Hour),
	}
	lanes := func(t *testing.T, entries []Entry) (c *chain, own []Raw) {
		c = &chain{}
		for _, e := range entries {
			r := c.add(t, e)
			e.Lane, e.Seq, e.Prev = r.Lane, r.Seq, ""
			if r.Seq > 0 {
				e.Prev = Hash(c.raws[r.Seq-1].Line)
			}
			if _, err := e.Seal(testKey); err != nil {
				t.Fatal(err)
			}
			own = append(own, OwnRaw(r.Pos, r.Line, e))
		}
		return c, own
	}
	c, own := lanes(t, entries)
	read, mine := NewBook(testKey, "", time.Hour), NewBook(testKey, "", time.Hour)
	if f := read.Apply(c.raws); len(f) != 0 {
		t.Fatalf("findings reading the lines: %v", f)
	}
	if f := mine.Apply(own); len(f) != 0 {
		t.Fatalf("findings taking own entries: %v", f)
	}
	if a, b := read.Describe(), mine.Describe(); a != b {
		t.Fatalf("own entries count otherwise than their lines:\nread %s\nown  %s", a, b)
	}
	for _, scope := range []string{ScopeAll, ScopePayTo + "0xb0b", ScopePayTo + "0xc0c"} {
		a, b := read.Tally(scope, "usdc", time.Time{}, t0.Add(time.Minute), 3), mine.Tally(scope, "usdc", time.Time{}, t0.Add(time.Minute), 3)
		if a.Count != b.Count || a.Atomic.Cmp(b.Atomic) != 0 || fmt.Sprint(a.Refs) != fmt.Sprint(b.Refs) {
			t.Fatalf("%s: read %+v, own %+v", scope, a, b)
		}
	}
	t.Run("not UTF-8", func(t *testing.T) {
		bad := slices.Clone(entries)
		bad[1].Caller = "agent\xff" // its line says "agent\ufffd"
		c, own := lanes(t, bad)
		read, mine := NewBook(testKey, "", time.Hour), NewBook(testKey, "", time.Hour)
		a, b := read.Apply(c.raws), mine.Apply(own)
		if len(a) == 0 || fmt.Sprint(a) != fmt.Sprint(b) || read.Describe() != mine.Describe() {
			t.Fatalf("read: %q %s\nown: %q %s", a, read.Describe(), b, mine.Describe())
		}
	})
	t.Run("a gap is still a finding", func(t *testing.T) {
		b := NewBook(testKey, "", time.Hour)
		if f := b.Apply([]Raw{own[0], own[2]}); len(f) == 0 || !strings.Contains(f[0], "missing") {
			t.Fatalf("findings %q", f)
		}
	})
	t.Run("a broken link is still a finding", func(t *testing.T) {
		b := NewBook(testKey, "", time.Hour)
		e := entries[2]
		e.Lane, e.Seq, e.Prev = 0, 1, Hash([]byte("another line"))
		line, err := e.Seal(testKey)
		if err != nil {
			t.Fatal(err)
		}
		f := b.Apply([]Raw{own[0], OwnRaw(Pos{Lane: 0, Seq: 1, Off: own[1].Off}, line, e)})
		if len(f) == 0 || !strings.Contains(f[0], "does not link") {
			t.Fatalf("findings %q", f)
		}
	})
}
