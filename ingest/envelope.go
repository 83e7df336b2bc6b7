// Package ingest receives the events a Haia Trace recorder mirrors to a
// Control Plane (POST /v1/events:batch, the core package's Control Plane
// writer) and turns each back into the Event Contract line the recorder's
// own file sink would have written, for a Sink to store durably.
//
// The wire shape is the Control Plane's closed ingest envelope:
//
//	{"events":[{"event_type","occurred_at","client_event_id","anonymous_id",
//	  "user_id","session_id","properties","meta"}, …]}
//
// where properties is the event's payload with the envelope fields seq,
// adapter, role and context_id spread over it, and meta carries the run
// (run_id) the recorder wrote the event to. Every event is checked on its
// own: one that breaks a rule is rejected with its index and issues, the
// others are stored.
package ingest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Bounds of the envelope, the Control Plane ingest API's own (the writer
// screens against the same numbers).
const (
	MaxBatch         = 500
	MaxEventType     = 128
	MaxClientEventID = 128
	MaxIdentity      = 256
	MaxRunID         = 128
	// MaxDepth bounds how deeply one event's JSON nests (the event object
	// is level 1, its properties level 2). A recorder's payloads are a few
	// levels deep; the bound keeps a hostile batch from costing more.
	MaxDepth = 64
	// bodyDepth is MaxDepth plus the batch object and its events array.
	bodyDepth = MaxDepth + 2
)

// Issue codes in a rejection.
const (
	CodeUnknownField   = "unknown_field"
	CodeDuplicateField = "duplicate_field"
	CodeRequired       = "required"
	CodeType           = "invalid_type"
	CodeTooLong        = "too_long"
	CodeFormat         = "invalid_format"
	CodeTooDeep        = "too_deep"
	CodeMismatch       = "mismatch"
	CodeUnsupported    = "unsupported"
	CodeTooLarge       = "too_large"
)

// Issue is one reason an event was not stored, as the writer reads it.
type Issue struct {
	Code    string `json:"code"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Rejection is an event of the batch that was not stored.
type Rejection struct {
	Index  int     `json:"index"`
	Issues []Issue `json:"issues"`
}

// Result is the batch endpoint's answer.
type Result struct {
	Accepted   int         `json:"accepted"`
	Duplicates int         `json:"duplicates"`
	Rejections []Rejection `json:"rejections"`
}

// Event is one envelope mapped back to the Event Contract: the run it
// belongs to, its event_id (the key it is deduplicated on within the run)
// and the line, without its line end, that the run file gets.
type Event struct {
	Index int // position in the batch
	Run   string
	ID    string
	Line  []byte
}

// BatchError is a request refused whole: its body is not a batch at all.
type BatchError struct{ Msg string }

func (e *BatchError) Error() string { return e.Msg }

func batchErrorf(format string, args ...any) error {
	return &BatchError{Msg: fmt.Sprintf(format, args...)}
}

// eventTypePattern is the character set the ingest API accepts in an
// event_type (JavaScript's \w is ASCII only).
var eventTypePattern = regexp.MustCompile(`^[A-Za-z0-9_$\-. ]+$`)

// runIDPattern is what a run id may be: it names the run file
// <run_id>.ndjson, so it is one plain path element.
var runIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]*$`)

