package reviewlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// typeReserved records what an allow reserved: the terms of the payment it
// allowed, until the Trace shows the payment or the reservation lapses.
const typeReserved = "reserved"

// CanonicalAuthorization is the action.canonical of an allow that holds its
// payment as open until the Trace shows it settled (an authorization signed
// for it); other allows carry "x402.payment".
const CanonicalAuthorization = "x402.authorization"

// canonicalPayment is the action.canonical of the guard's other answers.
const canonicalPayment = "x402.payment"

// Reservation is one reservation record of the log. The guard that wrote it
// sealed its terms with MAC (a key only the server holds); Verify-ing that
// is the engine's part. The record is trusted only together with the signed
// ALLOWED receipt it names.
type Reservation struct {
	ReceiptID string `json:"receipt_id"`
	Caller    string `json:"caller"`
	// Tenant is the tenant whose store the record was written to: sealed
	// with the rest, so a record copied into another tenant's store does
	// not verify there. A record without it (written by an earlier
	// version) reads as the store's own tenant's.
	Tenant string `json:"tenant,omitempty"`
	// PayTo (canonical address) and Host (canonical host): whom it pays.
	PayTo    string `json:"pay_to,omitempty"`
	Host     string `json:"host,omitempty"`
	Resource string `json:"resource,omitempty"`
	// Atomic is the amount in atomic units (decimal digits) of Asset.
	Atomic string `json:"atomic"`
	Asset  string `json:"asset"`
	// Until is when it lapses ("" for a hold until the Trace shows it).
	Until string `json:"until,omitempty"`
	// Open: it counts as an open payment until the Trace shows it.
	Open     bool   `json:"open,omitempty"`
	ReviewID string `json:"review_id,omitempty"`
	MAC      string `json:"mac"`
	// At is the record's time (the line's "at").
	At string `json:"-"`
	// Releases are the released records that name this reservation's
	// receipt, as the log holds them: unverified until the engine checks
	// their seals.
	Releases []Release `json:"-"`
	// ValidBefore is a signed authorization's validBefore as the spend
	// ledger records it (a view only: no record carries it).
	ValidBefore string `json:"-"`
}

// ReservationView is what a locked section (or a reader) knows of the
// reservations: the records that a signed ALLOWED receipt backs, and every
// disagreement between the records and the chain.
type ReservationView struct {
	Held []Reservation
	// Problems say where the records and the signed receipts disagree: an
	// allow receipt with no record (a record deleted), a record whose
	// receipt the chain does not hold or does not match.
	Problems []string
}

// allowedReceipt is what the receipt index keeps of one SERVICE ALLOWED
// receipt.
type allowedReceipt struct {
	id, agent string
	ts        time.Time
	hold      bool
}

// allowIndex keeps the recent ALLOWED receipts of the chains (and every
// hold): the receipts a reservation record must exist for.
type allowIndex struct {
	mu   sync.Mutex
	list []allowedReceipt
	byID map[string]int
}

func (a *allowIndex) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.list, a.byID = nil, map[string]int{}
}

// see indexes one receipt line's receipt when it reserves (ReservesOf).
func (a *allowIndex) see(line []byte) {
	if !bytes.Contains(line, []byte(`"`+noa.VerdictAllowed+`"`)) {
		return
	}
	// The head alone, as the ledger's receipt tail reads it: a line the
	// head reader takes that is no whole receipt only asks for one more
	// record (the chain's verifier reports the line).
	h, err := noa.ParseHead(bytes.TrimRight(line, "\r\n"))
	if err != nil {
		return
	}
	kind := reservesHead(h)
	if kind == "" {
		return
	}
	ts, _ := time.Parse(time.RFC3339Nano, h.TS)
	a.add(allowedReceipt{id: h.ID, agent: h.Agent.ID, ts: ts, hold: kind == ReservesHold})
}

// add indexes one reserving receipt (the first of its id).
func (a *allowIndex) add(r allowedReceipt) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byID == nil {
		a.byID = map[string]int{}
	}
	if _, ok := a.byID[r.id]; ok {
		return
	}
	a.byID[r.id] = len(a.list)
	a.list = append(a.list, r)
}

