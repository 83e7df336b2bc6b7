// Package jsjson reproduces the parts of JavaScript's JSON behaviour that the
// product must match byte for byte: string escaping, number printing and
// string ordering by UTF-16 code units.
package jsjson

import (
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string literal the way JSON.stringify
// writes it: only '"', '\\', control characters and lone surrogates are
// escaped; everything else (including '<', '&', U+2028, astral characters) is
// kept as is. A lone surrogate is carried in Go strings as its WTF-8 bytes
// (ED A0..BF xx), which is how this package's parser stores a "\ud800"
// escape; it is written back as a \uXXXX escape, as JSON.stringify does.
// Other invalid UTF-8 bytes cannot exist in a JavaScript string; they are
// written as U+FFFD, which is what a JavaScript decoder turns them into.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	i := 0
	for i+8 <= len(s) && plainWord(load8(s, i)) {
		i += 8
	}
	for i < len(s) {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"':
				dst = append(dst, '\\', '"')
			case '\\':
				dst = append(dst, '\\', '\\')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			if u, ok := surrogateAt(s, i); ok {
				dst = append(dst, '\\', 'u', hexDigits[u>>12], hexDigits[u>>8&0xf], hexDigits[u>>4&0xf], hexDigits[u&0xf])
				i += 3
			} else {
				dst = append(dst, "\ufffd"...)
				i++
			}
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// CompareUTF16 orders two strings the way JavaScript's < does: by UTF-16
// code units, not by code points or bytes. It returns -1, 0 or +1.
func CompareUTF16(a, b string) int {
	// Fast path: skip the common prefix; where the first differing bytes are
	// both ASCII, byte order is UTF-16 order.
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	switch {
	case i == n:
		if len(a) == len(b) {
			return 0
		}
		if (len(a) == n || a[n] < utf8.RuneSelf) && (len(b) == n || b[n] < utf8.RuneSelf) {
			if len(a) < len(b) {
				return -1
			}
			return 1
		}
	case a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf:
		if a[i] < b[i] {
			return -1
		}
		return 1
	}
	// Back up to the start of the character the difference is in.
	for i > 0 && (i == len(a) || i == len(b) || !utf8.RuneStart(a[i])) {
		i--
	}
	return compareUnits(a[i:], b[i:])
}

// compareUnits compares two strings one UTF-16 code unit at a time.
func compareUnits(a, b string) int {
	ua, ub := unitReader{s: a}, unitReader{s: b}
	for {
		ca, okA := ua.next()
		cb, okB := ub.next()
		switch {
		case !okA && !okB:
			return 0
		case !okA:
			return -1
		case !okB:
			return 1
		case ca < cb:
			return -1
		case ca > cb:
			return 1
		}
	}
}

// unitReader yields the UTF-16 code units of a Go string one at a time.
type unitReader struct {
	s     string
	trail rune // pending low surrogate of an astral character, or 0
}

func (u *unitReader) next() (rune, bool) {
	if u.trail != 0 {
		t := u.trail
		u.trail = 0
		return t, true
	}
	if len(u.s) == 0 {
		return 0, false
	}
	r, size := decodeUnitRune(u.s)
	u.s = u.s[size:]
	if r >= 0x10000 {
		r -= 0x10000
		u.trail = 0xDC00 + r&0x3FF
		return 0xD800 + r>>10, true
	}
	return r, true
}

// surrogateAt reports whether s[i:] starts with the WTF-8 encoding of a
// surrogate code unit (U+D800..U+DFFF) and returns that unit.
func surrogateAt(s string, i int) (rune, bool) {
	if i+2 >= len(s) {
		return 0, false
	}
	if s[i] != 0xED || s[i+1] < 0xA0 || s[i+1] > 0xBF || s[i+2]&0xC0 != 0x80 {
		return 0, false
	}
	return rune(0xD000) | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F), true
}

// decodeUnitRune decodes one rune, also accepting a WTF-8 surrogate (returned
// as the surrogate code unit itself) and mapping other invalid bytes to
// U+FFFD, as a JavaScript string would hold them.
func decodeUnitRune(s string) (rune, int) {
	r, size := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && size == 1 {
		if u, ok := surrogateAt(s, 0); ok {
			return u, 3
		}
	}
	return r, size
}
