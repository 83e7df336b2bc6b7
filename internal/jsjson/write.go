package jsjson

import (
	"math"
	"strconv"
	"strings"
)

// FormatNumber prints f the way JavaScript's Number#toString does
// (shortest round-trip digits; exponent form below 1e-6 and from 1e21 up;
// -0 prints as "0"). NaN and ±Inf, which JSON cannot carry, print as "null",
// as JSON.stringify writes them.
func FormatNumber(f float64) string {
	return string(AppendNumber(nil, f))
}

// AppendNumber appends FormatNumber(f) to dst.
func AppendNumber(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	if f == 0 {
		return append(dst, '0')
	}
	// Small integers are the common case (seq, versions, amounts).
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.AppendInt(dst, int64(f), 10)
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // d[.ddd]e±XX
	var digits []byte
	i := 0
	for ; i < len(e) && e[i] != 'e'; i++ {
		if e[i] != '.' {
			digits = append(digits, e[i])
		}
	}
	exp, _ := strconv.Atoi(string(e[i+1:]))
	k := len(digits)
	n := exp + 1 // the decimal point sits after n digits
	switch {
	case k <= n && n <= 21:
		dst = append(dst, digits...)
		for j := 0; j < n-k; j++ {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21:
		dst = append(dst, digits[:n]...)
		dst = append(dst, '.')
		dst = append(dst, digits[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for j := 0; j < -n; j++ {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	default:
		dst = append(dst, digits[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, digits[1:]...)
		}
		dst = append(dst, 'e')
		if n-1 >= 0 {
			dst = append(dst, '+')
		}
		dst = strconv.AppendInt(dst, int64(n-1), 10)
	}
	return dst
}

// AppendIndent appends v as JSON.stringify(v, null, indent) writes it, with
// every line after the first starting with prefix (the caller's current
// indentation, for values nested in hand-written output). An empty indent
// gives the compact form.
func AppendIndent(dst []byte, v Value, prefix, indent string) []byte {
	var w Indenter
	w.Reset(dst, prefix, indent)
	w.Value(v)
	return w.Buf
}

// Indenter writes JSON in the layout of JSON.stringify(v, null, indent),
// piece by piece: a document a caller builds by hand (Open, Key, Item,
// Close, and scalars appended to Buf with AppendString or AppendNumber)
// and the parsed values it holds (Value) are laid out by this one printer.
// Reset starts a document; the Indenter keeps its working memory between
// documents. It is not safe for concurrent use.
type Indenter struct {
	// Buf is what has been written. A caller appends scalars to it, and
	// may hand it on and truncate it between pieces.
	Buf    []byte
	indent string
	line   []byte // "\n" + the current indentation
}

// Reset starts a document in dst, indented by indent per level (the
// compact form when empty), every line after the first starting with
// prefix.
func (w *Indenter) Reset(dst []byte, prefix, indent string) {
	w.Buf, w.indent = dst, indent
	w.line = append(append(w.line[:0], '\n'), prefix...)
}

// Prefix is the current indentation.
func (w *Indenter) Prefix() string { return string(w.line[1:]) }

// Open starts an object ('{') or an array ('[') with at least one
// element; an empty one is written whole ("{}", "[]").
func (w *Indenter) Open(c byte) {
	w.Buf = append(w.Buf, c)
	w.line = append(w.line, w.indent...)
}

// Close ends what Open started ('}' or ']').
func (w *Indenter) Close(c byte) {
	w.line = w.line[:len(w.line)-len(w.indent)]
	if w.indent != "" {
		w.Buf = append(w.Buf, w.line...)
	}
	w.Buf = append(w.Buf, c)
}

// Item starts the n-th element (from 0) of an array.
func (w *Indenter) Item(n int) {
	if n > 0 {
		w.Buf = append(w.Buf, ',')
	}
	if w.indent != "" {
		w.Buf = append(w.Buf, w.line...)
	}
}

// Key starts the n-th member (from 0) of an object: its name, and the
// value comes next.
func (w *Indenter) Key(n int, key string) {
	w.Item(n)
	w.Buf = AppendString(w.Buf, key)
	w.Buf = append(w.Buf, ':')
	if w.indent != "" {
		w.Buf = append(w.Buf, ' ')
	}
}

// QuotedKey is Key for a name already written as a JSON string literal
// followed by ':' (`"name":`), as a caller's constant member names are:
// it is copied, not escaped again.
func (w *Indenter) QuotedKey(n int, quoted string) {
	w.Item(n)
	w.Buf = append(w.Buf, quoted...)
	if w.indent != "" {
		w.Buf = append(w.Buf, ' ')
	}
}

// Value writes a parsed value at the current indentation.
func (w *Indenter) Value(v Value) {
	if v.d != nil && v.d.text {
		w.text(v.d.src[v.i:])
		return
	}
	switch v.Kind() {
	case Null:
		w.Buf = append(w.Buf, "null"...)
	case Bool:
		if b, _ := v.Bool(); b {
			w.Buf = append(w.Buf, "true"...)
		} else {
			w.Buf = append(w.Buf, "false"...)
		}
	case Number:
		f, _ := v.Num()
		w.Buf = AppendNumber(w.Buf, f)
	case String:
		s, _ := v.Str()
		w.Buf = AppendString(w.Buf, s)
	case Array:
		if v.e().b == 0 {
			w.Buf = append(w.Buf, '[', ']')
			return
		}
		w.Open('[')
		n := 0
		v.eachRaw(func(i uint32) bool {
			w.Item(n)
			n++
			w.Value(Value{v.d, i})
			return true
		})
		w.Close(']')
	case Object:
		if v.e().b == 0 {
			w.Buf = append(w.Buf, '{', '}')
			return
		}
		w.Open('{')
		n := 0
		v.eachMember(func(key string, val Value) {
			w.Key(n, key)
			n++
			w.Value(val)
		})
		w.Close('}')
	}
}

// text writes a plain document (see Value.Plain) from its text, which
// runs to the next '\n' or the end of s: tokens are copied and only
// whitespace is rewritten. Plain strings hold no escapes, so each ends at
// the next '"'. The line's end is found on the way rather than first, and
// a key is copied with its ':' in one piece.
func (w *Indenter) text(s string) {
	buf, line, spaced := w.Buf, w.line, w.indent != ""
	for i := 0; i < len(s); {
		switch c := s[i]; c {
		case '\n':
			i = len(s)
		case ' ', '\t', '\r':
			i++
		case '"':
			j := i + 1 + strings.IndexByte(s[i+1:], '"')
			if j+1 < len(s) && s[j+1] == ':' {
				// A key (in a compact line, its ':' follows at once).
				buf = append(buf, s[i:j+2]...)
				if spaced {
					buf = append(buf, ' ')
				}
				i = j + 2
				continue
			}
			buf = append(buf, s[i:j+1]...)
			i = j + 1
		case '{', '[':
			j := i + 1
			for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\r') {
				j++
			}
			if j < len(s) && (s[j] == '}' || s[j] == ']') {
				buf = append(buf, c, s[j])
				i = j + 1
				continue
			}
			buf = append(buf, c)
			line = append(line, w.indent...)
			if spaced {
				buf = append(buf, line...)
			}
			i = j
		case '}', ']':
			// Never below the prefix, even for text changed since it was
			// parsed (a mapped file rewritten: its reader finds out).
			line = line[:max(len(line)-len(w.indent), 1)]
			if spaced {
				buf = append(buf, line...)
			}
			buf = append(buf, c)
			i++
		case ',':
			buf = append(buf, ',')
			if spaced {
				buf = append(buf, line...)
			}
			i++
		case ':':
			buf = append(buf, ':')
			if spaced {
				buf = append(buf, ' ')
			}
			i++
		default: // a number or a literal
			j := i + 1
			for j < len(s) && !delimiter(s[j]) {
				j++
			}
			buf = append(buf, s[i:j]...)
			i = j
		}
	}
	w.Buf, w.line = buf, line
}

func delimiter(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}