// ParseBatch reads a batch body and maps every event it holds. The body
// must be one JSON object with the single member "events", an array of at
// most MaxBatch objects; otherwise it is a *BatchError and nothing is
// stored. Within that, each event is mapped or rejected on its own.
func ParseBatch(body []byte) (events []Event, rejections []Rejection, err error) {
	if !utf8.Valid(body) {
		return nil, nil, batchErrorf("the body is not valid UTF-8 (at byte %d)", invalidUTF8At(body))
	}
	if d, at := nesting(body); d > bodyDepth {
		return nil, nil, batchErrorf("the body nests deeper than %d levels (at byte %d); an event may nest %d levels", bodyDepth, at, MaxDepth)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := expectDelim(dec, '{'); err != nil {
		return nil, nil, batchErrorf("the body must be a JSON object {\"events\": [...]}: %v", err)
	}
	var raws []json.RawMessage
	seen := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, batchErrorf("the body is not valid JSON: %v", err)
		}
		key, _ := tok.(string)
		if key != "events" {
			return nil, nil, batchErrorf("the body has the unknown member %q: a batch is {\"events\": [...]} alone", clip(key))
		}
		if seen {
			return nil, nil, batchErrorf("the body gives \"events\" twice")
		}
		seen = true
		// One Decode for the whole array: a Decode per element was three
		// times slower (BenchmarkParseBatch).
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, nil, batchErrorf("the body is not valid JSON: %v", err)
		}
		if len(val) == 0 || val[0] != '[' {
			return nil, nil, batchErrorf("\"events\" must be an array")
		}
		if err := json.Unmarshal(val, &raws); err != nil {
			return nil, nil, batchErrorf("\"events\" is not valid JSON: %v", err)
		}
		if len(raws) > MaxBatch {
			return nil, nil, batchErrorf("the batch holds %d events, more than %d events a request may; send at most %d", len(raws), MaxBatch, MaxBatch)
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, batchErrorf("the body is not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, batchErrorf("the body has text after the batch object")
	}
	if !seen {
		return nil, nil, batchErrorf("the body has no \"events\" array")
	}
	for i, raw := range raws {
		ev, issues := MapEvent(raw)
		if len(issues) > 0 {
			rejections = append(rejections, Rejection{Index: i, Issues: issues})
			continue
		}
		ev.Index = i
		events = append(events, ev)
	}
	return events, rejections, nil
}

// envelope is one event's members, each as its compact JSON text.
type envelope struct {
	eventType, occurredAt, clientEventID, anonymousID, userID, sessionID []byte
	// props are the properties' members in order, meta's too.
	props, meta []member
	seen        map[string]bool
}

type member struct {
	key  string
	text []byte // compact JSON
}