// since lists the receipts that must have a record at now: every hold, and
// every other allow at or after from. It forgets the allows older than
// forget (they can no longer hold anything).
func (a *allowIndex) since(from, forget time.Time) []allowedReceipt {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []allowedReceipt
	stale := 0
	for _, r := range a.list {
		switch {
		case r.hold || !r.ts.Before(from):
			out = append(out, r)
		case r.ts.Before(forget):
			stale++
		}
	}
	if stale > len(a.list)/2 && stale > 1024 {
		kept := a.list[:0]
		a.byID = map[string]int{}
		for _, r := range a.list {
			if r.hold || !r.ts.Before(forget) {
				a.byID[r.id] = len(kept)
				kept = append(kept, r)
			}
		}
		a.list = kept
	}
	return out
}

func (a *allowIndex) get(id string) (allowedReceipt, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i, ok := a.byID[id]
	if !ok {
		return allowedReceipt{}, false
	}
	return a.list[i], true
}

// resEntry is what the fold keeps of one reservation record: the record
// itself, as it was folded, so that a question reads the reservations that
// hold without reading and decoding each line again (a reservation lapses
// within a day, and only holds stay, so this is bounded by what holds).
type resEntry struct {
	off       int64
	receiptID string
	until     time.Time // zero: a hold
	res       Reservation
}

// reservationView reads the reservations that may hold at now (ttl is the
// policy's reservationMinutes) and checks them against the chain's ALLOWED
// receipts; the receipt index must be fresh (newVerifier).
func (l *Log) reservationView(st *state, at time.Time, ttl time.Duration) (ReservationView, error) {
	var held []Reservation
	for _, e := range st.liveReservations(at) {
		r := e.res
		rels, err := st.releasesOf(r.ReceiptID, -1)
		if err != nil {
			return ReservationView{}, err
		}
		r.Releases = rels
		held = append(held, r)
	}
	return l.checkHeld(st, held, at, ttl)
}

// releasesOf are the released records of the fold that name receipt, as
// the log holds them (unverified), but the one at offset skip.
func (st *state) releasesOf(receipt string, skip int64) ([]Release, error) {
	var out []Release
	for _, off := range st.releases[receipt] {
		if off == skip {
			continue
		}
		rel, err := st.recordAt(off)
		if err != nil {
			return nil, err
		}
		c := *rel.Release
		c.At = rel.At
		out = append(out, c)
	}
	return out, nil
}

// liveReservations forgets the fold's records that lapsed at at, and the
// releases of records it no longer holds, and returns the rest.
func (st *state) liveReservations(at time.Time) []resEntry {
	kept := st.reservations[:0]
	for _, e := range st.reservations {
		if !e.until.IsZero() && !at.Before(e.until) {
			continue // lapsed: forgotten
		}
		kept = append(kept, e)
	}
	st.reservations = kept
	// A release outlives nothing it could release.
	if len(st.releases) > len(kept) {
		live := make(map[string]bool, len(kept))
		for _, e := range kept {
			live[e.receiptID] = true
		}
		for id := range st.releases {
			if !live[id] {
				delete(st.releases, id)
			}
		}
	}
	return kept
}

