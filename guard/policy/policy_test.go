package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
)

const guardPolicy = `{"spec":"noa.policy/0.2","id":"guard","requiredPaths":["args.counterparty","amountAtomic"],
 "rules":[
  {"id":"block-big-new","when":{"op":"and","clauses":[
     {"op":"eq","path":"history.settledCount","value":0},
     {"op":"gt","path":"amountAtomic","value":2000000}]},"then":"DENY"},
  {"id":"allow-rest","when":{"op":"exists","path":"amountAtomic"},"then":"ALLOW"}]}`

func mustParse(t *testing.T, doc string) *Policy {
	t.Helper()
	p, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

func TestMaxDepthIsTheCanonicalBound(t *testing.T) {
	// The named bound of §2.8 is the canonical-JSON bound the vectors pin.
	if MaxDepth != 64 || jcs.MaxDepth != MaxDepth {
		t.Fatalf("MaxDepth = %d, jcs.MaxDepth = %d; the vectors pin 64", MaxDepth, jcs.MaxDepth)
	}
}

func TestEvaluateTyped(t *testing.T) {
	p := mustParse(t, guardPolicy)
	tests := []struct {
		name  string
		s     Snapshot
		want  Result
		valid bool // whether InputsHash must succeed
	}{
		{"allow", Snapshot{"args.counterparty": String("0xabc"), "amountAtomic": Int(5), "history.settledCount": Int(0)},
			Result{Verdict: Allow, RuleFired: "allow-rest", Step: StepRuleMatched}, true},
		{"deny", Snapshot{"args.counterparty": String("0xabc"), "amountAtomic": Int(2000001), "history.settledCount": Int(0)},
			Result{Verdict: Deny, RuleFired: "block-big-new", Step: StepRuleMatched}, true},
		{"nil snapshot", nil, Result{Verdict: Deny, RuleFired: FiredInputInvalid, Step: StepInputNotMap}, false},
		{"empty snapshot", Snapshot{}, Result{Verdict: Deny, RuleFired: FiredRequiredAbsentPrefix + "args.counterparty", Step: StepRequiredAbsent}, true},
		{"zero scalar", Snapshot{"args.counterparty": {}, "amountAtomic": Int(1)},
			Result{Verdict: Deny, RuleFired: FiredEvalError, Step: StepNotScalar}, false},
		{"unsafe int", Snapshot{"args.counterparty": String("a"), "amountAtomic": Int(1 << 53)},
			Result{Verdict: Deny, RuleFired: FiredEvalError, Step: StepNotScalar}, false},
		{"bad utf-8 value", Snapshot{"args.counterparty": String("\xff"), "amountAtomic": Int(1)},
			Result{Verdict: Deny, RuleFired: FiredEvalError, Step: StepNotScalar}, false},
		{"bad utf-8 key", Snapshot{"\xff": Int(1), "args.counterparty": String("a"), "amountAtomic": Int(1)},
			Result{Verdict: Deny, RuleFired: FiredEvalError, Step: StepInputSyntax}, false},
		{"forbidden key", Snapshot{"constructor": Int(1), "args.counterparty": String("a"), "amountAtomic": Int(1)},
			Result{Verdict: Deny, RuleFired: FiredEvalError, Step: StepInputSyntax}, false},
		{"type confusion", Snapshot{"args.counterparty": String("a"), "amountAtomic": Int(1), "history.settledCount": String("0")},
			Result{Verdict: Deny, RuleFired: FiredEvalError, Step: StepEvalError}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := p.Evaluate(tc.s)
			if got.Verdict != tc.want.Verdict || got.RuleFired != tc.want.RuleFired || got.Step != tc.want.Step {
				t.Errorf("Evaluate = %+v, want %+v", got, tc.want)
			}
			if got.Reason == "" {
				t.Error("no reason")
			}
			if got.Failed() == (got.Step == StepRuleMatched || got.Step == StepNoMatch) {
				t.Errorf("Failed() = %v at step %d", got.Failed(), got.Step)
			}
			_, err := InputsHash(tc.s)
			if (err == nil) != tc.valid {
				t.Errorf("InputsHash error = %v, want valid=%v", err, tc.valid)
			}
		})
	}
}

func TestEvaluateWithoutPolicy(t *testing.T) {
	for _, p := range []*Policy{nil, {}} {
		r := p.Evaluate(Snapshot{"x": Int(1)})
		if r.Verdict != Deny || r.RuleFired != FiredPolicyInvalid || r.Step != StepPolicyInvalid {
			t.Errorf("Evaluate on %#v = %+v, want DENY policy-invalid", p, r)
		}
	}
}

