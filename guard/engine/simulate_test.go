package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// TestSimulateKeptQuestions: a check and a forwarded call keep their
// questions and are replayed under a stricter policy (both allows become
// reviews); a question resealed by a key holder with another amount is
// unverifiable by its paramsHash, one given to another caller by the
// receipt's signer; the replay writes nothing.
func TestSimulateKeptQuestions(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir, `{"reviewAbove": "1.00", "perCounterpartyLimit": {"amount": "100", "windowHours": 24}}`)
	ctx := context.Background()
	a, err := f.eng.Check(ctx, "bot", Question{Counterparty: sellerA, Amount: "0.50"})
	if err != nil || a.Decision != guard.Allow {
		t.Fatalf("check: %+v %v", a, err)
	}
	q, c := payCall("0.60", "m1")
	b, err := f.eng.CheckCall(ctx, "bot", q, c)
	if err != nil || b.Decision != guard.Allow {
		t.Fatalf("call: %+v %v", b, err)
	}
	qf := filepath.Join(dir, reviewlog.DirName, reviewlog.QuestionsFile)
	data, err := os.ReadFile(qf)
	if err != nil {
		t.Fatal(err)
	}
	stricter, err := guard.ParseConfig([]byte(`{"reviewAbove": "0.40", "perCounterpartyLimit": {"amount": "100", "windowHours": 24}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := SimulateConfig{Policy: stricter, Templates: f.eng.cfg.Templates, History: f.eng.cfg.History, Log: f.log, Tenant: "test", ParamsKey: f.eng.cfg.ParamsKey}
	sim, err := Simulate(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sim.Replayed != 2 || sim.Transitions["allow→review"] != 2 || len(sim.Unverifiable) != 0 || sim.WithoutQuestion != 0 {
		t.Fatalf("replay: %+v", sim)
	}
	if ch := sim.Changes[1]; ch.Receipt != b.ReceiptID || ch.Kind != QuestionCall || ch.Rule != guard.RuleReviewAbove || ch.Amount != "0.6 USDC" {
		t.Fatalf("the call's change: %+v", ch)
	}
	after, _ := os.ReadFile(qf)
	if !bytes.Equal(data, after) {
		t.Fatal("the replay wrote the kept questions")
	}

	// A key holder's edits: the check's amount changed and resealed, the
	// call's caller changed and resealed.
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	reseal := func(line []byte, edit func(*KeptQuestion)) []byte {
		var kq KeptQuestion
		if err := json.Unmarshal(line, &kq); err != nil {
			t.Fatal(err)
		}
		edit(&kq)
		if kq.MAC, err = questionSeal(f.eng.cfg.ParamsKey, kq); err != nil {
			t.Fatal(err)
		}
		out, _ := json.Marshal(kq)
		return out
	}
	lines[0] = reseal(lines[0], func(kq *KeptQuestion) { kq.Question.Amount = "0.05" })
	lines[1] = reseal(lines[1], func(kq *KeptQuestion) { kq.Caller = "other" })
	if err := os.WriteFile(qf, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	sim, err = Simulate(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sim.Replayed != 0 || len(sim.Unverifiable) != 2 ||
		!strings.Contains(sim.Unverifiable[0].Why, "paramsHash does not match") || !strings.Contains(sim.Unverifiable[1].Why, `signed for caller "bot", not "other"`) {
		t.Fatalf("edited questions: %+v", sim)
	}
}