// checkHeld checks the records held against the chain's ALLOWED receipts:
// each must name a signed allow of its caller that holds as it says, and
// each signed allow that still reserves must have a record (one the fold
// saw, lapsed since or not, or one of held).
func (l *Log) checkHeld(st *state, held []Reservation, at time.Time, ttl time.Duration) (ReservationView, error) {
	var v ReservationView
	if ttl <= 0 {
		ttl = time.Minute
	}
	allowed, problems, err := l.allowSet(held, at.Add(-ttl))
	if err != nil {
		return ReservationView{}, err
	}
	v.Problems = problems
	recorded := map[string]bool{}
	for _, r := range held {
		recorded[r.ReceiptID] = true
		rx, ok := allowed.get(r.ReceiptID)
		switch {
		case !ok:
			v.Problems = append(v.Problems, fmt.Sprintf("the reservation record of receipt %s names a receipt that no signed allow of the decision chain holds", clip(r.ReceiptID)))
			continue
		case rx.agent != r.Caller:
			v.Problems = append(v.Problems, fmt.Sprintf("the reservation record of receipt %s names caller %q, but the signed receipt was given to %q", r.ReceiptID, clip(r.Caller), clip(rx.agent)))
			continue
		case rx.hold != (r.Until == ""):
			v.Problems = append(v.Problems, fmt.Sprintf("the reservation record of receipt %s does not hold the payment as the signed receipt says", r.ReceiptID))
			continue
		}
		v.Held = append(v.Held, r)
	}
	var missing []string
	for _, r := range allowed.since(at.Add(-ttl), at.Add(-maxReservationHorizon)) {
		// A record lapsed since is a record all the same.
		if !recorded[r.id] && !st.reserved[r.id] {
			missing = append(missing, r.id)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		shown := missing
		if len(shown) > 5 {
			shown = shown[:5]
		}
		v.Problems = append(v.Problems, fmt.Sprintf("%d signed allow receipts that still reserve their payment have no reservation record in %s (%s%s): a record was removed or never written",
			len(missing), FileName, strings.Join(shown, ", "), moreText(len(missing)-len(shown))))
	}
	return v, nil
}

// allowSet is what a decision knows of the chains' reserving receipts.
type allowSet interface {
	get(id string) (allowedReceipt, bool)
	since(from, forget time.Time) []allowedReceipt
}

// allowSet gives the reserving receipts of the window from, and those
// held names: read through the store's receipt index when the section
// has one (with what that index does not hold right), from the fold
// otherwise.
func (l *Log) allowSet(held []Reservation, from time.Time) (allowSet, []string, error) {
	src := l.rx.live
	if src == nil {
		return &l.rx.allowed, nil, nil
	}
	ids := make([]string, 0, len(held))
	for _, r := range held {
		ids = append(ids, r.ReceiptID)
	}
	a, problems, err := src.reserving(from, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("read the decision chains' receipt index: %w", err)
	}
	return a, problems, nil
}

// maxReservationHorizon is the longest a reservation can be configured to
// hold (guard.MaxReservationTTL); older allows are forgotten.
const maxReservationHorizon = 24 * time.Hour

func moreText(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" and %d more", n)
}

// Reservations reads the reservations that may hold now, checked against the
// decision chain (without the lock: for status views).
func (l *Log) Reservations(ctx context.Context, ttl time.Duration) (ReservationView, error) {
	var out ReservationView
	err := l.view(ctx, func(g Reader, st *state) error {
		if _, err := l.newVerifier(ctx, g); err != nil {
			return err
		}
		var err error
		out, err = l.reservationView(st, l.now(), ttl)
		return err
	})
	return out, err
}

// checkReservation validates a reserved record's fields.
func checkReservation(r record) error {
	res := r.Reservation
	if res == nil {
		return errors.New("a reserved record needs its reservation")
	}
	if r.ReviewID != "" || r.Counterparty != "" || r.Amount != nil || r.Status != "" || r.By != "" || r.Lines != nil || r.Caller != "" || r.ParamsHash != "" || r.Reasons != nil {
		return errors.New("a reserved record carries only at and reservation")
	}
	if res.ReceiptID == "" || res.Caller == "" || res.Atomic == "" || res.Asset == "" || res.MAC == "" || (res.PayTo == "" && res.Host == "") {
		return errors.New("a reservation needs receipt_id, caller, pay_to or host, atomic, asset and mac")
	}
	if len(res.Tenant) > maxFieldBytes || !utf8.ValidString(res.Tenant) {
		return fmt.Errorf("a reservation's tenant is longer than %d bytes or not UTF-8", maxFieldBytes)
	}
	if res.Until != "" {
		if _, err := parseTime(res.Until); err != nil {
			return fmt.Errorf("reservation until: %w", err)
		}
	}
	if res.ReviewID != "" {
		if err := checkID(res.ReviewID); err != nil {
			return err
		}
	}
	return nil
}

// applyReservation folds a reserved record in.
func (st *state) applyReservation(rec record, off int64) {
	e := resEntry{off: off, receiptID: rec.Reservation.ReceiptID, res: *rec.Reservation}
	e.res.At, e.res.Releases = rec.At, nil
	if rec.Reservation.Until != "" {
		e.until, _ = parseTime(rec.Reservation.Until)
	}
	st.reservations = append(st.reservations, e)
	st.reserved[e.receiptID] = true
}

// ReservationRecord is how the engine builds a record: at and the sealed
// reservation.
func reservationRecord(at time.Time, r *Reservation) record {
	c := *r
	c.At = ""
	return record{Type: typeReserved, At: formatTime(at), Reservation: &c}
}

// FormatTime writes a time as the log does.
func FormatTime(t time.Time) string { return formatTime(t) }
