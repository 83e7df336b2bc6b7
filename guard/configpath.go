package guard

import (
	"slices"
	"strconv"
	"strings"
)

// Path is where a value is in a policy file, from its root: member names
// of the grammar (string, written .key), names the operator chose — a
// tenant, a caller, an asset (Name, written ["name"]) — and list indexes
// (int, written [i]).
type Path []any

// Name is a member name the operator chose, in a Path.
type Name string

// String is the path as the loader's messages name it:
// tenants["acme"].perCounterpartyLimit.amount, allowlist[2].
func (p Path) String() string {
	var b strings.Builder
	for i, s := range p {
		switch v := s.(type) {
		case string:
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(v)
		case Name:
			b.WriteString("[" + strconv.Quote(clip(string(v))) + "]")
		case int:
			b.WriteString("[" + strconv.Itoa(v) + "]")
		}
	}
	return b.String()
}

// JSONPath is the path from the document's root, $ first:
// $.tenants["acme"].reviewAbove, $ for the document itself.
func (p Path) JSONPath() string {
	if len(p) == 0 {
		return "$"
	}
	if _, ok := p[0].(string); ok {
		return "$." + p.String()
	}
	return "$" + p.String()
}

// with is p followed by segs, sharing nothing with p.
func (p Path) with(segs ...any) Path {
	return append(slices.Clip(slices.Clone(p)), segs...)
}

// ConfigProblem is one mistake in a policy file: where it is and what is
// wrong (Err wraps ErrConfig).
type ConfigProblem struct {
	Path Path
	Err  error
}

// ConfigErrors is every mistake the loader found in a policy file, in
// document order. Its message is theirs, joined.
type ConfigErrors []ConfigProblem

func (e ConfigErrors) Error() string {
	msgs := make([]string, len(e))
	for i, p := range e {
		msgs[i] = p.Err.Error()
	}
	return strings.Join(msgs, "; ")
}

// Unwrap gives each problem's error (each wraps ErrConfig).
func (e ConfigErrors) Unwrap() []error {
	out := make([]error, len(e))
	for i, p := range e {
		out[i] = p.Err
	}
	return out
}

// problems collects what a policy file gets wrong, so the loader goes on
// past the first mistake; a layer composed more than once (an agent in
// every tenant) reports each of its mistakes once.
type problems struct {
	list ConfigErrors
	seen map[string]bool
}

func (ps *problems) add(at Path, err error) {
	if err == nil {
		return
	}
	k := at.String() + "\x00" + err.Error()
	if ps.seen[k] {
		return
	}
	if ps.seen == nil {
		ps.seen = map[string]bool{}
	}
	ps.seen[k] = true
	ps.list = append(ps.list, ConfigProblem{Path: at, Err: err})
}

// count is how many problems were found so far.
func (ps *problems) count() int { return len(ps.list) }
