// Package termsafe makes untrusted text safe to print on a terminal or in a
// chat message: every character that could move the cursor, reorder what is
// shown, or hide itself is replaced by a visible escape.
//
// What is escaped:
//   - the backslash, as \\ (so an escape in the input cannot pass for one we made);
//   - C0 controls, DEL and C1 controls: \n \r \t as such, the rest as \u00XX;
//   - every Unicode format character (category Cf): the bidi controls
//     U+061C, U+200E/F, U+202A–202E, U+2066–2069, the zero-width U+200B–200D,
//     U+2060, U+FEFF, the soft hyphen U+00AD, U+180E, the tag characters, ...;
//   - the line and paragraph separators U+2028/U+2029;
//   - characters that render as nothing in common fonts (U+034F, the Hangul
//     fillers U+115F, U+1160, U+3164, U+FFA0, the Khmer U+17B4/5);
//   - the whole tag block U+E0000–E007F, assigned or not;
//   - bytes that are not UTF-8, as \xNN.
//
// Runes are written \uXXXX, or \UXXXXXXXX above U+FFFF, in lower-case hex.
// Everything else, letters of any script, marks, emoji, spaces, is left as
// it is. The mapping is injective: distinct inputs give distinct outputs.
package termsafe

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// String returns s with every control, bidi, invisible character and
// invalid byte escaped visibly. The result is valid UTF-8.
func String(s string) string {
	i := 0
	for i < len(s) {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f || c == '\\' {
				break
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || NeedsEscape(r) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteByte(hexDigits[s[i]>>4])
			b.WriteByte(hexDigits[s[i]&0xf])
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case NeedsEscape(r):
			writeRune(&b, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// NeedsEscape reports whether String escapes the rune r (the backslash
// aside, which is escaped to keep the mapping injective).
func NeedsEscape(r rune) bool {
	if r < 0x20 || (r >= 0x7f && r < 0xa0) {
		return true
	}
	if r < 0xa0 {
		return false
	}
	switch r {
	case 0x034f, 0x115f, 0x1160, 0x17b4, 0x17b5, 0x2028, 0x2029, 0x3164, 0xffa0:
		return true
	}
	if r >= 0xe0000 && r <= 0xe007f {
		return true
	}
	return unicode.Is(unicode.Cf, r)
}

func writeRune(b *strings.Builder, r rune) {
	digits := 4
	if r > 0xffff {
		b.WriteString(`\U`)
		digits = 8
	} else {
		b.WriteString(`\u`)
	}
	for shift := (digits - 1) * 4; shift >= 0; shift -= 4 {
		b.WriteByte(hexDigits[(r>>uint(shift))&0xf])
	}
}

// JSON returns the JSON text b with every rune String would escape that is
// still raw in it (encoding/json leaves DEL, bidi, zero-width and tag
// characters as they are) written as a \u escape, so that the JSON means
// the same and shows safely on a terminal. Such runes can only occur inside
// strings of valid JSON, where \u escapes are allowed (the white space
// between tokens is left alone). Invalid UTF-8 is
// left as it is (encoding/json never writes it). b is returned unchanged
// when nothing needs escaping.
func JSON(b []byte) []byte {
	i := 0
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			if b[i] == 0x7f {
				break
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError && NeedsEscape(r) {
			break
		}
		i += size
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	out = append(out, b[:i]...)
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			if b[i] == 0x7f {
				out = appendU(out, 0x7f)
			} else {
				out = append(out, b[i])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError || !NeedsEscape(r) {
			out = append(out, b[i:i+size]...)
		} else if r > 0xffff {
			r -= 0x10000
			out = appendU(appendU(out, 0xd800+(r>>10)), 0xdc00+(r&0x3ff))
		} else {
			out = appendU(out, r)
		}
		i += size
	}
	return out
}

func appendU(out []byte, r rune) []byte {
	return append(out, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
}

// HTML returns the HTML text b with every rune String would escape written
// as a visible \uXXXX (or \UXXXXXXXX), except the line feed, carriage
// return and tab that lay out markup and the backslash: a page then shows
// no bidi control, zero-width or otherwise invisible character, whatever
// field slipped through unescaped. Invalid UTF-8 bytes are written \xNN.
// Values shown in a page should go through String first, which keeps the
// mapping injective; HTML is the net under the whole page.
func HTML(b []byte) []byte {
	i := 0
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') || c == 0x7f {
				break
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if (r == utf8.RuneError && size == 1) || NeedsEscape(r) {
			break
		}
		i += size
	}
	if i == len(b) {
		return b
	}
	var out strings.Builder
	out.Grow(len(b) + 16)
	out.Write(b[:i])
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out.WriteString(`\x`)
			out.WriteByte(hexDigits[b[i]>>4])
			out.WriteByte(hexDigits[b[i]&0xf])
		case r == '\n' || r == '\r' || r == '\t' || !NeedsEscape(r):
			out.Write(b[i : i+size])
		default:
			writeRune(&out, r)
		}
		i += size
	}
	return []byte(out.String())
}
