package reviewlog

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/strictjson"
)

// errNotExact marks a line that is one JSON object but could be read two
// ways: a member named twice, or a name spelled in another case beside
// (or instead of) the exact one. No writer of the log makes such a line;
// the fold reports it as tampering and applies nothing of it.
var errNotExact = errors.New("not a review log record: a name is repeated or not spelled exactly, so readers could disagree on what it says")

// Line types of guard/decisions.ndjson.
const (
	typeOpened  = "opened"
	typeDecided = "decided"
	// typeRepair records that the lines it names are the remains of writes
	// that did not complete (a writer killed mid-append). A writer that
	// finds such a tail starts on a new line and writes this marker first,
	// so the repair is itself part of the audit trail and readers never
	// have to guess.
	typeRepair = "repair"
	// typeLedger records that the spend ledger started (its genesis
	// receipt): from then on commitments are ledger entries, not reserved
	// lines. A build that predates the ledger reads the line as unknown and
	// gives no decision, rather than decide without the ledger.
	typeLedger = "ledger"
	// typeUsed records that an approval was honoured: the caller's
	// identical question was answered allow on its strength, once.
	typeUsed = "used"
)

// record is one line of the log. Which fields are required depends on Type.
//
//	{"type":"opened","review_id":…,"at":…,"counterparty":…,"amount":…,"asset":…,"template":…,"reasons":[…],"terms":{…}}
//	{"type":"decided","review_id":…,"at":…,"status":"approved"|"rejected","by":…,"note":…}
//	{"type":"repair","at":…,"lines":[n,…]}
//	{"type":"used","review_id":…,"at":…,"by":<caller>}
//	{"type":"reserved","at":…,"reservation":{…,"mac":…}}
//	{"type":"released","at":…,"release":{"receipt_id":…,"caller":…,"outcome":…,"outcome_receipt":…,"mac":…}}
//
// An opened record also names the caller that asked ("caller") and the
// paramsHash its receipts carry ("params_hash"), and the review's Terms
// ("terms"), whose TermsHash the server signs in the same locked section.
// Nothing in a line is trusted: what it says is checked against the
// signed receipts.
type record struct {
	Type         string         `json:"type"`
	ReviewID     string         `json:"review_id,omitempty"`
	At           string         `json:"at"`
	Counterparty string         `json:"counterparty,omitempty"`
	Amount       *string        `json:"amount,omitempty"` // may be "" (an empty amount was asked about)
	Asset        string         `json:"asset,omitempty"`
	Template     string         `json:"template,omitempty"`
	Reasons      []guard.Reason `json:"reasons,omitempty"`
	Status       string         `json:"status,omitempty"`
	By           string         `json:"by,omitempty"`
	Note         string         `json:"note,omitempty"`
	Lines        []int          `json:"lines,omitempty"`
	Caller       string         `json:"caller,omitempty"`
	ParamsHash   string         `json:"params_hash,omitempty"`
	// Authorization is what an authorized record records.
	Authorization *Authorized `json:"authorization,omitempty"`
	Terms         *Terms      `json:"terms,omitempty"`
	// PayTo is the payee address a question named beside a host.
	PayTo string `json:"pay_to,omitempty"`
	// Reservation is what a reserved record reserves.
	Reservation *Reservation `json:"reservation,omitempty"`
	// Release is what a released record releases.
	Release *Release `json:"release,omitempty"`
	// Ledger is the genesis receipt of the spend ledger (a ledger line).
	Ledger string `json:"ledger,omitempty"`
	// Settlement is what a settled record records.
	Settlement *Settled `json:"settlement,omitempty"`
	// Ambiguity is what an ambiguous record records.
	Ambiguity *Ambiguity `json:"ambiguity,omitempty"`
}

const timeLayout = "2006-01-02T15:04:05.000Z"

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil || formatTime(t) != s { // time.Parse also takes "9:00:00,1", which is not canonical

		return time.Time{}, fmt.Errorf("time %q is not of the form 2026-07-24T09:00:00.120Z", clip(s))
	}
	return t, nil
}

