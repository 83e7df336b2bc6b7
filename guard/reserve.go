package guard

import (
	"fmt"
	"iter"
	"math/big"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
)

// Rules about reservations.
const (
	// RuleReserved is the line of an allow that says what it reserves.
	RuleReserved = "reserved"
	// RuleReservationUnverified: the guard's record of what earlier allows
	// reserved and the signed decision chain disagree, so what is reserved
	// cannot be known.
	RuleReservationUnverified = "reservation_unverified"
)

// reservationRun is the run id reservations carry as evidence.
const reservationRun = "reservation"

// Reservation is an allow the guard gave (or an authorization it signed)
// whose payment the Trace does not show yet. Until the Trace shows it, it
// counts as a payment made at At: against every limit, velocity rule and
// duplicate window it could affect.
type Reservation struct {
	// ReceiptID is the signed decision receipt that reserved it.
	ReceiptID string
	Caller    string
	At        time.Time
	// Until is when it lapses; the zero time: never, it holds until the
	// Trace shows the payment (an authorization signed for it).
	Until time.Time
	// Open: it also counts as a payment that is open (paid, not settled)
	// to its counterparty, as a signed authorization is until the Trace
	// shows it settled.
	Open bool
	// PayTo (a canonical address) and Host (a canonical host) are whom it
	// pays; either may be empty, not both.
	PayTo, Host string
	// Resource is the canonical resource URL, or "".
	Resource string
	Atomic   *big.Int
	Asset    string
	// ReviewID names the review whose approval was used, or "".
	ReviewID string
	// ValidBefore is a signed authorization's validBefore, when known.
	ValidBefore time.Time
}

// Holds says whether the reservation still holds at now (before it lapses).
func (r Reservation) Holds(now time.Time) bool {
	return r.Until.IsZero() || now.Before(r.Until)
}

// Whom names what it pays, for messages.
func (r Reservation) Whom() string {
	switch {
	case r.PayTo != "" && r.Host != "":
		return r.Host + " (pay_to " + r.PayTo + ")"
	case r.PayTo != "":
		return r.PayTo
	}
	return r.Host
}

// ReservedOp is a reservation as the operation it stands for.
func ReservedOp(r Reservation) Op { return r.op() }

// op is the reservation as the operation it stands for.
func (r Reservation) op() Op {
	m := &Money{Atomic: r.Atomic, Asset: r.Asset}
	if r.PayTo != "" {
		m.PayTos = []string{r.PayTo}
	}
	if r.Host != "" {
		m.Hosts = []string{r.Host}
	}
	if r.Resource != "" {
		m.Resources = []string{r.Resource}
	}
	at := r.At.UTC().Format(time.RFC3339Nano)
	return Op{RunID: reservationRun, OperationID: r.ReceiptID, Template: "reservation", Completeness: "reserved",
		RolesKnown: true, PaidConfirmed: true, Open: r.Open, Spent: true, Money: m, FirstEventAt: at, LastEventAt: at, Reserved: true}
}

// Reserve adds to h, as operations, the reservations that hold at now and
// that no recorded payment shows yet, and returns how many the Trace
// shows (those count once, as the payment recorded).
//
// A recorded payment shows a reservation when it is paid (its payment
// stage closed), its first event is at or after the reservation's time,
// it names the reservation's pay_to address (or, for a reservation
// without one, its host), and its amount and asset are the reservation's
// exactly. The Trace does not record which caller paid, so the caller is
// not compared: any caller's payment of the same terms shows the oldest
// reservation it can. Each payment shows at most one reservation, and
// each reservation is shown by at most one payment.
func (h *History) Reserve(rs []Reservation, now time.Time) (shown int) {
	rs = slices.Clone(rs)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].At.Before(rs[j].At) })
	used := map[int]bool{}
	for _, r := range rs {
		if !r.Holds(now) {
			continue
		}
		if i, ok := h.showing(r, used); ok {
			used[i] = true
			shown++
			continue
		}
		h.Reserved = append(h.Reserved, r.op())
	}
	return shown
}

