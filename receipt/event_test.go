package receipt

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
	"unicode/utf8"
)

const goodLine = `{"event_id":"e1","event_type":"x402.payment.required","occurred_at":"2026-07-24T09:00:00.120Z","seq":3,"adapter":"trace-x402","role":"client","context_id":"op-1","payload":{"a":1},"extra":[1]}`

// withField replaces (or with del, removes) one top-level member of goodLine.
func withField(key, raw string) string {
	parts := map[string]string{
		"event_id": `"e1"`, "event_type": `"x402.payment.required"`, "occurred_at": `"2026-07-24T09:00:00.120Z"`,
		"seq": `3`, "adapter": `"trace-x402"`, "role": `"client"`, "context_id": `"op-1"`, "payload": `{"a":1}`,
	}
	order := []string{"event_id", "event_type", "occurred_at", "seq", "adapter", "role", "context_id", "payload"}
	var b strings.Builder
	b.WriteString("{")
	first := true
	for _, k := range order {
		v := parts[k]
		if k == key {
			v = raw
		}
		if v == "" {
			continue
		}
		if !first {
			b.WriteString(",")
		}
		first = false
		b.WriteString(`"` + k + `":` + v)
	}
	b.WriteString("}")
	return b.String()
}

func TestDecodeLineAccepts(t *testing.T) {
	ev, err := DecodeLine([]byte(goodLine))
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID != "e1" || ev.Type != "x402.payment.required" || ev.Seq != 3 || ev.Adapter != "trace-x402" ||
		!ev.HasRole || ev.Role != "client" || ev.ContextID != "op-1" || ev.OccurredAt != "2026-07-24T09:00:00.120Z" {
		t.Errorf("decoded %+v", ev)
	}
	if p := ev.Payload(); p.Len() != 1 {
		t.Errorf("payload has %d members", p.Len())
	}
	for _, line := range []string{
		withField("seq", "3.0"), withField("seq", "0"), withField("seq", "-0"), withField("seq", "1e3"),
		withField("role", ""), withField("context_id", ""), withField("context_id", `""`), withField("role", `""`),
		withField("occurred_at", `"2024-02-29T23:59:59.999Z"`), withField("payload", "{}"),
	} {
		if _, err := DecodeLine([]byte(line)); err != nil {
			t.Errorf("refused %s: %v", line, err)
		}
	}
}

