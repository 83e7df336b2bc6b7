package reviewlog

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// typeReleased records that what an allow reserved no longer counts: the
// payment it allowed was not made (the upstream of a proxied call answered
// that it did not run it). The line is sealed by the guard that wrote it
// with a key only the server holds, and the seal binds the reservation
// record it releases; checking the seal is the engine's part, and a release
// that does not verify leaves the reservation in force (fail closed).
const typeReleased = "released"

// maxReleasesPerReceipt bounds the released records kept for one receipt:
// the engine writes one; more can only be copies or forgeries, which the
// seal check refuses anyway.
const maxReleasesPerReceipt = 4

// Release is one released record of the log.
type Release struct {
	// ReceiptID is the allow receipt whose reservation is released.
	ReceiptID string `json:"receipt_id"`
	Caller    string `json:"caller"`
	// Outcome is why (the outcome of the forwarded call, as its receipt's
	// governance.ruleId says); OutcomeReceipt is that signed receipt.
	Outcome        string `json:"outcome"`
	OutcomeReceipt string `json:"outcome_receipt"`
	MAC            string `json:"mac"`
	// At is the record's time (the line's "at").
	At string `json:"-"`
}

// checkRelease validates a released record's fields.
func checkRelease(r record) error {
	rel := r.Release
	if rel == nil {
		return errors.New("a released record needs its release")
	}
	if r.ReviewID != "" || r.Counterparty != "" || r.Amount != nil || r.Status != "" || r.By != "" || r.Lines != nil || r.Caller != "" || r.ParamsHash != "" || r.Reasons != nil || r.Terms != nil {
		return errors.New("a released record carries only at and release")
	}
	if rel.ReceiptID == "" || rel.Caller == "" || rel.Outcome == "" || rel.OutcomeReceipt == "" || rel.MAC == "" {
		return errors.New("a release needs receipt_id, caller, outcome, outcome_receipt and mac")
	}
	for _, f := range []string{rel.ReceiptID, rel.Caller, rel.Outcome, rel.OutcomeReceipt, rel.MAC} {
		if len(f) > maxFieldBytes {
			return fmt.Errorf("a release field is longer than %d bytes", maxFieldBytes)
		}
	}
	return nil
}

// applyRelease folds a released record in: it is kept beside the receipt it
// names, for the engine to verify when the reservation is read.
func (st *state) applyRelease(rec record, off int64) {
	id := rec.Release.ReceiptID
	if len(st.releases[id]) < maxReleasesPerReceipt {
		st.releases[id] = append(st.releases[id], off)
	}
}

// Release runs hook in one locked section with the reservation record of
// receipt receiptID that holds now (nil when none does: it lapsed, was
// never written, or the log holds no such receipt). hook writes what must
// commit with the release (the outcome's signed receipt) and returns the
// sealed release to append, or nil to append nothing. When hook fails,
// nothing is written.
func (l *Log) Release(ctx context.Context, receiptID string, hook func(tx Tx, held *Reservation) (*Release, error)) error {
	if receiptID == "" || len(receiptID) > maxFieldBytes {
		return fmt.Errorf("%w: the receipt must be named", ErrBadInput)
	}
	return l.transact(ctx, func(g Writer, st *state, at time.Time) (*record, error) {
		var held *Reservation
		for _, e := range st.reservations {
			if e.receiptID != receiptID || (!e.until.IsZero() && !at.Before(e.until)) {
				continue
			}
			r := e.res
			held = &r
			break
		}
		rel, err := hook(Tx{Store: g, At: at, Kind: typeReleased}, held)
		if err != nil || rel == nil {
			return nil, err
		}
		c := *rel
		c.At = ""
		rec := record{Type: typeReleased, At: formatTime(at), Release: &c}
		if err := checkRelease(rec); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
		}
		return &rec, nil
	})
}
