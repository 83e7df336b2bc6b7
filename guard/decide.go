package guard

import (
	"fmt"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"iter"
	"math/big"
	"slices"
	"sort"
	"strings"
	"time"
)

// Decisions.
const (
	Allow  = "allow"
	Review = "review"
	Block  = "block"
)

// Rule names, in the order SPEC §6 evaluates them.
const (
	RuleDenylist           = "denylist"
	RuleAllowlist          = "allowlist"
	RuleOpenPartial        = "open_partial"
	RuleUnknownAsset       = "unknown_asset"
	RuleUnparseableAmount  = "unparseable_amount"
	RuleAssetMismatch      = "asset_mismatch"
	RulePerCounterparty    = "per_counterparty_limit"
	RuleMixedAssets        = "mixed_assets"
	RuleUnparseableHistory = "unparseable_history"
	RuleUnattributable     = "unattributable_history"
	RuleUnreadable         = "unreadable_history"
	RuleTotalLimit         = "total_limit"
	RuleVelocity           = "velocity_limit"
	RuleDuplicatePayment   = "duplicate_payment"
	RuleNewPayee           = "new_payee"
	RuleReviewAbove        = "review_above"
	RuleHistory            = "history"
)

// maxEvidence bounds the evidence one reason carries; the detail says how
// many more there were.
const maxEvidence = 20

// Ref names one operation: operation ids are unique only within a run.
type Ref struct {
	RunID       string `json:"run_id"`
	OperationID string `json:"operation_id"`
}

// Rules lists every rule the policy's decision can name, the history line
// last.
func Rules() []string {
	return []string{RuleDenylist, RuleAllowlist, RuleOpenPartial, RuleUnknownAsset, RuleUnparseableAmount,
		RuleAssetMismatch, RulePerCounterparty, RuleMixedAssets, RuleUnparseableHistory, RuleUnattributable,
		RuleUnreadable, RuleTotalLimit, RuleVelocity, RuleDuplicatePayment, RuleSignedOffer, RuleNewPayee, RuleReviewAbove, RuleHistory}
}

// Reason is one line of a decision's explanation.
type Reason struct {
	Rule     string `json:"rule"`
	Detail   string `json:"detail"`
	Evidence []Ref  `json:"evidence,omitempty"`
}

// Decision is the guard's answer.
type Decision struct {
	Decision string   `json:"decision"`
	Reasons  []Reason `json:"reasons"`
	Figures  Figures  `json:"figures"`
}

// Figures are the numbers the built-in rules computed; custom rules read them.
// Atomic amounts are in units of the policy's default asset.
type Figures struct {
	// Amount is the request in atomic units; nil when it could not be read
	// in the default asset (rule 4).
	Amount *big.Int `json:"amount_atomic,omitempty"`
	// Denylisted / Allowlisted: whether the counterparty is on each list.
	Denylisted  bool `json:"denylisted"`
	Allowlisted bool `json:"allowlisted"`
	// Matched is how many operations in history are with this counterparty.
	Matched int `json:"matched_operations"`
	// OpenPartial is how many of those are paid but not settled.
	OpenPartial int `json:"open_partial"`
	// WindowOperations is how many paid operations with this counterparty
	// fall inside the limit's window; Spend is the sum of those that could
	// be summed, SpendWithAmount adds this request. Both nil when rule 4 fired.
	WindowOperations   int      `json:"window_operations"`
	Spend              *big.Int `json:"spend_in_window_atomic,omitempty"`
	SpendWithAmount    *big.Int `json:"spend_with_amount_atomic,omitempty"`
	MixedAssets        int      `json:"mixed_assets"`
	UnparseableHistory int      `json:"unparseable_history"`
	// What history was read.
	Operations     int `json:"operations"`
	Runs           int `json:"runs"`
	Unattributable int `json:"unattributable"`
	// UnattributableOpen counts the unattributable operations that are
	// paid and not settled; PaidWithoutHost, for a host question, the paid
	// operations with no usable host.
	UnattributableOpen int  `json:"unattributable_open"`
	PaidWithoutHost    int  `json:"paid_without_host"`
	UnreadableRuns     int  `json:"unreadable_runs"`
	Coarse             bool `json:"coarse"`

	// Policy names every layer of the policy that answered, widest first
	// ("defaults + file + tenant acme + agent bot"); Agent is the caller id
	// of its agent layer, "" when none applied.
	Policy string `json:"policy"`
	Agent  string `json:"agent,omitempty"`
	// The total limit, over every counterparty; set only when the policy
	// has a totalLimit and the amount could be read.
	Total *TotalFigures `json:"total,omitempty"`
	// PaymentsInWindow / PaymentsTotalInWindow: payments (operations whose
	// paid stage closed) inside the velocity windows, to this counterparty
	// and to all; nil when the policy sets no such velocity limit.
	PaymentsInWindow      *int `json:"payments_in_window,omitempty"`
	PaymentsTotalInWindow *int `json:"payments_total_in_window,omitempty"`
	// DuplicatePayments are the payments for the question's resource inside
	// the duplicate window, PaidWithoutResource those in it with no usable
	// resource URL to compare; nil when the policy sets no duplicatePayment
	// rule or the question names no resource.
	DuplicatePayments   *int `json:"duplicate_payments,omitempty"`
	PaidWithoutResource *int `json:"paid_without_resource,omitempty"`
}

// TotalFigures are the total limit's figures, like the per-counterparty
// ones but over every counterparty.
type TotalFigures struct {
	WindowOperations   int      `json:"window_operations"`
	Spend              *big.Int `json:"spend_in_window_atomic"`
	SpendWithAmount    *big.Int `json:"spend_with_amount_atomic"`
	MixedAssets        int      `json:"mixed_assets"`
	UnparseableHistory int      `json:"unparseable_history"`
}

// Money is what one past operation says about who was paid, how much, in
// what. Fields that could not be read are empty; Problem says why the amount
// cannot be summed.
type Money struct {
	// PayTos are the canonical 0x addresses its requirements name (several
	// when its events disagree: it then counts against each of them).
	PayTos []string
	// Hosts are the canonical hosts of its resource URLs; Resources the
	// URLs themselves in canonical form (CanonicalResource).
	Hosts     []string
	Resources []string
	Atomic    *big.Int // amount in atomic units of Asset, or nil
	Asset     string   // registry-style key "caip2/address", or ""
	Problem   string   // why Atomic/Asset cannot be used, or ""
}

