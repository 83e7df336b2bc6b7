package noa

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParseHead holds the head reader to the strict one: whatever
// ParseReceipt accepts, ParseHead reads with the same id, time, agent,
// action and verdict (so a receipt the ledger must hold is never missed
// by the cheaper read), and no input makes it panic.
func FuzzParseHead(f *testing.F) {
	s := NewKeySigner(newKey(f))
	for i := 1; i <= 3; i++ {
		_, line, err := Seal(context.Background(), testDraft(i), nil, s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(line)
	}
	f.Add([]byte(`{"id":"x","ts":"2026-01-01T00:00:00Z","agent":{"id":1}}`))
	f.Add([]byte(`{"a":1,"a":2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, herr := ParseHead(data)
		r, err := ParseReceipt(data)
		if err != nil {
			return
		}
		if herr != nil {
			t.Fatalf("a receipt ParseReceipt accepts has no head: %v", herr)
		}
		if h.ID != r.ID || h.TS != r.TS || h.Agent.ID != r.Agent.ID || h.Agent.Principal != r.Agent.Principal ||
			h.Action.Canonical != r.Action.Canonical || h.Governance.Verdict != r.Governance.Verdict {
			t.Fatalf("head %+v differs from the receipt %+v %+v %+v %+v", h, r.ID, r.Agent, r.Action, r.Governance)
		}
	})
}

// TestParseHeadReadsAsJSONDoes: on well-formed objects whose member names
// are exact, the scanner reads what encoding/json reads into Head, escapes,
// repeated members, nulls and skipped values of every kind included; on
// malformed text both refuse.
func TestParseHeadReadsAsJSONDoes(t *testing.T) {
	for _, line := range []string{
		`{"id":"a","ts":"t"}`,
		` {"ts":"t", "id" : "a\u00e9\ud83d\ude00\/\n" } `,
		`{"id":"a","ts":"t","id":"b"}`,
		`{"id":"a","ts":"t","agent":{"id":"x","principal":"SERVICE","model":null},"agent":{"id":"y"}}`,
		`{"id":"a","ts":"t","agent":null,"action":{"canonical":"x402.payment","params":[1,-2.5e+3,true,false,null,{"k":[[]]}]},"governance":{"verdict":"ALLOWED","approval":{"a":"\"}"}}}`,
		`{"i\u0064":"a","ts":"t"}`,
		`{"id":"\ud800x","ts":"t"}`,
		`{"id":"\udc00\ud800\udc00","ts":"t"}`,
		`{"id":"a","ts":"t","x":0}`,
		`{"id":"a","ts":"t"} x`,
		`{"id":"a","ts":"t",}`,
		`{"id":"a","ts":"t","x":01}`,
		`{"id":"a","ts":"t","x":1.}`,
		`{"id":"a","ts":"t","x":tru}`,
		`{"id":"a","ts":"t","x":"\x"}`,
		`{"id":"a","ts":"t","x":"` + "\x01" + `"}`,
		`{"id":1,"ts":"t"}`,
		`{"id":"a","ts":"t","agent":"x"}`,
		`{"id":"a","ts":"t"`,
		`[]`,
		``,
	} {
		got, gerr := ParseHead([]byte(line))
		var want Head
		werr := json.Unmarshal([]byte(line), &want)
		if werr == nil && (want.ID == "" || want.TS == "") {
			werr = errors.New("no id or ts")
		}
		if (gerr == nil) != (werr == nil) {
			t.Errorf("%s: scanner %v, encoding/json %v", line, gerr, werr)
			continue
		}
		if gerr == nil && got != want {
			t.Errorf("%s: scanner %+v, encoding/json %+v", line, got, want)
		}
	}
}

func BenchmarkParseHead(b *testing.B) {
	_, line, err := Seal(context.Background(), testDraft(1), nil, NewKeySigner(newKey(b)))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := ParseHead(line); err != nil {
			b.Fatal(err)
		}
	}
}
