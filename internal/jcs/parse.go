// Package jcs implements RFC 8785 JSON canonicalization with the hardening
// that the NOA receipt v0.1 specification (§4) freezes: integers only (in the
// IEEE-754 safe range), duplicate object keys refused, unpaired UTF-16
// surrogates and invalid UTF-8 refused, prototype-pollution keys refused on
// parse, nesting depth and input size bounded.
//
// Canonical bytes feed hashes and signatures, so any disagreement between a
// producer and a verifier would be a forgery channel; this package therefore
// refuses whatever it cannot represent exactly instead of guessing.
package jcs

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

const (
	// MaxDepth is the deepest nesting accepted: the top-level value is at
	// depth 0, so MaxDepth+1 nested containers are the most a document holds.
	MaxDepth = 64
	// MaxSize bounds the input of Parse and Canonicalize (16 MiB).
	MaxSize = 16 << 20
	// MaxSafeInteger is 2^53-1, the largest integer every JSON reader that
	// uses IEEE-754 doubles holds exactly.
	MaxSafeInteger = 1<<53 - 1
)

// SyntaxError reports why and where (byte offset into the input) a document
// was refused.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("jcs: %s at byte %d", e.Msg, e.Offset)
}

// forbiddenKeys are refused as object keys on parse: a JavaScript verifier
// reading them into a plain object would pollute its prototype chain, so NOA
// bans them outright.
var forbiddenKeys = map[string]bool{"__proto__": true, "prototype": true, "constructor": true}

// Parse decodes one strict JSON document into map[string]any, []any, string,
// int64, bool or nil. It refuses everything NOA forbids: duplicate keys,
// forbidden keys, fractions, exponents, integers outside the safe range,
// unpaired surrogates, invalid UTF-8, control characters in strings,
// nesting deeper than MaxDepth, inputs larger than MaxSize, and anything
// but whitespace after the value.
func Parse(data []byte) (any, error) {
	return ParseLimit(data, MaxSize)
}

// ParseLimit is Parse with another size limit, for documents that hold
// many values (a chain of receipts in one JSON array).
func ParseLimit(data []byte, limit int) (any, error) {
	if len(data) > limit {
		return nil, &SyntaxError{Offset: limit, Msg: fmt.Sprintf("input of %d bytes exceeds the limit of %d bytes", len(data), limit)}
	}
	p := parser{data: data}
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.fail("trailing characters after the JSON value")
	}
	return v, nil
}

type parser struct {
	data []byte
	pos  int
}

func (p *parser) fail(format string, args ...any) error {
	return &SyntaxError{Offset: p.pos, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (any, error) {
	if depth > MaxDepth {
		return nil, p.fail("nesting deeper than %d levels", MaxDepth)
	}
	p.skipSpace()
	if p.pos >= len(p.data) {
		return nil, p.fail("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.str()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		return nil, p.fail("unexpected character %q", rune(c))
	}
}

func (p *parser) literal(word string) error {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return p.fail("invalid literal (expected %s)", word)
	}
	p.pos += len(word)
	return nil
}

func (p *parser) object(depth int) (any, error) {
	p.pos++ // '{'
	obj := map[string]any{}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return obj, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, p.fail("expected a string object key")
		}
		keyAt := p.pos
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		if forbiddenKeys[key] {
			return nil, &SyntaxError{Offset: keyAt, Msg: fmt.Sprintf("forbidden object key %q", key)}
		}
		if _, dup := obj[key]; dup {
			return nil, &SyntaxError{Offset: keyAt, Msg: fmt.Sprintf("duplicate object key %q", key)}
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, p.fail("expected ':' after object key %q", key)
		}
		p.pos++
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		obj[key] = v
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.fail("unterminated object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return obj, nil
		default:
			return nil, p.fail("expected ',' or '}' in object")
		}
	}
}

func (p *parser) array(depth int) (any, error) {
	p.pos++ // '['
	arr := []any{}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return arr, nil
	}
	for {
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		arr = append(arr, v)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.fail("unterminated array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return arr, nil
		default:
			return nil, p.fail("expected ',' or ']' in array")
		}
	}
}