// Op is one past operation as the guard sees it.
type Op struct {
	RunID, OperationID, Template, Completeness string
	// RolesKnown is false for a template without stage roles: such an
	// operation is judged coarsely (every partial counts as open, every
	// attributable operation as spend).
	RolesKnown                               bool
	PaidConfirmed, OutcomeConfirmed, Faulted bool
	// SettlementUnconfirmed: the template's settlement stage closed, but no
	// witness's payload says settle.success is true, so the guard does not
	// count the outcome as confirmed.
	SettlementUnconfirmed bool
	// Open: money moved and the outcome was not confirmed (or a fault was
	// seen). Spent: the operation counts toward spending limits.
	Open, Spent bool
	// Money is nil when the operation cannot be attributed to any
	// counterparty; Unattributable then says why.
	Money          *Money
	Unattributable string
	// FirstEventAt and LastEventAt are the occurred_at of its first and
	// last events.
	FirstEventAt, LastEventAt string
	// Reserved: this is no recorded operation but a reservation (an allow
	// the Trace does not show paid yet), counted as a payment.
	Reserved bool
	// times, when set (CacheTimes), are FirstEventAt and LastEventAt
	// parsed once.
	times opTimes
}

// opTimes are an operation's FirstEventAt and LastEventAt as parsed, kept
// where the operation is made: a history rebuilt while ingest appends to
// the runs is indexed again for every decision, and parsing every
// operation's times again was a third of that (docs/performance.md).
type opTimes struct {
	first, last     int64 // Unix nanoseconds
	firstOK, lastOK bool  // the text reads as RFC 3339
	set             bool
}

// CacheTimes returns o with its FirstEventAt and LastEventAt parsed once,
// for whoever keeps operations and hands them to many decisions (the
// catalog's summaries). Neither time may change afterwards. A time that
// reads but that Unix nanoseconds cannot hold is left to be parsed when
// read, as is every time of an operation made without CacheTimes.
func CacheTimes(o Op) Op {
	first, firstOK, fine := parseNano(o.FirstEventAt)
	last, lastOK, fine2 := parseNano(o.LastEventAt)
	if !fine || !fine2 {
		o.times = opTimes{}
		return o
	}
	o.times = opTimes{first: first, last: last, firstOK: firstOK, lastOK: lastOK, set: true}
	return o
}

// parseNano parses an event time as the guard does (RFC 3339) into Unix
// nanoseconds; fine is false when it reads but falls outside them.
func parseNano(s string) (ns int64, ok, fine bool) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, false, true
	}
	ns = t.UnixNano()
	return ns, true, time.Unix(0, ns).Equal(t)
}

// firstTime is the time of the operation's first event, and whether it
// reads.
func (o *Op) firstTime() (time.Time, bool) {
	if o.times.set {
		if !o.times.firstOK {
			return time.Time{}, false
		}
		return time.Unix(0, o.times.first).UTC(), true
	}
	t, err := time.Parse(time.RFC3339Nano, o.FirstEventAt)
	return t, err == nil
}

// UnreadableRun is a run file the caller could not read.
type UnreadableRun struct {
	RunID string `json:"run_id"`
	Error string `json:"error"`
}

// History is everything the caller read before asking.
type History struct {
	Ops        []Op
	Runs       int
	Unreadable []UnreadableRun
	// Templates are the templates history was read under (the policy's
	// historyTemplates); Overridden are those an operator file replaces.
	Templates  []string
	Overridden []string
	// Index, when set (BuildIndex), lets Decide skip the operations that
	// cannot bear on the question.
	Index *HistoryIndex
	// Reserved are the reservations the Trace does not show yet, as
	// operations (Reserve adds them); they are not indexed.
	Reserved []Op
	// Committed, when set, is the spend ledger's running totals of what
	// earlier allows, authorizations and forwarded calls committed that
	// the Trace does not show yet; Decide reads it by scope and window.
	Committed Committed
	// ReservationProblems say where the record of what earlier allows
	// reserved and the signed decision chain disagree: what is reserved is
	// then unknown, and nothing is allowed.
	ReservationProblems []string
}

func (o Op) ref() Ref { return Ref{RunID: o.RunID, OperationID: o.OperationID} }

// matches says whether the operation was with this counterparty: an address
// matches any requirements.pay_to, a host any resource URL's host.
func (o Op) matches(c Counterparty) bool {
	if o.Money == nil {
		return false
	}
	switch c.Kind {
	case KindAddress:
		return slices.Contains(o.Money.PayTos, c.Value)
	case KindHost:
		return slices.Contains(o.Money.Hosts, c.Value)
	}
	return false
}

// unattributableFor says why the operation cannot be told to be, or not to
// be, with a counterparty of this kind ("" when it can).
func (o Op) unattributableFor(kind CounterpartyKind) string {
	switch {
	case o.Money == nil || o.Unattributable != "":
		return o.Unattributable
	case kind == KindAddress && len(o.Money.PayTos) == 0:
		return whyNoPayTo
	case kind == KindHost && len(o.Money.Hosts) == 0:
		return whyNoHost
	}
	return ""
}

// MergeHistories combines history read under several templates into one,
// operation by operation, taking the worst case: an operation is open if it
// is open under any template, and spent if spent under any.
func MergeHistories(hs ...History) History {
	if len(hs) == 1 {
		return hs[0]
	}
	var out History
	index := map[Ref]int{}
	seenRun := map[string]bool{}
	for _, h := range hs {
		out.Runs = max(out.Runs, h.Runs)
		out.Templates = append(out.Templates, h.Templates...)
		out.Overridden = append(out.Overridden, h.Overridden...)
		for _, u := range h.Unreadable {
			if !seenRun[u.RunID] {
				seenRun[u.RunID] = true
				out.Unreadable = append(out.Unreadable, u)
			}
		}
		for _, o := range h.Ops {
			i, ok := index[o.ref()]
			if !ok {
				index[o.ref()] = len(out.Ops)
				out.Ops = append(out.Ops, o)
				continue
			}
			m := &out.Ops[i]
			m.Template += "+" + o.Template
			m.Open = m.Open || o.Open
			m.Spent = m.Spent || o.Spent
			m.RolesKnown = m.RolesKnown && o.RolesKnown
			m.SettlementUnconfirmed = m.SettlementUnconfirmed || o.SettlementUnconfirmed
			if (m.Money == nil || m.Unattributable != "") && o.Money != nil && o.Unattributable == "" {
				m.Money, m.Unattributable = o.Money, ""
			}
		}
	}
	return out
}

