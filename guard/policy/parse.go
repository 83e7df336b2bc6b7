package policy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// SpecVersion is the only value the spec member of a policy may hold.
const SpecVersion = "noa.policy/0.2"

// MaxDepth is this evaluator's nesting bound (spec §2.8, finding F6): no
// value of a policy document may lie more than MaxDepth levels below the top
// (the policy object is level 0; every object member and array element is one
// level deeper than its container). It is the bound of NOA's canonical JSON,
// and the one the conformance vectors pin: a rule of 50 nested `not`s is
// accepted, one of 62 is not. The same bound applies to input documents.
const MaxDepth = jcs.MaxDepth

// MaxDocumentBytes bounds a policy or input document.
const MaxDocumentBytes = jcs.MaxSize

// Verdicts.
const (
	Allow = "ALLOW"
	Deny  = "DENY"
)

// Errors a caller can test for with errors.Is on a Parse error.
var (
	// ErrSyntax: the bytes are not a strict JSON document (§4 step 1).
	ErrSyntax = errors.New("policy is not a strict JSON document")
	// ErrInvalid: the document breaks a validity rule of §2 (§4 step 3).
	ErrInvalid = errors.New("policy breaks the noa.policy/0.2 grammar")
)

// Problem is one broken validity rule: where (a JSON path such as
// $.rules[0].when.and[1].path), which rule of the specification's §2, and what.
type Problem struct {
	Path string
	Rule string
	Msg  string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s: %s (%s)", p.Path, p.Msg, p.Rule)
}

// Error is what Parse returns: either a syntax error (Problems empty, Err
// set) or the list of broken validity rules, in document order.
type Error struct {
	Syntax   error
	Problems []Problem
}

func (e *Error) Error() string {
	if e.Syntax != nil {
		return fmt.Sprintf("%s (noa.policy/0.2 §4 step 1): %v", ErrSyntax, e.Syntax)
	}
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return fmt.Sprintf("%s: %s", ErrInvalid, strings.Join(parts, "; "))
}

// Is lets errors.Is tell the two stages apart.
func (e *Error) Is(target error) bool {
	if e.Syntax != nil {
		return target == ErrSyntax
	}
	return target == ErrInvalid
}

// Unwrap exposes the syntax error, if any.
func (e *Error) Unwrap() error { return e.Syntax }

// Validity rules of the specification's §2, named in problems.
const (
	ruleSpec       = "§2.1 spec"
	ruleID         = "§2.2 policy id"
	ruleRequired   = "§2.3 requiredPaths"
	ruleRules      = "§2.4 rules"
	ruleThen       = "§2.5 then"
	ruleOp         = "§2.6 op and its members"
	ruleClosed     = "§2.7 closed grammar"
	ruleClauses    = "§2.9 clauses"
	rulePath       = "§2.10 path"
	ruleValues     = "§2.11 values"
	ruleValue      = "§2.12 value"
	ruleUniqueRule = "§2.13 unique rule ids"
)

// Policy is a parsed, valid noa.policy/0.2 document. Only Parse makes one;
// a zero Policy evaluates to policy-invalid.
type Policy struct {
	id            string
	requiredPaths []string
	rules         []rule
	readSet       []string
	hash          string
	readSetHash   string
}

type rule struct {
	id   string
	when *cond
	then string
}

// cond is one condition; which fields are used depends on op.
type cond struct {
	op      string
	path    string   // comparisons, in, exists, absent
	value   Scalar   // comparisons
	values  []Scalar // in
	clauses []*cond  // and, or; not holds its one clause here
}

// Parse reads and validates a policy document. The error is an *Error that
// names every broken rule with its JSON path.
func Parse(data []byte) (*Policy, error) {
	doc, err := jcs.Parse(data)
	if err != nil {
		return nil, &Error{Syntax: err}
	}
	v := validator{}
	p := v.policy(doc)
	if len(v.problems) > 0 {
		return nil, &Error{Problems: v.problems}
	}
	// A valid document is exactly representable (closed grammar, scalars
	// only where allowed), so its canonical form is the policy's identity.
	if p.hash, err = hashJSON(doc); err != nil {
		return nil, &Error{Problems: []Problem{{Path: "$", Rule: "§5.1 policyHash", Msg: err.Error()}}}
	}
	p.readSet = readSetOf(p)
	rs := make([]any, len(p.readSet))
	for i, s := range p.readSet {
		rs[i] = s
	}
	if p.readSetHash, err = hashJSON(rs); err != nil {
		return nil, &Error{Problems: []Problem{{Path: "$", Rule: "§5.2 readSetHash", Msg: err.Error()}}}
	}
	return p, nil
}

