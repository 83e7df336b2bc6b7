// Package mandate is the guard's standing approvals: a reviewer signs, with
// their own key, bounds a payee may be paid within (a host, a caller, an
// amount per payment, a budget, a number of payments, an expiry), and the
// decision engine (guard/engine) allows a question inside them that only
// an amount rule would send to review.
//
// A mandate is a chain of signed records kept by the guard's store
// (reviewlog/filestore: guard/mandates.ndjson; reviewlog/pgstore: the
// mandate_records table): a grant, the further signatures a quorum asks
// for, a revocation. Every record is signed by a reviewer's Ed25519 key,
// or, for a grant the reviewer console makes with an approval, by the
// reviewer's passkey (a WebAuthn assertion over the record's digest bound
// to the decision's hash, see PasskeyChallenge), and names the hash of the
// record before it, so a writer of the store can neither forge, alter,
// reorder nor remove one without the next reader seeing it; a record that
// does not verify is never trusted. What a
// mandate has paid is the spend ledger's (package ledger): each use is a
// sealed entry naming the mandate.
package mandate

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
)

// Record kinds.
const (
	// KindGrant is a mandate's terms, signed by the reviewer who grants it.
	KindGrant = "grant"
	// KindSign is another reviewer's signature of a grant's terms (Terms
	// names them), for a mandate a quorum asks several reviewers for.
	KindSign = "sign"
	// KindRevoke ends a mandate: from it on, nothing is allowed under it.
	KindRevoke = "revoke"
)

// Version is the record format this package writes and reads.
const Version = 1

// MaxLine bounds one record line.
const MaxLine = 8 << 10

// signLabel domain-separates a mandate's signatures from every other
// signature a reviewer's key makes.
const signLabel = "haia-trace-mcp/mandate/v1\x00"

// Record is one line of the mandate records.
type Record struct {
	V    int    `json:"v"`
	Kind string `json:"kind"`
	// ID names the mandate ("m_" and 16 hex digits).
	ID string `json:"id"`
	// Prev is the SHA-256 (hex) of the line before this one, "" for the
	// first record of a store.
	Prev string `json:"prev"`
	// Tenant is the tenant whose guard honours it.
	Tenant string `json:"tenant"`
	// The grant's terms: PayTo (a canonical 0x address) is paid; Host,
	// when set, is the only host it is paid for; Agent, when set, the
	// only caller. Asset is the asset key ("caip2/address"); MaxAtomic,
	// BudgetAtomic the most one payment and all payments may be, in its
	// atomic units; Count, when not 0, how many payments it allows.
	PayTo        string `json:"pay_to,omitempty"`
	Host         string `json:"host,omitempty"`
	Agent        string `json:"agent,omitempty"`
	Asset        string `json:"asset,omitempty"`
	MaxAtomic    string `json:"max_atomic,omitempty"`
	BudgetAtomic string `json:"budget_atomic,omitempty"`
	Count        int    `json:"count,omitempty"`
	// NotBefore and Expires bound when it may be used (times as At).
	NotBefore string `json:"not_before,omitempty"`
	Expires   string `json:"expires,omitempty"`
	// Approvals is how many distinct reviewers must sign the grant before
	// it can be used (0 or 1: its grantor alone).
	Approvals int `json:"approvals,omitempty"`
	// Note is the grantor's; Source and Reference say where its terms
	// came from (an AP2 open payment mandate and its payment.reference).
	Note      string `json:"note,omitempty"`
	Source    string `json:"source,omitempty"`
	Reference string `json:"reference,omitempty"`
	// Terms is, on a sign or revoke record, the TermsHash of the grant it
	// acts on.
	Terms string `json:"terms,omitempty"`
	// Decision, on a record a passkey signed with a review's decision in
	// the same gesture, is that decision's hash (reviewlog.DecisionHash):
	// the passkey's challenge binds the two (PasskeyChallenge).
	Decision string `json:"decision,omitempty"`
	// At is when it was signed; By the reviewer id, KID their key's id
	// (PasskeyKID for a passkey's record).
	At  string `json:"at"`
	By  string `json:"by"`
	KID string `json:"kid"`
	// Sig is the Ed25519 signature (base64url, no padding) of the label
	// and every byte of the line before it; or PasskeySigPrefix and the
	// passkey's assertion (base64url of its JSON) over PasskeyChallenge.
	Sig string `json:"sig"`
}