func listed(list []Counterparty, c Counterparty) bool {
	for _, e := range list {
		if e == c {
			return true
		}
	}
	return false
}

// Decide applies the policy's rules in order. It is pure: the same request,
// history, policy and clock give the same decision. Where the history cannot
// tell (an unreadable run, an open operation that cannot be attributed), the
// answer is review, never allow, unless the policy says to ignore it.
func Decide(req Request, h History, cfg *Config, now time.Time) Decision {
	var d Decision
	f := &d.Figures
	block, review := false, false
	add := func(r Reason, outcome string) {
		d.Reasons = append(d.Reasons, r)
		switch outcome {
		case Block:
			block = true
		case Review:
			review = true
		}
	}
	cp := req.Counterparty
	// With the payee address of the 402 beside a host, an operation is
	// with the counterparty when it names either, and attribution is judged
	// by the address: where the money went, which no other seller can
	// declare for it. A host alone is judged by the resource URLs sellers
	// declare.
	var payCp *Counterparty
	kind := cp.Kind
	if req.PayTo != "" && req.PayTo != cp.Value {
		payCp = &Counterparty{Kind: KindAddress, Value: req.PayTo}
		kind = KindAddress
	}
	hostOnly := cp.Kind == KindHost && payCp == nil
	ours := func(o *Op) bool { return o.matches(cp) || (payCp != nil && o.matches(*payCp)) }

	var matched []timedOp
	var unattributedOpen, unattributedSpent, elsewhereOpen []Op
	sawMatch := func(o *Op, last paidTime) {
		matched = append(matched, timedOp{op: o, last: last})
		if !o.RolesKnown {
			f.Coarse = true
		}
	}
	sawUnattributable := func(o Op) {
		f.Unattributable++
		if o.Open {
			unattributedOpen = append(unattributedOpen, o)
		}
		if o.Spent && !o.Open {
			unattributedSpent = append(unattributedSpent, o)
		}
		if cp.Kind == KindHost && o.Spent && (o.Money == nil || len(o.Money.Hosts) == 0) {
			f.PaidWithoutHost++
		}
	}
	scan := func(o *Op) {
		switch {
		case ours(o):
			sawMatch(o, o.lastTime())
		case o.unattributableFor(kind) != "":
			sawUnattributable(*o)
		case hostOnly && o.Open:
			elsewhereOpen = append(elsewhereOpen, *o)
		}
	}
	// mine, when set, is the index's reading of the operations with cp
	// (matched then holds only the reservations with it).
	var mine *withOps
	// With an index, the open operations with the counterparty and those
	// with other hosts are read from it and from the runs it counts
	// (Elided.AddRun) in the history's order, the reservations' after:
	// openMore and elsewhereMore count those left out of the lists, which
	// hold at least the first maxEvidence.
	var open []Op
	nListed, openMore, elsewhereMore := 0, 0, 0
	if ix := h.Index; ix != nil {
		var seen func(int32) bool
		var list []int32
		if payCp == nil {
			mine = ix.mine(cp)
			if mine == nil {
				mine = &withOps{}
			}
			seen = func(i int32) bool {
				_, ok := slices.BinarySearch(mine.all, i)
				return ok
			}
			f.Coarse = mine.coarse > 0
		} else {
			list, seen = ix.ours(cp, payCp)
			matched = make([]timedOp, 0, len(list)+len(h.Reserved))
			for _, i := range list {
				sawMatch(&h.Ops[i], ix.lastOf(h.Ops, i))
			}
			nListed = len(matched)
		}
		var openIdx []int32
		if mine != nil {
			openIdx = mine.open
		} else {
			openIdx = slices.DeleteFunc(slices.Clone(list), func(i int32) bool { return !h.Ops[i].Open })
		}
		// The reason lists the first maxEvidence and counts the rest.
		n, placed := ix.elided.openWith(cp, payCp)
		open = placedOps(&h, openIdx[:min(len(openIdx), maxEvidence)], placed)
		openMore = n + len(openIdx) - len(open)
		u := ix.unattributable[kind]
		f.Unattributable, f.PaidWithoutHost = u.n, 0
		if cp.Kind == KindHost {
			f.PaidWithoutHost = ix.unattributable[KindHost].paidWithoutHost
		}
		for _, i := range u.open {
			if !seen(i) {
				unattributedOpen = append(unattributedOpen, h.Ops[i])
			}
		}
		for _, i := range u.spent {
			if !seen(i) && !h.Ops[i].Open {
				unattributedSpent = append(unattributedSpent, h.Ops[i])
			}
		}
		if hostOnly {
			nIdx, idx := ix.openElsewhere(mine)
			n, placed := ix.elided.openElsewhere(cp.Value)
			elsewhereOpen = placedOps(&h, idx, placed)
			elsewhereMore = nIdx + n - len(elsewhereOpen)
		}
	} else {
		for i := range h.Ops {
			scan(&h.Ops[i])
		}
	}
	for i := range h.Reserved {
		scan(&h.Reserved[i])
	}
	// What the ledger holds, by scope: counted, never walked.
	cv := commitView{c: h.Committed, asset: cfg.DefaultAsset.Key, now: now, cp: cp, pay: payCp, kind: kind}
	var live, liveUn, elsewhere tallied
	live, liveUn, elsewhere = cv.tally("", time.Time{}), cv.tally("", time.Time{}), cv.tally("", time.Time{})
	if h.Committed != nil {
		live, liveUn = cv.ours(time.Time{}), cv.unattributable(time.Time{})
		if hostOnly {
			elsewhere = cv.elsewhereOpen()
		}
	}
	nMatched := len(matched)
	if mine != nil {
		nMatched += len(mine.all)
	}
	if ix := h.Index; ix != nil && ix.elided != nil {
		n, coarse := ix.elided.matched(cp, payCp)
		nMatched += n
		f.Coarse = f.Coarse || coarse
	}
	// spentFrom are the spent operations with the counterparty that a
	// window from from counts (inside it, or of a time that does not
	// read), in the order of the history; the reservations last.
	spentFrom := func(from time.Time) iter.Seq[timedOp] {
		return func(yield func(timedOp) bool) {
			if mine != nil {
				for _, i := range mine.spentFrom(h.Index, h.Ops, from) {
					if !yield(timedOp{op: &h.Ops[i], last: h.Index.lastOf(h.Ops, i)}) {
						return
					}
				}
			}
			for _, m := range matched {
				if in, ok := m.inWindow(from); m.op.Spent && (in || !ok) && !yield(m) {
					return
				}
			}
		}
	}
	f.Matched = nMatched + live.n
	f.Unattributable += liveUn.n
	f.UnattributableOpen = len(unattributedOpen) + liveUn.open

	// 1. denylist
	if listed(cfg.Denylist, cp) || (payCp != nil && listed(cfg.Denylist, *payCp)) {
		f.Denylisted = true
		who := cfg.Label(cp.Value)
		if !listed(cfg.Denylist, cp) {
			who = cfg.Label(payCp.Value) + " (the pay_to of this payment)"
		}
		add(Reason{Rule: RuleDenylist, Detail: fmt.Sprintf("the counterparty %s is on the denylist", who)}, Block)
	}
	// 2. allowlist
	f.Allowlisted = listed(cfg.Allowlist, cp) || (payCp != nil && listed(cfg.Allowlist, *payCp))
	if (cfg.Allowlisting || len(cfg.Allowlist) > 0) && !f.Allowlisted {
		detail := fmt.Sprintf("the allowlist has %d entries and the counterparty %s is not one of them", len(cfg.Allowlist), cfg.Label(cp.Value))
		if len(cfg.Allowlist) == 0 {
			detail = fmt.Sprintf("the allowlists of the policy's layers (%s) have no counterparty in common, so %s is not on the allowlist", cfg.Name(), cfg.Label(cp.Value))
		}
		add(Reason{Rule: RuleAllowlist, Detail: detail}, Review)
	}
	// 3. open_partial
	for _, m := range matched[nListed:] {
		if m.op.Open {
			open = append(open, *m.op)
		}
	}
	nOpen := len(open) + openMore + live.open
	f.OpenPartial = nOpen
	if nOpen > cfg.MaxOpenPartial {
		what := "partial operations where the payment stage closed and the outcome was not confirmed"
		if f.Coarse {
			what = "partial operations (some under a template without stage roles, where every partial counts as open)"
		}
		detail := fmt.Sprintf("%s with %s; the policy tolerates %d. From the buyer's side a payment whose settlement answer never arrived and one that settled silently look the same",
			count(nOpen, strings.Replace(what, "operations", "operation", 1), what), cfg.Label(cp.Value), cfg.MaxOpenPartial)
		if live.open > 0 {
			detail += fmt.Sprintf(" (%s of them %s signed by this server that the Trace does not show settled yet)", count(live.open, "is an authorization", "are authorizations"), isAre(live.open))
		}
		add(Reason{Rule: RuleOpenPartial, Detail: detail + moreNote(nOpen), Evidence: refsWith(open, live.openRefs)}, Review)
	}
	// 3a. unattributable_history: money moved and was not settled, and the
	// guard cannot tell whether it was this counterparty.
	if n := len(unattributedOpen) + liveUn.open; n > 0 && cfg.UnattributableHistory != Ignore {
		why := firstWhy(unattributedOpen, kind)
		if liveUn.open > 0 {
			why = joinWhy(why, fmt.Sprintf("%d: an authorization this server signed names no %s", liveUn.open, kindWord(kind)))
		}
		detail := fmt.Sprintf("%s paid and not settled cannot be attributed to any %s (%s), so any of them may be with %s",
			count(n, "operation", "operations"), kindWord(kind), why, cfg.Label(cp.Value))
		add(Reason{Rule: RuleUnattributable, Detail: detail + moreNote(n), Evidence: refsWith(unattributedOpen, liveUn.openRefs)}, Review)
	}
	// 3a'. A host alone is tied to a payment only by the resource URL its
	// seller declared, and a seller can declare any host: open payments
	// declared for other hosts may be with this one.
	if n := len(elsewhereOpen) + elsewhereMore + elsewhere.open; n > 0 && cfg.UnattributableHistory != Ignore {
		detail := fmt.Sprintf("%s paid and not settled %s attributed to other hosts only by the resource URL their sellers declared, and a seller can declare any host, so any of them may be with %s; pass pay_to (the payee address of the 402) beside the host to tell them apart",
			count(n, "operation", "operations"), isAre(n), cfg.Label(cp.Value))
		add(Reason{Rule: RuleUnattributable, Detail: detail + moreNote(n), Evidence: refsWith(elsewhereOpen, elsewhere.openRefs)}, Review)
	}
	// 3b. unreadable_history: a run that cannot be read may hide anything.
	if len(h.Unreadable) > 0 && cfg.UnreadableHistory != Ignore {
		add(Reason{Rule: RuleUnreadable, Detail: fmt.Sprintf("%s cannot be read (%s), so the guard cannot tell whether it hides payments to %s that were never settled",
			count(len(h.Unreadable), "run", "runs"), unreadableNames(h.Unreadable), cfg.Label(cp.Value))}, Review)
	}
	// 4. can the amount be read in the policy's asset?
	moneyOK := true
	switch {
	case req.AssetErr != nil:
		moneyOK = false
		add(Reason{Rule: RuleUnknownAsset, Detail: shortErr(req.AssetErr) + "; no money rule was applied"}, Review)
	case req.Asset.Key != cfg.DefaultAsset.Key:
		moneyOK = false
		add(Reason{Rule: RuleAssetMismatch, Detail: fmt.Sprintf("the request is in %s but the policy's limits are in %s; no money rule was applied",
			req.Asset.Describe(), cfg.DefaultAsset.Describe())}, Review)
	}
	if req.AmountErr != nil {
		moneyOK = false
		add(Reason{Rule: RuleUnparseableAmount, Detail: shortErr(req.AmountErr) + "; no money rule was applied"}, Review)
	}
	if moneyOK {
		f.Amount = new(big.Int).Set(req.Atomic)
		// 5. per_counterparty_limit
		from := now.Add(-cfg.Limit.Window)
		spend := new(big.Int)
		var inWindow, mixed, unparseable []Op
		for m := range spentFrom(from) {
			o := m.op
			if !o.Spent {
				continue
			}
			if !m.last.ok {
				unparseable = append(unparseable, *o)
				continue
			}
			if m.last.at.Before(from) {
				continue
			}
			inWindow = append(inWindow, *o)
			switch {
			case o.Money.Problem != "" || o.Money.Atomic == nil || o.Money.Asset == "":
				unparseable = append(unparseable, *o)
			case o.Money.Asset != cfg.DefaultAsset.Key:
				mixed = append(mixed, *o)
			default:
				spend.Add(spend, o.Money.Atomic)
			}
		}
		held := cv.tally("", time.Time{})
		if h.Committed != nil {
			held = cv.ours(from)
		}
		spend.Add(spend, held.atomic)
		nIn, nMixed := len(inWindow)+held.n-held.other, len(mixed)+held.other
		f.WindowOperations = nIn + held.other
		f.MixedAssets, f.UnparseableHistory = nMixed, len(unparseable)
		f.Spend = spend
		f.SpendWithAmount = new(big.Int).Add(spend, req.Atomic)
		if f.SpendWithAmount.Cmp(cfg.Limit.Amount) > 0 {
			add(Reason{Rule: RulePerCounterparty, Detail: fmt.Sprintf("%s to %s in the last %s plus %s makes %s, over the limit of %s",
				spentAndHeld(cfg, spend, held), cfg.Label(cp.Value), hours(cfg.Limit.Window), cfg.FormatDefault(req.Atomic), cfg.FormatDefault(f.SpendWithAmount), cfg.FormatDefault(cfg.Limit.Amount)) + moreNote(nIn),
				Evidence: refsWith(inWindow, held.refs)}, Review)
		}
		if nMixed > 0 {
			add(Reason{Rule: RuleMixedAssets, Detail: fmt.Sprintf("%s with %s in the window are in another asset than %s and cannot be added to the limit", count(nMixed, "paid operation", "paid operations"), cfg.Label(cp.Value), cfg.DefaultAsset.Symbol) + moreNote(nMixed),
				Evidence: refsWith(mixed, held.refs)}, Review)
		}
		if len(unparseable) > 0 {
			add(Reason{Rule: RuleUnparseableHistory, Detail: fmt.Sprintf("%s with %s have an amount, asset or time that cannot be read (%s), so the spend in the window is unknown", count(len(unparseable), "paid operation", "paid operations"), cfg.Label(cp.Value), firstProblem(unparseable)) + moreNote(len(unparseable)),
				Evidence: refs(unparseable)}, Review)
		}
		// 5'. Paid operations that cannot be attributed to anyone may, at
		// worst, be with this counterparty: where they could take it over
		// the limit, review.
		if cfg.UnattributableHistory != Ignore {
			if r, ok := unattributedLimit(unattributedSpent, cv.unattributableFrom(h, from), f.SpendWithAmount, cfg, from, cp, kind); ok {
				add(r, Review)
			}
		}
		// 5a. total_limit
		if cfg.TotalLimit != nil {
			for _, r := range totalLimit(req, h, cv, cfg, now, f) {
				add(r, Review)
			}
		}
	}
	// 5b. velocity_limit and 5c. duplicate_payment need no amount.
	for _, r := range velocity(h, cv, spentFrom, unattributedSpent, cfg, now, f, cp, kind) {
		add(r, Review)
	}
	if r, ok := duplicate(req, h, cv, cfg, now, f); ok {
		add(r, Review)
	}
	// 5e. new_payee: a first payment to a payee needs a person's word.
	if cfg.ReviewNewPayee {
		payee := cp
		if payCp != nil {
			payee = *payCp
		}
		if r, ok := newPayee(h, payee, cfg); ok {
			add(r, Review)
		}
	}
	// 6'. What earlier allows reserved cannot be known.
	if len(h.ReservationProblems) > 0 {
		add(Reason{Rule: RuleReservationUnverified, Detail: fmt.Sprintf("what earlier allows reserved cannot be known, so no limit can be judged: %s", strings.Join(h.ReservationProblems, "; "))}, Review)
	}
	// 5d. signed_offer: what the seller signed, when the payment came
	// with its 402.
	if r, outcome, ok := signedOffer(req, cfg); ok {
		add(r, outcome)
	}
	// 6. review_above
	if moneyOK && req.Atomic.Cmp(cfg.ReviewAbove) > 0 {
		add(Reason{Rule: RuleReviewAbove, Detail: fmt.Sprintf("%s is more than the %s a payment may be without review", cfg.FormatDefault(req.Atomic), cfg.FormatDefault(cfg.ReviewAbove))}, Review)
	}

	f.Policy, f.Agent = cfg.Name(), cfg.Agent
	d.Reasons = append(d.Reasons, historyReason(h, f, cfg, cp, req, now))
	switch {
	case block:
		d.Decision = Block
	case review:
		d.Decision = Review
	default:
		d.Decision = Allow
	}
	return d
}