// ID is the policy's id member.
func (p *Policy) ID() string { return p.id }

// Hash is the policyHash: "sha256:" and the hex SHA-256 of the policy's
// canonical JSON (§5.1).
func (p *Policy) Hash() string { return p.hash }

// ReadSet is every input key the policy may consult: requiredPaths and every
// leaf condition's path, deduplicated and in UTF-16 order (§5.2). It is a
// static over-approximation, not what an evaluation read.
func (p *Policy) ReadSet() []string { return slices.Clone(p.readSet) }

// ReadSetHash is "sha256:" and the hex SHA-256 of the canonical JSON of
// ReadSet (§5.2).
func (p *Policy) ReadSetHash() string { return p.readSetHash }

// RequiredPaths are the keys every snapshot must hold, in policy order.
func (p *Policy) RequiredPaths() []string { return slices.Clone(p.requiredPaths) }

// RuleIDs lists the rule ids in evaluation order.
func (p *Policy) RuleIDs() []string {
	ids := make([]string, len(p.rules))
	for i, r := range p.rules {
		ids[i] = r.id
	}
	return ids
}

func readSetOf(p *Policy) []string {
	set := map[string]bool{}
	for _, k := range p.requiredPaths {
		set[k] = true
	}
	var walk func(c *cond)
	walk = func(c *cond) {
		if c.clauses != nil {
			for _, x := range c.clauses {
				walk(x)
			}
			return
		}
		set[c.path] = true
	}
	for _, r := range p.rules {
		walk(r.when)
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.SortFunc(out, jsjson.CompareUTF16)
	return out
}

// validator walks the generic document, collecting problems and building the
// typed policy; recursion is bounded because jcs.Parse bounds nesting.
type validator struct {
	problems []Problem
}

func (v *validator) fail(path, rule, format string, args ...any) {
	v.problems = append(v.problems, Problem{Path: path, Rule: rule, Msg: fmt.Sprintf(format, args...)})
}

// closed reports every key of obj outside allowed, in UTF-16 order so that
// messages are stable.
func (v *validator) closed(obj map[string]any, path string, allowed ...string) {
	var extra []string
	for k := range obj {
		if !slices.Contains(allowed, k) {
			extra = append(extra, k)
		}
	}
	slices.SortFunc(extra, jsjson.CompareUTF16)
	for _, k := range extra {
		v.fail(path, ruleClosed, "unknown key %q (allowed: %s)", k, strings.Join(allowed, ", "))
	}
}

func (v *validator) policy(doc any) *Policy {
	obj, ok := doc.(map[string]any)
	if !ok {
		v.fail("$", ruleSpec, "a policy must be a JSON object, not %s", scalarFromJSON(doc).describe())
		return nil
	}
	v.closed(obj, "$", "spec", "id", "requiredPaths", "rules")
	p := &Policy{}
	if s, ok := obj["spec"].(string); !ok || s != SpecVersion {
		v.fail("$.spec", ruleSpec, "must be exactly %q", SpecVersion)
	}
	if s, ok := obj["id"].(string); !ok || s == "" {
		v.fail("$.id", ruleID, "must be a non-empty string")
	} else {
		p.id = s
	}
	if arr, ok := obj["requiredPaths"].([]any); !ok {
		v.fail("$.requiredPaths", ruleRequired, "must be an array of non-empty strings")
	} else {
		p.requiredPaths = make([]string, 0, len(arr))
		for i, x := range arr {
			if s, ok := x.(string); !ok || s == "" {
				v.fail("$.requiredPaths["+strconv.Itoa(i)+"]", ruleRequired, "must be a non-empty string")
			} else {
				p.requiredPaths = append(p.requiredPaths, s)
			}
		}
	}
	arr, ok := obj["rules"].([]any)
	if !ok {
		v.fail("$.rules", ruleRules, "must be an array")
		return p
	}
	seen := map[string]bool{}
	for i, x := range arr {
		path := "$.rules[" + strconv.Itoa(i) + "]"
		ro, ok := x.(map[string]any)
		if !ok {
			v.fail(path, ruleRules, "a rule must be an object with id, when, then")
			continue
		}
		v.closed(ro, path, "id", "when", "then")
		r := rule{}
		if s, ok := ro["id"].(string); !ok || s == "" {
			v.fail(path+".id", ruleRules, "must be a non-empty string")
		} else if seen[s] {
			v.fail(path+".id", ruleUniqueRule, "duplicate rule id %q", s)
		} else {
			seen[s] = true
			r.id = s
		}
		if s, ok := ro["then"].(string); !ok || (s != Allow && s != Deny) {
			v.fail(path+".then", ruleThen, "must be exactly %q or %q", Allow, Deny)
		} else {
			r.then = s
		}
		r.when = v.condition(ro["when"], path+".when")
		p.rules = append(p.rules, r)
	}
	return p
}

func (v *validator) condition(x any, path string) *cond {
	obj, ok := x.(map[string]any)
	if !ok {
		what := "nothing (missing or null)"
		if x != nil {
			what = scalarFromJSON(x).describe()
		}
		v.fail(path, ruleOp, "must be a condition object, found %s", what)
		return nil
	}
	op, ok := obj["op"].(string)
	if !ok {
		v.fail(path+".op", ruleOp, "must be a string naming the operator")
		return nil
	}
	c := &cond{op: op}
	switch op {
	case "and", "or":
		v.closed(obj, path, "op", "clauses")
		arr, ok := obj["clauses"].([]any)
		if !ok || len(arr) == 0 {
			v.fail(path+".clauses", ruleClauses, "%s needs a non-empty array of conditions", op)
			return c
		}
		c.clauses = make([]*cond, 0, len(arr))
		for i, y := range arr {
			c.clauses = append(c.clauses, v.condition(y, path+".clauses["+strconv.Itoa(i)+"]"))
		}
	case "not":
		v.closed(obj, path, "op", "clause")
		c.clauses = []*cond{v.condition(obj["clause"], path+".clause")}
	case "exists", "absent":
		v.closed(obj, path, "op", "path")
		c.path = v.path(obj, path)
	case "in":
		v.closed(obj, path, "op", "path", "values")
		c.path = v.path(obj, path)
		arr, ok := obj["values"].([]any)
		if !ok || len(arr) == 0 {
			v.fail(path+".values", ruleValues, "in needs a non-empty array of scalars")
			return c
		}
		first := KindInvalid
		for i, y := range arr {
			s := scalarFromJSON(y)
			at := path + ".values[" + strconv.Itoa(i) + "]"
			switch {
			case !s.Valid():
				v.fail(at, ruleValues, "must be a string, boolean or safe integer, not %s", s.describe())
			case first == KindInvalid:
				first = s.kind
			case s.kind != first:
				v.fail(at, ruleValues, "mixed scalar types (%s after %s): membership has no defined comparison", s.kind, first)
			}
			c.values = append(c.values, s)
		}
	case "eq", "ne", "lt", "le", "gt", "ge":
		v.closed(obj, path, "op", "path", "value")
		c.path = v.path(obj, path)
		val, present := obj["value"]
		s := scalarFromJSON(val)
		if !present {
			v.fail(path+".value", ruleValue, "missing: %s needs a string, boolean or safe integer", op)
		} else if !s.Valid() {
			v.fail(path+".value", ruleValue, "must be a string, boolean or safe integer, not %s", s.describe())
		}
		c.value = s
	default:
		v.fail(path+".op", ruleOp, "unknown operator %q (allowed: eq ne lt le gt ge in exists absent and or not)", op)
	}
	return c
}

func (v *validator) path(obj map[string]any, at string) string {
	s, ok := obj["path"].(string)
	if !ok || s == "" {
		v.fail(at+".path", rulePath, "must be a non-empty string")
	}
	return s
}