func (p *parser) number() (any, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.data) && p.data[p.pos] == '0':
		p.pos++
	case p.pos < len(p.data) && p.data[p.pos] >= '1' && p.data[p.pos] <= '9':
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
		}
	default:
		return nil, p.fail("invalid number")
	}
	if p.pos < len(p.data) {
		switch p.data[p.pos] {
		case '.', 'e', 'E':
			return nil, &SyntaxError{Offset: start, Msg: "non-integer number (fraction or exponent) not allowed"}
		}
	}
	text := string(p.data[start:p.pos])
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n > MaxSafeInteger || n < -MaxSafeInteger {
		return nil, &SyntaxError{Offset: start, Msg: fmt.Sprintf("integer %s outside the safe range ±(2^53-1)", text)}
	}
	return n, nil
}

// str decodes a string token, refusing control characters, invalid UTF-8,
// bad escapes and unpaired surrogates.
func (p *parser) str() (string, error) {
	p.pos++ // opening quote
	var out []byte
	for {
		if p.pos >= len(p.data) {
			return "", p.fail("unterminated string")
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(out), nil
		case c == '\\':
			if err := p.escape(&out); err != nil {
				return "", err
			}
		case c < 0x20:
			return "", p.fail("unescaped control character U+%04X in string", c)
		case c < utf8.RuneSelf:
			out = append(out, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size == 1 {
				return "", p.fail("invalid UTF-8 in string (an unpaired surrogate or a bad byte)")
			}
			out = append(out, p.data[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

func (p *parser) escape(out *[]byte) error {
	at := p.pos
	p.pos++ // backslash
	if p.pos >= len(p.data) {
		return p.fail("unterminated escape")
	}
	e := p.data[p.pos]
	p.pos++
	switch e {
	case '"', '\\', '/':
		*out = append(*out, e)
	case 'b':
		*out = append(*out, '\b')
	case 'f':
		*out = append(*out, '\f')
	case 'n':
		*out = append(*out, '\n')
	case 'r':
		*out = append(*out, '\r')
	case 't':
		*out = append(*out, '\t')
	case 'u':
		u, err := p.hex4()
		if err != nil {
			return err
		}
		r := rune(u)
		switch {
		case utf16.IsSurrogate(r) && r < 0xDC00:
			// A high surrogate must be followed at once by an escaped low one.
			if len(p.data)-p.pos < 2 || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
				return &SyntaxError{Offset: at, Msg: fmt.Sprintf("unpaired surrogate \\u%04x in string", u)}
			}
			p.pos += 2
			lo, err := p.hex4()
			if err != nil {
				return err
			}
			if lo < 0xDC00 || lo > 0xDFFF {
				return &SyntaxError{Offset: at, Msg: fmt.Sprintf("unpaired surrogate \\u%04x in string", u)}
			}
			r = utf16.DecodeRune(r, rune(lo))
		case utf16.IsSurrogate(r):
			return &SyntaxError{Offset: at, Msg: fmt.Sprintf("unpaired surrogate \\u%04x in string", u)}
		}
		*out = utf8.AppendRune(*out, r)
	default:
		return &SyntaxError{Offset: at, Msg: fmt.Sprintf("invalid escape \\%c", e)}
	}
	return nil
}

func (p *parser) hex4() (uint16, error) {
	if len(p.data)-p.pos < 4 {
		return 0, p.fail("invalid \\u escape")
	}
	var u uint16
	for _, c := range p.data[p.pos : p.pos+4] {
		u <<= 4
		switch {
		case c >= '0' && c <= '9':
			u |= uint16(c - '0')
		case c >= 'a' && c <= 'f':
			u |= uint16(c-'a') + 10
		case c >= 'A' && c <= 'F':
			u |= uint16(c-'A') + 10
		default:
			return 0, p.fail("invalid \\u escape")
		}
	}
	p.pos += 4
	return u, nil
}
