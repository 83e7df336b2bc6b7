package ledger

import (
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Scopes an entry is summed under (Tally's scope argument). A scope with a
// value is its name, a colon and the value.
const (
	ScopeAll        = "all"
	ScopePayTo      = "pay_to:"
	ScopeHost       = "host:"
	ScopeHostPayTo  = "host+pay_to:" // host, a space, the address
	ScopeResource   = "resource:"
	ScopeNoPayTo    = "no_pay_to"
	ScopeNoHost     = "no_host"
	ScopeNoResource = "no_resource"
	ScopeAnyHost    = "any_host" // every entry that names a host
	// ScopeHostNoPayTo is the entries of a host that name no payee address.
	ScopeHostNoPayTo = "host-no_pay_to:"
)

// Book is one process's verified reading of the ledger. It takes each
// lane's lines in order, checks each one's seal and link once, and keeps
// what still counts summed by scope. Anything that does not verify — a
// line not sealed by this server, a link that does not hold, a gap, an
// approval used twice — is a finding; a Book with findings cannot say what
// is committed, and a decision that reads it must not allow.
//
// A Book is safe for concurrent use.
type Book struct {
	key    []byte
	tenant string

	mu        sync.Mutex
	heads     [Lanes]head
	byReceipt map[string]*rec
	groups    map[groupKey]*series
	byScope   map[string][]*series
	used      map[string]*rec
	// mandates are what each mandate's uses add up to, whatever their
	// age (a mandate may outlive every window): released uses excluded.
	mandates map[string]*MandateUse
	findings []string
	// horizon is the longest window a question reads: entries that can no
	// longer count in it are let go.
	horizon time.Duration
	// matched is the Trace's payments the Book last matched, by terms.
	byTerms   map[string][]*rec
	payIdx    map[string][]time.Time
	shownSet  map[*rec]bool
	matchedFP string
	// paid are the payments last matched, in time order, when they came
	// so (paidOK): what Match takes in only the new payments against
	// (matchMore). rematch: since then a payment was freed or a new
	// commitment could be shown by one matched, and only a whole match
	// is right. noMatchMore makes every match whole (tests); the counts
	// say how many of each ran.
	paid                      []paid
	paidOK, rematch           bool
	noMatchMore               bool
	wholeMatches, moreMatches int
	applied                   int64
	// genesis is the ledger's first entry (KindGenesis), once read.
	genesis *Entry
	// noSeal: lines are read as they say, their seals unchecked (an
	// audit without the server's key).
	noSeal bool
	// seen is every payee address and host an entry of the ledger ever
	// named (ScopePayTo and ScopeHost keys): never pruned, so that a payee
	// the guard once allowed stays known however long ago.
	seen map[string]struct{}
	// expiring are the authorizations that name their terms (payer,
	// nonce, validBefore), by validBefore: what Expired offers for a
	// check on chain. Those that stopped counting or were set aside are
	// dropped as Expired walks past them.
	expiring []*rec
}

type head struct {
	seq  int64 // the next entry's seq
	off  int64 // the next entry's byte offset
	hash string
}

type groupKey struct {
	scope string
	asset string
	dur   time.Duration
}

// rec is one commitment the Book holds.
type rec struct {
	e         Entry
	at, until time.Time
	atomic    *big.Int
	shown     bool // the Trace shows its payment
	released  bool
	series    []*series
	// validBefore is an authorization's expiry (zero: not recorded);
	// aside: Expired no longer offers it (SetAside).
	validBefore time.Time
	aside       bool
}

func (r *rec) counts() bool { return !r.shown && !r.released }

func (r *rec) weight() int64 {
	if r.counts() {
		return 1
	}
	return 0
}

func (r *rec) openWeight() int64 {
	if r.counts() && r.e.Open {
		return 1
	}
	return 0
}

func (r *rec) amount() *big.Int {
	if r.counts() {
		return r.atomic
	}
	return new(big.Int)
}

// NewBook is an empty reading of the ledger of tenant's store, whose seals
// verify under key. horizon is the longest window a question reads.
func NewBook(key []byte, tenant string, horizon time.Duration) *Book {
	return &Book{key: key, tenant: tenant, horizon: horizon, byReceipt: map[string]*rec{}, groups: map[groupKey]*series{},
		byScope: map[string][]*series{}, used: map[string]*rec{}, mandates: map[string]*MandateUse{},
		byTerms: map[string][]*rec{}, shownSet: map[*rec]bool{}, seen: map[string]struct{}{}}
}

// SetHorizon changes the longest window kept (a new policy).
func (b *Book) SetHorizon(h time.Duration) {
	b.mu.Lock()
	if h > b.horizon {
		b.horizon = h
	}
	b.mu.Unlock()
}

// Horizon is the longest window the Book keeps.
func (b *Book) Horizon() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.horizon
}

// Heads is where every lane's next entry goes: the positions to read the
// ledger from.
func (b *Book) Heads() []Pos {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Pos, Lanes)
	for i, h := range b.heads {
		out[i] = Pos{Lane: i, Seq: h.seq, Off: h.off}
	}
	return out
}

