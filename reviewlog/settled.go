package reviewlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// typeSettled records the seller's settlement of a signed authorization
// (its PAYMENT-RESPONSE answer) and its signed receipt, as handed in by the
// agent, with what checking them found. Its receipt in the decision chain
// carries the SHA-256 of the settlement's canonical form.
const typeSettled = "settled"

// CanonicalSettlementRecorded is the action of the receipt that records a
// settlement.
const CanonicalSettlementRecorded = "x402.settlement.recorded"

// Settled is one settlement as the log keeps it.
type Settled struct {
	// Nonce names the authorization it settles; AuthorizationReceipt and
	// DecisionReceipt are that authorization's receipts.
	Nonce                string `json:"nonce"`
	AuthorizationReceipt string `json:"authorization_receipt"`
	DecisionReceipt      string `json:"decision_receipt"`
	// Receipt is the receipt that records this settlement.
	Receipt string `json:"receipt"`
	// Success, Transaction, Network and Payer are the seller's settlement
	// answer ({success, transaction, network, payer}).
	Success     bool   `json:"success"`
	Transaction string `json:"transaction"`
	Network     string `json:"network"`
	Payer       string `json:"payer"`
	// SellerReceipt is the seller's signed receipt (the offer-receipt
	// extension's artifact, as sent), and SellerReceiptSigner who signed it
	// as verified; both empty when none was handed in.
	SellerReceipt       json.RawMessage `json:"seller_receipt,omitempty"`
	SellerReceiptSigner string          `json:"seller_receipt_signer,omitempty"`
	// Findings are where the settlement or the receipt disagree with the
	// authorization or the offer, for a human to read.
	Findings []string `json:"findings,omitempty"`
	// Digest is the SHA-256 (0x hex) of the settlement's canonical form, the
	// receipt's paramsHash stands for.
	Digest string `json:"digest"`
	// Source says where the settlement was taken from: SourceAgent (""
	// in records of earlier versions: record_receipt) or SourceTrace (the
	// recorder's events, read by the server), with Trace naming the event.
	Source string    `json:"source,omitempty"`
	Trace  *TraceRef `json:"trace,omitempty"`
	// HoldKept: the settlement did not end the authorization's hold as an
	// open payment (a settlement read from the Trace with a finding: an
	// unsigned record is trusted no further than the Trace's payments are).
	HoldKept bool `json:"hold_kept,omitempty"`
}

// Settlement sources.
const (
	SourceAgent = "agent"
	SourceTrace = "trace"
)

// TraceRef names the event of the Trace a settlement was read from, and how
// it was bound to its authorization: "nonce" (an event of its operation
// carries the authorization's nonce) or "terms" (payer, payee, amount,
// asset, network and resource, within the authorization's validity, and
// no other authorization's).
type TraceRef struct {
	Run        string `json:"run"`
	Operation  string `json:"operation"`
	Line       int    `json:"line"`
	Event      string `json:"event"`
	OccurredAt string `json:"occurred_at"`
	Binding    string `json:"binding"`
}

// SourceName is the source as people read it.
func (s Settled) SourceName() string {
	if s.Source == SourceTrace {
		return "the Trace"
	}
	return "the agent (record_receipt)"
}

func checkSettled(s *Settled) error {
	switch {
	case s == nil:
		return errors.New("a settled record needs a settlement")
	case !isHex0x(s.Nonce, 64) || !isHex0x(s.Transaction, 64) || !isHex0x(s.Digest, 64):
		return errors.New("a settled record's nonce, transaction and digest are 0x and 64 lower-case hex digits")
	case s.Receipt == "" || s.AuthorizationReceipt == "" || s.DecisionReceipt == "" || len(s.Receipt) > maxFieldBytes || len(s.AuthorizationReceipt) > maxFieldBytes || len(s.DecisionReceipt) > maxFieldBytes:
		return errors.New("a settled record names its receipts")
	case !isAddress(s.Payer) || s.Network == "" || len(s.Network) > 64:
		return errors.New("a settled record needs the payer's address and the network")
	case len(s.SellerReceipt) > 16<<10 || (len(s.SellerReceipt) > 0 && !json.Valid(s.SellerReceipt)) || len(s.SellerReceiptSigner) > maxFieldBytes || len(s.Findings) > 32:
		return errors.New("a settled record's seller receipt is one JSON object of at most 16 KiB, with at most 32 findings")
	}
	switch s.Source {
	case "", SourceAgent:
		if s.Trace != nil {
			return errors.New("a settled record handed in by the agent names no Trace event")
		}
	case SourceTrace:
		t := s.Trace
		if t == nil || t.Run == "" || t.Line < 1 || (t.Binding != "nonce" && t.Binding != "terms") ||
			len(t.Run) > maxFieldBytes || len(t.Operation) > maxFieldBytes || len(t.Event) > maxFieldBytes || len(t.OccurredAt) > maxFieldBytes {
			return errors.New("a settled record read from the Trace names its run, line, event and binding")
		}
	default:
		return errors.New("a settled record's source is agent or trace")
	}
	for _, f := range s.Findings {
		if len(f) > maxFieldBytes {
			return errors.New("a settled record's finding is too long")
		}
	}
	return nil
}

// ErrSettled marks a settlement that cannot be recorded twice.
var ErrSettled = errors.New("already settled")

// RecordSettlement appends a settlement in one locked section with what
// hook writes (the settlement's receipt and the ledger's release, whose
// receipt id hook returns). A second settlement of one nonce is refused
// (ErrSettled); when hook fails nothing is written.
func (l *Log) RecordSettlement(ctx context.Context, caller string, s Settled, hook func(tx Tx) (string, error)) (Settled, error) {
	if caller == "" || len(caller) > maxFieldBytes {
		return Settled{}, fmt.Errorf("%w: the caller must be named", ErrBadInput)
	}
	err := l.transact(ctx, func(g Writer, st *state, at time.Time) (*record, error) {
		done, err := l.settlementsIn(ctx, g)
		if err != nil {
			return nil, err
		}
		for _, d := range done {
			if d.Nonce == s.Nonce {
				return nil, fmt.Errorf("%w: the authorization of nonce %s was settled at %s (receipt %s)", ErrSettled, s.Nonce, d.At, d.Receipt)
			}
		}
		id, err := hook(Tx{Store: g, At: at, Kind: typeSettled})
		if err != nil {
			return nil, err
		}
		s.Receipt = id
		if err := checkSettled(&s); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
		}
		return &record{Type: typeSettled, At: formatTime(at), Caller: caller, Settlement: &s}, nil
	})
	if err != nil {
		return Settled{}, err
	}
	return s, nil
}

// SettledLine is a settled record as read back.
type SettledLine struct {
	Settled
	Line   int    `json:"line"`
	At     string `json:"at"`
	Caller string `json:"caller"`
}

// Settlements reads every settled record of the log, in order.
func (l *Log) Settlements(ctx context.Context) ([]SettledLine, error) {
	var out []SettledLine
	err := l.store.View(ctx, func(r Reader) error {
		var err error
		out, err = l.settlementsIn(ctx, r)
		return err
	})
	return out, err
}

func (l *Log) settlementsIn(ctx context.Context, r Reader) ([]SettledLine, error) {
	var out []SettledLine
	err := l.eachRecord(ctx, r, typeSettled, func(rec *record, n int) {
		out = append(out, SettledLine{Settled: *rec.Settlement, Line: n, At: rec.At, Caller: rec.Caller})
	})
	return out, err
}
