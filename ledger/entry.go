// Package ledger is the guard's spend ledger: every commitment the guard
// made (an allow it gave, an approval it used, an authorization it signed, a
// paying call it forwarded) is an entry, sealed with the server's key and
// linked to the entry before it in its lane, so that none can be hidden,
// reordered, renumbered, altered or replayed without the next reader
// seeing it.
//
// A Book is one process's verified reading of the ledger: it reads each
// entry once, checks its seal and its link, and keeps running totals by
// scope (payee, host, resource, the tenant) and window, so that a decision
// reads what is committed without walking the entries. The store keeps the
// lines (reviewlog/filestore: guard/ledger.ndjson; reviewlog/pgstore: the
// ledger_entries table), the engine (guard/engine) decides what to append.
package ledger

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"time"
	"unicode/utf8"
)

// Entry kinds.
const (
	// KindHold is a check_before_pay allow (an approval used included): it
	// counts as a payment from At until Until (reservationMinutes later),
	// unless the Trace shows the payment first or a release lets it go.
	KindHold = "hold"
	// KindSpend is a paying call the guard proxy forwarded: once the
	// upstream ran it, it is spend, and counts for the whole of the
	// longest window of the policy (Until), unless the Trace shows it or a
	// release says the upstream refused it before running.
	KindSpend = "spend"
	// KindAuthorization is an x402 authorization the server signed: it
	// counts as spend, and as a payment open to its payee, until Until,
	// unless the Trace shows it.
	KindAuthorization = "authorization"
	// KindRelease lets go of an earlier entry (Target): the payment is
	// known not to have happened.
	KindRelease = "release"
	// KindGenesis starts the ledger of a store: every commitment receipt
	// signed after it must have its entry. Its receipt is signed into the
	// decision chain, so a ledger emptied or replaced is seen.
	KindGenesis = "genesis"
)

// Outcomes a release gives.
const (
	// OutcomeNotRun: the upstream refused the call before running it.
	OutcomeNotRun = "not_run"
	// OutcomeUnused: an authorization whose validBefore passed and whose
	// nonce the asset contract says was never used.
	OutcomeUnused = "authorization_unused"
	// OutcomeRefused: the seller refused the payment (a 402 again, or an
	// error that proves nothing was charged).
	OutcomeRefused = "refused"
	// OutcomeSettled: the seller's settlement answer for an authorization
	// was handed in. Its target keeps counting as spend for its window,
	// and no longer as a payment open to its payee; it is asked about on
	// chain no more.
	OutcomeSettled = "settled"
)

// Version is the entry format this package writes and reads.
const Version = 1

// sealLabel domain-separates the ledger's seals from the server's other
// HMACs under the same key.
const sealLabel = "haia-trace-mcp/ledger/v1\x00"

// MaxLine bounds one entry line; a longer line is not an entry.
const MaxLine = 16 << 10

// Entry is one line of the ledger.
type Entry struct {
	V int `json:"v"`
	// Lane and Seq place the entry: Seq counts from 0 within its lane,
	// without a gap.
	Lane int   `json:"lane"`
	Seq  int64 `json:"seq"`
	// Prev is the SHA-256 (hex) of the lane's previous line, "" for seq 0.
	Prev string `json:"prev"`
	Kind string `json:"kind"`
	// At is when it was committed; Until is when it stops counting on its
	// own (RFC 3339, UTC, milliseconds).
	At    string `json:"at"`
	Until string `json:"until,omitempty"`
	// Receipt is the signed decision receipt the commitment stands for
	// (for a release: the receipt of the outcome, if any).
	Receipt string `json:"receipt"`
	// Caller asked; Tenant is the store's tenant it was written for.
	Caller string `json:"caller"`
	Tenant string `json:"tenant,omitempty"`
	// PayTo (canonical address), Host (canonical host) and Resource
	// (canonical URL): whom it pays, for what.
	PayTo    string `json:"pay_to,omitempty"`
	Host     string `json:"host,omitempty"`
	Resource string `json:"resource,omitempty"`
	// Atomic is the amount in atomic units (decimal digits) of Asset.
	Atomic string `json:"atomic,omitempty"`
	Asset  string `json:"asset,omitempty"`
	// Open: it counts as a payment open (paid, not settled) to its payee.
	Open bool `json:"open,omitempty"`
	// Review names the review whose approval this commitment used.
	Review string `json:"review,omitempty"`
	// Payer (a lower-case address), Nonce (0x and 64 lower-case hex
	// digits) and ValidBefore (a time as At) are an authorization's
	// EIP-3009 signer, nonce and expiry: all three, or none (an entry
	// written before they were recorded). With them, once ValidBefore has
	// passed, the asset contract can say the authorization was never used
	// and a release lets it go (OutcomeUnused).
	Payer       string `json:"payer,omitempty"`
	Nonce       string `json:"nonce,omitempty"`
	ValidBefore string `json:"valid_before,omitempty"`
	// Target is the receipt of the entry a release lets go; Outcome says
	// why.
	Target  string `json:"target,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	// Mandate names the standing approval (package mandate) this
	// commitment was allowed under: it is charged to the mandate's
	// budget and count as well as to every limit.
	Mandate string `json:"mandate,omitempty"`
	// MAC seals every byte of the line before it with the server's key.
	MAC string `json:"mac"`
}

// body is the entry without its seal, in the order lines are written.
type body struct {
	V           int    `json:"v"`
	Lane        int    `json:"lane"`
	Seq         int64  `json:"seq"`
	Prev        string `json:"prev"`
	Kind        string `json:"kind"`
	At          string `json:"at"`
	Until       string `json:"until,omitempty"`
	Receipt     string `json:"receipt"`
	Caller      string `json:"caller"`
	Tenant      string `json:"tenant,omitempty"`
	PayTo       string `json:"pay_to,omitempty"`
	Host        string `json:"host,omitempty"`
	Resource    string `json:"resource,omitempty"`
	Atomic      string `json:"atomic,omitempty"`
	Asset       string `json:"asset,omitempty"`
	Open        bool   `json:"open,omitempty"`
	Review      string `json:"review,omitempty"`
	Payer       string `json:"payer,omitempty"`
	Nonce       string `json:"nonce,omitempty"`
	ValidBefore string `json:"valid_before,omitempty"`
	Target      string `json:"target,omitempty"`
	Outcome     string `json:"outcome,omitempty"`
	Mandate     string `json:"mandate,omitempty"`
}

func (e *Entry) body() body {
	return body{e.V, e.Lane, e.Seq, e.Prev, e.Kind, e.At, e.Until, e.Receipt, e.Caller, e.Tenant, e.PayTo, e.Host,
		e.Resource, e.Atomic, e.Asset, e.Open, e.Review, e.Payer, e.Nonce, e.ValidBefore, e.Target, e.Outcome, e.Mandate}
}

// prefix is the line up to its seal: the body's JSON without its closing
// brace, then the mac member's name.
func (e *Entry) prefix() ([]byte, error) {
	b, err := json.Marshal(e.body())
	if err != nil {
		return nil, err
	}
	b = b[:len(b)-1]
	return append(b, `,"mac":"`...), nil
}