func TestReasonsNameTheRule(t *testing.T) {
	p := mustParse(t, guardPolicy)
	r := p.Evaluate(Snapshot{"args.counterparty": String("a"), "amountAtomic": Int(3000000), "history.settledCount": Int(0)})
	if !strings.Contains(r.Reason, `"block-big-new"`) {
		t.Errorf("reason %q does not name the rule", r.Reason)
	}
	r = p.Evaluate(Snapshot{"args.counterparty": String("a"), "amountAtomic": Int(1), "z": {}, "b": scalarFromJSON(nil)})
	if !strings.Contains(r.Reason, `"b"`) || !strings.Contains(r.Reason, "null") {
		t.Errorf("reason %q should name the least non-scalar key and what it is", r.Reason)
	}
}

func TestInputsHashIsCanonical(t *testing.T) {
	// The same snapshot read from two spellings hashes the same, and the
	// hash is over the RFC 8785 form (keys in UTF-16 order, no whitespace).
	a, err := SnapshotFromJSON([]byte(`{ "b": 1, "a": "x", "\u00e9": true, "😀": -0 }`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := SnapshotFromJSON([]byte(`{"😀":0,"é":true,"a":"x","b":1}`))
	if err != nil {
		t.Fatal(err)
	}
	ha, err := InputsHash(a)
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := InputsHash(b)
	want, _ := hashJSON(map[string]any{"a": "x", "b": int64(1), "é": true, "😀": int64(0)})
	if ha != hb || ha != want {
		t.Errorf("hashes differ: %s %s %s", ha, hb, want)
	}
	if _, err := InputsHash(Snapshot{"x": scalarFromJSON([]any{})}); !errors.Is(err, ErrNotScalar) {
		t.Errorf("InputsHash of a non-scalar: %v, want ErrNotScalar", err)
	}
}

func TestSnapshotFromJSONErrors(t *testing.T) {
	tests := []struct {
		doc  string
		want error
	}{
		{`{`, ErrInputSyntax},
		{`{"a":1,"a":2}`, ErrInputSyntax},
		{`{"a":1.0}`, ErrInputSyntax},
		{`{"prototype":1}`, ErrInputSyntax},
		{`null`, ErrInputNotObject},
		{`[]`, ErrInputNotObject},
		{`"s"`, ErrInputNotObject},
		{`7`, ErrInputNotObject},
	}
	for _, tc := range tests {
		_, err := SnapshotFromJSON([]byte(tc.doc))
		if !errors.Is(err, tc.want) {
			t.Errorf("SnapshotFromJSON(%s) = %v, want %v", tc.doc, err, tc.want)
		}
	}
	s, err := SnapshotFromJSON([]byte(`{"n":null,"a":[],"o":{},"s":"x","b":false,"i":-3}`))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]Kind{"n": KindInvalid, "a": KindInvalid, "o": KindInvalid, "s": KindString, "b": KindBool, "i": KindInt}
	for k, want := range kinds {
		if got := s[k].Kind(); got != want {
			t.Errorf("%s: kind %v, want %v", k, got, want)
		}
	}
	if s["s"].Str() != "x" || s["b"].BoolValue() || s["i"].IntValue() != -3 {
		t.Errorf("values read wrongly: %v", s)
	}
}

func TestParseErrorStages(t *testing.T) {
	_, err := Parse([]byte(`{`))
	if !errors.Is(err, ErrSyntax) || errors.Is(err, ErrInvalid) {
		t.Errorf("syntax error classified as %v", err)
	}
	_, err = Parse([]byte(`{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[],"x":1}`))
	if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrSyntax) {
		t.Errorf("grammar error classified as %v", err)
	}
	var pe *Error
	if !errors.As(err, &pe) || len(pe.Problems) != 1 || pe.Problems[0].Path != "$" || pe.Problems[0].Rule != ruleClosed {
		t.Errorf("problems = %+v", pe)
	}
}

func TestAccessors(t *testing.T) {
	p := mustParse(t, guardPolicy)
	if p.ID() != "guard" {
		t.Errorf("ID = %q", p.ID())
	}
	if got := strings.Join(p.RuleIDs(), ","); got != "block-big-new,allow-rest" {
		t.Errorf("RuleIDs = %s", got)
	}
	if got := strings.Join(p.RequiredPaths(), ","); got != "args.counterparty,amountAtomic" {
		t.Errorf("RequiredPaths = %s", got)
	}
	if got := strings.Join(p.ReadSet(), ","); got != "amountAtomic,args.counterparty,history.settledCount" {
		t.Errorf("ReadSet = %s", got)
	}
	// Callers get copies: changing them cannot change the policy.
	p.ReadSet()[0] = "mutated"
	p.RequiredPaths()[0] = "mutated"
	if p.ReadSet()[0] != "amountAtomic" || p.RequiredPaths()[0] != "args.counterparty" {
		t.Error("accessors expose internal slices")
	}
}

func TestScalarString(t *testing.T) {
	tests := []struct {
		v    Scalar
		want string
	}{
		{String("a\"b"), `"a\"b"`},
		{Bool(true), "true"},
		{Int(-7), "-7"},
		{Scalar{}, "an unset value"},
		{scalarFromJSON(nil), "null"},
	}
	for _, tc := range tests {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("String() = %s, want %s", got, tc.want)
		}
	}
}

