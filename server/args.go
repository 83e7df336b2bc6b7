package server

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// args reads a tool's arguments with messages an agent (or its operator)
// can act on, never Go type names.
type args struct {
	m    map[string]any
	errs []string
}

func newArgs(raw any, allowed ...string) *args {
	a := &args{}
	switch m := raw.(type) {
	case nil:
		a.m = map[string]any{}
	case map[string]any:
		a.m = m
	default:
		a.errs = append(a.errs, "arguments must be a JSON object")
		a.m = map[string]any{}
	}
	known := map[string]bool{}
	for _, k := range allowed {
		known[k] = true
	}
	var unknown []string
	for k := range a.m {
		if !known[k] {
			unknown = append(unknown, fmt.Sprintf("%q", k))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		a.errs = append(a.errs, fmt.Sprintf("unknown argument %s (accepted: %s)", strings.Join(unknown, ", "), strings.Join(allowed, ", ")))
	}
	return a
}

// str returns the string argument key, or def when it is absent.
func (a *args) str(key string, required bool, def string, maxLen int) string {
	v, ok := a.m[key]
	if !ok || v == nil {
		if required {
			a.errs = append(a.errs, fmt.Sprintf("%s is required", key))
		}
		return def
	}
	s, ok := v.(string)
	if !ok {
		a.errs = append(a.errs, fmt.Sprintf("%s must be a string", key))
		return def
	}
	if s == "" {
		// The schemas say so: an empty string is no value (leave an
		// optional argument out to get its default).
		if required {
			a.errs = append(a.errs, fmt.Sprintf("%s must not be empty", key))
		} else {
			a.errs = append(a.errs, fmt.Sprintf("%s must not be empty (leave it out for the default)", key))
		}
		return def
	}
	if !utf8.ValidString(s) {
		a.errs = append(a.errs, fmt.Sprintf("%s is not valid UTF-8", key))
		return def
	}
	if maxLen > 0 && len(s) > maxLen {
		a.errs = append(a.errs, fmt.Sprintf("%s is longer than %d bytes", key, maxLen))
		return def
	}
	return s
}

// question reads an argument of a guard question by the guard's own
// checks (guard.Arg): a JSON string, or, for the decimal amount, a JSON
// number taken exactly as the client wrote it (0.30 stays "0.30"; an
// exponent or a sign is left for the amount's own check to refuse, with its
// message). A number that reached the server only as a float (an
// in-process call) is refused, since its text is lost.
func (a *args) question(arg guard.Arg) string {
	v, present := a.m[arg.Name]
	var text string
	switch x := v.(type) {
	case nil:
		present = false
	case string:
		text = x
	case json.Number:
		if !arg.Decimal {
			a.errs = append(a.errs, fmt.Sprintf("%s must be a string", arg.Name))
			return ""
		}
		if msg := arg.CheckNumber(x.String()); msg != "" {
			a.errs = append(a.errs, msg)
			return ""
		}
		return x.String()
	case float64:
		if arg.Decimal {
			a.errs = append(a.errs, fmt.Sprintf("%s must be a decimal string such as \"0.25\" (its exact text is not known)", arg.Name))
		} else {
			a.errs = append(a.errs, fmt.Sprintf("%s must be a string", arg.Name))
		}
		return ""
	default:
		if arg.Decimal {
			a.errs = append(a.errs, fmt.Sprintf("%s must be a decimal string such as \"0.25\" or a JSON number", arg.Name))
		} else {
			a.errs = append(a.errs, fmt.Sprintf("%s must be a string", arg.Name))
		}
		return ""
	}
	if msg := arg.Check(text, present); msg != "" {
		a.errs = append(a.errs, msg)
		return ""
	}
	return text
}

// oneOf checks that a string argument, when present, is one of the choices.
func (a *args) oneOf(key, val string, choices ...string) {
	if val == "" {
		return
	}
	for _, c := range choices {
		if val == c {
			return
		}
	}
	a.errs = append(a.errs, fmt.Sprintf("%s must be one of %s (got %q)", key, strings.Join(choices, ", "), val))
}

// intIn returns the integer argument key within [lo, hi], or def when absent.
func (a *args) intIn(key string, def, lo, hi int) int {
	v, ok := a.m[key]
	if !ok || v == nil {
		return def
	}
	var f float64
	ok = true
	switch n := v.(type) {
	case json.Number:
		i, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil || i < int64(lo) || i > int64(hi) {
			a.errs = append(a.errs, fmt.Sprintf("%s must be an integer from %d to %d (got %s)", key, lo, hi, n))
			return def
		}
		return int(i)
	case float64:
		f = n
	case int:
		f = float64(n)
	case int64:
		f = float64(n)
	default:
		ok = false
	}
	if !ok {
		a.errs = append(a.errs, fmt.Sprintf("%s must be an integer from %d to %d", key, lo, hi))
		return def
	}
	if f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		a.errs = append(a.errs, fmt.Sprintf("%s must be an integer from %d to %d (got %v)", key, lo, hi, f))
		return def
	}
	return int(f)
}

// err joins every problem found, or returns "" when there was none.
// boolean reads an optional JSON true/false.
func (a *args) boolean(key string) bool {
	v, ok := a.m[key]
	if !ok || v == nil {
		return false
	}
	b, isBool := v.(bool)
	if !isBool {
		a.errs = append(a.errs, fmt.Sprintf("%s must be true or false", key))
	}
	return b
}

func (a *args) err() string {
	if len(a.errs) == 0 {
		return ""
	}
	return "invalid arguments: " + strings.Join(a.errs, "; ")
}