func seal(key, prefix []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(sealLabel))
	m.Write(prefix)
	return hex.EncodeToString(m.Sum(nil))
}

// Seal checks e, fills in its MAC under key and returns its line (without a
// newline). V is set to Version.
func (e *Entry) Seal(key []byte) ([]byte, error) {
	if len(key) == 0 {
		return nil, errors.New("ledger: no key to seal with")
	}
	e.V = Version
	if err := e.check(); err != nil {
		return nil, err
	}
	p, err := e.prefix()
	if err != nil {
		return nil, err
	}
	e.MAC = seal(key, p)
	line := append(append(p, e.MAC...), `"}`...)
	if len(line) > MaxLine {
		return nil, fmt.Errorf("ledger: entry of receipt %s is %d bytes, more than %d", e.Receipt, len(line), MaxLine)
	}
	return line, nil
}

// ErrNotSealed is a line whose seal does not verify under the server's key:
// written, or altered, by someone who does not hold it.
var ErrNotSealed = errors.New("not sealed by this server's key")

// Parse reads one line (without its newline) as an entry and verifies its
// seal under key. The line must be exactly as Seal writes it: the same
// members, in the same order and spelling, each once, with no other bytes,
// so that every reader reads it one way.
func Parse(line []byte, key []byte) (Entry, error) {
	var e Entry
	if len(line) > MaxLine {
		return e, fmt.Errorf("a line of %d bytes, more than %d", len(line), MaxLine)
	}
	if err := json.Unmarshal(line, &e); err != nil {
		return e, fmt.Errorf("not an entry: %w", err)
	}
	if e.V != Version {
		return e, fmt.Errorf("entry format %d, not %d", e.V, Version)
	}
	p, err := e.prefix()
	if err != nil {
		return e, err
	}
	want := append(append(p, e.MAC...), `"}`...)
	if !bytes.Equal(want, line) {
		return e, errors.New("not written the one way an entry is written (a member repeated, misspelt, reordered or added)")
	}
	if err := e.check(); err != nil {
		return e, err
	}
	if !hmac.Equal([]byte(seal(key, p)), []byte(e.MAC)) {
		return e, ErrNotSealed
	}
	return e, nil
}

// Peek reads a line as Parse does, without checking its seal: for a
// reader that does not hold the key, which must not trust what it reads.
func Peek(line []byte) (Entry, error) {
	var e Entry
	if len(line) > MaxLine {
		return e, fmt.Errorf("a line of %d bytes, more than %d", len(line), MaxLine)
	}
	if err := json.Unmarshal(line, &e); err != nil {
		return e, fmt.Errorf("not an entry: %w", err)
	}
	p, err := e.prefix()
	if err != nil {
		return e, err
	}
	if !bytes.Equal(append(append(p, e.MAC...), `"}`...), line) {
		return e, errors.New("not written the one way an entry is written (a member repeated, misspelt, reordered or added)")
	}
	return e, e.check()
}

