package reviewlog

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

const (
	idA     = "1b4e28ba-2fa1-4d2c-883f-0016d3cca427"
	idB     = "2c5f39cb-3ab2-4e3d-994a-1127e4ddb538"
	openedA = `{"type":"opened","review_id":"` + idA + `","at":"2026-07-25T12:00:00.000Z","counterparty":"api.example.com","amount":"1","asset":"a","reasons":[]}`
	openedB = `{"type":"opened","review_id":"` + idB + `","at":"2026-07-25T12:00:01.000Z","counterparty":"api.example.com","amount":"2","asset":"a","reasons":[]}`
	decideA = `{"type":"decided","review_id":"` + idA + `","at":"2026-07-25T12:05:00.000Z","status":"approved","by":"alice"}`
)

func TestFold(t *testing.T) {
	tests := []struct {
		name    string
		log     string
		reviews int
		tail    []int
		errHas  string
		// finding: a contradicting line is reported and not applied.
		finding string
	}{
		{name: "empty", log: ""},
		{name: "one of each", log: openedA + "\n" + decideA + "\n", reviews: 1},
		{name: "CRLF and blank lines", log: openedA + "\r\n\r\n  \n" + decideA + "\r\n", reviews: 1},
		{name: "torn tail", log: openedA + "\n" + `{"type":"decided","revi`, reviews: 1, tail: []int{2}},
		{name: "torn tail after a blank line", log: openedA + "\n\n" + `{"ty`, reviews: 1, tail: []int{3}},
		{name: "whitespace-only tail is no record", log: openedA + "\n   ", reviews: 1},
		{name: "complete bad lines at the end are the tail", log: openedA + "\n{\"ty\n{\"type\":\"rep", reviews: 1, tail: []int{2, 3}},
		{name: "repair record closes the tail", log: openedA + "\n{\"ty\n" + `{"type":"repair","at":"2026-07-25T12:06:00.000Z","lines":[2]}` + "\n" + openedB + "\n", reviews: 2},
		{name: "bad middle line", log: openedA + "\nnot json\n" + openedB + "\n", errHas: "line 2: not a review log record"},
		{name: "repair naming other lines", log: openedA + "\n{\"ty\n" + `{"type":"repair","at":"2026-07-25T12:06:00.000Z","lines":[1]}` + "\n" + openedB + "\n", errHas: "line 2: not a review log record"},
		{name: "repair with nothing to repair", log: `{"type":"repair","at":"2026-07-25T12:06:00.000Z","lines":[1]}` + "\n" + openedA + "\n", reviews: 1, finding: "repair record names lines [1]"},
		{name: "repair naming a decided line cannot reopen it", log: openedA + "\n" + decideA + "\n" + `{"type":"repair","at":"2026-07-25T12:06:00.000Z","lines":[2]}` + "\n", reviews: 1, finding: "repair record names lines [2]"},
		{name: "decided before opened", log: decideA + "\n" + openedA + "\n", reviews: 1, finding: "review " + idA + " is decided but was never opened"},
		{name: "decided twice", log: openedA + "\n" + decideA + "\n" + decideA + "\n" + openedB + "\n", reviews: 2, finding: "review " + idA + " is decided a second time"},
		{name: "opened twice", log: openedA + "\n" + openedA + "\n" + openedB + "\n", reviews: 2, finding: "review " + idA + " is opened a second time"},
		{name: "unknown field", log: `{"type":"opened","review_id":"` + idA + `","at":"2026-07-25T12:00:00.000Z","counterparty":"c","amount":"1","asset":"a","extra":1}` + "\n" + openedB + "\n", errHas: `unknown field "extra"`},
		{name: "bad time", log: strings.Replace(openedA, "12:00:00.000Z", "noon", 1) + "\n" + openedB + "\n", errHas: "at: time"},
		{name: "bad status", log: openedA + "\n" + strings.Replace(decideA, "approved", "maybe", 1) + "\n" + openedB + "\n", errHas: `status "maybe"`},
		{name: "bad id", log: strings.Replace(openedA, idA, "42", 1) + "\n" + openedB + "\n", errHas: "not a review id"},
		{name: "decided without by", log: openedA + "\n" + strings.Replace(decideA, `,"by":"alice"`, "", 1) + "\n" + openedB + "\n", errHas: "needs by"},
		{name: "unknown type", log: `{"type":"comment","at":"2026-07-25T12:00:00.000Z"}` + "\n" + openedA + "\n", errHas: `unknown record type "comment"`},
		{name: "trailing data", log: openedA + " {}\n" + openedB + "\n", errHas: "line 1: not a review log record"},
		{name: "invalid UTF-8", log: "\xff\n" + openedB + "\n", errHas: "UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := fold([]byte(tc.log), "decisions.ndjson")
			if tc.errHas != "" {
				if err == nil || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v, want ErrCorrupt mentioning %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(st.entries) != tc.reviews {
				t.Errorf("%d reviews, want %d", len(st.entries), tc.reviews)
			}
			if got := st.tailLines(); len(got) != len(tc.tail) || (len(got) > 0 && !equalInts(got, tc.tail)) {
				t.Errorf("tail %v, want %v", got, tc.tail)
			}
			found := false
			for _, f := range st.findings {
				found = found || (tc.finding != "" && strings.Contains(f.What, tc.finding))
			}
			if (tc.finding != "") != found || (tc.finding == "" && len(st.findings) > 0) {
				t.Errorf("findings %+v, want one mentioning %q", st.findings, tc.finding)
			}
			if tc.name == "repair naming a decided line cannot reopen it" && st.byID[idA].status != Approved {
				t.Errorf("the repair reopened the review: %+v", st.byID[idA])
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzFold: the log reader never panics on arbitrary bytes, and anything it
// accepts can be appended to and read again.
func FuzzFold(f *testing.F) {
	for _, s := range []string{"", openedA + "\n", openedA + "\n" + decideA + "\n", openedA + "\n{\"ty", "x\n" + openedA + "\n",
		`{"type":"released","at":"2026-12-01T10:00:00.000Z","release":{"receipt_id":"r","caller":"a","outcome":"o","outcome_receipt":"p","mac":"m"}}` + "\n", openedA + "\n{\n" + `{"type":"repair","at":"2026-07-25T12:06:00.000Z","lines":[2]}` + "\n",
		strings.TrimSuffix(openedA, "}") + `,"terms":{"review_id":"` + idA + `","caller":"","tenant":"t","counterparty":"api.example.com","amount":"1",` +
			`"amount_atomic":"1000000","asset":"a","resource":"https://api.example.com/x","template":"x402-buyer","rules":[],"params_hash":""}}` + "\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := fold(data, "fuzz")
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		for _, e := range st.entries {
			if st.byID[e.id] != e || (e.status != Pending && e.status != Approved && e.status != Rejected) {
				t.Fatalf("inconsistent review %+v", e)
			}
			r, err := st.review(e)
			if err != nil {
				t.Fatalf("review %s does not read back: %v", e.id, err)
			}
			// Whatever terms a line carries, checking them against no
			// signature finds it unsigned or tampered, never signed.
			if th, fs := checkTerms(r, signed{}, nil); th != "" || (r.Terms != nil && len(fs) == 0) {
				t.Fatalf("terms %+v read as signed without a receipt: %q %v", r.Terms, th, fs)
			}
		}
		id, _ := newID()
		amount := "1"
		at := time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)
		more, err := st.appendix([]record{{Type: typeOpened, ReviewID: id, At: formatTime(at), Counterparty: "c", Amount: &amount, Reasons: []guard.Reason{}}}, at)
		if err != nil {
			t.Fatal(err)
		}
		after, err := fold(append(append([]byte{}, data...), more...), "fuzz")
		if err != nil {
			t.Fatalf("the log does not read after an append: %v\n%q", err, append(data, more...))
		}
		if after.byID[id] == nil || len(after.entries) != len(st.entries)+1 || len(after.tailLines()) != 0 {
			t.Fatalf("append lost: %d → %d reviews, tail %v", len(st.entries), len(after.entries), after.tailLines())
		}
	})
}

const (
	reservedT = `{"type":"reserved","at":"2026-07-25T12:00:00.000Z","reservation":{"receipt_id":"rx-1","caller":"bot","tenant":"acme","pay_to":"0xb0b","atomic":"100","asset":"usdc","until":"2026-07-25T12:15:00.000Z","mac":"00"}}`
	releasedT = `{"type":"released","at":"2026-07-25T12:01:00.000Z","release":{"receipt_id":"rx-1","caller":"bot","outcome":"upstream_refused","outcome_receipt":"rx-2","mac":"00"}}`
)

// A store indexes a reserved line's reservation and a released line's
// release as the log reads them, at the line's time, and nothing of a
// line the log refuses.
func TestParseLineHeadReservations(t *testing.T) {
	h, ok := ParseLineHead([]byte(reservedT + "\n"))
	want := Reservation{ReceiptID: "rx-1", Caller: "bot", Tenant: "acme", PayTo: "0xb0b", Atomic: "100", Asset: "usdc", Until: "2026-07-25T12:15:00.000Z", MAC: "00", At: "2026-07-25T12:00:00.000Z"}
	if !ok || h.Type != typeReserved || h.Reservation == nil || h.Release != nil || fmt.Sprint(*h.Reservation) != fmt.Sprint(want) {
		t.Fatalf("reserved: %+v %v, want %+v", h, ok, want)
	}
	h, ok = ParseLineHead([]byte(releasedT))
	if !ok || h.Type != typeReleased || h.Release == nil || h.Reservation != nil || h.Release.ReceiptID != "rx-1" || h.Release.At != "2026-07-25T12:01:00.000Z" {
		t.Fatalf("released: %+v %v", h, ok)
	}
	for _, bad := range []string{
		strings.Replace(reservedT, `"tenant"`, `"Tenant"`, 1),
		strings.Replace(reservedT, `"mac":"00"`, `"mac":""`, 1),
		strings.Replace(reservedT, `"until":"2026-07-25T12:15:00.000Z"`, `"until":"tomorrow"`, 1),
		strings.Replace(reservedT, `"tenant":"acme"`, `"tenant":"`+strings.Repeat("a", 3000)+`"`, 1),
		strings.Replace(releasedT, `"type":"released"`, `"type":"reserved"`, 1),
	} {
		if h, ok := ParseLineHead([]byte(bad)); ok || h.Reservation != nil || h.Release != nil {
			t.Fatalf("%.120s: %+v %v, want nothing", bad, h, ok)
		}
	}
}

// ParseLineHead is the log's own strict reading: a store indexes a line's
// type and review only when the log reads it as a record.
func TestParseLineHead(t *testing.T) {
	at := func(s string) time.Time { v, _ := time.Parse(time.RFC3339, s); return v }
	for _, c := range []struct {
		name, line string
		want       LineHead
		ok, opens  bool
	}{
		{"opened", openedA + "\n", LineHead{Type: typeOpened, ReviewID: idA, At: at("2026-07-25T12:00:00Z"), Notify: idA}, true, true},
		{"opened without newline", openedA, LineHead{Type: typeOpened, ReviewID: idA, At: at("2026-07-25T12:00:00Z"), Notify: idA}, true, true},
		{"decided", decideA, LineHead{Type: typeDecided, ReviewID: idA, At: at("2026-07-25T12:05:00Z"), Status: Approved}, true, false},
		{"repair", `{"type":"repair","at":"2026-07-25T12:06:00.000Z","lines":[2]}`, LineHead{Type: typeRepair, At: at("2026-07-25T12:06:00Z")}, true, false},
		{"torn", openedA[:40], LineHead{}, false, false},
		{"unknown field", strings.TrimSuffix(openedA, "}") + `,"x":1}`, LineHead{}, false, false},
		{"field of another case", strings.Replace(openedA, `"type"`, `"Type"`, 1), LineHead{}, false, false},
		{"bad id", strings.ReplaceAll(openedA, idA, "not-an-id"), LineHead{}, false, false},
		{"not JSON", "x", LineHead{}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, ok := ParseLineHead([]byte(c.line))
			if c.opens {
				// The question key is the fold's.
				c.want.QuestionKey = QuestionKey("", guard.Question{Counterparty: "api.example.com", Amount: "1", Asset: "a"}, "")
			}
			if h != c.want || ok != c.ok || h.Opens() != c.opens {
				t.Fatalf("ParseLineHead = %+v, %v (opens %v); want %+v, %v (opens %v)", h, ok, h.Opens(), c.want, c.ok, c.opens)
			}
		})
	}
}

// An opened line with terms gives its caller, tenant and both keys; the
// terms key leaves out the review id, so two reviews of one question on
// the same terms share it, and any other member or rule changes it.
func TestLineHeadKeys(t *testing.T) {
	terms := Terms{ReviewID: idA, Caller: "bot", Tenant: "acme", Counterparty: "api.example.com", Amount: "1", AmountAtomic: "1000000",
		Asset: "a", Resource: "https://api.example.com/x", Template: "x402-buyer", Rules: []string{"a_rule", "b_rule"}, ParamsHash: "hmac:1"}
	line := func(t Terms) []byte {
		amount := t.Amount
		b, err := encodeRecord(record{Type: typeOpened, ReviewID: t.ReviewID, At: "2026-07-25T12:00:00.000Z", Counterparty: t.Counterparty, Amount: &amount,
			Asset: t.Asset, Template: t.Template, Reasons: []guard.Reason{}, Caller: t.Caller, Terms: &t, PayTo: "0xabc"})
		if err != nil {
			panic(err)
		}
		return b
	}
	h, ok := ParseLineHead(line(terms))
	q := QuestionKey("bot", guard.Question{Counterparty: "api.example.com", Amount: "1", Asset: "a", Template: "x402-buyer", PayTo: "0xabc"}, "https://api.example.com/x")
	if !ok || h.Caller != "bot" || h.Tenant != "acme" || h.QuestionKey != q || h.TermsKey != TermsKey(terms) || len(h.TermsKey) != 32 {
		t.Fatalf("head %+v %v; want caller bot, tenant acme, question key %s, terms key %s", h, ok, q, TermsKey(terms))
	}
	other := terms
	other.ReviewID = "2b4e28ba-2fa1-4d2c-883f-0016d3cca427"
	if TermsKey(other) != h.TermsKey {
		t.Fatal("the terms key depends on the review id")
	}
	for name, edit := range map[string]func(*Terms){
		"caller": func(t *Terms) { t.Caller = "bot2" }, "tenant": func(t *Terms) { t.Tenant = "" }, "amount_atomic": func(t *Terms) { t.AmountAtomic = "1" },
		"params_hash": func(t *Terms) { t.ParamsHash = "" }, "rules": func(t *Terms) { t.Rules = []string{"a_rule"} },
		"members that run together": func(t *Terms) { t.Asset, t.Resource = "a;https://api.example.com/x", "" },
	} {
		o := terms
		edit(&o)
		if TermsKey(o) == h.TermsKey {
			t.Errorf("changing %s keeps the terms key", name)
		}
	}
}

// FuzzParseLineHead: any bytes give a head only when the fold reads them
// as a record of that type and review, with the fold's question key.
func FuzzParseLineHead(f *testing.F) {
	for _, s := range []string{openedA, decideA, openedA[:40], "{}", `{"type":"used"}`, reservedT, releasedT, strings.Replace(reservedT, `"tenant"`, `"Tenant"`, 1)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		h, ok := ParseLineHead(line)
		r, err := decodeRecord(line)
		if ok != (err == nil) || (ok && (h.Type != r.Type || h.ReviewID != r.ReviewID)) || (!ok && h != LineHead{}) {
			t.Fatalf("head %+v %v, record %+v %v", h, ok, r, err)
		}
		if ok && r.Type == typeOpened {
			k := openedKey(r)
			if h.QuestionKey != hex.EncodeToString(k[:]) || (r.Terms != nil) != (h.TermsKey != "") {
				t.Fatalf("head %+v of %+v: keys are not the fold's", h, r)
			}
		}
		// A reservation or release comes only from the line of that type,
		// as the record holds it, at the line's time.
		if (h.Reservation != nil) != (ok && r.Type == typeReserved) || (h.Release != nil) != (ok && r.Type == typeReleased) {
			t.Fatalf("head %+v of a %q line", h, r.Type)
		}
		if h.Reservation != nil && (h.Reservation.At != r.At || h.Reservation.ReceiptID != r.Reservation.ReceiptID || h.Reservation.Atomic != r.Reservation.Atomic ||
			h.Reservation.Tenant != r.Reservation.Tenant || h.Reservation.PayTo != r.Reservation.PayTo || h.Reservation.Host != r.Reservation.Host) {
			t.Fatalf("head's reservation %+v, record's %+v", h.Reservation, r.Reservation)
		}
		if h.Release != nil && (h.Release.At != r.At || h.Release.ReceiptID != r.Release.ReceiptID) {
			t.Fatalf("head's release %+v, record's %+v", h.Release, r.Release)
		}
	})
}
