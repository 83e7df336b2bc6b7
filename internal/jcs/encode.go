package jcs

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// Canonicalize returns the RFC 8785 canonical form of one JSON document,
// after the strict checks of Parse.
func Canonicalize(data []byte) ([]byte, error) {
	v, err := Parse(data)
	if err != nil {
		return nil, err
	}
	return Append(make([]byte, 0, len(data)), v)
}

// Marshal returns the canonical bytes of a Go value. The values Parse
// produces (map[string]any, []any, string, integers, bool, nil) are written
// directly, with strings checked for valid UTF-8; integral floats are
// accepted, other floats refused. Any other type (structs, typed maps and
// slices, json.Marshaler) goes through encoding/json first and is then
// canonicalized under the same rules; note that encoding/json turns invalid
// UTF-8 inside such values into U+FFFD instead of failing.
func Marshal(v any) ([]byte, error) {
	return Append(nil, v)
}

// Append appends the canonical bytes of v to dst; see Marshal.
func Append(dst []byte, v any) ([]byte, error) {
	return appendValue(dst, v, 0, "$")
}

func appendValue(dst []byte, v any, depth int, path string) ([]byte, error) {
	if depth > MaxDepth {
		return nil, fmt.Errorf("jcs: %s: nesting deeper than %d levels", path, MaxDepth)
	}
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		if x {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case string:
		if !utf8.ValidString(x) {
			return nil, fmt.Errorf("jcs: %s: string is not valid UTF-8 (unpaired surrogate or bad byte)", path)
		}
		return jsjson.AppendString(dst, x), nil
	case int:
		return appendInt(dst, int64(x), path)
	case int8:
		return appendInt(dst, int64(x), path)
	case int16:
		return appendInt(dst, int64(x), path)
	case int32:
		return appendInt(dst, int64(x), path)
	case int64:
		return appendInt(dst, x, path)
	case uint:
		return appendUint(dst, uint64(x), path)
	case uint8:
		return appendUint(dst, uint64(x), path)
	case uint16:
		return appendUint(dst, uint64(x), path)
	case uint32:
		return appendUint(dst, uint64(x), path)
	case uint64:
		return appendUint(dst, x, path)
	case float32:
		return appendFloat(dst, float64(x), path)
	case float64:
		return appendFloat(dst, x, path)
	case json.Number:
		n, err := strconv.ParseInt(string(x), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("jcs: %s: number %s is not an integer in the safe range", path, x)
		}
		return appendInt(dst, n, path)
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			if !utf8.ValidString(k) {
				return nil, fmt.Errorf("jcs: %s: object key %q is not valid UTF-8", path, k)
			}
			keys = append(keys, k)
		}
		slices.SortFunc(keys, jsjson.CompareUTF16)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = jsjson.AppendString(dst, k)
			dst = append(dst, ':')
			var err error
			if dst, err = appendValue(dst, x[k], depth+1, path+"."+k); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	case []any:
		dst = append(dst, '[')
		for i, e := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendValue(dst, e, depth+1, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("jcs: %s: %w", path, err)
		}
		tree, err := Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("jcs: %s (a %T): %w", path, v, err)
		}
		return appendValue(dst, tree, depth, path)
	}
}

func appendInt(dst []byte, n int64, path string) ([]byte, error) {
	if n > MaxSafeInteger || n < -MaxSafeInteger {
		return nil, fmt.Errorf("jcs: %s: integer %d outside the safe range ±(2^53-1)", path, n)
	}
	return strconv.AppendInt(dst, n, 10), nil
}

func appendUint(dst []byte, n uint64, path string) ([]byte, error) {
	if n > MaxSafeInteger {
		return nil, fmt.Errorf("jcs: %s: integer %d outside the safe range ±(2^53-1)", path, n)
	}
	return strconv.AppendUint(dst, n, 10), nil
}

func appendFloat(dst []byte, f float64, path string) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f) {
		return nil, fmt.Errorf("jcs: %s: non-integer number %v not allowed", path, f)
	}
	if math.Abs(f) > MaxSafeInteger {
		return nil, fmt.Errorf("jcs: %s: integer %v outside the safe range ±(2^53-1)", path, f)
	}
	// int64(-0.0) is 0, which is how JCS writes negative zero.
	return strconv.AppendInt(dst, int64(f), 10), nil
}
