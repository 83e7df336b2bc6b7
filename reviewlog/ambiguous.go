package reviewlog

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// typeAmbiguous records a settlement of the Trace the server could not bind
// to one authorization: a finding for a person, recorded once.
const typeAmbiguous = "ambiguous"

// Kinds of ambiguity.
const (
	// AmbiguousSettlement: one transaction of the Trace has the terms of
	// several authorizations.
	AmbiguousSettlement = "settlement_fits_several"
	// AmbiguousAuthorization: one authorization has the terms of several
	// transactions of the Trace.
	AmbiguousAuthorization = "authorization_fits_several"
)

// Ambiguity is a settlement of the Trace that fits several authorizations
// by its terms, or an authorization several settlements fit: none was
// bound, and a person must hand the right one in (record_receipt).
type Ambiguity struct {
	// Key names the ambiguity (AmbiguityKey): the same transactions and
	// authorizations are one ambiguity, recorded once.
	Key  string `json:"key"`
	Kind string `json:"kind"`
	// Nonces are the authorizations concerned, Transactions the
	// settlements of the Trace (each sorted, lower-case).
	Nonces       []string `json:"nonces"`
	Transactions []string `json:"transactions"`
	// TraceRun and TraceLine name the Trace event of the first
	// transaction.
	TraceRun  string `json:"trace_run"`
	TraceLine int    `json:"trace_line"`
	// Text says it for a person.
	Text string `json:"text"`
}

// AmbiguityLine is an ambiguous record as read back.
type AmbiguityLine struct {
	Ambiguity
	Line int    `json:"line"`
	At   string `json:"at"`
}

// AmbiguityKey names an ambiguity by its kind, transactions and
// authorizations, whatever their order or case.
func AmbiguityKey(kind string, nonces, txs []string) string {
	n := lowerSorted(nonces)
	t := lowerSorted(txs)
	sum := sha256.Sum256([]byte(kind + "\x00" + strings.Join(n, ",") + "\x00" + strings.Join(t, ",")))
	return hex.EncodeToString(sum[:16])
}

func lowerSorted(in []string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = strings.ToLower(s)
	}
	sort.Strings(out)
	return out
}

func checkAmbiguity(a *Ambiguity) error {
	switch {
	case a == nil:
		return errors.New("an ambiguous record needs its ambiguity")
	case a.Kind != AmbiguousSettlement && a.Kind != AmbiguousAuthorization:
		return fmt.Errorf("an ambiguity's kind is %s or %s", AmbiguousSettlement, AmbiguousAuthorization)
	case len(a.Nonces) == 0 || len(a.Nonces) > 64 || len(a.Transactions) == 0 || len(a.Transactions) > 64:
		return errors.New("an ambiguity names 1 to 64 authorizations and 1 to 64 transactions")
	case a.TraceRun == "" || len(a.TraceRun) > maxFieldBytes || a.TraceLine < 1 || a.Text == "" || len(a.Text) > 4<<10:
		return errors.New("an ambiguity names its run, line and text")
	}
	for _, n := range a.Nonces {
		if !isHex0x(n, 64) {
			return errors.New("an ambiguity's nonces are 0x and 64 lower-case hex digits")
		}
	}
	for _, t := range a.Transactions {
		if !isHex0x(t, 64) {
			return errors.New("an ambiguity's transactions are 0x and 64 lower-case hex digits")
		}
	}
	if !isLowerHex(a.Key, 32) || a.Key != AmbiguityKey(a.Kind, a.Nonces, a.Transactions) {
		return errors.New("an ambiguity's key is not the key of its kind, authorizations and transactions")
	}
	return nil
}

// RecordAmbiguity appends a, unless the log holds an ambiguity of its key
// already (recorded false): each ambiguity is recorded, and told, once.
func (l *Log) RecordAmbiguity(ctx context.Context, a Ambiguity) (recorded bool, err error) {
	a.Nonces, a.Transactions = lowerSorted(a.Nonces), lowerSorted(a.Transactions)
	a.Key = AmbiguityKey(a.Kind, a.Nonces, a.Transactions)
	if err := checkAmbiguity(&a); err != nil {
		return false, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	err = l.transact(ctx, func(g Writer, st *state, at time.Time) (*record, error) {
		have, err := l.ambiguitiesIn(ctx, g)
		if err != nil {
			return nil, err
		}
		for _, h := range have {
			if h.Key == a.Key {
				return nil, nil
			}
		}
		recorded = true
		return &record{Type: typeAmbiguous, At: formatTime(at), Ambiguity: &a}, nil
	})
	if err != nil {
		return false, err
	}
	return recorded, nil
}

// Ambiguities reads every ambiguous record of the log, in order.
func (l *Log) Ambiguities(ctx context.Context) ([]AmbiguityLine, error) {
	var out []AmbiguityLine
	err := l.store.View(ctx, func(r Reader) error {
		var err error
		out, err = l.ambiguitiesIn(ctx, r)
		return err
	})
	return out, err
}

func (l *Log) ambiguitiesIn(ctx context.Context, r Reader) ([]AmbiguityLine, error) {
	var out []AmbiguityLine
	err := l.eachRecord(ctx, r, typeAmbiguous, func(rec *record, n int) {
		out = append(out, AmbiguityLine{Ambiguity: *rec.Ambiguity, Line: n, At: rec.At})
	})
	return out, err
}

// Notification prefixes: the outbox id of a settlement with findings is
// NotifySettlement and its nonce, of an ambiguity NotifyAmbiguity and its
// key (an opened review's is the review's id).
const (
	NotifySettlement = "settlement:"
	NotifyAmbiguity  = "ambiguity:"
)

// LogCursor is how far NotificationsSince read the review log.
type LogCursor struct {
	Off      int64
	Identity string
}

// NotificationsSince reads the review log from c on and returns the outbox
// ids of the findings its whole lines record (settlements with findings,
// ambiguities), in order, and where it stopped. A log replaced since
// (archived) is read from its start.
func (l *Log) NotificationsSince(ctx context.Context, c LogCursor) ([]string, LogCursor, error) {
	var out []string
	err := l.store.View(ctx, func(r Reader) error {
		s, err := r.Log(ctx)
		if err != nil {
			return err
		}
		defer s.Close()
		if s.Identity() != c.Identity || s.Size() < c.Off {
			c = LogCursor{Identity: s.Identity()}
		}
		br := bufio.NewReaderSize(io.NewSectionReader(s, c.Off, s.Size()-c.Off), 64<<10)
		for {
			raw, err := readLine(br)
			if err == io.EOF {
				return nil // a torn tail is read again once it is whole
			}
			c.Off += int64(len(raw))
			// Only a line that names findings or an ambiguity can be one
			// (as the log writes them); the others are not decoded, so a
			// start over a long log reads it at the speed of a scan.
			if err == nil && (bytes.Contains(raw, []byte(`"findings":`)) || bytes.Contains(raw, []byte(`"ambiguity":`))) {
				if h, ok := ParseLineHead(trimLine(raw)); ok && h.Notify != "" && !h.Opens() {
					out = append(out, h.Notify)
				}
			}
			if err != nil && !errors.Is(err, errLineTooLong) {
				return fmt.Errorf("read %s: %w", l.Path(), err)
			}
		}
	})
	return out, c, err
}