// Next is where the next entry of lane goes, and the hash it links to.
func (b *Book) Next(lane int) (Pos, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.heads[lane]
	return Pos{Lane: lane, Seq: h.seq, Off: h.off}, h.hash
}

// Findings is what did not verify, in the order found.
func (b *Book) Findings() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.findings...)
}

// Applied is how many entries the Book has taken in.
func (b *Book) Applied() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.applied
}

func (b *Book) finding(format string, a ...any) {
	b.findings = append(b.findings, fmt.Sprintf(format, a...))
}

// Apply takes in lines read from the store, each lane in order. Lines
// before a lane's head were taken in already (by another section of this
// process) and are skipped; a line past it is a gap. It returns the
// findings it added.
func (b *Book) Apply(raws []Raw) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	before := len(b.findings)
	for _, r := range raws {
		b.apply(r)
	}
	return append([]string(nil), b.findings[before:]...)
}

func (b *Book) apply(r Raw) {
	if r.Lane < 0 || r.Lane >= Lanes {
		b.finding("a ledger line of lane %d, which no ledger has", r.Lane)
		return
	}
	h := &b.heads[r.Lane]
	if r.Line == nil {
		if r.Seq < h.seq {
			b.finding("ledger lane %d now ends before entry %d, which was read before: entries were removed from its end", r.Lane, h.seq-1)
		}
		return
	}
	switch {
	case r.Seq < h.seq:
		return
	case r.Seq > h.seq:
		b.finding("ledger lane %d goes from entry %d to entry %d: entries are missing (removed or renumbered)", r.Lane, h.seq-1, r.Seq)
		// Read on from here: what follows is still what it says, and is
		// counted; the gap stays a finding.
	}
	e, err := b.entryOf(r)
	if err != nil {
		b.finding("ledger lane %d, entry %d: %v", r.Lane, r.Seq, err)
		h.seq, h.off, h.hash = r.Seq+1, r.Off+int64(len(r.Line))+1, Hash(r.Line)
		return
	}
	switch {
	case e.Lane != r.Lane || e.Seq != r.Seq:
		b.finding("ledger lane %d, entry %d: the sealed entry says lane %d, entry %d (moved or renumbered)", r.Lane, r.Seq, e.Lane, e.Seq)
	case r.Seq == h.seq && e.Prev != h.hash && !(h.seq == 0 && e.Prev == ""):
		b.finding("ledger lane %d, entry %d does not link to the entry before it (an entry removed, replaced or reordered)", r.Lane, r.Seq)
	case e.Tenant != b.tenant:
		b.finding("ledger lane %d, entry %d was written for tenant %q, not this store's %q (moved between tenants' stores)", r.Lane, r.Seq, clip(e.Tenant), b.tenant)
	}
	h.seq, h.off, h.hash = r.Seq+1, r.Off+int64(len(r.Line))+1, Hash(r.Line)
	b.applied++
	b.take(e)
}