func TestDecodeLineRules(t *testing.T) {
	cases := []struct {
		name, line, rule, msg string
	}{
		{"bom", "\xef\xbb\xbf" + goodLine, RuleUTF8, "byte order mark"},
		{"invalid utf8", strings.Replace(goodLine, "e1", "e\xff", 1), RuleUTF8, "invalid UTF-8 at byte 14"},
		{"invalid utf8 after an escape", strings.Replace(goodLine, "e1", "e\\n\xc3(", 1), RuleUTF8, "invalid UTF-8 at byte 16"},
		{"invalid utf8 outside strings", strings.Replace(goodLine, "{", "{\xa0", 1), RuleUTF8, "invalid UTF-8 at byte 1"},
		{"invalid utf8 in a line that is not json either", "{\"a\":\"\xe2\x82\",", RuleUTF8, "invalid UTF-8 at byte 6"},
		{"not json", `{"event_id":`, RuleJSON, "invalid JSON at byte 12"},
		{"not an object", `[1]`, RuleObject, "got array"},
		{"event_id missing", withField("event_id", ""), RuleEventID, "missing"},
		{"event_id empty", withField("event_id", `""`), RuleEventID, "non-empty"},
		{"event_id number", withField("event_id", `7`), RuleEventID, "got number"},
		{"event_type missing", withField("event_type", ""), RuleEventType, "missing"},
		{"event_type empty", withField("event_type", `""`), RuleEventType, "non-empty"},
		{"adapter missing", withField("adapter", ""), RuleAdapter, "missing"},
		{"adapter null", withField("adapter", "null"), RuleAdapter, "got null"},
		{"occurred_at missing", withField("occurred_at", ""), RuleOccurredAt, "missing"},
		{"occurred_at number", withField("occurred_at", "1"), RuleOccurredAt, "must be a string"},
		{"occurred_at no millis", withField("occurred_at", `"2026-07-24T09:00:00Z"`), RuleOccurredAt, "not canonical"},
		{"occurred_at offset", withField("occurred_at", `"2026-07-24T09:00:00.120+00:00"`), RuleOccurredAt, "not canonical"},
		{"occurred_at lower z", withField("occurred_at", `"2026-07-24t09:00:00.120z"`), RuleOccurredAt, "not canonical"},
		{"occurred_at feb 30", withField("occurred_at", `"2026-02-30T09:00:00.120Z"`), RuleOccurredAt, "not a real instant"},
		{"occurred_at hour 24", withField("occurred_at", `"2026-02-03T24:00:00.000Z"`), RuleOccurredAt, "not a real instant"},
		{"occurred_at leap second", withField("occurred_at", `"2026-06-30T23:59:60.000Z"`), RuleOccurredAt, "not a real instant"},
		{"seq missing", withField("seq", ""), RuleSeq, "missing"},
		{"seq string", withField("seq", `"3"`), RuleSeq, "must be a number"},
		{"seq negative", withField("seq", `-1`), RuleSeq, "non-negative integer, got -1"},
		{"seq fraction", withField("seq", `1.5`), RuleSeq, "got 1.5"},
		{"seq overflow", withField("seq", `1e400`), RuleSeq, "non-negative integer"},
		{"role number", withField("role", `1`), RuleRole, "must be a string when present"},
		{"role null", withField("role", `null`), RuleRole, "got null"},
		{"context_id number", withField("context_id", `1`), RuleContextID, "must be a string when present"},
		{"payload missing", withField("payload", ""), RulePayload, "missing"},
		{"payload array", withField("payload", "[]"), RulePayload, "got array"},
		{"payload null", withField("payload", "null"), RulePayload, "got null"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeLine([]byte(c.line))
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("DecodeLine(%s) = %v, want a LineError", c.line, err)
			}
			if le.Rule != c.rule || !strings.Contains(err.Error(), c.msg) || !strings.HasPrefix(err.Error(), c.rule+": ") {
				t.Errorf("error %q (rule %s), want rule %s mentioning %q", err, le.Rule, c.rule, c.msg)
			}
		})
	}
}

