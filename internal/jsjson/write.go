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
	var p Printer
	return p.AppendIndent(dst, v, prefix, indent)
}

// Printer is AppendIndent with its working memory kept between calls, for a
// caller that prints many values. The zero Printer is ready; it is not safe
// for concurrent use.
type Printer struct{ line []byte }

// AppendIndent is the package-level AppendIndent.
func (p *Printer) AppendIndent(dst []byte, v Value, prefix, indent string) []byte {
	w := writer{dst: dst, indent: indent, line: append(append(p.line[:0], '\n'), prefix...)}
	w.value(v)
	p.line = w.line
	return w.dst
}

type writer struct {
	dst    []byte
	indent string
	line   []byte // "\n" + current indentation
}

func (w *writer) value(v Value) {
	if v.d != nil && v.d.text {
		w.text(v.textSrc())
		return
	}
	switch v.Kind() {
	case Null:
		w.dst = append(w.dst, "null"...)
	case Bool:
		if b, _ := v.Bool(); b {
			w.dst = append(w.dst, "true"...)
		} else {
			w.dst = append(w.dst, "false"...)
		}
	case Number:
		f, _ := v.Num()
		w.dst = AppendNumber(w.dst, f)
	case String:
		s, _ := v.Str()
		w.dst = AppendString(w.dst, s)
	case Array:
		if v.e().b == 0 {
			w.dst = append(w.dst, '[', ']')
			return
		}
		w.dst = append(w.dst, '[')
		first := true
		w.open()
		v.eachRaw(func(i uint32) bool {
			w.sep(&first)
			w.value(Value{v.d, i})
			return true
		})
		w.close(']')
	case Object:
		if v.e().b == 0 {
			w.dst = append(w.dst, '{', '}')
			return
		}
		w.dst = append(w.dst, '{')
		first := true
		w.open()
		v.eachMember(func(key string, val Value) {
			w.sep(&first)
			w.dst = AppendString(w.dst, key)
			w.dst = append(w.dst, ':')
			if w.indent != "" {
				w.dst = append(w.dst, ' ')
			}
			w.value(val)
		})
		w.close('}')
	}
}

func (w *writer) open() { w.line = append(w.line, w.indent...) }

func (w *writer) sep(first *bool) {
	if !*first {
		w.dst = append(w.dst, ',')
	}
	*first = false
	if w.indent != "" {
		w.dst = append(w.dst, w.line...)
	}
}

func (w *writer) close(c byte) {
	w.line = w.line[:len(w.line)-len(w.indent)]
	if w.indent != "" {
		w.dst = append(w.dst, w.line...)
	}
	w.dst = append(w.dst, c)
}

// text writes a plain document (see Value.Plain) from its text: tokens are
// copied and only whitespace is rewritten. Plain strings hold no escapes, so
// each ends at the next '"'.
func (w *writer) text(s string) {
	for i := 0; i < len(s); {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '{', '[':
			j := i + 1
			for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r') {
				j++
			}
			if j < len(s) && (s[j] == '}' || s[j] == ']') {
				w.dst = append(w.dst, c, s[j])
				i = j + 1
				continue
			}
			w.dst = append(w.dst, c)
			w.open()
			if w.indent != "" {
				w.dst = append(w.dst, w.line...)
			}
			i = j
		case '}', ']':
			w.close(c)
			i++
		case ',':
			w.dst = append(w.dst, ',')
			if w.indent != "" {
				w.dst = append(w.dst, w.line...)
			}
			i++
		case ':':
			w.dst = append(w.dst, ':')
			if w.indent != "" {
				w.dst = append(w.dst, ' ')
			}
			i++
		case '"':
			end := i + 1 + strings.IndexByte(s[i+1:], '"')
			w.dst = append(w.dst, s[i:end+1]...)
			i = end + 1
		default: // a number or a literal
			j := i + 1
			for j < len(s) && !delimiter(s[j]) {
				j++
			}
			w.dst = append(w.dst, s[i:j]...)
			i = j
		}
	}
}

func delimiter(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}