// plain says whether every text of e is valid UTF-8: then its line, as
// Seal writes it, reads back as e itself (json.Marshal would write the
// replacement character for an invalid byte, and a reader would read
// that).
func (e *Entry) plain() bool {
	for _, s := range [...]string{e.Prev, e.Kind, e.At, e.Until, e.Receipt, e.Caller, e.Tenant, e.PayTo, e.Host, e.Resource, e.Atomic, e.Asset,
		e.Review, e.Payer, e.Nonce, e.ValidBefore, e.Target, e.Outcome, e.Mandate, e.MAC} {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// Hash is the link the next entry of the lane names as Prev.
func Hash(line []byte) string {
	s := sha256.Sum256(line)
	return hex.EncodeToString(s[:])
}

// check says what is wrong with an entry's fields ("" members allowed
// where the kind allows them).
func (e *Entry) check() error {
	if e.Lane < 0 || e.Seq < 0 {
		return fmt.Errorf("lane %d, seq %d: negative", e.Lane, e.Seq)
	}
	if (e.Seq == 0) != (e.Prev == "") {
		return fmt.Errorf("seq %d with prev %q: only the first entry of a lane has no prev", e.Seq, e.Prev)
	}
	if _, err := ParseTime(e.At); err != nil {
		return fmt.Errorf("at: %w", err)
	}
	if e.Until != "" {
		if _, err := ParseTime(e.Until); err != nil {
			return fmt.Errorf("until: %w", err)
		}
	}
	if e.Kind == KindGenesis {
		if e.Receipt == "" || e.PayTo != "" || e.Host != "" || e.Atomic != "" || e.Target != "" || e.Mandate != "" {
			return errors.New("a genesis names its receipt and nothing else")
		}
		return nil
	}
	if e.Receipt == "" && e.Kind != KindRelease {
		return errors.New("no receipt")
	}
	if e.Caller == "" {
		return errors.New("no caller")
	}
	switch e.Kind {
	case KindHold, KindSpend, KindAuthorization:
		if e.PayTo == "" && e.Host == "" {
			return errors.New("neither pay_to nor host")
		}
		if e.Asset == "" {
			return errors.New("no asset")
		}
		if a, ok := new(big.Int).SetString(e.Atomic, 10); !ok || a.Sign() < 0 || strconv.Quote(e.Atomic) != `"`+a.String()+`"` {
			return fmt.Errorf("amount %q is not atomic units", e.Atomic)
		}
		if e.Target != "" || e.Outcome != "" {
			return fmt.Errorf("a %s names a target", e.Kind)
		}
		if e.Mandate != "" && (len(e.Mandate) != 18 || e.Mandate[:2] != "m_" || !lowerHex("0x"+e.Mandate[2:], 8)) {
			return fmt.Errorf("mandate %q is not a mandate id (m_ and 16 hex digits)", clip(e.Mandate))
		}
		if err := e.checkTerms(); err != nil {
			return err
		}
	case KindRelease:
		if e.Mandate != "" {
			return errors.New("a release names no mandate")
		}
		if e.Payer != "" || e.Nonce != "" || e.ValidBefore != "" {
			return errors.New("a release names no authorization terms")
		}
		if e.Target == "" || e.Outcome == "" {
			return errors.New("a release without a target or an outcome")
		}
	default:
		return fmt.Errorf("unknown kind %q", e.Kind)
	}
	return nil
}

// checkTerms checks an authorization's payer, nonce and validBefore: all
// three or none, each written the one way, and only on an authorization.
func (e *Entry) checkTerms() error {
	if e.Payer == "" && e.Nonce == "" && e.ValidBefore == "" {
		return nil
	}
	switch {
	case e.Kind != KindAuthorization:
		return fmt.Errorf("a %s names authorization terms", e.Kind)
	case !lowerHex(e.Payer, 20):
		return fmt.Errorf("payer %q is not 0x and 40 lower-case hex digits", clip(e.Payer))
	case !lowerHex(e.Nonce, 32):
		return fmt.Errorf("nonce %q is not 0x and 64 lower-case hex digits", clip(e.Nonce))
	}
	if _, err := ParseTime(e.ValidBefore); err != nil {
		return fmt.Errorf("valid_before: %w", err)
	}
	return nil
}

// lowerHex says whether s is 0x and n bytes in lower-case hex.
func lowerHex(s string, n int) bool {
	if len(s) != 2+2*n || s[:2] != "0x" {
		return false
	}
	for _, c := range s[2:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// timeLayout is the one way times are written: UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z"

// FormatTime writes t as entries do.
func FormatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

// ParseTime reads a time written by FormatTime, and nothing else.
func ParseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil || FormatTime(t) != s {
		return time.Time{}, fmt.Errorf("%q is not a time as entries write it (2026-07-24T09:00:00.000Z)", clip(s))
	}
	return t, nil
}

func clip(s string) string {
	if len(s) > 48 {
		return s[:48] + "…"
	}
	return s
}