// inWindow says whether the operation's last event falls at or after from.
// ok is false when its time cannot be read.
func inWindow(o Op, from time.Time) (in, ok bool) {
	return timedOp{op: &o, last: o.lastTime()}.inWindow(from)
}

// timedOp is an operation Decide counts and the time of its last event,
// read once (from the index when there is one).
type timedOp struct {
	op   *Op
	last paidTime
}

func (t timedOp) inWindow(from time.Time) (in, ok bool) {
	if !t.last.ok {
		return false, false
	}
	return !t.last.at.Before(from), true
}

// lastTime is the time of the operation's last event, and whether it reads.
func (o *Op) lastTime() paidTime {
	if o.times.set {
		if !o.times.lastOK {
			return paidTime{}
		}
		return paidTime{at: time.Unix(0, o.times.last).UTC(), ok: true}
	}
	t, err := time.Parse(time.RFC3339Nano, o.LastEventAt)
	return paidTime{at: t, ok: err == nil}
}

// timed is h.all() with each operation's last time: the index's where it
// has one.
func (h History) timed() iter.Seq[timedOp] {
	return func(yield func(timedOp) bool) {
		ix := h.Index
		for i := range h.Ops {
			t := timedOp{op: &h.Ops[i]}
			if ix != nil && i < ix.n {
				t.last = ix.lastOf(h.Ops, int32(i))
			} else {
				t.last = t.op.lastTime()
			}
			if !yield(t) {
				return
			}
		}
		for i := range h.Reserved {
			if !yield(timedOp{op: &h.Reserved[i], last: h.Reserved[i].lastTime()}) {
				return
			}
		}
	}
}