// entryOf is r's entry: the one this process sealed into it (OwnRaw), or
// its line parsed and its seal checked.
func (b *Book) entryOf(r Raw) (Entry, error) {
	if r.own != nil && r.own.V == Version && r.own.MAC != "" && r.own.plain() {
		return *r.own, nil
	}
	return b.parse(r.Line)
}

func (b *Book) parse(line []byte) (Entry, error) {
	if b.noSeal {
		return Peek(line)
	}
	return Parse(line, b.key)
}

// take counts a verified entry.
func (b *Book) take(e Entry) {
	if e.Kind == KindGenesis {
		if b.genesis != nil {
			b.finding("the ledger has two starts (receipts %s and %s)", b.genesis.Receipt, e.Receipt)
			return
		}
		b.genesis = &e
		return
	}
	if e.Kind == KindRelease {
		t, ok := b.byReceipt[e.Target]
		switch {
		case !ok:
			// The entry it releases is not held: too old to count, or not
			// read yet (never: a release follows its entry in time).
		case e.Outcome == OutcomeSettled && t.e.Kind != KindAuthorization:
			b.finding("a settlement names receipt %s, which is a %s, not an authorization", e.Target, t.e.Kind)
		case t.e.Kind == KindAuthorization && e.Outcome != OutcomeUnused && e.Outcome != OutcomeSettled:
			b.finding("a release of the authorization of receipt %s gives outcome %q; only an authorization known unused is released", e.Target, e.Outcome)
		case t.e.Caller != e.Caller:
			b.finding("a release of receipt %s names caller %q, not the commitment's", e.Target, clip(e.Caller))
		case e.Outcome == OutcomeSettled:
			// Paid: still spend for its window, no longer open.
			if t.counts() && t.e.Open {
				for _, s := range t.series {
					s.unopen(t)
				}
			}
			t.e.Open = false
			t.aside = true
		case !t.released:
			if t.shown {
				// Its payment is free to show another commitment.
				b.rematch = true
			}
			b.setCounts(t, func() { t.released = true })
			if u := b.mandates[t.e.Mandate]; t.e.Mandate != "" && u != nil {
				u.Count--
				u.Atomic.Sub(u.Atomic, t.atomic)
			}
		}
		return
	}
	if old, dup := b.byReceipt[e.Receipt]; dup {
		b.finding("receipt %s has two ledger entries (lane %d entry %d, lane %d entry %d): a replay", e.Receipt, old.e.Lane, old.e.Seq, e.Lane, e.Seq)
		return
	}
	at, _ := ParseTime(e.At)
	var until time.Time
	if e.Until != "" {
		until, _ = ParseTime(e.Until)
	}
	a, _ := new(big.Int).SetString(e.Atomic, 10)
	r := &rec{e: e, at: at, until: until, atomic: a}
	if e.PayTo != "" {
		b.seen[ScopePayTo+e.PayTo] = struct{}{}
	}
	if e.Host != "" {
		b.seen[ScopeHost+e.Host] = struct{}{}
	}
	b.byReceipt[e.Receipt] = r
	if e.Kind == KindAuthorization && e.ValidBefore != "" {
		r.validBefore, _ = ParseTime(e.ValidBefore)
		i := sort.Search(len(b.expiring), func(i int) bool { return b.expiring[i].validBefore.After(r.validBefore) })
		b.expiring = slices.Insert(b.expiring, i, r)
	}
	if e.Review != "" {
		if first, ok := b.used[e.Review]; ok {
			b.finding("the approval of review %s was used twice (receipts %s and %s)", e.Review, first.e.Receipt, e.Receipt)
		} else {
			b.used[e.Review] = r
		}
	}
	if e.Mandate != "" {
		u := b.mandates[e.Mandate]
		if u == nil {
			u = &MandateUse{Atomic: new(big.Int), Asset: e.Asset}
			b.mandates[e.Mandate] = u
		}
		u.Count++
		u.Atomic.Add(u.Atomic, a)
		if e.Asset != u.Asset {
			b.finding("mandate %s is charged in two assets (receipt %s)", e.Mandate, e.Receipt)
		}
	}
	dur := time.Duration(-1)
	if !until.IsZero() {
		dur = until.Sub(at)
	}
	for _, sc := range scopesOf(&e) {
		k := groupKey{scope: sc, asset: e.Asset, dur: dur}
		s, ok := b.groups[k]
		if !ok {
			s = &series{dur: dur}
			b.groups[k] = s
			b.byScope[sc] = append(b.byScope[sc], s)
		}
		s.add(r)
		r.series = append(r.series, s)
	}
	b.matchNew(r)
}

