package reviewlog

import (
	"strings"
	"testing"
)

func TestReleasedRecord(t *testing.T) {
	good := `{"type":"released","at":"2026-12-01T10:00:00.000Z","release":{"receipt_id":"rcpt_1","caller":"agent","outcome":"upstream_tool_error","outcome_receipt":"rcpt_2","mac":"` + strings.Repeat("ab", 32) + `"}}`
	rec, err := decodeRecord([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	st := newState()
	st.apply(rec, 7)
	if got := st.releases["rcpt_1"]; len(got) != 1 || got[0] != 7 {
		t.Fatalf("folded releases %v", st.releases)
	}
	for name, bad := range map[string]string{
		"no mac":              strings.Replace(good, `,"mac":"`+strings.Repeat("ab", 32)+`"`, ``, 1),
		"no receipt":          strings.Replace(good, `"receipt_id":"rcpt_1",`, ``, 1),
		"no outcome receipt":  strings.Replace(good, `"outcome_receipt":"rcpt_2",`, ``, 1),
		"no caller":           strings.Replace(good, `"caller":"agent",`, ``, 1),
		"question fields":     strings.Replace(good, `"at":`, `"counterparty":"x","at":`, 1),
		"unknown field":       strings.Replace(good, `"caller":"agent"`, `"caller":"agent","extra":1`, 1),
		"no release":          `{"type":"released","at":"2026-12-01T10:00:00.000Z"}`,
		"on a reserved line":  strings.Replace(good, `"type":"released"`, `"type":"reserved"`, 1),
		"on an opened record": `{"type":"opened","review_id":"1b4e28ba-2fa1-4d2c-883f-0016d3cca427","at":"2026-12-01T10:00:00.000Z","counterparty":"a","amount":"1","release":{}}`,
		"long field":          strings.Replace(good, `"outcome":"upstream_tool_error"`, `"outcome":"`+strings.Repeat("x", maxFieldBytes+1)+`"`, 1),
	} {
		if _, err := decodeRecord([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A receipt keeps at most a few releases, however many lines name it.
	for i := range 10 {
		st.apply(rec, int64(100+i))
	}
	if n := len(st.releases["rcpt_1"]); n != maxReleasesPerReceipt {
		t.Fatalf("%d releases kept for one receipt", n)
	}
}
