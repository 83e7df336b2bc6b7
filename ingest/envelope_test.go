package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// wire builds one envelope the way the recorder's Control Plane writer
// maps a TraceEvent line (toIngestEvent): properties are the payload with
// seq, adapter, role and context_id spread after it.
func wire(t testing.TB, line string, run string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	var ev map[string]json.RawMessage
	if err := dec.Decode(&ev); err != nil {
		t.Fatal(err)
	}
	// The payload's members in order.
	pdec := json.NewDecoder(bytes.NewReader(ev["payload"]))
	pdec.UseNumber()
	var props []string
	if _, err := pdec.Token(); err != nil {
		t.Fatal(err)
	}
	for pdec.More() {
		k, _ := pdec.Token()
		var v json.RawMessage
		if err := pdec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		kb, _ := json.Marshal(k)
		props = append(props, string(kb)+":"+string(v))
	}
	props = append(props, `"seq":`+string(ev["seq"]), `"adapter":`+string(ev["adapter"]))
	if r, ok := ev["role"]; ok {
		props = append(props, `"role":`+string(r))
	}
	session := ""
	if c, ok := ev["context_id"]; ok {
		props = append(props, `"context_id":`+string(c))
		session = `,"session_id":` + string(c)
	}
	meta := `{"source":"haia-trace","trace_schema":"v1"`
	if run != "" {
		meta += `,"run_id":"` + run + `"`
	}
	meta += "}"
	return `{"event_type":` + string(ev["event_type"]) + `,"occurred_at":` + string(ev["occurred_at"]) +
		`,"client_event_id":` + string(ev["event_id"]) + `,"anonymous_id":"agent-1"` + session +
		`,"properties":{` + strings.Join(props, ",") + `},"meta":` + meta + `}`
}

const lineFull = `{"event_id":"9b2f3c1e-1111-4a2b-8c3d-000000000001","event_type":"x402.payment.submitted","occurred_at":"2026-12-05T17:00:00.123Z","context_id":"req-1","seq":3,"adapter":"trace-x402","role":"client","payload":{"requirements":{"pay_to":"0xabc","amount":"250000","asset":"0xusdc","network":"eip155:8453"},"resource":{"url":"https://seller.example/api"},"note":"<b>&\u2028 é","n":1.5e300}}`
const lineBare = `{"event_id":"e2","event_type":"chain.tx.confirmed","occurred_at":"2026-12-05T17:00:01.000Z","seq":0,"adapter":"trace-chain","payload":{}}`

// TestMapEventGivesTheRecorderLineBack: an envelope made by the writer's
// mapping comes back as the very line the recorder's file sink wrote.
func TestMapEventGivesTheRecorderLineBack(t *testing.T) {
	for _, line := range []string{lineFull, lineBare} {
		ev, issues := MapEvent([]byte(wire(t, line, "1721709600000")))
		if len(issues) > 0 {
			t.Fatalf("issues: %+v", issues)
		}
		if string(ev.Line) != line {
			t.Errorf("line:\n got %s\nwant %s", ev.Line, line)
		}
		if ev.Run != "1721709600000" {
			t.Errorf("run %q", ev.Run)
		}
	}
}

// TestMapEventWithoutClientEventID: an id the writer left off (over 128
// characters) is derived from the event, the same on every retry.
func TestMapEventWithoutClientEventID(t *testing.T) {
	w := strings.Replace(wire(t, lineBare, "r1"), `"client_event_id":"e2",`, "", 1)
	a, issues := MapEvent([]byte(w))
	if len(issues) > 0 {
		t.Fatal(issues)
	}
	b, _ := MapEvent([]byte(w))
	if a.ID == "" || a.ID != b.ID || !strings.HasPrefix(a.ID, "cp-") {
		t.Fatalf("derived ids %q, %q", a.ID, b.ID)
	}
}

// TestMapEventSessionOnly: a context_id only in session_id still groups
// the event.
func TestMapEventSessionOnly(t *testing.T) {
	w := `{"event_type":"a.b.c","occurred_at":"2026-12-05T17:00:01.000Z","client_event_id":"x","user_id":"u","session_id":"op-9","properties":{"seq":1,"adapter":"a"},"meta":{"run_id":"r"}}`
	ev, issues := MapEvent([]byte(w))
	if len(issues) > 0 {
		t.Fatal(issues)
	}
	want := `{"event_id":"x","event_type":"a.b.c","occurred_at":"2026-12-05T17:00:01.000Z","context_id":"op-9","seq":1,"adapter":"a","payload":{}}`
	if string(ev.Line) != want {
		t.Fatalf("got %s", ev.Line)
	}
}

