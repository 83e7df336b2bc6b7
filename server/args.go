package server

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"unicode/utf8"
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
func (a *args) err() string {
	if len(a.errs) == 0 {
		return ""
	}
	return "invalid arguments: " + strings.Join(a.errs, "; ")
}