// showing finds the recorded payment that shows r, not already used.
func (h *History) showing(r Reservation, used map[int]bool) (int, bool) {
	// terms: operation i pays what r reserves, to whom r pays it; Money
	// and its amount are known to be read (Op.paidAt).
	terms := func(i int) bool {
		m := h.Ops[i].Money
		if used[i] || m.Asset != r.Asset || m.Atomic.Cmp(r.Atomic) != 0 {
			return false
		}
		if r.PayTo != "" {
			return slices.Contains(m.PayTos, r.PayTo)
		}
		return slices.Contains(m.Hosts, r.Host)
	}
	best, bestAt := -1, ""
	try := func(i int, at time.Time) {
		if !at.Before(r.At) && terms(i) && (best < 0 || h.Ops[i].FirstEventAt < bestAt) {
			best, bestAt = i, h.Ops[i].FirstEventAt
		}
	}
	if ix := h.Index; ix != nil {
		c := Counterparty{Kind: KindHost, Value: r.Host}
		if r.PayTo != "" {
			c = Counterparty{Kind: KindAddress, Value: r.PayTo}
		}
		// No payment to c at or after r: none shows it (the usual case,
		// a reservation newer than the Trace), known without a look at each.
		if l, ok := ix.latest(c); !ok || l.Before(r.At) {
			return -1, false
		}
		for _, i := range ix.with(c) {
			if p := ix.paidOf(h.Ops, i); p.ok {
				try(int(i), p.at)
			}
		}
	} else {
		for i, o := range h.Ops {
			if o.shows() && terms(i) {
				if at, ok := o.paidAt(); ok {
					try(i, at)
				}
			}
		}
	}
	return best, best >= 0
}

// shows says whether the operation is a payment that can show a
// reservation: paid, its amount read.
func (o Op) shows() bool {
	return o.Spent && o.Money != nil && o.Money.Atomic != nil && o.Money.Problem == ""
}

// paidAt is the time of the first event of an operation that can show a
// reservation (shows), and whether it can: one whose time does not parse
// shows none.
func (o Op) paidAt() (time.Time, bool) {
	if !o.shows() {
		return time.Time{}, false
	}
	return o.firstTime()
}

// all is every operation Decide counts: the recorded ones and the
// reservations the Trace does not show yet.
func (h History) all() iter.Seq[Op] {
	return func(yield func(Op) bool) {
		for _, o := range h.Ops {
			if !yield(o) {
				return
			}
		}
		for _, o := range h.Reserved {
			if !yield(o) {
				return
			}
		}
	}
}

// ReservationLine is the reason an allow gives for what it reserves.
func ReservationLine(r Reservation, cfg *Config) Reason {
	var b strings.Builder
	amount := r.Atomic.String() + " atomic units of " + r.Asset
	if r.Asset == cfg.DefaultAsset.Key {
		amount = cfg.FormatDefault(r.Atomic)
	}
	fmt.Fprintf(&b, "this allow reserves %s to %s", amount, r.Whom())
	if r.Resource != "" {
		fmt.Fprintf(&b, " for %s", r.Resource)
	}
	b.WriteString(": it counts at once against every limit, velocity and duplicate rule, for every caller, ")
	switch {
	case r.Until.IsZero() && !r.ValidBefore.IsZero():
		fmt.Fprintf(&b, "and as a payment open to it, until the Trace shows the payment or, once the authorization expires at %s, the asset contract says it was never used",
			r.ValidBefore.UTC().Format(time.RFC3339))
	case r.Until.IsZero():
		b.WriteString("and as a payment open to it, until the Trace shows the payment")
	default:
		fmt.Fprintf(&b, "until the Trace shows the payment or the reservation lapses at %s", r.Until.UTC().Format(time.RFC3339))
	}
	if r.ReceiptID != "" {
		fmt.Fprintf(&b, " (receipt %s)", r.ReceiptID)
	}
	return Reason{Rule: RuleReserved, Detail: b.String()}
}

// Payments are the paid operations of the Trace whose first event is at or
// after since, as the ledger matches them against what it holds
// (ledger.Book.Match): a payment shows the commitment of its terms.
func (h History) Payments(since time.Time) []ledger.Payment {
	var out []ledger.Payment
	for _, o := range h.Ops {
		at, ok := o.paidAt()
		if !ok || at.Before(since) {
			continue
		}
		out = append(out, ledger.Payment{PayTos: o.Money.PayTos, Hosts: o.Money.Hosts, Atomic: o.Money.Atomic.String(), Asset: o.Money.Asset, At: at})
	}
	return out
}
