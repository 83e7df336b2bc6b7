package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
)

// MaxSafeInteger is the largest magnitude an integer scalar may have
// (2^53-1): every JSON reader built on IEEE-754 doubles holds it exactly.
const MaxSafeInteger = 1<<53 - 1

// Kind is the type of a Scalar.
type Kind uint8

// The kinds of scalar. KindInvalid marks a value that is not a scalar (null,
// an array, an object, an unsafe integer, a string that is not UTF-8): it may
// sit in a Snapshot, and evaluating such a snapshot denies (§4 step 6).
const (
	KindInvalid Kind = iota
	KindString
	KindBool
	KindInt
)

func (k Kind) String() string {
	switch k {
	case KindString:
		return "string"
	case KindBool:
		return "boolean"
	case KindInt:
		return "integer"
	default:
		return "non-scalar"
	}
}

// Scalar is one value of an input snapshot or of a policy condition: a
// string, a boolean or a safe integer. The zero Scalar is not a scalar.
type Scalar struct {
	kind Kind
	s    string // the string value, or for KindInvalid what the value was
	n    int64
	b    bool
}

// String returns a string scalar. A string that is not valid UTF-8 cannot
// be written in a JSON document and is therefore not a scalar.
func String(s string) Scalar {
	if !utf8.ValidString(s) {
		return Scalar{kind: KindInvalid, s: "a string that is not valid UTF-8"}
	}
	return Scalar{kind: KindString, s: s}
}

// Bool returns a boolean scalar.
func Bool(b bool) Scalar { return Scalar{kind: KindBool, b: b} }

// Int returns an integer scalar; outside ±MaxSafeInteger it is not a scalar.
func Int(n int64) Scalar {
	if n > MaxSafeInteger || n < -MaxSafeInteger {
		return Scalar{kind: KindInvalid, s: "the integer " + strconv.FormatInt(n, 10) + " (outside ±(2^53-1))"}
	}
	return Scalar{kind: KindInt, n: n}
}

// Kind reports the scalar's type.
func (v Scalar) Kind() Kind { return v.kind }

// Valid reports whether v is a scalar the specification allows (§1.1).
func (v Scalar) Valid() bool { return v.kind != KindInvalid }

// Str, BoolValue and IntValue return the value of the matching kind (and the
// zero value otherwise).
func (v Scalar) Str() string {
	if v.kind != KindString {
		return ""
	}
	return v.s
}

// BoolValue returns the boolean of a KindBool scalar.
func (v Scalar) BoolValue() bool { return v.kind == KindBool && v.b }

// IntValue returns the integer of a KindInt scalar.
func (v Scalar) IntValue() int64 {
	if v.kind != KindInt {
		return 0
	}
	return v.n
}

// String renders the scalar as JSON would (for messages), or describes what
// a non-scalar was.
func (v Scalar) String() string {
	switch v.kind {
	case KindString:
		return strconv.Quote(v.s)
	case KindBool:
		return strconv.FormatBool(v.b)
	case KindInt:
		return strconv.FormatInt(v.n, 10)
	default:
		if v.s == "" {
			return "an unset value"
		}
		return v.s
	}
}

// jsonValue is the value jcs writes for the scalar.
func (v Scalar) jsonValue() (any, bool) {
	switch v.kind {
	case KindString:
		return v.s, true
	case KindBool:
		return v.b, true
	case KindInt:
		return v.n, true
	default:
		return nil, false
	}
}

// scalarFromJSON converts a value produced by jcs.Parse.
func scalarFromJSON(x any) Scalar {
	switch t := x.(type) {
	case string:
		return String(t)
	case bool:
		return Bool(t)
	case int64:
		return Int(t)
	case nil:
		return Scalar{kind: KindInvalid, s: "null"}
	case []any:
		return Scalar{kind: KindInvalid, s: "an array"}
	case map[string]any:
		return Scalar{kind: KindInvalid, s: "an object"}
	default:
		return Scalar{kind: KindInvalid, s: fmt.Sprintf("a %T", x)}
	}
}

// Snapshot is the flat input of an evaluation: opaque keys (never dotted
// paths) mapped to scalars. A nil Snapshot is "no map at all" and denies
// with input-invalid; an empty one is a map without keys.
type Snapshot map[string]Scalar

// Errors a caller can test for with errors.Is.
var (
	// ErrInputSyntax: the input bytes are not a strict JSON document (§4 step 2).
	ErrInputSyntax = errors.New("input snapshot is not a strict JSON document")
	// ErrInputNotObject: the input is JSON but not an object (§4 step 4).
	ErrInputNotObject = errors.New("input snapshot is not a JSON object")
	// ErrNotScalar: a snapshot value or key cannot be hashed or evaluated.
	ErrNotScalar = errors.New("input snapshot holds a value that is not a scalar")
)

// SnapshotFromJSON reads an input snapshot document (the --input file of
// `policy eval`). Members whose values are not scalars are kept as
// KindInvalid so that evaluation reports them in the normative order (a
// missing required path first, then the non-scalar).
func SnapshotFromJSON(data []byte) (Snapshot, error) {
	doc, err := jcs.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInputSyntax, err)
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: the top-level value is %s", ErrInputNotObject, scalarFromJSON(doc).describe())
	}
	s := make(Snapshot, len(obj))
	for k, x := range obj {
		s[k] = scalarFromJSON(x)
	}
	return s, nil
}

// describe names the type of a value for messages.
func (v Scalar) describe() string {
	if v.kind == KindInvalid {
		return v.String()
	}
	return "a " + v.kind.String()
}

// forbiddenKey reports keys that a strict NOA document may not carry; a
// snapshot holding one could never be re-read by another verifier.
func forbiddenKey(k string) bool {
	return k == "__proto__" || k == "prototype" || k == "constructor"
}

// checkDocument reports why s could not have come from a strict JSON
// document (bad keys, strings that are not UTF-8), or nil.
func (s Snapshot) checkDocument() error {
	for k, v := range s {
		if !utf8.ValidString(k) {
			return fmt.Errorf("%w: key %q is not valid UTF-8", ErrNotScalar, k)
		}
		if forbiddenKey(k) {
			return fmt.Errorf("%w: key %q is forbidden in NOA documents", ErrNotScalar, k)
		}
		if v.kind == KindString && !utf8.ValidString(v.s) {
			return fmt.Errorf("%w: the value of %q is not valid UTF-8", ErrNotScalar, k)
		}
	}
	return nil
}

// InputsHash is the inputsHash of the NOA compliance commitment (§6):
// "sha256:" and the hex SHA-256 of the RFC 8785 canonical JSON of the
// snapshot. It fails when the snapshot holds a non-scalar or a key no
// document could carry.
func InputsHash(s Snapshot) (string, error) {
	if s == nil {
		return "", fmt.Errorf("%w: the snapshot is nil", ErrInputNotObject)
	}
	if err := s.checkDocument(); err != nil {
		return "", err
	}
	m := make(map[string]any, len(s))
	for k, v := range s {
		x, ok := v.jsonValue()
		if !ok {
			return "", fmt.Errorf("%w: %q is %s", ErrNotScalar, k, v.describe())
		}
		m[k] = x
	}
	return hashJSON(m)
}

// hashJSON returns "sha256:<hex>" over the canonical bytes of v.
func hashJSON(v any) (string, error) {
	b, err := jcs.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("canonicalize for hashing: %w", err)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
