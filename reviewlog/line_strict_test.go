package reviewlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const (
	strictOpened = `{"type":"opened","review_id":"` + idA + `","at":"2026-07-25T12:00:00.000Z","counterparty":"top.example.com","amount":"0.21","asset":"usdc",` +
		`"template":"x402-buyer","reasons":[{"rule":"review_above","detail":"d","evidence":[{"run_id":"run-1","operation_id":"op-1"}]}],"caller":"agent-1","params_hash":"hmac:1",` +
		`"terms":{"review_id":"` + idA + `","caller":"agent-1","tenant":"acme","counterparty":"terms.example.com","amount":"0.210","amount_atomic":"210000","asset":"usdc",` +
		`"resource":"https://terms.example.com/x","template":"x402-buyer","rules":["review_above"],"params_hash":"hmac:1"}}`
	strictUsed   = `{"type":"used","review_id":"` + idA + `","at":"2026-07-25T12:06:00.000Z","by":"agent-1"}`
	strictRepair = `{"type":"repair","at":"2026-07-25T12:06:00.000Z","lines":[2]}`
)

func strictAuthorized() string {
	return `{"type":"authorized","at":"2026-12-01T10:00:00.000Z","caller":"agent","authorization":{"decision_receipt":"rcpt_1","receipt":"rcpt_2",` +
		`"network":"eip155:8453","token":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","name":"USD Coin","version":"2",` +
		`"from":"0x2c7536E3605D9C16a7a3D7b1898e529396a65c23","to":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","value":"250000",` +
		`"valid_after":"1","valid_before":"2","nonce":"0x` + strings.Repeat("ab", 32) + `","signature":"0x` + strings.Repeat("cd", 65) + `","digest":"0x` + strings.Repeat("ef", 32) + `"}}`
}

// Every object the log reads is exact: a field named twice, or spelled in
// another case beside the exact name or instead of it, makes a line that
// readers could read two ways (encoding/json takes the last of them, any
// case; PostgreSQL's ->> and a JavaScript verifier the exact one). Such a
// line is no record; the log reports it as not exact (errNotExact).
func TestEveryObjectOfTheLogIsExact(t *testing.T) {
	targets := []struct{ object, line, member string }{
		{"record", strictOpened, `"counterparty":"top.example.com"`},
		{"record", strictOpened, `"amount":"0.21"`},
		{"record", decideA, `"status":"approved"`},
		{"record", strictUsed, `"by":"agent-1"`},
		{"record", strictRepair, `"lines":[2]`},
		{"terms", strictOpened, `"counterparty":"terms.example.com"`},
		{"terms", strictOpened, `"amount":"0.210"`},
		{"terms", strictOpened, `"tenant":"acme"`},
		{"terms", strictOpened, `"rules":["review_above"]`},
		{"reasons", strictOpened, `"rule":"review_above"`},
		{"evidence", strictOpened, `"run_id":"run-1"`},
		{"authorization", strictAuthorized(), `"value":"250000"`},
		{"authorization", strictAuthorized(), `"to":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C"`},
		{"reservation", reservedT, `"atomic":"100"`},
		{"reservation", reservedT, `"pay_to":"0xb0b"`},
		{"release", releasedT, `"outcome":"upstream_refused"`},
	}
	for _, tg := range targets {
		if !strings.Contains(tg.line, tg.member) {
			t.Fatalf("%s: %s is not in the line", tg.object, tg.member)
		}
		if _, err := decodeRecord([]byte(tg.line)); err != nil {
			t.Fatalf("%s: the exact line is refused: %v", tg.object, err)
		}
		name, value, _ := strings.Cut(tg.member, ":")
		other := `"` + strings.ToUpper(name[1:2]) + name[2:] // "amount" → "Amount"
		for trick, bad := range map[string]string{
			"repeated":                tg.member + "," + tg.member,
			"repeated, another value": tg.member + "," + name + `:"9999"`,
			"other case beside":       tg.member + "," + other + ":" + value,
			"other case before":       other + ":" + value + "," + tg.member,
			"other case alone":        other + ":" + value,
		} {
			line := strings.Replace(tg.line, tg.member, bad, 1)
			_, err := decodeRecord([]byte(line))
			if !errors.Is(err, errNotExact) {
				t.Errorf("%s %s, %s: %v, want a line that is not exact", tg.object, name, trick, err)
			}
			if h, ok := ParseLineHead([]byte(line)); ok {
				t.Errorf("%s %s, %s: a store would index it as %+v", tg.object, name, trick, h)
			}
		}
	}
	// A field of no known name inside an object is not a record either, but
	// it is not a second reading: it is reported as a bad line.
	for _, bad := range []string{
		strings.Replace(strictOpened, `"tenant":"acme"`, `"tenant":"acme","extra":"x"`, 1),
		strings.Replace(strictOpened, `"run_id":"run-1"`, `"run_id":"run-1","line":3`, 1),
		strings.Replace(reservedT, `"mac":"00"`, `"mac":"00","more":1`, 1),
	} {
		if _, err := decodeRecord([]byte(bad)); err == nil || errors.Is(err, errNotExact) || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%.80s…: %v, want an unknown field", bad, err)
		}
	}
}

