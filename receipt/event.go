// Package receipt reads Haia Trace runs (the Event Contract), loads operation
// templates and assembles per-operation receipts whose JSON is byte-identical
// to the reference implementation's (@usehaia/trace-core 0.0.10).
package receipt

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// Event is one line of a run file that passed the envelope rules.
type Event struct {
	ID, Type, OccurredAt, Adapter string
	Seq                           float64 // a validated non-negative integer
	Role                          string
	HasRole                       bool
	// mapped says the event's line is the run file's own bytes mapped
	// into memory (ReadRunFileHeld), which a writer could change after
	// they were checked, and sum is its sum then (see changed). They
	// sit in HasRole's padding: an event is no larger for them.
	mapped    bool
	sum       uint32
	ContextID string // "" means the event belongs to no operation
	Line      int    // 1-based line number in its run file
	Raw       jsjson.Value
}

// lineSeed seeds the sums of mapped lines: made once, never written after.
var lineSeed = maphash.MakeSeed()

// lineSum is the sum Event.changed compares: the low half of the line's
// maphash (the runtime's AES hash where the processor has it: 5 GB/s on a
// 600-byte line on the development machine).
func lineSum(line string) uint32 { return uint32(maphash.String(lineSeed, line)) }

// changed reports whether the line an event was decoded from is no longer
// the bytes it was decoded from: a writer rewrote the run file in place
// while it was mapped. Every string of the event, and every byte printed
// of it, is in that line (a line kept as text runs to its '\n', so a line
// end written over makes it longer). An event read any other way holds
// its own copy and never changes. A 32-bit sum misses a random change
// once in four billion: it guards against a file rewritten by mistake,
// not against its writer, who could have written anything before the read.
func (e *Event) changed() bool {
	return e.mapped && lineSum(e.Raw.Source()) != e.sum
}

// Payload returns the event's payload object.
func (e Event) Payload() jsjson.Value {
	p, _ := e.Raw.Get("payload")
	return p
}

// Envelope rule names, used in LineError.Rule.
const (
	RuleUTF8       = "utf8"
	RuleJSON       = "json"
	RuleObject     = "object"
	RuleEventID    = "event_id"
	RuleEventType  = "event_type"
	RuleOccurredAt = "occurred_at"
	RuleSeq        = "seq"
	RuleAdapter    = "adapter"
	RuleRole       = "role"
	RuleContextID  = "context_id"
	RulePayload    = "payload"
	RuleLineSize   = "line_size"
	RuleRunSize    = "run_size"
)

// LineError says which rule a line of a run file broke.
type LineError struct {
	Run  string // run id, "" when not known
	Line int    // 1-based line number, 0 when not known
	Rule string
	Err  error
}

func (e *LineError) Error() string {
	var b []byte
	if e.Run != "" {
		b = fmt.Appendf(b, "run %s", e.Run)
	}
	if e.Line > 0 {
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "line %d", e.Line)
	}
	if len(b) > 0 {
		b = append(b, ": "...)
	}
	b = fmt.Appendf(b, "%s: %v", e.Rule, e.Err)
	return string(b)
}

func (e *LineError) Unwrap() error { return e.Err }

func ruleErr(rule, format string, args ...any) *LineError {
	return &LineError{Rule: rule, Err: fmt.Errorf(format, args...)}
}

// DecodeLine decodes one line (without its line end) against the envelope
// rules. The error is a *LineError naming the broken rule.
//
// Decision on bytes a JavaScript reader would have silently rewritten: a line
// with invalid UTF-8 or starting with a byte order mark is refused with a
// clear error rather than having its bytes replaced (U+FFFD) as Node would;
// the reference could not parse a BOM-prefixed line either.
func DecodeLine(line []byte) (Event, error) {
	return decodeLine(nil, string(line))
}