// body is a record without its signature, in the order lines are written.
type body struct {
	V            int    `json:"v"`
	Kind         string `json:"kind"`
	ID           string `json:"id"`
	Prev         string `json:"prev"`
	Tenant       string `json:"tenant"`
	PayTo        string `json:"pay_to,omitempty"`
	Host         string `json:"host,omitempty"`
	Agent        string `json:"agent,omitempty"`
	Asset        string `json:"asset,omitempty"`
	MaxAtomic    string `json:"max_atomic,omitempty"`
	BudgetAtomic string `json:"budget_atomic,omitempty"`
	Count        int    `json:"count,omitempty"`
	NotBefore    string `json:"not_before,omitempty"`
	Expires      string `json:"expires,omitempty"`
	Approvals    int    `json:"approvals,omitempty"`
	Note         string `json:"note,omitempty"`
	Source       string `json:"source,omitempty"`
	Reference    string `json:"reference,omitempty"`
	Terms        string `json:"terms,omitempty"`
	Decision     string `json:"decision,omitempty"`
	At           string `json:"at"`
	By           string `json:"by"`
	KID          string `json:"kid"`
}

func (r *Record) body() body {
	return body{r.V, r.Kind, r.ID, r.Prev, r.Tenant, r.PayTo, r.Host, r.Agent, r.Asset, r.MaxAtomic, r.BudgetAtomic, r.Count,
		r.NotBefore, r.Expires, r.Approvals, r.Note, r.Source, r.Reference, r.Terms, r.Decision, r.At, r.By, r.KID}
}

// prefix is the line up to its signature.
func (r *Record) prefix() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r.body()); err != nil {
		return nil, err
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	b = b[:len(b)-1]
	return append(b, `,"sig":"`...), nil
}

func message(prefix []byte) []byte { return append([]byte(signLabel), prefix...) }

// Sign checks r, sets V and signs it with key (the reviewer's, whose id
// is r.By and key id r.KID); it returns the line (without a newline).
func (r *Record) Sign(key ed25519.PrivateKey) ([]byte, error) {
	r.V = Version
	if err := r.Check(); err != nil {
		return nil, err
	}
	p, err := r.prefix()
	if err != nil {
		return nil, err
	}
	r.Sig = base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, message(p)))
	line := append(append(p, r.Sig...), `"}`...)
	if len(line) > MaxLine {
		return nil, fmt.Errorf("mandate record of %d bytes, more than %d (shorten the note)", len(line), MaxLine)
	}
	return line, nil
}

// Parse reads one line as a record, exactly as Sign writes it (the same
// members, in the same order, each once, nothing else), without checking
// its signature (Verify does).
func Parse(line []byte) (Record, error) {
	var r Record
	if len(line) > MaxLine {
		return r, fmt.Errorf("a line of %d bytes, more than %d", len(line), MaxLine)
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("not a mandate record: %w", err)
	}
	if r.V != Version {
		return r, fmt.Errorf("record format %d, not %d", r.V, Version)
	}
	p, err := r.prefix()
	if err != nil {
		return r, err
	}
	if !bytes.Equal(append(append(p, r.Sig...), `"}`...), line) {
		return r, errors.New("not written the one way a mandate record is written (a member repeated, misspelt, reordered or added)")
	}
	if err := r.Check(); err != nil {
		return r, err
	}
	return r, nil
}

// Verify checks the record's Ed25519 signature (of line, as Parse read
// it) under pub.
func (r *Record) Verify(pub ed25519.PublicKey) error {
	if r.SignedWithPasskey() {
		return errors.New("it is signed with a passkey, not a key")
	}
	p, err := r.prefix()
	if err != nil {
		return err
	}
	sig, err := base64.RawURLEncoding.DecodeString(r.Sig)
	if err != nil || len(pub) != ed25519.PublicKeySize || !ed25519.Verify(pub, message(p), sig) {
		return errors.New("its signature does not verify")
	}
	return nil
}

// Hash is the link the next record names as Prev.
func Hash(line []byte) string {
	s := sha256.Sum256(line)
	return hex.EncodeToString(s[:])
}

// TermsHash is what a sign or revoke record names of a grant: the SHA-256
// (hex) of its body without the place it was written at (Prev), so that
// the same terms are named however the records around them change.
func (r *Record) TermsHash() string {
	b := r.body()
	b.Prev = ""
	data, _ := json.Marshal(b)
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// NewID is a fresh mandate id.
func NewID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("mandate id: %w", err)
	}
	return "m_" + hex.EncodeToString(b[:]), nil
}

// CheckID says whether s is written as a mandate id.
func CheckID(s string) error {
	if len(s) != 18 || !strings.HasPrefix(s, "m_") || !lowerHex(s[2:]) {
		return fmt.Errorf("%q is not a mandate id (m_ and 16 hex digits)", clip(s))
	}
	return nil
}