// MapEvent checks one envelope and maps it to its Event Contract line:
//
//	{"event_id", "event_type", "occurred_at", "context_id"?, "seq", "adapter", "role"?, "payload"}
//
// in the order the recorder stamps them, each value the sender's own JSON
// text (so a line reads back byte for byte as the recorder's file sink
// wrote it). event_id is client_event_id; without one (the writer leaves
// off an id over 128 characters) it is derived from the event's text, so
// a retry still finds it. payload is properties less seq, adapter, role
// and context_id (the writer spreads those over the payload, so a payload
// member of the same name never reaches the wire).
func MapEvent(raw []byte) (Event, []Issue) {
	var env envelope
	if issues := env.read(raw); len(issues) > 0 {
		return Event{}, issues
	}
	var issues []Issue
	add := func(code, field, format string, args ...any) {
		issues = append(issues, Issue{Code: code, Field: field, Message: fmt.Sprintf(format, args...)})
	}
	str := func(field string, text []byte, limit int, required bool) (string, bool) {
		if text == nil {
			if required {
				add(CodeRequired, field, "%s is required", field)
			}
			return "", false
		}
		var s string
		if text[0] != '"' || json.Unmarshal(text, &s) != nil {
			add(CodeType, field, "%s must be a string", field)
			return "", false
		}
		if limit > 0 && jsLen(s) > limit {
			add(CodeTooLong, field, "%s is %d characters; at most %d", field, jsLen(s), limit)
			return "", false
		}
		return s, true
	}
	eventType, ok := str("event_type", env.eventType, MaxEventType, true)
	if ok && (eventType == "" || !eventTypePattern.MatchString(eventType)) {
		add(CodeFormat, "event_type", "event_type must be 1 to %d letters, digits, '_', '$', '-', '.' or spaces", MaxEventType)
	}
	str("occurred_at", env.occurredAt, 0, true)
	clientID, hasClientID := str("client_event_id", env.clientEventID, MaxClientEventID, false)
	if hasClientID && clientID == "" {
		add(CodeFormat, "client_event_id", "client_event_id is empty")
	}
	str("anonymous_id", env.anonymousID, MaxIdentity, false)
	str("user_id", env.userID, MaxIdentity, false)
	if env.anonymousID == nil && env.userID == nil {
		add(CodeRequired, "anonymous_id", "an event needs an identity: anonymous_id or user_id")
	}
	session, hasSession := str("session_id", env.sessionID, MaxIdentity, false)
	if !env.seen["properties"] {
		add(CodeRequired, "properties", "properties is required")
	}
	if !env.seen["meta"] {
		add(CodeRequired, "meta", "meta is required")
	}
	find := func(ms []member, key string) []byte {
		for _, m := range ms {
			if m.key == key {
				return m.text
			}
		}
		return nil
	}
	seq := find(env.props, "seq")
	adapter := find(env.props, "adapter")
	role := find(env.props, "role")
	contextText := find(env.props, "context_id")
	if env.seen["properties"] {
		if seq == nil {
			add(CodeRequired, "properties.seq", "properties.seq is required (the event's seq)")
		}
		if adapter == nil {
			add(CodeRequired, "properties.adapter", "properties.adapter is required (the event's adapter)")
		}
	}
	var run string
	if env.seen["meta"] {
		if schema := find(env.meta, "trace_schema"); schema != nil && string(schema) != `"v1"` {
			add(CodeUnsupported, "meta.trace_schema", "meta.trace_schema %s is not one this server maps (v1)", clip(string(schema)))
		}
		var ok bool
		if run, ok = str("meta.run_id", find(env.meta, "run_id"), MaxRunID, true); ok && !runIDPattern.MatchString(run) {
			add(CodeFormat, "meta.run_id", "meta.run_id must be letters, digits, '_', '-' and '.' (not first): it names the run file")
			run = ""
		}
	}
	if hasSession && contextText != nil {
		var ctx string
		if json.Unmarshal(contextText, &ctx) == nil && ctx != session {
			add(CodeMismatch, "session_id", "session_id and properties.context_id name different operations")
		}
	}
	if len(issues) > 0 {
		return Event{}, issues
	}
	if contextText == nil && hasSession {
		contextText = env.sessionID
	}

	id := env.clientEventID
	if !hasClientID {
		// Derived from what the writer sends again on a retry: the event's
		// own text, compacted.
		var c bytes.Buffer
		_ = json.Compact(&c, raw)
		sum := sha256.Sum256(c.Bytes())
		id, _ = json.Marshal("cp-" + hex.EncodeToString(sum[:16]))
	}
	var line bytes.Buffer
	line.Grow(len(raw) + 64)
	line.WriteString(`{"event_id":`)
	line.Write(id)
	line.WriteString(`,"event_type":`)
	line.Write(env.eventType)
	line.WriteString(`,"occurred_at":`)
	line.Write(env.occurredAt)
	if contextText != nil {
		line.WriteString(`,"context_id":`)
		line.Write(contextText)
	}
	line.WriteString(`,"seq":`)
	line.Write(seq)
	line.WriteString(`,"adapter":`)
	line.Write(adapter)
	if role != nil {
		line.WriteString(`,"role":`)
		line.Write(role)
	}
	line.WriteString(`,"payload":{`)
	first := true
	for _, m := range env.props {
		switch m.key {
		case "seq", "adapter", "role", "context_id":
			continue
		}
		if !first {
			line.WriteByte(',')
		}
		first = false
		k, _ := json.Marshal(m.key)
		line.Write(k)
		line.WriteByte(':')
		line.Write(m.text)
	}
	line.WriteString("}}")
	ev, err := receipt.DecodeLine(line.Bytes())
	if err != nil {
		var le *receipt.LineError
		field := ""
		if errors.As(err, &le) {
			field = contractField(le.Rule)
		}
		return Event{}, []Issue{{Code: CodeFormat, Field: field, Message: "not an Event Contract event: " + err.Error()}}
	}
	return Event{Run: run, ID: ev.ID, Line: line.Bytes()}, nil
}