// decodeLineText decodes one line, found at off in the text lines holds,
// with dec's reused scratch storage. A plain event (see jsjson.Value.Plain)
// keeps only its line's text as its Raw value; others keep a copy of their
// parsed document.
func decodeLineText(dec *jsjson.Decoder, lines jsjson.Lines, line string, off int) (Event, error) {
	if err := checkBOM(line); err != nil {
		return Event{}, err
	}
	v, err := dec.Scratch(line)
	if err != nil {
		return Event{}, parseError(line, err)
	}
	if !v.Plain() {
		return decodeValue(dec.Keep(v))
	}
	ev, err := decodeValue(v) // a plain document's strings are all in line
	if ev.Raw = lines.Line(v, off); ev.Raw == v {
		ev.Raw = dec.Keep(v) // not a line of lines: keep the parse after all
	}
	return ev, err
}

// decodeLineScratch decodes one line into dec's reused scratch storage: the
// event's Raw is valid only until dec is used again.
func decodeLineScratch(dec *jsjson.Decoder, line string) (Event, error) {
	if err := checkBOM(line); err != nil {
		return Event{}, err
	}
	v, err := dec.Scratch(line)
	if err != nil {
		return Event{}, parseError(line, err)
	}
	return decodeValue(v)
}

// checkBOM refuses a line that starts with a byte order mark.
func checkBOM(line string) error {
	if strings.HasPrefix(line, "\ufeff") {
		return ruleErr(RuleUTF8, "line starts with a UTF-8 byte order mark (U+FEFF); remove it")
	}
	return nil
}

// parseError is the error for a line the parser refused. The parser
// refuses every invalid UTF-8 byte (in a string or out of one), so the
// bytes are checked only then, and invalid UTF-8 is reported as such
// wherever it is, as if it had been checked first.
func parseError(line string, err error) error {
	if !utf8.ValidString(line) {
		off := firstInvalidUTF8(line)
		return ruleErr(RuleUTF8, "invalid UTF-8 at byte %d (0x%02x); event lines must be UTF-8", off, line[off])
	}
	return &LineError{Rule: RuleJSON, Err: err}
}

// decodeLine decodes one line; with a non-nil dec the event's storage comes
// from dec's shared blocks.
func decodeLine(dec *jsjson.Decoder, line string) (Event, error) {
	if err := checkBOM(line); err != nil {
		return Event{}, err
	}
	var (
		v   jsjson.Value
		err error
	)
	if dec != nil {
		v, err = dec.ParseString(line)
	} else {
		v, err = jsjson.ParseString(line)
	}
	if err != nil {
		return Event{}, parseError(line, err)
	}
	return decodeValue(v)
}

func firstInvalidUTF8(b string) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRuneInString(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return 0
}