// maxField bounds a text field of a record.
const maxField = 512

// Check says what is wrong with a record's fields.
func (r *Record) Check() error {
	if err := CheckID(r.ID); err != nil {
		return err
	}
	if r.Prev != "" && (len(r.Prev) != 64 || !lowerHex(r.Prev)) {
		return fmt.Errorf("prev %q is not a SHA-256 in hex", clip(r.Prev))
	}
	for name, v := range map[string]string{"tenant": r.Tenant, "pay_to": r.PayTo, "host": r.Host, "agent": r.Agent, "asset": r.Asset,
		"note": r.Note, "source": r.Source, "reference": r.Reference, "by": r.By, "kid": r.KID} {
		if len(v) > maxField || !utf8.ValidString(v) {
			return fmt.Errorf("%s is longer than %d bytes or not UTF-8", name, maxField)
		}
	}
	if r.Decision != "" && !isDigest(r.Decision) {
		return fmt.Errorf("decision %q is not sha256:<64 hex>", clip(r.Decision))
	}
	if r.Tenant == "" || r.By == "" || r.KID == "" {
		return errors.New("a record names its tenant, its signer and the signer's key id")
	}
	if _, err := ParseTime(r.At); err != nil {
		return fmt.Errorf("at: %w", err)
	}
	switch r.Kind {
	case KindGrant:
		return r.checkGrant()
	case KindSign, KindRevoke:
		if len(r.Terms) != 64 || !lowerHex(r.Terms) {
			return fmt.Errorf("a %s names the terms hash of the grant it acts on", r.Kind)
		}
		if r.PayTo != "" || r.Host != "" || r.Agent != "" || r.Asset != "" || r.MaxAtomic != "" || r.BudgetAtomic != "" || r.Count != 0 ||
			r.NotBefore != "" || r.Expires != "" || r.Approvals != 0 || r.Source != "" || r.Reference != "" {
			return fmt.Errorf("a %s names no terms of its own", r.Kind)
		}
		return nil
	}
	return fmt.Errorf("unknown kind %q", clip(r.Kind))
}

func (r *Record) checkGrant() error {
	if !isAddress(r.PayTo) {
		return fmt.Errorf("pay_to %q is not 0x and 40 hex digits", clip(r.PayTo))
	}
	if r.Asset == "" {
		return errors.New("no asset")
	}
	max, err := atomic(r.MaxAtomic, "max_atomic")
	if err != nil {
		return err
	}
	budget, err := atomic(r.BudgetAtomic, "budget_atomic")
	if err != nil {
		return err
	}
	if max.Sign() <= 0 || budget.Sign() <= 0 {
		return errors.New("the most per payment and the budget must be more than zero")
	}
	if r.Count < 0 || r.Approvals < 0 || r.Approvals > 16 {
		return errors.New("count and approvals are counts")
	}
	if r.Terms != "" {
		return errors.New("a grant names no other terms")
	}
	exp, err := ParseTime(r.Expires)
	if err != nil {
		return fmt.Errorf("expires: %w", err)
	}
	if r.NotBefore != "" {
		nb, err := ParseTime(r.NotBefore)
		if err != nil {
			return fmt.Errorf("not_before: %w", err)
		}
		if !nb.Before(exp) {
			return errors.New("it expires before it may be used")
		}
	}
	return nil
}

func atomic(s, name string) (*big.Int, error) {
	a, ok := new(big.Int).SetString(s, 10)
	if !ok || a.Sign() < 0 || strconv.Quote(s) != `"`+a.String()+`"` {
		return nil, fmt.Errorf("%s %q is not atomic units", name, clip(s))
	}
	return a, nil
}

// Max and Budget are a grant's bounds in atomic units.
func (r *Record) Max() *big.Int    { a, _ := atomic(r.MaxAtomic, ""); return a }
func (r *Record) Budget() *big.Int { a, _ := atomic(r.BudgetAtomic, ""); return a }

func isAddress(s string) bool {
	if len(s) != 42 || s[:2] != "0x" {
		return false
	}
	for _, c := range s[2:] {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return true
}

func isDigest(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	return ok && len(h) == 64 && lowerHex(h)
}

func lowerHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return s != ""
}

// FormatTime writes t as records do: the spend ledger's one way
// (ledger.FormatTime), so that a mandate's times and its uses' compare as
// written.
func FormatTime(t time.Time) string { return ledger.FormatTime(t) }

// ParseTime reads a time written by FormatTime, and nothing else.
func ParseTime(s string) (time.Time, error) { return ledger.ParseTime(s) }

func clip(s string) string {
	if len(s) > 48 {
		return s[:48] + "…"
	}
	return s
}
