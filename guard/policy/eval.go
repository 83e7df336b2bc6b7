package policy

import (
	"errors"
	"fmt"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// ruleFired values the evaluator itself produces (§4). They are part of the
// conformance contract: no finer-grained identifiers may be added (F3).
const (
	FiredPolicyInvalid = "policy-invalid"
	FiredEvalError     = "eval-error"
	FiredInputInvalid  = "input-invalid"
	// FiredRequiredAbsentPrefix is followed by the first missing required path.
	FiredRequiredAbsentPrefix = "required-input-absent:"
)

// Step is the row of the specification's §4 table that decided a result.
type Step int

// The evaluation steps of §4, in their normative order.
const (
	StepPolicySyntax   Step = 1 // policy bytes do not parse → DENY policy-invalid
	StepInputSyntax    Step = 2 // input bytes do not parse → DENY eval-error
	StepPolicyInvalid  Step = 3 // policy breaks §2 → DENY policy-invalid
	StepInputNotMap    Step = 4 // input is not a map → DENY input-invalid
	StepRequiredAbsent Step = 5 // a required path is absent → DENY required-input-absent:<p>
	StepNotScalar      Step = 6 // an input value is not a scalar → DENY eval-error
	StepRuleMatched    Step = 7 // the first matching rule decides
	StepNoMatch        Step = 8 // no rule matched → DENY, ruleFired null
	StepEvalError      Step = 9 // an error while evaluating → DENY eval-error
)

// Result is the outcome of one evaluation.
type Result struct {
	// Verdict is Allow or Deny.
	Verdict string
	// RuleFired is the rule id or sentinel of §4; "" stands for JSON null
	// (no rule matched). Rule ids are never empty, so "" is unambiguous.
	RuleFired string
	// Step is the §4 row that decided.
	Step Step
	// Reason says in words why, for logs and guard reasons.
	Reason string
}

// Failed reports whether the result comes from a failure path (anything
// but a matched rule or the default verdict): the policy, the input or the
// evaluation was broken.
func (r Result) Failed() bool { return r.Step != StepRuleMatched && r.Step != StepNoMatch }

func deny(step Step, fired, format string, args ...any) Result {
	return Result{Verdict: Deny, RuleFired: fired, Step: step, Reason: fmt.Sprintf(format, args...)}
}

// EvaluateJSON runs the whole of §4 over two documents, as a verifier that
// holds only bytes would: evaluate(policyBytes, inputBytes).
func EvaluateJSON(policyDoc, inputDoc []byte) Result {
	p, perr := Parse(policyDoc)
	if perr != nil && errors.Is(perr, ErrSyntax) {
		return deny(StepPolicySyntax, FiredPolicyInvalid, "%v", perr)
	}
	s, ierr := SnapshotFromJSON(inputDoc)
	if ierr != nil && errors.Is(ierr, ErrInputSyntax) {
		return deny(StepInputSyntax, FiredEvalError, "%v", ierr)
	}
	if perr != nil {
		return deny(StepPolicyInvalid, FiredPolicyInvalid, "%v", perr)
	}
	if ierr != nil {
		return deny(StepInputNotMap, FiredInputInvalid, "%v", ierr)
	}
	return p.Evaluate(s)
}

// Evaluate runs steps 4 to 9 of §4 over a snapshot. It never panics and
// every failure denies. A nil or zero Policy is policy-invalid; a nil
// Snapshot is input-invalid; a snapshot that no strict JSON document could
// carry (a key such as "constructor", a string that is not UTF-8) is
// eval-error, as the input-parsing step would have made it.
func (p *Policy) Evaluate(s Snapshot) Result {
	if p == nil || p.hash == "" {
		return deny(StepPolicyInvalid, FiredPolicyInvalid, "no valid policy (only Parse makes one)")
	}
	if err := s.checkDocument(); err != nil {
		return deny(StepInputSyntax, FiredEvalError, "%v", err)
	}
	if s == nil {
		return deny(StepInputNotMap, FiredInputInvalid, "%v: the snapshot is nil", ErrInputNotObject)
	}
	for _, k := range p.requiredPaths {
		if _, ok := s[k]; !ok {
			return deny(StepRequiredAbsent, FiredRequiredAbsentPrefix+k, "required input %q is absent", k)
		}
	}
	// Step 6 looks at every key, read or not; report the least key so that
	// the reason does not depend on map order.
	bad := ""
	found := false
	for k, v := range s {
		if !v.Valid() && (!found || jsjson.CompareUTF16(k, bad) < 0) {
			bad, found = k, true
		}
	}
	if found {
		return deny(StepNotScalar, FiredEvalError, "input %q is %s, not a string, boolean or safe integer", bad, s[bad].describe())
	}
	for _, r := range p.rules {
		ok, err := r.when.match(s)
		if err != nil {
			return deny(StepEvalError, FiredEvalError, "rule %q: %v", r.id, err)
		}
		if ok {
			return Result{Verdict: r.then, RuleFired: r.id, Step: StepRuleMatched,
				Reason: fmt.Sprintf("rule %q matched: %s", r.id, r.then)}
		}
	}
	return deny(StepNoMatch, "", "no rule matched; the default verdict is DENY")
}

// match evaluates a condition left to right with short-circuit, as the
// reference does: an error in a clause that is never reached is no error.
func (c *cond) match(s Snapshot) (bool, error) {
	switch c.op {
	case "and":
		for _, x := range c.clauses {
			ok, err := x.match(s)
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	case "or":
		for _, x := range c.clauses {
			ok, err := x.match(s)
			if err != nil || ok {
				return ok, err
			}
		}
		return false, nil
	case "not":
		ok, err := c.clauses[0].match(s)
		return !ok, err
	case "exists":
		_, ok := s[c.path]
		return ok, nil
	case "absent":
		_, ok := s[c.path]
		return !ok, nil
	case "in":
		v, ok := s[c.path]
		if !ok {
			return false, nil // absence is not membership
		}
		for _, x := range c.values {
			k, err := compare(c.path, v, x)
			if err != nil {
				return false, err
			}
			if k == 0 {
				return true, nil
			}
		}
		return false, nil
	}
	v, ok := s[c.path]
	if !ok {
		return false, nil // absence is not inequality, not even for ne
	}
	k, err := compare(c.path, v, c.value)
	if err != nil {
		return false, err
	}
	switch c.op {
	case "eq":
		return k == 0, nil
	case "ne":
		return k != 0, nil
	case "lt":
		return k < 0, nil
	case "le":
		return k <= 0, nil
	case "gt":
		return k > 0, nil
	case "ge":
		return k >= 0, nil
	}
	return false, fmt.Errorf("unknown operator %q", c.op)
}

// compare orders two scalars of one type: integers numerically, false before
// true, strings by UTF-16 code units. Different types are an error (§3.1),
// never a quiet false.
func compare(path string, a, b Scalar) (int, error) {
	if a.kind != b.kind || !a.Valid() {
		return 0, fmt.Errorf("cannot compare input %q (%s) with %s %s", path, a.describe(), b.describe(), b)
	}
	switch a.kind {
	case KindInt:
		switch {
		case a.n < b.n:
			return -1, nil
		case a.n > b.n:
			return 1, nil
		}
		return 0, nil
	case KindBool:
		switch {
		case a.b == b.b:
			return 0, nil
		case !a.b:
			return -1, nil
		}
		return 1, nil
	default:
		return jsjson.CompareUTF16(a.s, b.s), nil
	}
}
