package noa

import (
	"context"
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