// scopesOf is every scope an entry is summed under.
func scopesOf(e *Entry) []string {
	out := make([]string, 0, 6)
	out = append(out, ScopeAll)
	if e.PayTo != "" {
		out = append(out, ScopePayTo+e.PayTo)
	} else {
		out = append(out, ScopeNoPayTo)
	}
	if e.Host != "" {
		out = append(out, ScopeHost+e.Host, ScopeAnyHost)
		if e.PayTo != "" {
			out = append(out, ScopeHostPayTo+e.Host+" "+e.PayTo)
		}
		if e.PayTo == "" {
			out = append(out, ScopeHostNoPayTo+e.Host)
		}
	} else {
		out = append(out, ScopeNoHost)
	}
	if e.Resource != "" {
		out = append(out, ScopeResource+e.Resource)
	} else {
		out = append(out, ScopeNoResource)
	}
	return out
}

// setCounts applies change to r and moves its weight in every series.
func (b *Book) setCounts(r *rec, change func()) {
	before := r.counts()
	change()
	after := r.counts()
	for _, s := range r.series {
		s.set(r, before, after)
	}
}

// Genesis is the receipt that started the ledger and its time, once the
// Book read it.
func (b *Book) Genesis() (receipt string, at time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.genesis == nil {
		return "", time.Time{}, false
	}
	at, _ = ParseTime(b.genesis.At)
	return b.genesis.Receipt, at, true
}

// Finding records what the caller found does not verify against the
// ledger (a signed commitment receipt without its entry).
func (b *Book) Finding(format string, a ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.finding(format, a...)
}

// Used says which commitment used the approval of a review, if one did.
func (b *Book) Used(review string) (receipt string, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.used[review]
	if !ok {
		return "", false
	}
	return r.e.Receipt, true
}

// MandateUse is what the uses of one mandate add up to: how many, and
// their sum in atomic units of Asset.
type MandateUse struct {
	Count  int
	Atomic *big.Int
	Asset  string
}

// Mandate is what the ledger charged to a mandate, every use that was not
// released, whatever its age.
func (b *Book) Mandate(id string) MandateUse {
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.mandates[id]
	if u == nil {
		return MandateUse{Atomic: new(big.Int)}
	}
	return MandateUse{Count: u.Count, Atomic: new(big.Int).Set(u.Atomic), Asset: u.Asset}
}

// Has says whether the Book holds the commitment of a receipt (a release
// of it included: it is then not counting).
func (b *Book) Has(receipt string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.byReceipt[receipt]
	return ok
}

// Get is the entry of a receipt's commitment, and whether it still counts
// (not shown by the Trace, not released).
func (b *Book) Get(receipt string) (e Entry, counting, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.byReceipt[receipt]
	if !ok {
		return Entry{}, false, false
	}
	return r.e, r.counts(), true
}

// Seen says whether any commitment the Book took in, however old, released
// or shown by the Trace, named scope: ScopePayTo+address or ScopeHost+host.
func (b *Book) Seen(scope string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.seen[scope]
	return ok
}

// Tally is what one scope's commitments add up to in a window.
type Tally struct {
	// Count is how many count in the window, every asset; Atomic is the sum
	// of those in the asked asset, Other how many are in another asset.
	Count  int
	Atomic *big.Int
	Other  int
	// Open is how many count as payments open to their payee.
	Open int
	// Refs are the newest of them (receipt ids), at most the number asked;
	// OpenRefs the newest of the open ones.
	Refs, OpenRefs []string
}