// The fold reports a line that is not exact as a finding and applies
// nothing of it, as if it had been removed; a record after it is no
// corruption (it is no torn write). After a torn tail it is a record that
// follows the tail: the log is corrupt, as for any record there.
func TestFoldReportsALineThatIsNotExact(t *testing.T) {
	for name, line := range map[string]string{
		"amount twice in terms": strings.Replace(strictOpened, `"amount":"0.210"`, `"amount":"0.210","amount":"0.001"`, 1),
		"Amount beside amount":  strings.Replace(strictOpened, `"amount":"0.210"`, `"amount":"0.210","Amount":"0.001"`, 1),
		"Status for status":     strings.Replace(decideA, `"status"`, `"Status"`, 1),
	} {
		t.Run(name, func(t *testing.T) {
			log := openedB + "\n" + line + "\n" + strictUsed + "\n"
			if strings.HasPrefix(line, `{"type":"decided"`) {
				log = strictOpened + "\n" + line + "\n" + openedB + "\n"
			}
			st, err := fold([]byte(log), "decisions.ndjson")
			if err != nil {
				t.Fatalf("fold: %v", err)
			}
			if len(st.findings) == 0 || st.findings[0].Line != 2 || !strings.Contains(st.findings[0].What, "not applied") {
				t.Fatalf("findings %+v, want line 2 reported and not applied", st.findings)
			}
			if e := st.byID[idA]; e != nil && e.status != Pending {
				t.Fatalf("review A reads %q from a line that is not exact", e.status)
			}
			if strings.HasPrefix(line, `{"type":"opened"`) && st.byID[idA] != nil {
				t.Fatalf("review A was opened by a line that is not exact")
			}
			if st.byID[idB] == nil {
				t.Fatalf("the exact lines around it were not read")
			}
		})
	}
	bad := strings.Replace(strictOpened, `"amount":"0.210"`, `"amount":"0.210","amount":"0.001"`, 1)
	if _, err := fold([]byte(openedB+"\n{\"ty\n"+bad+"\n"+openedA+"\n"), "decisions.ndjson"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("after a torn line: %v, want corrupt", err)
	}
}

// FuzzDecodeRecordExact: whatever bytes a line holds, the log reads it as
// a record only where no object in it names a field twice and every name
// is one of the log's, spelled exactly (checked here by a token walk of
// its own, not by the reader's).
func FuzzDecodeRecordExact(f *testing.F) {
	for _, s := range []string{strictOpened, strictUsed, strictRepair, decideA, reservedT, releasedT, strictAuthorized(),
		strings.Replace(strictOpened, `"amount":"0.210"`, `"amount":"0.210","Amount":"0.001"`, 1),
		strings.Replace(reservedT, `"atomic":"100"`, `"atomic":"100","atomic":"1"`, 1),
		strings.Replace(strictOpened, `"run_id"`, `"Run_id"`, 1)} {
		f.Add([]byte(s))
	}
	names := map[string]bool{}
	for _, line := range []string{strictOpened, strictUsed, strictRepair, decideA, reservedT, releasedT, strictAuthorized()} {
		keysOf(t0{}, []byte(line), func(k string) bool { names[k] = true; return true })
	}
	for _, k := range []string{"note", "status", "by", "host", "resource", "until", "open", "review_id", "pay_to"} {
		names[k] = true
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if _, err := decodeRecord(line); err != nil {
			return
		}
		if !keysOf(t, line, func(k string) bool { return names[k] }) {
			t.Fatalf("read as a record: %q", line)
		}
	})
}

type t0 struct{}

func (t0) Fatalf(string, ...any) {}

// keysOf walks every object of line; ok is false where a name repeats in
// one object or fn refuses a name.
func keysOf(t interface{ Fatalf(string, ...any) }, line []byte, fn func(string) bool) (ok bool) {
	dec := json.NewDecoder(bytes.NewReader(line))
	type frame struct {
		obj  bool
		seen map[string]bool
	}
	var stack []*frame
	key := false
	for {
		tok, err := dec.Token()
		if err != nil {
			return true
		}
		if d, isDelim := tok.(json.Delim); isDelim {
			switch d {
			case '{', '[':
				stack = append(stack, &frame{obj: d == '{', seen: map[string]bool{}})
				key = d == '{'
			default:
				stack = stack[:len(stack)-1]
				key = len(stack) > 0 && stack[len(stack)-1].obj
			}
			continue
		}
		if key {
			k := tok.(string)
			top := stack[len(stack)-1]
			if top.seen[k] || !fn(k) {
				t.Fatalf("the name %q", k)
				return false
			}
			top.seen[k] = true
			key = false
			continue
		}
		key = len(stack) > 0 && stack[len(stack)-1].obj
	}
}