func TestMapEventRejects(t *testing.T) {
	good := wire(t, lineFull, "r1")
	deep := strings.Repeat(`{"a":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth)
	for _, c := range []struct {
		name, event, code, field string
	}{
		{"unknown key", strings.Replace(good, `"anonymous_id"`, `"extra":1,"anonymous_id"`, 1), CodeUnknownField, "extra"},
		{"repeated key", strings.Replace(good, `"anonymous_id":"agent-1"`, `"anonymous_id":"agent-1","anonymous_id":"agent-2"`, 1), CodeDuplicateField, "anonymous_id"},
		{"repeated property", strings.Replace(good, `"seq":3`, `"seq":3,"seq":4`, 1), CodeDuplicateField, "properties.seq"},
		{"not an object", `[1,2]`, CodeType, ""},
		{"no event_type", strings.Replace(good, `"event_type":"x402.payment.submitted",`, "", 1), CodeRequired, "event_type"},
		{"event_type pattern", strings.Replace(good, `x402.payment.submitted`, `x402/payment`, 1), CodeFormat, "event_type"},
		{"event_type long", strings.Replace(good, `x402.payment.submitted`, strings.Repeat("a", 129), 1), CodeTooLong, "event_type"},
		{"event_type number", strings.Replace(good, `"x402.payment.submitted"`, `7`, 1), CodeType, "event_type"},
		{"no identity", strings.Replace(good, `"anonymous_id":"agent-1",`, "", 1), CodeRequired, "anonymous_id"},
		{"identity long", strings.Replace(good, `"agent-1"`, `"`+strings.Repeat("é", 257)+`"`, 1), CodeTooLong, "anonymous_id"},
		{"client id long", strings.Replace(good, `9b2f3c1e-1111-4a2b-8c3d-000000000001`, strings.Repeat("x", 129), 1), CodeTooLong, "client_event_id"},
		{"no run", strings.Replace(good, `,"run_id":"r1"`, "", 1), CodeRequired, "meta.run_id"},
		{"run path", strings.Replace(good, `"run_id":"r1"`, `"run_id":"../x"`, 1), CodeFormat, "meta.run_id"},
		{"run dot", strings.Replace(good, `"run_id":"r1"`, `"run_id":".hidden"`, 1), CodeFormat, "meta.run_id"},
		{"schema", strings.Replace(good, `"trace_schema":"v1"`, `"trace_schema":"v2"`, 1), CodeUnsupported, "meta.trace_schema"},
		{"no properties", strings.Replace(good, `"properties":`, `"x":`, 1), CodeUnknownField, "x"},
		{"properties array", strings.Replace(good, `"properties":{`, `"properties":[{`, 1)[:0] + `{"event_type":"a","occurred_at":"2026-12-05T17:00:01.000Z","anonymous_id":"a","properties":[],"meta":{"run_id":"r"}}`, CodeType, "properties"},
		{"no seq", strings.Replace(good, `"seq":3,`, "", 1), CodeRequired, "properties.seq"},
		{"no adapter", strings.Replace(good, `"adapter":"trace-x402",`, "", 1), CodeRequired, "properties.adapter"},
		{"negative seq", strings.Replace(good, `"seq":3`, `"seq":-1`, 1), CodeFormat, "properties.seq"},
		{"bad time", strings.Replace(good, `2026-12-05T17:00:00.123Z`, `2026-02-30T17:00:00.123Z`, 1), CodeFormat, "occurred_at"},
		{"session mismatch", strings.Replace(good, `"session_id":"req-1"`, `"session_id":"req-2"`, 1), CodeMismatch, "session_id"},
		{"role null", strings.Replace(good, `"role":"client"`, `"role":null`, 1), CodeFormat, "properties.role"},
		{"too deep", strings.Replace(good, `"note":`, `"deep":`+deep+`,"note":`, 1), CodeTooDeep, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, issues := MapEvent([]byte(c.event))
			for _, is := range issues {
				if is.Code == c.code && is.Field == c.field {
					if is.Message == "" {
						t.Error("an issue without a message")
					}
					return
				}
			}
			t.Fatalf("want %s on %q, got %+v", c.code, c.field, issues)
		})
	}
}

func TestParseBatch(t *testing.T) {
	good := wire(t, lineFull, "r1")
	bad := strings.Replace(good, `"anonymous_id"`, `"extra":1,"anonymous_id"`, 1)
	events, rej, err := ParseBatch([]byte(`{"events":[` + good + "," + bad + "," + wire(t, lineBare, "r2") + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 || events[0].Index != 0 || events[1].Index != 2 || events[1].Run != "r2" {
		t.Fatalf("events %+v", events)
	}
	if len(rej) != 1 || rej[0].Index != 1 || rej[0].Issues[0].Code != CodeUnknownField {
		t.Fatalf("rejections %+v", rej)
	}

	many := "[" + strings.TrimSuffix(strings.Repeat(good+",", MaxBatch+1), ",") + "]"
	for _, c := range []struct{ name, body, want string }{
		{"not json", `{"events":[`, "not valid JSON"},
		{"array", `[]`, "must be a JSON object"},
		{"unknown member", `{"events":[],"extra":1}`, `unknown member "extra"`},
		{"no events", `{}`, `no "events"`},
		{"events twice", `{"events":[],"events":[]}`, "twice"},
		{"events object", `{"events":{}}`, "must be an array"},
		{"trailing", `{"events":[]} {}`, "text after"},
		{"too many", `{"events":` + many + `}`, "more than 500 events"},
		{"utf8", "{\"events\":[\"\xff\"]}", "not valid UTF-8 (at byte 12)"},
		{"deep", `{"events":[` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `]}`, "nests deeper than 66 levels"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := ParseBatch([]byte(c.body))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
	// Exactly 500 is a batch.
	events, _, err = ParseBatch([]byte(`{"events":[` + strings.TrimSuffix(strings.Repeat(good+",", MaxBatch), ",") + `]}`))
	if err != nil || len(events) != MaxBatch {
		t.Fatalf("500 events: %d, %v", len(events), err)
	}
}

// FuzzParseBatch: whatever the body, ParseBatch does not panic; every
// event it maps is a line the Trace reader accepts, in a run that names a
// file, and every event of the batch is either mapped or rejected, once.
func FuzzParseBatch(f *testing.F) {
	f.Add([]byte(`{"events":[` + wire(f, lineFull, "r1") + `]}`))
	f.Add([]byte(`{"events":[` + wire(f, lineBare, "r2") + `,{}]}`))
	f.Add([]byte(`{"events":[{"event_type":"a","occurred_at":"2026-12-05T17:00:01.000Z","user_id":"u","session_id":"s","properties":{"seq":1.0,"adapter":"a","role":"x","context_id":"s"},"meta":{"run_id":"r"}}]}`))
	f.Add([]byte(`{"events":[{"properties":{"seq":1,"seq":2}}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		events, rej, err := ParseBatch(body)
		if err != nil {
			if events != nil || rej != nil {
				t.Fatal("a refused batch with events")
			}
			return
		}
		seen := map[int]bool{}
		for _, ev := range events {
			if seen[ev.Index] {
				t.Fatalf("index %d twice", ev.Index)
			}
			seen[ev.Index] = true
			got, err := receipt.DecodeLine(ev.Line)
			if err != nil {
				t.Fatalf("mapped line %s: %v", ev.Line, err)
			}
			if got.ID != ev.ID || !runIDPattern.MatchString(ev.Run) || len(ev.Run) > MaxRunID {
				t.Fatalf("event %+v", ev)
			}
			if bytes.Contains(ev.Line, []byte("\n")) {
				t.Fatal("a line end inside a line")
			}
		}
		for _, r := range rej {
			if seen[r.Index] || len(r.Issues) == 0 {
				t.Fatalf("rejection %+v", r)
			}
			seen[r.Index] = true
		}
		for i := range len(seen) {
			if !seen[i] {
				t.Fatal(fmt.Sprint("event ", i, " neither mapped nor rejected"))
			}
		}
	})
}
