package engine

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/big"
	"strconv"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// ReservationInfo is one reservation as answers and statuses show it.
type ReservationInfo struct {
	ReceiptID string `json:"receipt_id"`
	Caller    string `json:"caller"`
	PayTo     string `json:"pay_to,omitempty"`
	Host      string `json:"host,omitempty"`
	Resource  string `json:"resource,omitempty"`
	// Amount in display units of Asset, AmountAtomic in atomic units.
	Amount       string `json:"amount"`
	AmountAtomic string `json:"amount_atomic"`
	Asset        string `json:"asset"`
	At           string `json:"at"`
	// Until is when it lapses; empty for a hold (an authorization), which
	// holds until the Trace shows the payment.
	Until string `json:"until,omitempty"`
	// Open: it counts as a payment open to its counterparty.
	Open     bool   `json:"open,omitempty"`
	ReviewID string `json:"review_id,omitempty"`
	// Kind is the ledger entry's kind: hold (an allow), authorization (a
	// signed payment) or spend (a forwarded paying call).
	Kind string `json:"kind,omitempty"`
	// ValidBefore is an authorization's validBefore, when recorded: once
	// it has passed, the hold is released if the asset contract says the
	// authorization was never used.
	ValidBefore string `json:"valid_before,omitempty"`

	res guard.Reservation
}

func (i *ReservationInfo) reason(pol *guard.Config) guard.Reason {
	return guard.ReservationLine(i.res, pol)
}

// reservationMAC seals a reservation record's terms with the server's
// key: a writer of the store, who holds no key, can delete a record (the
// chain's allow receipts tell) but cannot forge or alter one.
func reservationMAC(key []byte, r *reviewlog.Reservation, at string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("haia-trace-mcp/reservation/v1"))
	m.Write([]byte(sealedText(r, at)))
	return hex.EncodeToString(m.Sum(nil))
}

// sealedText is what reservationMAC seals after its label: every field,
// each as NUL, its length, a colon and its bytes. The tenant follows the
// rest when the record names one (records of earlier versions name none,
// and their seals stay as they were).
func sealedText(r *reviewlog.Reservation, at string) string {
	var b []byte
	fields := []string{r.ReceiptID, r.Caller, r.PayTo, r.Host, r.Resource, r.Atomic, r.Asset, r.Until, strconv.FormatBool(r.Open), r.ReviewID, at}
	if r.Tenant != "" {
		fields = append(fields, "tenant", r.Tenant)
	}
	for _, f := range fields {
		b = append(b, 0)
		b = strconv.AppendInt(b, int64(len(f)), 10)
		b = append(b, ':')
		b = append(b, f...)
	}
	return string(b)
}

// releaseMAC seals a released record with the server's key, bound to the
// seal of the reservation record it releases (reservationMAC, which covers
// every term of that record and its time): a writer of the store can
// delete a release (the reservation then counts again: fail closed) but
// cannot forge one, move one to another reservation, or alter one.
func releaseMAC(key []byte, rel *reviewlog.Release, reservationSeal, at string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("haia-trace-mcp/release/v1"))
	for _, f := range []string{rel.ReceiptID, rel.Caller, rel.Outcome, rel.OutcomeReceipt, reservationSeal, at} {
		fmt.Fprintf(m, "\x00%d:%s", len(f), f)
	}
	return hex.EncodeToString(m.Sum(nil))
}

// released says whether a sealed release of this server lets go of r (whose
// own seal was checked), with what is wrong with every release that does
// not verify: such a release is never honoured, and the reservation keeps
// counting.
func (e *Engine) released(r *reviewlog.Reservation) (bool, []string) {
	var ok bool
	var problems []string
	for i := range r.Releases {
		rel := &r.Releases[i]
		switch {
		case !hmac.Equal([]byte(releaseMAC(e.cfg.ParamsKey, rel, r.MAC, rel.At)), []byte(rel.MAC)):
			problems = append(problems, fmt.Sprintf("the release record of receipt %s is not sealed by this server's key for that reservation (altered, forged or moved); the reservation keeps counting", r.ReceiptID))
		case rel.Caller != r.Caller:
			problems = append(problems, fmt.Sprintf("the release record of receipt %s names caller %q, not the reservation's; the reservation keeps counting", r.ReceiptID, rel.Caller))
		case !Outcome(rel.Outcome).Settled():
			problems = append(problems, fmt.Sprintf("the release record of receipt %s gives outcome %q, which does not say the payment was not made; the reservation keeps counting", r.ReceiptID, rel.Outcome))
		case r.Open || r.Until == "":
			problems = append(problems, fmt.Sprintf("the release record of receipt %s names a held authorization, which no outcome releases; the reservation keeps counting", r.ReceiptID))
		default:
			ok = true
		}
	}
	return ok, problems
}