func TestDecodeLineKeepsRawAndLastValue(t *testing.T) {
	// A repeated member keeps its first position and its last value, so the
	// envelope is checked against what JSON.parse would hold.
	line := strings.Replace(goodLine, `"extra":[1]`, `"extra":[1],"event_id":"e2"`, 1)
	ev, err := DecodeLine([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID != "e2" {
		t.Errorf("ID = %q, want the last value", ev.ID)
	}
	if m := ev.Raw.Members(); m[0].Key != "event_id" || m[len(m)-1].Key != "extra" {
		t.Errorf("member order %v", m)
	}
}

func collect(t *testing.T, text string, lim Limits) ([]Event, int64, int, error) {
	t.Helper()
	var evs []Event
	n, next, err := ReadEvents(strings.NewReader(text), 1, lim, func(e Event) error {
		evs = append(evs, e)
		return nil
	})
	// ScanEvents must agree, reading byte by byte or all at once.
	for _, r := range []io.Reader{strings.NewReader(text), iotest.OneByteReader(strings.NewReader(text))} {
		var ids []string
		sn, snext, serr := ScanEvents(r, 1, lim, func(e Event) error {
			ids = append(ids, e.ID+"@"+strconv.Itoa(e.Line))
			return nil
		})
		var want []string
		for _, e := range evs {
			want = append(want, e.ID+"@"+strconv.Itoa(e.Line))
		}
		var le, sle *LineError
		errors.As(err, &le)
		errors.As(serr, &sle)
		sameErr := (err == nil) == (serr == nil) && (le == nil) == (sle == nil) && (le == nil || (le.Rule == sle.Rule && le.Line == sle.Line))
		if sn != n || snext != next || !sameErr || (err == nil && strings.Join(ids, ",") != strings.Join(want, ",")) {
			t.Errorf("ScanEvents: %v consumed %d next %d err %v; ReadEvents: %v %d %d %v", ids, sn, snext, serr, want, n, next, err)
		}
	}
	checkBorrowed(t, text, lim, evs, n, next, err)
	return evs, n, next, err
}

// checkBorrowed checks that ScanEventsBorrowed reads what another reader
// read (evs, n, next, err), with a read buffer of its own and with one full of
// another read's bytes, reading byte by byte or all at once. fn copies what
// it keeps, as the contract asks.
func checkBorrowed(t *testing.T, text string, lim Limits, evs []Event, n int64, next int, err error) {
	t.Helper()
	describe := func(e Event) string {
		return strings.Join([]string{e.ID, e.Type, e.OccurredAt, e.Adapter, e.Role, e.ContextID, strconv.Itoa(e.Line)}, "|")
	}
	var want []string
	for _, e := range evs {
		want = append(want, describe(e))
	}
	dirty := bytes.Repeat([]byte("\n{\"x\""), 1<<19)[:0]
	for _, buf := range [][]byte{nil, dirty} {
		for _, r := range []io.Reader{strings.NewReader(text), iotest.OneByteReader(strings.NewReader(text))} {
			var got []string
			bn, bnext, kept, berr := ScanEventsBorrowed(r, 1, lim, buf, func(e Event, _ int64) error {
				got = append(got, strings.Clone(describe(e)))
				return nil
			})
			var le, ble *LineError
			errors.As(err, &le)
			errors.As(berr, &ble)
			sameErr := (err == nil) == (berr == nil) && (le == nil) == (ble == nil) && (le == nil || (le.Rule == ble.Rule && le.Line == ble.Line))
			if bn != n || bnext != next || !sameErr || (err == nil && !slices.Equal(got, want)) {
				t.Errorf("ScanEventsBorrowed: %q consumed %d next %d err %v; want %q %d %d %v", got, bn, bnext, berr, want, n, next, err)
			}
			if (berr == nil) != (kept != nil) {
				t.Errorf("ScanEventsBorrowed gave back buffer %v after error %v", kept != nil, berr)
			}
		}
	}
}

func TestReadEvents(t *testing.T) {
	l1 := withField("event_id", `"a"`)
	l2 := withField("event_id", `"b"`)
	cases := []struct {
		name     string
		text     string
		ids      string
		lines    string
		consumed int
		next     int
	}{
		{"empty", "", "", "", 0, 1},
		{"clean", l1 + "\n" + l2 + "\n", "a,b", "1,2", len(l1) + len(l2) + 2, 3},
		{"torn tail dropped", l1 + "\n" + l2[:20], "a", "1", len(l1) + 1, 2},
		{"unterminated complete line is a torn tail", l1 + "\n" + l2, "a", "1", len(l1) + 1, 2},
		{"blank lines skipped but counted", "\n  \t\r\n" + l1 + "\n\u00a0\ufeff\u2028\n" + l2 + "\n", "a,b", "3,5", len(l1) + len(l2) + 2 + 1 + 5 + 9, 6},
		{"crlf", l1 + "\r\n" + l2 + "\r\n", "a,b", "1,2", len(l1) + len(l2) + 4, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			evs, n, next, err := collect(t, c.text, DefaultLimits())
			if err != nil {
				t.Fatal(err)
			}
			var ids, lines []string
			for _, e := range evs {
				ids = append(ids, e.ID)
				lines = append(lines, strings.TrimSpace(strings.Repeat(" ", 0)+itoa(e.Line)))
			}
			if strings.Join(ids, ",") != c.ids || strings.Join(lines, ",") != c.lines || n != int64(c.consumed) || next != c.next {
				t.Errorf("ids %v lines %v consumed %d next %d; want %s / %s / %d / %d", ids, lines, n, next, c.ids, c.lines, c.consumed, c.next)
			}
		})
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func TestReadEventsResumes(t *testing.T) {
	l1, l2 := withField("event_id", `"a"`), withField("event_id", `"b"`)
	text := "\n" + l1 + "\n" + l2[:30]
	_, n, next, err := collect(t, text, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	grown := text + l2[30:] + "\n"
	var got []Event
	n2, next2, err := ReadEvents(strings.NewReader(grown[n:]), next, DefaultLimits(), func(e Event) error {
		got = append(got, e)
		return nil
	})
	if err != nil || len(got) != 1 || got[0].ID != "b" || got[0].Line != 3 || next2 != 4 || n+n2 != int64(len(grown)) {
		t.Errorf("resume: %v %d events, line %v, next %d, consumed %d of %d", err, len(got), got, next2, n+n2, len(grown))
	}
}

func TestReadEventsErrors(t *testing.T) {
	l1 := withField("event_id", `"a"`)
	long := withField("payload", `{"pad":"`+strings.Repeat("x", 200)+`"}`)
	cases := []struct {
		name, text string
		lim        Limits
		rule       string
		line       int
		msg        string
	}{
		{"bad line names its number", l1 + "\n\n" + withField("seq", "-2") + "\n", DefaultLimits(), RuleSeq, 3, "line 3: seq: must be a non-negative integer, got -2"},
		{"not json", l1 + "\nnope\n", DefaultLimits(), RuleJSON, 2, "line 2: json: invalid JSON at byte 0"},
		{"line limit", long + "\n", Limits{MaxLineBytes: 100, MaxRunBytes: 1 << 20}, RuleLineSize, 1, "over the 100 bytes line limit"},
		{"line limit beyond the read buffer", withField("payload", `{"pad":"`+strings.Repeat("x", 200<<10)+`"}`) + "\n", Limits{MaxLineBytes: 100 << 10, MaxRunBytes: 1 << 30}, RuleLineSize, 1, "longer than the 100 KiB"},
		{"run limit", l1 + "\n" + l1 + "\n", Limits{MaxLineBytes: 1 << 20, MaxRunBytes: int64(len(l1)) + 5}, RuleRunSize, 2, "larger than the"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, _, err := collect(t, c.text, c.lim)
			var le *LineError
			if !errors.As(err, &le) || le.Rule != c.rule || le.Line != c.line {
				t.Fatalf("err = %v, want rule %s on line %d", err, c.rule, c.line)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("err = %q, want it to contain %q", err, c.msg)
			}
		})
	}
	// An I/O error is reported, wrapped.
	boom := errors.New("disk on fire")
	_, _, err := ReadEvents(iotest.ErrReader(boom), 1, DefaultLimits(), func(Event) error { return nil })
	if !errors.Is(err, boom) {
		t.Errorf("I/O error = %v", err)
	}
	// fn's error stops the read.
	stop := errors.New("stop")
	_, _, err = ReadEvents(strings.NewReader(l1+"\n"+l1+"\n"), 1, DefaultLimits(), func(Event) error { return stop })
	if !errors.Is(err, stop) {
		t.Errorf("fn error = %v", err)
	}
}

// runReaders are the two ways a whole run file is read: into the heap, and
// held outside it (the build command's).
var runReaders = []struct {
	name string
	read func(path string, lim Limits) (string, []Event, error)
}{
	{"ReadRunFile", ReadRunFile},
	{"ReadRunFileHeld", func(path string, lim Limits) (string, []Event, error) {
		id, evs, _, err := ReadRunFileHeld(path, lim) // never released: the test reads the events after
		return id, evs, err
	}},
}

func TestReadRunFile(t *testing.T) {
	for _, r := range runReaders {
		t.Run(r.name, func(t *testing.T) { testReadRunFile(t, r.read) })
	}
}

func testReadRunFile(t *testing.T, readRunFile func(string, Limits) (string, []Event, error)) {
	dir := t.TempDir()
	good := filepath.Join(dir, "1721709600000.ndjson")
	if err := os.WriteFile(good, []byte(goodLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id, evs, err := readRunFile(good, DefaultLimits())
	if err != nil || id != "1721709600000" || len(evs) != 1 || evs[0].Line != 1 {
		t.Fatalf("ReadRunFile = %q %d %v", id, len(evs), err)
	}
	bad := filepath.Join(dir, "r2.ndjson")
	if err := os.WriteFile(bad, []byte(goodLine+"\n"+withField("payload", "7")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = readRunFile(bad, DefaultLimits())
	if err == nil || err.Error() != "run r2, line 2: payload: must be an object, got number" {
		t.Errorf("error = %v", err)
	}
	_, _, err = readRunFile(filepath.Join(dir, "absent.ndjson"), DefaultLimits())
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent file: %v", err)
	}
	_, _, err = readRunFile(dir, DefaultLimits())
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	empty := filepath.Join(dir, "r3.ndjson")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, evs, err := readRunFile(empty, DefaultLimits()); err != nil || len(evs) != 0 {
		t.Errorf("empty file: %d events, %v", len(evs), err)
	}
	// A torn last line is not read; a file over the limit is refused.
	torn := filepath.Join(dir, "r4.ndjson")
	if err := os.WriteFile(torn, []byte(goodLine+"\n"+goodLine[:20]), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, evs, err := readRunFile(torn, DefaultLimits()); err != nil || len(evs) != 1 {
		t.Errorf("torn tail: %d events, %v", len(evs), err)
	}
	_, _, err = readRunFile(torn, Limits{MaxLineBytes: 4 << 20, MaxRunBytes: 64})
	if le := (*LineError)(nil); !errors.As(err, &le) || le.Rule != RuleRunSize {
		t.Errorf("over the limit: %v", err)
	}
	// A run of several read chunks (read in parallel), a torn tail after.
	big := filepath.Join(dir, "r5.ndjson")
	n := 5*readChunk/2/(len(goodLine)+1) + 1
	text := strings.Repeat(goodLine+"\n", n) + goodLine[:30]
	if err := os.WriteFile(big, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, evs, err := readRunFile(big, DefaultLimits()); err != nil || len(evs) != n || evs[n-1].Line != n || evs[n-1].ID == "" || evs[n-1].ID != evs[0].ID {
		t.Errorf("a run of several chunks: %d events (want %d), %v", len(evs), n, err)
	}
}

func TestRunIDFromFileName(t *testing.T) {
	for name, want := range map[string]string{"abc.ndjson": "abc", "1.2.ndjson": "1.2", ".ndjson": "", "abc.json": "", "abc.ndjson.bak": ""} {
		got, ok := RunIDFromFileName(name)
		if got != want || ok != (want != "") {
			t.Errorf("RunIDFromFileName(%q) = %q %v", name, got, ok)
		}
	}
}

func FuzzDecodeLine(f *testing.F) {
	f.Add([]byte(goodLine))
	f.Add([]byte(withField("seq", "3.0")))
	f.Add([]byte(withField("occurred_at", `"2026-02-30T09:00:00.120Z"`)))
	f.Add([]byte("\xef\xbb\xbf{}"))
	f.Add([]byte(`{"event_id":"\ud800","event_type":"t","occurred_at":"2026-07-24T09:00:00.120Z","seq":1e2,"adapter":"a","payload":{"1":2,"0":1}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := DecodeLine(line)
		// The scratch and text-only decoders (index and build) agree with it.
		var dec jsjson.Decoder
		sev, serr := decodeLineScratch(&dec, string(line))
		var scratchOut string
		if serr == nil {
			scratchOut = string(jsjson.AppendIndent(nil, sev.Raw, "", "  ")) // before dec is used again
		}
		text := string(line)
		tev, terr := decodeLineText(&dec, jsjson.NewLines(text), text, 0)
		if fmt.Sprint(err) != fmt.Sprint(serr) || fmt.Sprint(err) != fmt.Sprint(terr) {
			t.Fatalf("decoders disagree: %v / %v / %v", err, serr, terr)
		}
		if err == nil {
			want := string(jsjson.AppendIndent(nil, ev.Raw, "", "  "))
			if scratchOut != want {
				t.Fatalf("scratch event prints %q, want %q", scratchOut, want)
			}
			if got := string(jsjson.AppendIndent(nil, tev.Raw, "", "  ")); got != want {
				t.Fatalf("text-only event prints %q, want %q", got, want)
			}
		}
		if err != nil {
			var le *LineError
			if !errors.As(err, &le) || le.Rule == "" {
				t.Fatalf("error without a rule: %v", err)
			}
			if !utf8.Valid(line) && le.Rule != RuleUTF8 {
				t.Fatalf("invalid UTF-8 reported as rule %s: %v", le.Rule, err)
			}
			return
		}
		if ev.ID == "" || ev.Type == "" || ev.Adapter == "" || ev.Seq < 0 || len(ev.OccurredAt) != 24 || ev.Payload().Len() < 0 {
			t.Fatalf("accepted a broken envelope: %+v", ev)
		}
	})
}

// realInstant must accept exactly what time.Parse accepts for the layout.
func TestRealInstantAgreesWithTimeParse(t *testing.T) {
	const layout = "2006-01-02T15:04:05.000Z"
	check := func(s string) {
		_, err := time.Parse(layout, s)
		if got, want := realInstant(s), err == nil; got != want {
			t.Errorf("realInstant(%q) = %v, time.Parse accepts it: %v", s, got, want)
		}
	}
	for _, year := range []int{0, 1, 4, 100, 400, 1900, 2000, 2023, 2024, 2100, 9999} {
		for month := 0; month <= 13; month++ {
			for day := 0; day <= 32; day++ {
				check(fmt.Sprintf("%04d-%02d-%02dT12:00:00.000Z", year, month, day))
			}
		}
	}
	for _, hms := range []string{"00:00:00", "23:59:59", "24:00:00", "23:60:00", "23:59:60", "99:99:99", "09:05:07"} {
		check("2026-07-24T" + hms + ".999Z")
	}
}

// FuzzScanEventsBorrowed reads arbitrary bytes with a reused, dirty read
// buffer and a small line limit (so lines straddle its refills), and checks
// it reads what ScanEventsAt reads (which, unlike ReadEvents, refuses a
// torn last line longer than the line limit).
func FuzzScanEventsBorrowed(f *testing.F) {
	f.Add(goodLine+"\n"+goodLine+"\n", 1<<10)
	f.Add(goodLine+"\r\n\n  \n"+goodLine, 1<<10)
	f.Add(goodLine+"\n{\"bad\n", 64)
	f.Add(strings.Replace(goodLine, `"extra":[1]`, `"extra":"\\u00e9\\n"`, 1)+"\n", 300)
	f.Fuzz(func(t *testing.T, text string, maxLine int) {
		lim := Limits{MaxLineBytes: min(max(maxLine, 16), 1<<12), MaxRunBytes: 1 << 20}
		var evs []Event
		n, next, err := ScanEventsAt(strings.NewReader(text), 1, lim, func(e Event, _ int64) error {
			evs = append(evs, e)
			return nil
		})
		checkBorrowed(t, text, lim, evs, n, next, err)
	})
}