// timedOps are ops with their last times, read here.
func timedOps(ops []Op) iter.Seq[timedOp] {
	return func(yield func(timedOp) bool) {
		for i := range ops {
			if !yield(timedOp{op: &ops[i], last: ops[i].lastTime()}) {
				return
			}
		}
	}
}

// totalLimit is rule 5a: the spend to every counterparty inside the window
// plus this amount against the total limit, with what cannot be summed.
// An operation counts once however many counterparties it names.
func totalLimit(req Request, h History, cv commitView, cfg *Config, now time.Time, f *Figures) []Reason {
	lim := cfg.TotalLimit
	from := now.Add(-lim.Window)
	spend := new(big.Int)
	var in, mixed, unparseable []Op
	for t := range h.timed() {
		o := t.op
		if !o.Spent {
			continue
		}
		inside, ok := t.inWindow(from)
		if !ok {
			unparseable = append(unparseable, *o)
			continue
		}
		if !inside {
			continue
		}
		in = append(in, *o)
		switch {
		case o.Money == nil || o.Money.Problem != "" || o.Money.Atomic == nil || o.Money.Asset == "":
			unparseable = append(unparseable, *o)
		case o.Money.Asset != cfg.DefaultAsset.Key:
			mixed = append(mixed, *o)
		default:
			spend.Add(spend, o.Money.Atomic)
		}
	}
	held := cv.tally(ledger.ScopeAll, from)
	spend.Add(spend, held.atomic)
	nIn, nMixed := len(in)+held.n, len(mixed)+held.other
	t := &TotalFigures{WindowOperations: nIn, Spend: spend, SpendWithAmount: new(big.Int).Add(spend, req.Atomic),
		MixedAssets: nMixed, UnparseableHistory: len(unparseable)}
	f.Total = t
	var out []Reason
	if t.SpendWithAmount.Cmp(lim.Amount) > 0 {
		out = append(out, Reason{Rule: RuleTotalLimit, Detail: fmt.Sprintf("%s to all counterparties in the last %s plus %s makes %s, over the total limit of %s",
			spentAndHeld(cfg, spend, held), hours(lim.Window), cfg.FormatDefault(req.Atomic), cfg.FormatDefault(t.SpendWithAmount), cfg.FormatDefault(lim.Amount)) + moreNote(nIn),
			Evidence: refsWith(in, held.refs)})
	}
	if nMixed > 0 {
		out = append(out, Reason{Rule: RuleMixedAssets, Detail: fmt.Sprintf("%s in the total limit's window are in another asset than %s and cannot be added to the total limit", count(nMixed, "paid operation", "paid operations"), cfg.DefaultAsset.Symbol) + moreNote(nMixed),
			Evidence: refsWith(mixed, held.refs)})
	}
	if len(unparseable) > 0 {
		out = append(out, Reason{Rule: RuleUnparseableHistory, Detail: fmt.Sprintf("%s have an amount, asset or time that cannot be read (%s), so the total spend in the window is unknown", count(len(unparseable), "paid operation", "paid operations"), firstProblemOrNone(unparseable)) + moreNote(len(unparseable)),
			Evidence: refs(unparseable)})
	}
	return out
}

