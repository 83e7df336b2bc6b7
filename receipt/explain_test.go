package receipt

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the explain goldens in testdata/receipt/explain")

// TestExplainGoldens explains every operation of the four reference fixture
// runs with the bundled templates and compares with the goldens.
func TestExplainGoldens(t *testing.T) {
	shared := sharedDir(t, "explain goldens over the reference fixture runs")
	goldDir := filepath.Join("..", "testdata", "receipt", "explain")
	for _, name := range BundledNames() {
		t.Run(name, func(t *testing.T) {
			tm, err := Bundled(name)
			if err != nil {
				t.Fatal(err)
			}
			runID, evs, err := ReadRunFile(filepath.Join(shared, "haia-trace", "fixtures", name+".ndjson"), DefaultLimits())
			if err != nil {
				t.Fatal(err)
			}
			res := Assemble(evs, tm)
			var b strings.Builder
			for i := range res.Receipts {
				r := &res.Receipts[i]
				text := Explain(runID, r)
				if again := Explain(runID, r); again != text {
					t.Fatalf("Explain is not deterministic for %s", r.Operation.OperationID)
				}
				b.WriteString("== " + r.Operation.OperationID + " (" + r.Completeness + ")\n" + text + "\n\n")
			}
			path := filepath.Join(goldDir, name+".txt")
			if *update {
				if err := os.MkdirAll(goldDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run the test with -update to create it)", err)
			}
			if b.String() != string(want) {
				t.Errorf("explanations differ from %s (rerun with -update if the change is intended):\n got:\n%s\nwant:\n%s", path, b.String(), want)
			}
		})
	}
}

func TestExplainRules(t *testing.T) {
	buyer, _ := Bundled("x402-buyer")
	custom := mustTemplate(t, "template: mine\nversion: 1\nstages:\n  - {id: a, required: true, match: [{event: x.a}]}\n  - {id: b, required: false, match: [{event: x.b}]}\nexceptions: [x.bad]\n")
	at := "2026-07-24T09:00:00.000Z"
	cases := []struct {
		name  string
		tm    *Template
		lines []string
		want  []string
		not   []string
	}{
		{"buyer paid, no settlement: blind spot", buyer, []string{
			evLine("c1", "x402.payment.required", at, 0, "client", "op"),
			evLine("p1", "x402.payment.submitted", at, 1, "client", "op"),
		}, []string{`Operation "op" in run "r1"`, "is partial.", "Seen: the 402 payment challenge (c1) and the payment leaving the buyer (p1).",
			`Not seen: a successful settlement answer (required stage "settlement", expected x402.payment.responded); no settlement answer was recorded for the payment.`,
			"settled silently look the same"}, nil},
		{"buyer full", buyer, []string{
			evLine("c1", "x402.payment.required", at, 0, "client", "op"),
			evLine("p1", "x402.payment.submitted", at, 1, "client", "op"),
			evLine("s1", "x402.payment.responded", at, 2, "client", "op"),
		}, []string{"is full: every required stage was observed and no fault was recorded."}, []string{"Not seen", "settled silently"}},
		{"buyer 402 only: no money, no blind spot", buyer, []string{
			evLine("c1", "x402.payment.required", at, 0, "client", "op"),
		}, []string{"Not seen: the payment leaving the buyer", "Not seen: a successful settlement answer"}, []string{"settled silently"}},
		{"fault with stages closed", buyer, []string{
			evLine("c1", "x402.payment.required", at, 0, "client", "op"),
			evLine("p1", "x402.payment.submitted", at, 1, "client", "op"),
			evLine("s1", "x402.payment.responded", at, 2, "client", "op"),
			evLine("f1", "x402.settle.failed", at, 3, "client", "op"),
		}, []string{"every required stage was observed, but a fault was recorded.", "Fault recorded: x402.settle.failed (f1)."}, nil},
		{"custom template is generic", custom, []string{
			evLine("1", "x.b", at, 0, "-", "op"), evLine("2", "x.bad", at, 1, "-", "op"), evLine("3", "x.bad", at, 2, "-", "op"),
		}, []string{`mine template (version 1) from 3 events`, `Seen: stage "b" (1).`, `Not seen: stage "a" (required stage "a", expected x.a).`, "Faults recorded: x.bad (2) and x.bad (3)."}, []string{"look the same"}},
		{"nothing seen", custom, []string{evLine("1", "x.other", at, 0, "-", "op")},
			[]string{"from 1 event,", "None of the events this template looks for was seen.", `Optional and not seen: stage "b".`}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := Assemble(decodeAll(t, c.lines...), c.tm)
			got := Explain("r1", &res.Receipts[0])
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in:\n%s", w, got)
				}
			}
			for _, w := range c.not {
				if strings.Contains(got, w) {
					t.Errorf("unexpected %q in:\n%s", w, got)
				}
			}
		})
	}
}

func TestStageRoles(t *testing.T) {
	for tmpl, want := range map[string][2]string{
		"x402-buyer": {"payment", "settlement"}, "x402-seller": {"verification", "settlement"},
		"x402-facilitator": {"verification", "settlement"}, "escrow-arc": {"deposit", "disposition"},
	} {
		p, o, ok := StageRoles(tmpl)
		if !ok || p != want[0] || o != want[1] {
			t.Errorf("StageRoles(%s) = %s %s %v", tmpl, p, o, ok)
		}
		tm, _ := Bundled(tmpl)
		found := 0
		for _, s := range tm.Stages {
			if s.ID == p || s.ID == o {
				found++
			}
		}
		if found != 2 {
			t.Errorf("%s: role stages not in the bundled template", tmpl)
		}
	}
	if _, _, ok := StageRoles("custom"); ok {
		t.Error("a custom template has roles")
	}
}