type tally struct {
	count, open    int
	sum            *big.Int
	refs, openRefs []*rec
}

// Tally sums the commitments of a scope made at or after from that still
// count at now (a zero from: every one that counts at now).
func (b *Book) Tally(scope, asset string, from, now time.Time, refs int) Tally {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := Tally{Atomic: new(big.Int)}
	var newest, newestOpen []*rec
	for _, s := range b.byScope[scope] {
		var t tally
		t.sum = new(big.Int)
		s.window(from, now, refs, &t)
		out.Count += t.count
		out.Open += t.open
		if len(s.recs) == 0 {
			continue
		}
		if s.recs[0].e.Asset == asset {
			out.Atomic.Add(out.Atomic, t.sum)
		} else {
			out.Other += t.count
		}
		newest = append(newest, t.refs...)
		newestOpen = append(newestOpen, t.openRefs...)
	}
	out.Refs = receipts(newest, refs)
	out.OpenRefs = receipts(newestOpen, refs)
	return out
}

// receipts names the newest n of recs.
func receipts(recs []*rec, n int) []string {
	sort.Slice(recs, func(i, j int) bool { return recs[i].at.After(recs[j].at) })
	var out []string
	for i := 0; i < len(recs) && i < n; i++ {
		out = append(out, recs[i].e.Receipt)
	}
	return out
}

// Live lists the commitments that count at now, oldest first.
func (b *Book) Live(now time.Time) []Entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Entry
	for _, r := range b.byReceipt {
		if r.counts() && (r.until.IsZero() || now.Before(r.until)) {
			out = append(out, r.e)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].At != out[j].At {
			return out[i].At < out[j].At
		}
		return out[i].Receipt < out[j].Receipt
	})
	return out
}

// Expired lists, earliest first, at most n authorizations that still
// count, name their payer, nonce and validBefore, have a validBefore
// before cutoff, and were not set aside: those whose use the asset
// contract can now settle for good.
func (b *Book) Expired(cutoff time.Time, n int) []Entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Entry
	keep := b.expiring[:0]
	for i, r := range b.expiring {
		if !r.validBefore.Before(cutoff) || len(out) == n {
			keep = append(keep, b.expiring[i:]...)
			break
		}
		if !r.counts() || r.aside || b.byReceipt[r.e.Receipt] != r || (!r.until.IsZero() && r.until.Before(cutoff)) {
			// Stopped counting, set aside, let go, or past its window:
			// nothing left to release.
			continue
		}
		keep = append(keep, r)
		out = append(out, r.e)
	}
	clear(b.expiring[len(keep):])
	b.expiring = keep
	return out
}

// SetAside stops Expired offering the authorization of receipt: this
// process knows what the chain says of it (used: it keeps counting) or
// cannot ask. It keeps counting as before.
func (b *Book) SetAside(receipt string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.byReceipt[receipt]; ok {
		r.aside = true
	}
}

// Prune lets go of what can no longer count at now in any window the
// Book keeps. Approvals used are remembered whatever their age.
func (b *Book) Prune(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.groups {
		s.prune(now, b.horizon)
	}
	cut := now.Add(-b.horizon)
	for id, r := range b.byReceipt {
		if r.at.Before(cut) && !r.until.IsZero() && r.until.Before(now) && !stillHeld(r) {
			delete(b.byReceipt, id)
			b.dropTerms(r)
		}
	}
}

func stillHeld(r *rec) bool {
	for _, s := range r.series {
		if s.index(r) >= 0 {
			return true
		}
	}
	return false
}

// Describe summarises the Book for logs and status.
func (b *Book) Describe() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var lanes []string
	for i, h := range b.heads {
		if h.seq > 0 {
			lanes = append(lanes, fmt.Sprintf("lane %d: %d", i, h.seq))
		}
	}
	return fmt.Sprintf("%d entries read (%s), %d findings", b.applied, strings.Join(lanes, ", "), len(b.findings))
}