func toGuard(r reviewlog.Reservation, at string) (guard.Reservation, error) {
	g := guard.Reservation{ReceiptID: r.ReceiptID, Caller: r.Caller, PayTo: r.PayTo, Host: r.Host, Resource: r.Resource, Asset: r.Asset, Open: r.Open, ReviewID: r.ReviewID}
	var err error
	if g.At, err = time.Parse(time.RFC3339Nano, at); err != nil {
		return g, fmt.Errorf("reservation %s: at %q: %w", r.ReceiptID, at, err)
	}
	if r.Until != "" {
		if g.Until, err = time.Parse(time.RFC3339Nano, r.Until); err != nil {
			return g, fmt.Errorf("reservation %s: until %q: %w", r.ReceiptID, r.Until, err)
		}
	}
	a, ok := new(big.Int).SetString(r.Atomic, 10)
	if !ok || a.Sign() < 0 {
		return g, fmt.Errorf("reservation %s: amount %q is not atomic units", r.ReceiptID, r.Atomic)
	}
	g.Atomic = a
	return g, nil
}

func info(g guard.Reservation, r reviewlog.Reservation, at string, decimals int) *ReservationInfo {
	amount := r.Atomic + " atomic units"
	if decimals >= 0 {
		amount = guard.FormatAmount(g.Atomic, decimals)
	}
	return &ReservationInfo{ReceiptID: r.ReceiptID, Caller: r.Caller, PayTo: r.PayTo, Host: r.Host, Resource: r.Resource,
		Amount: amount, AmountAtomic: r.Atomic, Asset: r.Asset, At: at, Until: r.Until, Open: r.Open, ReviewID: r.ReviewID, res: g}
}

// sealCache remembers the reservation records whose seal verified, by
// their every sealed field and seal, with the reservation each one reads
// as: a question reads every reservation that holds, and computing each
// one's HMAC (and parsing its times and amount) again on every question
// would make its cost grow with them. A record whose fields differ in any
// byte is another key and is checked afresh. The reservations kept share
// their amounts, which no reader changes.
type sealCache struct {
	mu sync.Mutex
	ok map[sealKey]guard.Reservation
}

// sealKey is every field of a reservation record that its seal covers
// (sealedText), and the seal.
type sealKey struct {
	receiptID, caller, payTo, host, resource, atomic, asset, until string
	open                                                           bool
	reviewID, at, mac                                              string
	tenant                                                         string
}

// check verifies r's seal, then reads it as a reservation: ok is false
// when the seal does not verify, err says why a sealed record does not
// read.
func (c *sealCache) check(key []byte, r *reviewlog.Reservation) (g guard.Reservation, ok bool, err error) {
	k := sealKey{r.ReceiptID, r.Caller, r.PayTo, r.Host, r.Resource, r.Atomic, r.Asset, r.Until, r.Open, r.ReviewID, r.At, r.MAC, r.Tenant}
	c.mu.Lock()
	g, hit := c.ok[k]
	c.mu.Unlock()
	if hit {
		return g, true, nil
	}
	if !hmac.Equal([]byte(reservationMAC(key, r, r.At)), []byte(r.MAC)) {
		return g, false, nil
	}
	if g, err = toGuard(*r, r.At); err != nil {
		return g, true, err
	}
	c.mu.Lock()
	if c.ok == nil {
		c.ok = map[sealKey]guard.Reservation{}
	}
	c.ok[k] = g
	c.mu.Unlock()
	return g, true, nil
}

// trim forgets every record when the cache holds far more than holds now
// (lapsed reservations); the next question checks the live ones again.
func (c *sealCache) trim(live int) {
	c.mu.Lock()
	if len(c.ok) > 2*live+256 {
		c.ok = nil
	}
	c.mu.Unlock()
}

// moot says whether a pending review's question would now be answered
// without review (allow or block): its human decision no longer bears on
// the payment. A question that can no longer be read is not moot.
func (e *Engine) moot(r reviewlog.Review, h guard.History, now time.Time) bool {
	if r.Caller == "" {
		return false
	}
	pol := e.Policy().For(r.Caller)
	req, err := guard.ParseRequest(guard.RawRequest{Counterparty: r.Counterparty, Amount: r.Amount, Asset: r.Asset, Template: r.Template, PayTo: r.PayTo, Resource: r.Resource}, pol)
	if err != nil {
		return false
	}
	return e.decide(req, h, pol, now, nil).Decision != guard.Review
}

// Reservations lists what earlier allows, authorizations and forwarded
// calls still hold now, as the spend ledger's verified entries say and the
// Trace does not show yet, with every finding.
func (e *Engine) Reservations(ctx context.Context) ([]*ReservationInfo, []string, error) {
	return e.Committed(ctx)
}

// History is the history the guard reads to answer: the operations of
// every history template, with the spend ledger's running totals of what
// the Trace does not show yet (the reviewer console draws it).
//
// The commitments come as operations (History.Reserved), for drawing; the
// history is not for Decide, which reads the running totals instead.
func (e *Engine) History(ctx context.Context) (guard.History, error) {
	h, now, err := e.judgedNow(ctx, false)
	if err != nil {
		return h, err
	}
	h.Committed = nil
	for _, en := range e.book.Live(now) {
		if i := e.entryInfo(en); i != nil {
			h.Reserved = append(h.Reserved, guard.ReservedOp(i.res))
		}
	}
	return h, nil
}

// bearsOn says whether a reservation pays the review's counterparty.
func bearsOn(i *ReservationInfo, r reviewlog.Review) bool {
	return i.PayTo != "" && (i.PayTo == r.Counterparty || i.PayTo == r.PayTo) || i.Host != "" && i.Host == r.Counterparty
}
