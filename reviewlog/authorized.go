package reviewlog

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// typeAuthorized records an x402 payment authorization the guard signed:
// its terms, its signature and the signed receipts it is bound to. The
// line is unsigned, like every line of the log; its receipt in the decision
// chain carries the hash of its EIP-712 digest, so a reader can tell an
// edited line from the one that was signed (see `authorization show`).
const typeAuthorized = "authorized"

// CanonicalAuthorizationSigned is the action of the receipt that records a
// signed x402 authorization (the decision that allowed it is its own
// receipt, x402.payment).
const CanonicalAuthorizationSigned = "x402.authorization.signed"

// Authorized is one signed x402 authorization as the log keeps it. Every
// amount is in atomic units, every time in Unix seconds, as signed.
type Authorized struct {
	// DecisionReceipt is the signed decision that allowed it (its nonce is
	// derived from this id); Receipt is the receipt that records the
	// authorization itself.
	DecisionReceipt string `json:"decision_receipt"`
	Receipt         string `json:"receipt"`
	// ReviewID names the review whose approval it used, or "".
	ReviewID string `json:"review_id,omitempty"`
	Network  string `json:"network"`
	// Token is the asset's contract (the EIP-712 verifying contract); Name
	// and Version its EIP-712 domain.
	Token       string `json:"token"`
	Name        string `json:"name"`
	Version     string `json:"version"`
	From        string `json:"from"`
	To          string `json:"to"`
	Value       string `json:"value"`
	ValidAfter  string `json:"valid_after"`
	ValidBefore string `json:"valid_before"`
	Nonce       string `json:"nonce"`
	Signature   string `json:"signature"`
	// Digest is the EIP-712 hash that was signed.
	Digest string `json:"digest"`
	// Resource is the URL the seller declared for the payment.
	Resource string `json:"resource,omitempty"`
	// Offer is the seller's signed offer for the entry paid (the x402
	// offer-receipt extension's artifact, as sent), and OfferSigner who
	// signed it as verified before the engine was asked; both empty when
	// the 402 carried none.
	Offer       json.RawMessage `json:"offer,omitempty"`
	OfferSigner string          `json:"offer_signer,omitempty"`
	// OfferSeal is what the authorization's receipt seals of that offer
	// (nil when none was recorded, and in records written before seals):
	// the receipt's paramsHash covers it with the EIP-712 digest, so the
	// offer, its signer and its key cannot be swapped after the fact.
	OfferSeal *OfferSeal `json:"offer_seal,omitempty"`
}

// OfferSeal is the seller's offer an authorization accepted, as its
// receipt seals it (engine.AuthorizationSealedParamsHash).
type OfferSeal struct {
	// Offer is the offer's digest (OfferDigest of Offer).
	Offer string `json:"offer"`
	// Format is the offer's format: eip712 or jws.
	Format string `json:"format"`
	// Signer is the signer recorded (OfferSigner): an address for EIP-712,
	// the key identifier (did:web, did:key, did:jwk …) with its algorithm
	// and key thumbprint for a JWS; "" when the signature did not verify.
	Signer string `json:"signer"`
	// Key is the key that verified the offer: the RFC 7638 thumbprint of
	// the JWS key (for a did:web identifier, the key the policy pinned),
	// or the lower-case address an EIP-712 signature recovers to; "" when
	// the signature did not verify.
	Key string `json:"key"`
}

// OfferDigest is the digest an offer seal names: "sha256:" and the hex
// SHA-256 of the offer's JSON as the seller sent it, in compact form (no
// whitespace between tokens, as the review log keeps it) with <, >, &,
// U+2028 and U+2029 inside strings written as \u escapes (as a JSON
// encoder may write them), so that the same bytes hash the same in the
// log, in the database and in an indented dossier.
func OfferDigest(offer []byte) (string, error) {
	var c, e bytes.Buffer
	if err := json.Compact(&c, offer); err != nil {
		return "", fmt.Errorf("the offer is not JSON: %w", err)
	}
	json.HTMLEscape(&e, c.Bytes())
	h := sha256.Sum256(e.Bytes())
	return "sha256:" + hex.EncodeToString(h[:]), nil
}

// checkSeal says what is wrong with an authorization's offer seal ("" when
// nothing): it names the offer and signer recorded beside it.
func checkSeal(a *Authorized) string {
	s := a.OfferSeal
	if s == nil {
		return ""
	}
	d, err := OfferDigest(a.Offer)
	var art struct {
		Format string `json:"format"`
	}
	switch {
	case len(a.Offer) == 0 || err != nil || s.Offer != d:
		return "an authorized record's offer_seal must name the digest of the offer recorded"
	case (s.Format != "eip712" && s.Format != "jws") || json.Unmarshal(a.Offer, &art) != nil || art.Format != s.Format:
		return "an authorized record's offer_seal format is the offer's, eip712 or jws"
	case s.Signer != a.OfferSigner:
		return "an authorized record's offer_seal signer must be the offer_signer recorded"
	case len(s.Key) > maxFieldBytes || (s.Key == "") != (s.Signer == ""):
		return "an authorized record's offer_seal key names the key that verified the offer, when one did"
	}
	for _, f := range []string{s.Signer, s.Key} {
		for _, r := range f {
			if r < 0x20 || r == 0x7f {
				return "an authorized record's offer_seal signer and key are printable text"
			}
		}
	}
	return ""
}