// FuzzPolicy parses arbitrary policy bytes and evaluates them over arbitrary
// input bytes: no panic, a verdict is always ALLOW or DENY, every failure
// denies, only a matched rule may allow, and the typed path agrees with the
// bytes path.
func FuzzPolicy(f *testing.F) {
	f.Add([]byte(guardPolicy), []byte(`{"args.counterparty":"a","amountAtomic":5}`))
	f.Add([]byte(guardPolicy), []byte(`{"args.counterparty":"a","amountAtomic":3000000,"history.settledCount":0}`))
	f.Add([]byte(guardPolicy), []byte(`{"args.counterparty":"a","amountAtomic":"5"}`))
	f.Add([]byte(`{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"in","path":"x","values":["a","😀"]},"then":"ALLOW"}]}`), []byte(`{"x":"😀"}`))
	f.Add([]byte(`{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"not","clause":{"op":"or","clauses":[{"op":"absent","path":"x"},{"op":"lt","path":"x","value":true}]}},"then":"ALLOW"}]}`), []byte(`{"x":false}`))
	f.Add([]byte(`{"spec":"noa.policy/0.2","id":"p","requiredPaths":[],"rules":[{"id":"r","when":{"op":"and","clauses":[]},"then":"ALLOW"}]}`), []byte(`{}`))
	f.Add([]byte(`[`), []byte(`null`))
	f.Add([]byte(`{}`), []byte(`[]`))
	f.Fuzz(func(t *testing.T, policyDoc, inputDoc []byte) {
		r := EvaluateJSON(policyDoc, inputDoc)
		if r.Verdict != Allow && r.Verdict != Deny {
			t.Fatalf("verdict %q", r.Verdict)
		}
		if r.Failed() && r.Verdict != Deny {
			t.Fatalf("a failure allowed: %+v", r)
		}
		if r.Verdict == Allow && r.Step != StepRuleMatched {
			t.Fatalf("ALLOW without a matched rule: %+v", r)
		}
		if r.Step < StepPolicySyntax || r.Step > StepEvalError || r.Reason == "" {
			t.Fatalf("bad step or reason: %+v", r)
		}
		p, err := Parse(policyDoc)
		if err != nil {
			if r.RuleFired != FiredPolicyInvalid && r.Step != StepInputSyntax {
				t.Fatalf("invalid policy (%v) gave %+v", err, r)
			}
			return
		}
		if !strings.HasPrefix(p.Hash(), "sha256:") || !strings.HasPrefix(p.ReadSetHash(), "sha256:") {
			t.Fatalf("hashes %q %q", p.Hash(), p.ReadSetHash())
		}
		// A valid policy re-canonicalized is still valid with the same hash.
		canon, err := jcs.Canonicalize(policyDoc)
		if err != nil {
			t.Fatalf("valid policy does not canonicalize: %v", err)
		}
		p2, err := Parse(canon)
		if err != nil || p2.Hash() != p.Hash() || p2.ReadSetHash() != p.ReadSetHash() {
			t.Fatalf("canonical form parses differently: %v", err)
		}
		if s, err := SnapshotFromJSON(inputDoc); err == nil {
			r2 := p.Evaluate(s)
			if r2.Verdict != r.Verdict || r2.RuleFired != r.RuleFired || r2.Step != r.Step {
				t.Fatalf("Evaluate %+v != EvaluateJSON %+v", r2, r)
			}
			if h, err := InputsHash(s); err == nil && !strings.HasPrefix(h, "sha256:") {
				t.Fatalf("inputsHash %q", h)
			}
		}
	})
}

func TestCommit(t *testing.T) {
	p := mustParse(t, guardPolicy)
	s := Snapshot{"args.counterparty": String("0xabc"), "amountAtomic": Int(3000000), "history.settledCount": Int(0)}
	c, r, err := p.Commit(s)
	if err != nil {
		t.Fatal(err)
	}
	wantInputs, _ := InputsHash(s)
	want := Compliance{PolicyHash: p.Hash(), ReadSetHash: p.ReadSetHash(), InputsHash: wantInputs, Verdict: Deny}
	if c != want || r.RuleFired != "block-big-new" {
		t.Errorf("Commit = %+v, %+v; want %+v", c, r, want)
	}
	for name, bad := range map[string]Snapshot{
		"nil":        nil,
		"non-scalar": {"args.counterparty": scalarFromJSON(nil), "amountAtomic": Int(1)},
	} {
		c, r, err := p.Commit(bad)
		if err == nil || c != (Compliance{}) || r.Verdict != Deny {
			t.Errorf("%s: Commit = %+v, %+v, %v; want an error and DENY", name, c, r, err)
		}
	}
	var none *Policy
	if _, r, err := none.Commit(s); err == nil || r.RuleFired != FiredPolicyInvalid {
		t.Errorf("nil policy: %+v, %v", r, err)
	}
}