// velocity is rule 5b: this payment would be one more inside each
// velocity window. An operation whose time cannot be read counts as inside.
func velocity(h History, cv commitView, mine func(from time.Time) iter.Seq[timedOp], unattributed []Op, cfg *Config, now time.Time, f *Figures, cp Counterparty, kind CounterpartyKind) []Reason {
	var out []Reason
	inside := func(lim *CountLimit, ops func(from time.Time) iter.Seq[timedOp]) []Op {
		from := now.Add(-lim.Window)
		var in []Op
		for t := range ops(from) {
			if !t.op.Spent {
				continue
			}
			if inside, ok := t.inWindow(from); inside || !ok {
				in = append(in, *t.op)
			}
		}
		return in
	}
	check := func(lim *CountLimit, ops func(from time.Time) iter.Seq[timedOp], held func(from time.Time) tallied, slot **int, whom string) int {
		if lim == nil {
			return 0
		}
		in := inside(lim, ops)
		c := held(now.Add(-lim.Window))
		n := len(in) + c.n
		*slot = &n
		if n+1 > lim.Count {
			out = append(out, Reason{Rule: RuleVelocity, Detail: fmt.Sprintf("%s to %s in the last %s; this one would make %d, more than the %d the policy allows",
				count(n, "payment", "payments")+heldNote(c.n), whom, minutes(lim.Window), n+1, lim.Count) + moreNote(n), Evidence: refsWith(in, c.refs)})
		}
		return n
	}
	ours := func(from time.Time) tallied {
		if cv.c == nil {
			return cv.tally("", from)
		}
		return cv.ours(from)
	}
	n := check(cfg.Velocity.PerCounterparty, mine, ours, &f.PaymentsInWindow, cfg.Label(cp.Value))
	if lim := cfg.Velocity.PerCounterparty; lim != nil && n+1 <= lim.Count && cfg.UnattributableHistory != Ignore {
		// At worst, the payments no one can attribute were with it too.
		un := inside(lim, func(time.Time) iter.Seq[timedOp] { return timedOps(unattributed) })
		c := cv.unattributableFrom(h, now.Add(-lim.Window))
		if m := len(un) + c.n; n+m+1 > lim.Count {
			why := firstWhy(un, kind)
			if c.n > 0 {
				why = joinWhy(why, fmt.Sprintf("%d: held by earlier allows that name no %s", c.n, kindWord(kind)))
			}
			out = append(out, Reason{Rule: RuleUnattributable, Detail: fmt.Sprintf("%s settled in the last %s cannot be attributed to any %s (%s); at worst they were to %s, and this one would make %d, more than the %d the policy allows",
				count(m, "payment", "payments"), minutes(lim.Window), kindWord(kind), why, cfg.Label(cp.Value), n+m+1, lim.Count) + moreNote(m), Evidence: refsWith(un, c.refs)})
		}
	}
	check(cfg.Velocity.Total, func(time.Time) iter.Seq[timedOp] { return h.timed() }, func(from time.Time) tallied { return cv.tally(ledger.ScopeAll, from) }, &f.PaymentsTotalInWindow, "all counterparties")
	return out
}