func decodeValue(v jsjson.Value) (Event, error) {
	if v.Kind() != jsjson.Object {
		return Event{}, ruleErr(RuleObject, "an event must be a JSON object, got %s", v.Kind())
	}
	// One pass over the members; the rules are then checked in a fixed
	// order, so a line breaking several names the same rule every time.
	var id, typ, adapter, at, seq, role, ctx, payload jsjson.Value
	var has uint8
	const (
		hasID = 1 << iota
		hasType
		hasAdapter
		hasAt
		hasSeq
		hasRole
		hasCtx
		hasPayload
	)
	v.Range(func(k string, m jsjson.Value) bool {
		switch k {
		case "event_id":
			id, has = m, has|hasID
		case "event_type":
			typ, has = m, has|hasType
		case "adapter":
			adapter, has = m, has|hasAdapter
		case "occurred_at":
			at, has = m, has|hasAt
		case "seq":
			seq, has = m, has|hasSeq
		case "role":
			role, has = m, has|hasRole
		case "context_id":
			ctx, has = m, has|hasCtx
		case "payload":
			payload, has = m, has|hasPayload
		}
		return true
	})
	ev := Event{Raw: v}
	var err error
	if ev.ID, err = requiredString(id, has&hasID != 0); err != nil {
		return Event{}, &LineError{Rule: RuleEventID, Err: err}
	}
	if ev.Type, err = requiredString(typ, has&hasType != 0); err != nil {
		return Event{}, &LineError{Rule: RuleEventType, Err: err}
	}
	if ev.Adapter, err = requiredString(adapter, has&hasAdapter != 0); err != nil {
		return Event{}, &LineError{Rule: RuleAdapter, Err: err}
	}
	if has&hasAt == 0 {
		return Event{}, ruleErr(RuleOccurredAt, "missing; expected an ISO-8601 UTC time like 2026-07-24T09:00:00.120Z")
	}
	var ok bool
	if ev.OccurredAt, ok = at.Str(); !ok {
		return Event{}, ruleErr(RuleOccurredAt, "must be a string, got %s", at.Kind())
	}
	if err := checkTimestamp(ev.OccurredAt); err != nil {
		return Event{}, &LineError{Rule: RuleOccurredAt, Err: err}
	}
	if has&hasSeq == 0 {
		return Event{}, ruleErr(RuleSeq, "missing; expected a non-negative integer")
	}
	if ev.Seq, ok = seq.Num(); !ok {
		return Event{}, ruleErr(RuleSeq, "must be a number, got %s", seq.Kind())
	}
	if math.IsInf(ev.Seq, 0) || ev.Seq < 0 || ev.Seq != math.Trunc(ev.Seq) {
		return Event{}, ruleErr(RuleSeq, "must be a non-negative integer, got %s", jsjson.FormatNumber(ev.Seq))
	}
	if ev.Seq == 0 {
		ev.Seq = 0 // -0 sorts and prints as 0
	}
	if has&hasRole != 0 {
		if ev.Role, ok = role.Str(); !ok {
			return Event{}, ruleErr(RuleRole, "must be a string when present, got %s", role.Kind())
		}
		ev.HasRole = true
	}
	if has&hasCtx != 0 {
		if ev.ContextID, ok = ctx.Str(); !ok {
			return Event{}, ruleErr(RuleContextID, "must be a string when present, got %s", ctx.Kind())
		}
	}
	if has&hasPayload == 0 {
		return Event{}, ruleErr(RulePayload, "missing; expected an object")
	}
	if payload.Kind() != jsjson.Object {
		return Event{}, ruleErr(RulePayload, "must be an object, got %s", payload.Kind())
	}
	return ev, nil
}

func requiredString(m jsjson.Value, present bool) (string, error) {
	if !present {
		return "", errors.New("missing; expected a non-empty string")
	}
	s, ok := m.Str()
	if !ok {
		return "", fmt.Errorf("must be a string, got %s", m.Kind())
	}
	if s == "" {
		return "", errors.New("must be a non-empty string")
	}
	return s, nil
}

// checkTimestamp accepts exactly YYYY-MM-DDTHH:MM:SS.mmmZ naming a real
// instant. The fixed width is what makes the assembler's string ordering
// chronological.
func checkTimestamp(s string) error {
	const layout = "2006-01-02T15:04:05.000Z"
	bad := func() error {
		return fmt.Errorf("%q is not canonical ISO-8601 UTC with milliseconds (like 2026-07-24T09:00:00.120Z)", s)
	}
	if len(s) != len(layout) {
		return bad()
	}
	for i := 0; i < len(s); i++ {
		c, l := s[i], layout[i]
		if l >= '0' && l <= '9' {
			if c < '0' || c > '9' {
				return bad()
			}
		} else if c != l {
			return bad()
		}
	}
	if !realInstant(s) {
		return fmt.Errorf("%q is not a real instant (no such date or time of day)", s)
	}
	return nil
}

// realInstant checks the fields of a timestamp whose digits are in place,
// accepting exactly what time.Parse accepts for the layout: months 01-12,
// days that exist in the month (leap years included), hours 00-23, minutes
// and seconds 00-59.
func realInstant(s string) bool {
	num := func(i, n int) int {
		v := 0
		for _, c := range []byte(s[i : i+n]) {
			v = v*10 + int(c-'0')
		}
		return v
	}
	year, month, day := num(0, 4), num(5, 2), num(8, 2)
	if month < 1 || month > 12 || day < 1 || num(11, 2) > 23 || num(14, 2) > 59 || num(17, 2) > 59 {
		return false
	}
	days := [13]int{0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}[month]
	if month == 2 && year%4 == 0 && (year%100 != 0 || year%400 == 0) {
		days = 29
	}
	return day <= days
}