func checkAuthorized(a *Authorized) error {
	if a == nil {
		return errors.New("an authorized record needs an authorization")
	}
	switch {
	case a.DecisionReceipt == "" || a.Receipt == "" || len(a.DecisionReceipt) > maxFieldBytes || len(a.Receipt) > maxFieldBytes:
		return errors.New("an authorized record needs its decision_receipt and receipt")
	case !isHex0x(a.Nonce, 64) || !isHex0x(a.Digest, 64):
		return errors.New("an authorized record's nonce and digest are 0x and 64 lower-case hex digits")
	case !isHex0x(a.Signature, 130):
		return errors.New("an authorized record's signature is 0x and 130 lower-case hex digits")
	case !isAddress(a.From) || !isAddress(a.To) || !isAddress(a.Token):
		return errors.New("an authorized record's from, to and token are addresses")
	case !isUint256Digits(a.Value) || !isUint256Digits(a.ValidAfter) || !isUint256Digits(a.ValidBefore):
		return errors.New("an authorized record's value and validity are decimal numbers")
	case a.Network == "" || a.Name == "" || a.Version == "" || len(a.Network) > 64 || len(a.Name) > 256 || len(a.Version) > 256 || len(a.Resource) > maxFieldBytes:
		return errors.New("an authorized record needs its network, name and version")
	case len(a.Offer) > 16<<10 || len(a.OfferSigner) > maxFieldBytes || (len(a.Offer) > 0 && !json.Valid(a.Offer)):
		return errors.New("an authorized record's offer is one JSON object of at most 16 KiB")
	}
	if why := checkSeal(a); why != "" {
		return errors.New(why)
	}
	return nil
}

// RecordAuthorization appends a signed authorization to the log in one
// locked section with what hook writes (the authorization's receipt, whose
// id hook returns and which the line then names). When hook fails, nothing
// is written.
func (l *Log) RecordAuthorization(ctx context.Context, caller string, a Authorized, hook func(tx Tx) (string, error)) (Authorized, error) {
	if caller == "" || len(caller) > maxFieldBytes {
		return Authorized{}, fmt.Errorf("%w: the caller must be named", ErrBadInput)
	}
	err := l.transact(ctx, func(g Writer, st *state, at time.Time) (*record, error) {
		id, err := hook(Tx{Store: g, At: at, Kind: typeAuthorized})
		if err != nil {
			return nil, err
		}
		a.Receipt = id
		if err := checkAuthorized(&a); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
		}
		return &record{Type: typeAuthorized, At: formatTime(at), Caller: caller, Authorization: &a}, nil
	})
	if err != nil {
		return Authorized{}, err
	}
	return a, nil
}

// AuthorizedLine is an authorized record as read back, with where it is.
type AuthorizedLine struct {
	Authorized
	Line   int    `json:"line"`
	At     string `json:"at"`
	Caller string `json:"caller"`
}

// Authorizations reads every authorized record of the log, in order.
// Lines that are not records are skipped here (audit reports them).
func (l *Log) Authorizations(ctx context.Context) ([]AuthorizedLine, error) {
	var out []AuthorizedLine
	err := l.store.View(ctx, func(r Reader) error {
		return l.eachRecord(ctx, r, typeAuthorized, func(rec *record, n int) {
			out = append(out, AuthorizedLine{Authorized: *rec.Authorization, Line: n, At: rec.At, Caller: rec.Caller})
		})
	})
	return out, err
}

// eachRecord calls fn with every record of type typ in the log, in order,
// with its line number. Lines that are not records are skipped here (audit
// reports them).
func (l *Log) eachRecord(ctx context.Context, r Reader, typ string, fn func(rec *record, line int)) error {
	s, err := r.Log(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	br := bufio.NewReaderSize(io.NewSectionReader(s, 0, s.Size()), 64<<10)
	for n := 1; ; n++ {
		raw, err := readLine(br)
		if len(raw) > 0 && !errors.Is(err, errLineTooLong) {
			if rec, derr := decodeRecord(trimLine(raw)); derr == nil && rec.Type == typ {
				fn(&rec, n)
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil && !errors.Is(err, errLineTooLong) {
			return fmt.Errorf("read %s: %w", l.Path(), err)
		}
	}
}

func trimLine(raw []byte) []byte {
	n := len(raw)
	if n > 0 && raw[n-1] == '\n' {
		n--
	}
	if n > 0 && raw[n-1] == '\r' {
		n--
	}
	return raw[:n]
}