// decodeRecord reads one line strictly: unknown fields, trailing data and
// missing or malformed fields are refused.
func decodeRecord(b []byte) (record, error) {
	var r record
	if !utf8.Valid(b) {
		return r, errors.New("not valid UTF-8")
	}
	// encoding/json matches field names without regard to case and keeps
	// the last of two members with one name; another reader (PostgreSQL,
	// a verifier in another language) may take the other. The log's names
	// are exact and once, in the record and in every object inside it.
	if err := strictjson.Check(b, &r); err != nil {
		var se *strictjson.Error
		if errors.As(err, &se) && se.Ambiguous {
			return r, fmt.Errorf("%w: %w", errNotExact, err)
		}
		return r, fmt.Errorf("not a review log record: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("not a review log record: %s", plainJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return r, errors.New("data after the record")
	}
	if _, err := parseTime(r.At); err != nil {
		return r, fmt.Errorf("at: %w", err)
	}
	if r.Type != typeAuthorized && r.Authorization != nil {
		return r, errors.New("only an authorized record carries an authorization")
	}
	if r.Type != typeSettled && r.Settlement != nil {
		return r, errors.New("only a settled record carries a settlement")
	}
	if r.Type != typeAmbiguous && r.Ambiguity != nil {
		return r, errors.New("only an ambiguous record carries an ambiguity")
	}
	if r.Type != typeReserved && r.Reservation != nil {
		return r, errors.New("only a reserved record carries a reservation")
	}
	if r.Type != typeReleased && r.Release != nil {
		return r, errors.New("only a released record carries a release")
	}
	if r.Type != typeOpened && r.PayTo != "" {
		return r, errors.New("only an opened record carries pay_to")
	}
	if r.Type != typeLedger && r.Ledger != "" {
		return r, errors.New("only a ledger record names the ledger's start")
	}
	switch r.Type {
	case typeOpened:
		if err := checkID(r.ReviewID); err != nil {
			return r, err
		}
		if r.Counterparty == "" || r.Amount == nil {
			return r, errors.New("an opened record needs counterparty and amount")
		}
		if r.Status != "" || r.By != "" || r.Note != "" || r.Lines != nil {
			return r, errors.New("an opened record carries decision fields")
		}
		if r.Terms != nil && r.Terms.Rules == nil {
			return r, errors.New("an opened record's terms need rules")
		}
	case typeDecided:
		if err := checkID(r.ReviewID); err != nil {
			return r, err
		}
		if r.Status != Approved && r.Status != Rejected {
			return r, fmt.Errorf("status %q is neither approved nor rejected", clip(r.Status))
		}
		if r.By == "" {
			return r, errors.New("a decided record needs by")
		}
		if r.Counterparty != "" || r.Amount != nil || r.Asset != "" || r.Template != "" || r.Reasons != nil || r.Lines != nil || r.Caller != "" || r.ParamsHash != "" || r.Terms != nil {
			return r, errors.New("a decided record carries question fields")
		}
	case typeUsed:
		if err := checkID(r.ReviewID); err != nil {
			return r, err
		}
		if r.By == "" || r.Status != "" || r.Note != "" || r.Counterparty != "" || r.Amount != nil || r.Reasons != nil || r.Lines != nil || r.ParamsHash != "" || r.Terms != nil {
			return r, errors.New("a used record carries only review_id, at and by")
		}
	case typeAuthorized:
		if r.Caller == "" || r.ReviewID != "" || r.Counterparty != "" || r.Amount != nil || r.Status != "" || r.By != "" || r.Reasons != nil || r.Lines != nil || r.ParamsHash != "" || r.Terms != nil {
			return r, errors.New("an authorized record carries only at, caller and authorization")
		}
		if err := checkAuthorized(r.Authorization); err != nil {
			return r, err
		}
	case typeSettled:
		if r.Caller == "" || r.ReviewID != "" || r.Counterparty != "" || r.Amount != nil || r.Status != "" || r.By != "" || r.Reasons != nil || r.Lines != nil || r.ParamsHash != "" || r.Terms != nil {
			return r, errors.New("a settled record carries only at, caller and settlement")
		}
		if err := checkSettled(r.Settlement); err != nil {
			return r, err
		}
	case typeAmbiguous:
		if r.Caller != "" || r.ReviewID != "" || r.Counterparty != "" || r.Amount != nil || r.Status != "" || r.By != "" || r.Reasons != nil || r.Lines != nil || r.ParamsHash != "" || r.Terms != nil {
			return r, errors.New("an ambiguous record carries only at and ambiguity")
		}
		if err := checkAmbiguity(r.Ambiguity); err != nil {
			return r, err
		}
	case typeReserved:
		if err := checkReservation(r); err != nil {
			return r, err
		}
	case typeReleased:
		if err := checkRelease(r); err != nil {
			return r, err
		}
	case typeLedger:
		if r.Ledger == "" || r.ReviewID != "" || r.Counterparty != "" || r.Amount != nil || r.Status != "" || r.By != "" || r.Caller != "" || r.ParamsHash != "" || r.Terms != nil || r.Lines != nil {
			return r, errors.New("a ledger record carries only at and ledger")
		}
	case typeRepair:
		if len(r.Lines) == 0 || r.ReviewID != "" || r.Counterparty != "" || r.Amount != nil || r.Status != "" || r.By != "" || r.Caller != "" || r.ParamsHash != "" || r.Terms != nil {
			return r, errors.New("a repair record carries only at and lines")
		}
	default:
		return r, fmt.Errorf("unknown record type %q", clip(r.Type))
	}
	return r, nil
}

// LineHead is what a store may index of one line of the review log: the
// line's type and the review it concerns ("" for none); for the lines
// that change a review's state, what a store keeps of that state in rows;
// and, for a reserved or released line, its reservation or release as the
// line holds it (unverified: checking the seal is the engine's part).
type LineHead struct {
	Type     string
	ReviewID string
	// At is the line's time (every record has one).
	At time.Time
	// Of an opened line: who asked, the tenant its terms name, the key of
	// the question (QuestionKey: what the fold groups a caller's reviews
	// of one question by) and the key of its terms without the review id
	// (TermsKey; "" when the line carries no terms), both hex.
	Caller, Tenant, QuestionKey, TermsKey string
	// Status is a decided line's (approved or rejected).
	Status string
	// Reservation is a reserved line's reservation, with At set to the
	// line's time; nil for any other line.
	Reservation *Reservation
	// Release is a released line's release, with At set; nil otherwise.
	Release *Release
	// Notify is the id under which the line is told to a person through
	// the notification outbox: an opened review's id, NotifySettlement and
	// the nonce of a settlement with findings, NotifyAmbiguity and the key
	// of an ambiguity; "" for any other line.
	Notify string
}

// ParseLineHead reads the head of one line of the review log (with or
// without its newline), by the log's own strict reading: ok is false for
// a line the log does not read as a record (a store keeps such a line,
// unindexed; the fold reports it).
func ParseLineHead(line []byte) (h LineHead, ok bool) {
	r, err := decodeRecord(line)
	if err != nil {
		return LineHead{}, false
	}
	at, _ := parseTime(r.At) // decodeRecord refuses a line whose time does not parse
	h = LineHead{Type: r.Type, ReviewID: r.ReviewID, At: at}
	switch r.Type {
	case typeOpened:
		k := openedKey(r)
		h.Caller, h.QuestionKey = r.Caller, hex.EncodeToString(k[:])
		if r.Terms != nil {
			h.Tenant, h.TermsKey = r.Terms.Tenant, TermsKey(*r.Terms)
		}
	case typeDecided:
		h.Status = r.Status
	case typeSettled:
		if len(r.Settlement.Findings) > 0 {
			h.Notify = NotifySettlement + r.Settlement.Nonce
		}
	case typeAmbiguous:
		h.Notify = NotifyAmbiguity + r.Ambiguity.Key
	}
	if h.Opens() {
		h.Notify = h.ReviewID
	}
	if r.Reservation != nil {
		c := *r.Reservation
		c.At, c.Releases = r.At, nil
		h.Reservation = &c
	}
	if r.Release != nil {
		c := *r.Release
		c.At = r.At
		h.Release = &c
	}
	return h, true
}

// Opens says whether the line opens a review (ReviewID names it).
func (h LineHead) Opens() bool { return h.Type == typeOpened && h.ReviewID != "" }

// Decides says whether the line decides review h.ReviewID (h.Status).
func (h LineHead) Decides() bool { return h.Type == typeDecided && h.ReviewID != "" }

// Uses says whether the line uses the approval of review h.ReviewID.
func (h LineHead) Uses() bool { return h.Type == typeUsed && h.ReviewID != "" }

// plainJSONError keeps encoding/json's message but not its Go type names.
func plainJSONError(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		return fmt.Sprintf("field %q has the wrong type (%s)", ute.Field, ute.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func encodeRecord(r record) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, fmt.Errorf("encode review log record: %w", err)
	}
	return buf.Bytes(), nil // Encode ends the line with '\n'
}

// checkID accepts a lower-case RFC 9562 version 4 UUID, as newID makes.
func checkID(id string) error {
	if len(id) != 36 {
		return fmt.Errorf("%w: %q is not a review id (a UUID such as 1b4e28ba-2fa1-4d2c-883f-0016d3cca427)", ErrBadID, clip(id))
	}
	for i := 0; i < 36; i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return fmt.Errorf("%w: %q is not a review id", ErrBadID, clip(id))
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return fmt.Errorf("%w: %q is not a review id (lower-case hex digits expected)", ErrBadID, clip(id))
			}
		}
	}
	if id[14] != '4' || !strings.ContainsRune("89ab", rune(id[19])) {
		return fmt.Errorf("%w: %q is not a version 4 UUID", ErrBadID, clip(id))
	}
	return nil
}

func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