// contractField names the envelope member an Event Contract rule reads.
func contractField(rule string) string {
	switch rule {
	case receipt.RuleEventID:
		return "client_event_id"
	case receipt.RuleEventType, receipt.RuleOccurredAt:
		return rule
	case receipt.RuleSeq, receipt.RuleAdapter, receipt.RuleRole, receipt.RuleContextID:
		return "properties." + rule
	case receipt.RulePayload:
		return "properties"
	}
	return ""
}

// read takes one event object's members apart, refusing unknown and
// repeated members and nesting deeper than MaxDepth.
func (env *envelope) read(raw []byte) []Issue {
	if d, _ := nesting(raw); d > MaxDepth {
		return []Issue{{Code: CodeTooDeep, Message: fmt.Sprintf("the event nests deeper than %d levels", MaxDepth)}}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := expectDelim(dec, '{'); err != nil {
		return []Issue{{Code: CodeType, Message: "an event must be a JSON object"}}
	}
	env.seen = map[string]bool{}
	var issues []Issue
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return []Issue{{Code: CodeFormat, Message: "the event is not valid JSON"}}
		}
		key := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return []Issue{{Code: CodeFormat, Message: "the event is not valid JSON"}}
		}
		if env.seen[key] {
			issues = append(issues, Issue{Code: CodeDuplicateField, Field: clip(key), Message: fmt.Sprintf("%s is given twice", clip(key))})
			continue
		}
		env.seen[key] = true
		text := compact(val)
		switch key {
		case "event_type":
			env.eventType = text
		case "occurred_at":
			env.occurredAt = text
		case "client_event_id":
			env.clientEventID = text
		case "anonymous_id":
			env.anonymousID = text
		case "user_id":
			env.userID = text
		case "session_id":
			env.sessionID = text
		case "properties", "meta":
			ms, iss := members(key, text)
			issues = append(issues, iss...)
			if key == "properties" {
				env.props = ms
			} else {
				env.meta = ms
			}
		default:
			issues = append(issues, Issue{Code: CodeUnknownField, Field: clip(key),
				Message: fmt.Sprintf("%s is not a member of the ingest envelope (event_type, occurred_at, client_event_id, anonymous_id, user_id, session_id, properties, meta)", clip(key))})
		}
	}
	return issues
}

// members lists the members of the object text, in order.
func members(field string, text []byte) ([]member, []Issue) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	if err := expectDelim(dec, '{'); err != nil {
		return nil, []Issue{{Code: CodeType, Field: field, Message: field + " must be a JSON object"}}
	}
	ms := []member{}
	seen := map[string]bool{}
	var issues []Issue
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, []Issue{{Code: CodeFormat, Field: field, Message: field + " is not valid JSON"}}
		}
		key := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, []Issue{{Code: CodeFormat, Field: field, Message: field + " is not valid JSON"}}
		}
		if seen[key] {
			issues = append(issues, Issue{Code: CodeDuplicateField, Field: field + "." + clip(key), Message: fmt.Sprintf("%s.%s is given twice", field, clip(key))})
			continue
		}
		seen[key] = true
		ms = append(ms, member{key: key, text: val})
	}
	return ms, issues
}

func compact(b []byte) []byte {
	var c bytes.Buffer
	if json.Compact(&c, b) != nil {
		return b
	}
	return c.Bytes()
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("found %s where %q was expected", describe(tok), string(want))
	}
	return nil
}

func describe(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return fmt.Sprintf("%q", tok)
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a value"
}

// nesting is the deepest nesting of arrays and objects in a JSON text,
// and the byte where it first goes deepest, counted without decoding.
func nesting(b []byte) (depth, at int) {
	d := 0
	in, esc := false, false
	for i, c := range b {
		if in {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				in = false
			}
			continue
		}
		switch c {
		case '"':
			in = true
		case '{', '[':
			d++
			if d > depth {
				depth, at = d, i
			}
		case '}', ']':
			d--
		}
	}
	return depth, at
}

// jsLen is a string's length as JavaScript counts it (UTF-16 code units),
// which is how the ingest API's bounds are written.
func jsLen(s string) int {
	n := 0
	for _, r := range s {
		n += max(1, utf16.RuneLen(r))
	}
	return n
}

func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// clip shortens a name a client sent for a message.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