// unattributedLimit is the per-counterparty limit at worst: the paid
// operations inside the window that cannot be attributed to any
// counterparty of this kind may all be with it. Those whose amount cannot
// be read in the policy's asset could take it over the limit by
// themselves.
func unattributedLimit(ops []Op, held tallied, withAmount *big.Int, cfg *Config, from time.Time, cp Counterparty, kind CounterpartyKind) (Reason, bool) {
	sum := new(big.Int)
	var in, unknown []Op
	for _, o := range ops {
		if inside, ok := inWindow(o, from); ok && !inside {
			continue
		}
		in = append(in, o)
		if o.Money == nil || o.Money.Atomic == nil || o.Money.Problem != "" || o.Money.Asset != cfg.DefaultAsset.Key {
			unknown = append(unknown, o)
			continue
		}
		sum.Add(sum, o.Money.Atomic)
	}
	sum.Add(sum, held.atomic)
	worst := new(big.Int).Add(withAmount, sum)
	n, nUnknown := len(in)+held.n, len(unknown)+held.other
	why := firstWhy(in, kind)
	if held.n > 0 {
		why = joinWhy(why, fmt.Sprintf("%d: held by earlier allows that name no %s", held.n, kindWord(kind)))
	}
	switch {
	case n == 0:
		return Reason{}, false
	case nUnknown > 0:
		return Reason{Rule: RuleUnattributable, Detail: fmt.Sprintf("%s in the last %s cannot be attributed to any %s (%s), and %d of them have no amount that can be read in %s; at worst they were paid to %s and take it over the limit of %s",
			count(n, "paid operation", "paid operations"), hours(cfg.Limit.Window), kindWord(kind), why, nUnknown, cfg.DefaultAsset.Symbol, cfg.Label(cp.Value), cfg.FormatDefault(cfg.Limit.Amount)) + moreNote(n),
			Evidence: refsWith(in, held.refs)}, true
	case worst.Cmp(cfg.Limit.Amount) > 0:
		return Reason{Rule: RuleUnattributable, Detail: fmt.Sprintf("%s settled in the last %s (%s) cannot be attributed to any %s (%s); at worst they were paid to %s, which with this payment makes %s, over the limit of %s",
			count(n, "paid operation", "paid operations"), hours(cfg.Limit.Window), cfg.FormatDefault(sum), kindWord(kind), why, cfg.Label(cp.Value), cfg.FormatDefault(worst), cfg.FormatDefault(cfg.Limit.Amount)) + moreNote(n),
			Evidence: refsWith(in, held.refs)}, true
	}
	return Reason{}, false
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// duplicate is rule 5c: a payment for the same resource inside the window.
// An operation whose time cannot be read counts as inside. The resource
// the seller declares, where the question carries one beside the resource
// requested, is a second key: history records what sellers declared.
func duplicate(req Request, h History, cv commitView, cfg *Config, now time.Time, f *Figures) (Reason, bool) {
	if cfg.DuplicateWindow <= 0 || req.Resource == "" {
		return Reason{}, false
	}
	same := func(rs []string) bool {
		return slices.Contains(rs, req.Resource) || (req.SellerResource != "" && slices.Contains(rs, req.SellerResource))
	}
	from := now.Add(-cfg.DuplicateWindow)
	var paid []Op
	without := 0
	for t := range h.timed() {
		o := t.op
		if !o.Spent {
			continue
		}
		if inside, ok := t.inWindow(from); !inside && ok {
			continue
		}
		switch {
		case o.Money == nil || len(o.Money.Resources) == 0:
			without++
		case same(o.Money.Resources):
			paid = append(paid, *o)
		}
	}
	held := cv.tally(ledger.ScopeResource+req.Resource, from)
	if req.SellerResource != "" && req.SellerResource != req.Resource {
		held = held.plus(cv.tally(ledger.ScopeResource+req.SellerResource, from))
	}
	without += cv.tally(ledger.ScopeNoResource, from).n
	n := len(paid) + held.n
	f.DuplicatePayments, f.PaidWithoutResource = &n, &without
	if n == 0 {
		return Reason{}, false
	}
	what := req.Resource
	if req.SellerResource != "" {
		what += " (which the seller declares as " + req.SellerResource + ")"
	}
	return Reason{Rule: RuleDuplicatePayment, Detail: fmt.Sprintf("%s was already paid for in the last %s (%s); paying again may pay twice for the same thing",
		what, minutes(cfg.DuplicateWindow), count(n, "payment", "payments")+heldNote(held.n)) + moreNote(n), Evidence: refsWith(paid, held.refs)}, true
}

// newPayee is rule 5e: neither the Trace (an operation with the payee
// whose payment was made) nor the spend ledger (a commitment ever made to
// it, which an approval's use is) has seen the payee for this tenant. Where
// part of the Trace cannot be read an earlier payment cannot be known
// either, and the answer stays review.
func newPayee(h History, payee Counterparty, cfg *Config) (Reason, bool) {
	if h.Committed != nil {
		scope := ledger.ScopePayTo + payee.Value
		if payee.Kind == KindHost {
			scope = ledger.ScopeHost + payee.Value
		}
		if h.Committed.Seen(scope) {
			return Reason{}, false
		}
	}
	paid := func(o Op) bool { return o.Spent && o.matches(payee) }
	if ix := h.Index; ix != nil {
		if ix.elided.with(payee).Spent > 0 {
			return Reason{}, false
		}
		for _, i := range ix.with(payee) {
			if paid(h.Ops[i]) {
				return Reason{}, false
			}
		}
	} else {
		for _, o := range h.Ops {
			if paid(o) {
				return Reason{}, false
			}
		}
	}
	for _, o := range h.Reserved {
		if paid(o) {
			return Reason{}, false
		}
	}
	detail := fmt.Sprintf("first payment to %s: neither the Trace nor the spend ledger shows a payment to it for this tenant, and the policy (reviewNewPayee) has a person confirm a new payee once", cfg.Label(payee.Value))
	if n := len(h.Unreadable); n > 0 {
		detail += fmt.Sprintf("; %s of the Trace cannot be read, so an earlier payment to it there cannot be known", count(n, "run", "runs"))
	}
	return Reason{Rule: RuleNewPayee, Detail: detail}, true
}

// count writes "1 run" / "3 runs": n, then the singular or the plural
// phrase.
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func kindWord(k CounterpartyKind) string {
	if k == KindHost {
		return "host"
	}
	return "address"
}

func firstWhy(ops []Op, kind CounterpartyKind) string {
	why := map[string]int{}
	for _, o := range ops {
		why[o.unattributableFor(kind)]++
	}
	return whyText(why)
}

// whyText writes reason counts in a stable order.
func whyText(why map[string]int) string {
	keys := make([]string, 0, len(why))
	for k := range why {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d: %s", why[k], k))
	}
	return strings.Join(parts, "; ")
}

func unreadableNames(us []UnreadableRun) string {
	names := make([]string, 0, min(len(us), maxEvidence+1))
	for i, u := range us {
		if i == maxEvidence {
			names = append(names, fmt.Sprintf("and %d more", len(us)-i))
			break
		}
		names = append(names, u.RunID)
	}
	return strings.Join(names, ", ")
}

func historyReason(h History, f *Figures, cfg *Config, cp Counterparty, req Request, now time.Time) Reason {
	f.Operations, f.Runs, f.UnreadableRuns = len(h.Ops)+h.ElidedOps(), h.Runs, len(h.Unreadable)
	kind := cp.Kind
	if req.PayTo != "" && req.PayTo != cp.Value {
		kind = KindAddress
	}
	templates := h.Templates
	if len(templates) == 0 {
		templates = cfg.HistoryTemplates
	}
	var b strings.Builder
	fmt.Fprintf(&b, "read %s in %s under template %s (the policy's history templates); %d %s with %s",
		count(f.Operations, "operation", "operations"), count(f.Runs, "run", "runs"), strings.Join(templates, ", "), f.Matched, isAre(f.Matched), cfg.Label(cp.Value))
	if len(h.Overridden) > 0 {
		fmt.Fprintf(&b, "; the operator's templates directory replaces the bundled %s", strings.Join(h.Overridden, ", "))
	}
	if req.PayTo != "" && kind == KindAddress && cp.Kind == KindHost {
		fmt.Fprintf(&b, " or its pay_to %s", cfg.Label(req.PayTo))
	}
	if n := len(h.Reserved); n > 0 {
		fmt.Fprintf(&b, "; %s of earlier allows that the Trace does not show paid yet count as payments", count(n, "reservation", "reservations"))
	}
	if h.Committed != nil {
		if n := h.Committed.Tally(ledger.ScopeAll, cfg.DefaultAsset.Key, time.Time{}, now, 0).Count; n > 0 {
			fmt.Fprintf(&b, "; %s held by earlier allows, authorizations and forwarded calls that the Trace does not show paid yet count as payments", count(n, "amount", "amounts"))
		}
	}
	if f.Unattributable > 0 {
		var why string
		if h.Index != nil {
			why = whyText(h.Index.unattributable[kind].why)
		} else {
			var un []Op
			for o := range h.all() {
				if !o.matches(cp) && o.unattributableFor(kind) != "" {
					un = append(un, o)
				}
			}
			why = firstWhy(un, kind)
		}
		fmt.Fprintf(&b, "; %s could not be attributed to any %s (%s), %d of them paid and not settled", count(f.Unattributable, "operation", "operations"), kindWord(kind), why, f.UnattributableOpen)
		if cfg.UnattributableHistory == Ignore && f.UnattributableOpen > 0 {
			b.WriteString(", which the policy says to ignore")
		}
	}
	if cp.Kind == KindHost && f.Matched == 0 && f.PaidWithoutHost > 0 {
		fmt.Fprintf(&b, "; nothing matched the host %s, and %s had no usable host to compare", cp.Value, count(f.PaidWithoutHost, "paid operation", "paid operations"))
	}
	if f.UnreadableRuns > 0 {
		fmt.Fprintf(&b, "; %s could not be read (%s)", count(f.UnreadableRuns, "run", "runs"), unreadableNames(h.Unreadable))
		if cfg.UnreadableHistory == Ignore {
			b.WriteString(" and the policy says to ignore them, so they may hide operations with this counterparty")
		}
	}
	settleUnconfirmed := 0
	if h.Index != nil {
		settleUnconfirmed = h.Index.settleUnconfirmed
	} else {
		for _, o := range h.Ops {
			if o.SettlementUnconfirmed {
				settleUnconfirmed++
			}
		}
	}
	if settleUnconfirmed > 0 {
		fmt.Fprintf(&b, "; %s had a settlement answer that does not say settle.success is true, so they count as not settled", count(settleUnconfirmed, "operation", "operations"))
	}
	if f.Coarse {
		b.WriteString("; some operations with this counterparty use a template without stage roles, so they are judged coarsely: every partial counts as open and every attributable operation as spend")
	}
	if cfg.DuplicateWindow > 0 {
		switch {
		case req.Resource == "":
			b.WriteString("; the question names no resource, so duplicate_payment could not apply")
		case *f.PaidWithoutResource > 0:
			fmt.Fprintf(&b, "; %s in the duplicate window had no usable resource URL to compare with %s", count(*f.PaidWithoutResource, "payment", "payments"), req.Resource)
		}
	}
	fmt.Fprintf(&b, "; policy: %s", f.Policy)
	return Reason{Rule: RuleHistory, Detail: b.String()}
}

func refs(ops []Op) []Ref {
	n := min(len(ops), maxEvidence)
	out := make([]Ref, 0, n)
	for _, o := range ops[:n] {
		out = append(out, o.ref())
	}
	return out
}

func moreNote(n int) string {
	if n <= maxEvidence {
		return ""
	}
	return fmt.Sprintf(" (evidence lists the first %d of %d)", maxEvidence, n)
}

func firstProblem(ops []Op) string {
	for _, o := range ops {
		if o.Money != nil && o.Money.Problem != "" {
			return "first: " + o.Money.Problem
		}
		if _, err := time.Parse(time.RFC3339Nano, o.LastEventAt); err != nil {
			return fmt.Sprintf("first: last event time %q", clip(o.LastEventAt))
		}
	}
	return "first: no amount or asset"
}

// firstProblemOrNone is firstProblem for operations that may have no money
// fields at all.
func firstProblemOrNone(ops []Op) string {
	for _, o := range ops {
		switch {
		case o.Money == nil:
			return "first: " + o.Unattributable
		case o.Money.Problem != "":
			return "first: " + o.Money.Problem
		}
		if _, err := time.Parse(time.RFC3339Nano, o.LastEventAt); err != nil {
			return fmt.Sprintf("first: last event time %q", clip(o.LastEventAt))
		}
	}
	return "first: no amount or asset"
}

func minutes(d time.Duration) string {
	switch {
	case d%time.Hour == 0 && d > time.Hour:
		return hours(d)
	case d%time.Minute == 0:
		return count(int(d/time.Minute), "minute", "minutes")
	}
	return d.String()
}

func hours(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%d hours", d/time.Hour)
	}
	return d.String()
}

// Text renders a decision for people: the answer, then one line per reason
// with its evidence.
func (d Decision) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "decision: %s\n", d.Decision)
	for _, r := range d.Reasons {
		fmt.Fprintf(&b, "- %s: %s\n", r.Rule, r.Detail)
		for _, e := range r.Evidence {
			fmt.Fprintf(&b, "    run %s, operation %s\n", e.RunID, e.OperationID)
		}
	}
	return b.String()
}
