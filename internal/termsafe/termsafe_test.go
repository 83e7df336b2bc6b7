package termsafe

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"ascii", "0xb0b0 pays 1.50 USDC", "0xb0b0 pays 1.50 USDC"},
		{"non-Latin letters", "Zürich 東京 Москва العربية עברית", "Zürich 東京 Москва العربية עברית"},
		{"emoji and variation selector", "paid 🎉 ❤️ 👍🏽", "paid 🎉 ❤️ 👍🏽"},
		{"combining mark", "e\u0301", "e\u0301"},
		{"real replacement char", "\ufffd", "\ufffd"},
		{"backslash", `a\b`, `a\\b`},
		{"fake escape", `0.01\u200b`, `0.01\\u200b`},
		{"newline, tab, CR", "a\nb\tc\rd", `a\nb\tc\rd`},
		{"NUL and ESC", "\x00\x1b[31mred", `\u0000\u001b[31mred`},
		{"DEL", "x\x7f", `x\u007f`},
		{"C1 CSI", "x\u009b2J", `x\u009b2J`},
		{"zero width space in amount", "0.01\u200b", `0.01\u200b`},
		{"ZWNJ, ZWJ, word joiner, BOM", "\u200c\u200d\u2060\ufeff", `\u200c\u200d\u2060\ufeff`},
		{"soft hyphen, Mongolian vowel separator", "a\u00adb\u180ec", `a\u00adb\u180ec`},
		{"Arabic letter mark, LRM, RLM", "\u061c\u200e\u200f", `\u061c\u200e\u200f`},
		{"embeddings and overrides", "\u202a\u202b\u202c\u202d\u202e", `\u202a\u202b\u202c\u202d\u202e`},
		{"isolates", "\u2066\u2067\u2068\u2069", `\u2066\u2067\u2068\u2069`},
		{"RLO hides an extension", "invoice\u202efdp.exe", `invoice\u202efdp.exe`},
		{"line and paragraph separators", "a\u2028b\u2029", `a\u2028b\u2029`},
		{"Hangul filler", "x\u3164y", `x\u3164y`},
		{"tag characters", "\U000e0001\U000e0041\U000e007f", `\U000e0001\U000e0041\U000e007f`},
		{"unassigned tag block", "\U000e0000\U000e0010", `\U000e0000\U000e0010`},
		{"invalid byte", "ok\xffok", `ok\xffok`},
		{"truncated sequence", "\xe2\x80", `\xe2\x80`},
		{"encoded surrogate", "\xed\xa0\x80", `\xed\xa0\x80`},
		{"overlong slash", "\xc0\xaf", `\xc0\xaf`},
		{"mixed", "run\u200b-1\n\\", `run\u200b-1\n\\`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := String(tt.in)
			if got != tt.want {
				t.Errorf("String(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if back, err := unescape(got); err != nil || back != tt.in {
				t.Errorf("unescape(%q) = %q, %v; want %q", got, back, err, tt.in)
			}
		})
	}
}

func TestStringKeepsCleanInputShared(t *testing.T) {
	in := "0xb0b0000000000000000000000000000000000002"
	if got := String(in); got != in {
		t.Fatalf("String(%q) = %q", in, got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = String(in) }); n != 0 {
		t.Errorf("clean input allocates %v times; want 0", n)
	}
}

// forbidden is the list of what must never reach the output, written out
// independently of NeedsEscape.
func forbidden(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	case r >= 0x200b && r <= 0x200d, r == 0x2060, r == 0xfeff, r == 0x00ad, r == 0x180e:
		return true
	case r >= 0xe0000 && r <= 0xe007f, r == 0x2028, r == 0x2029:
		return true
	}
	return false
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"", "plain", `\`, `\u200b`, "0.01\u200b", "\xff", "\xed\xa0\x80", "a\u202eb", "\U000e0041", "東京🎉", "\\x41", "\x1b]8;;http://x\x07"} {
		f.Add(s, "x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea := String(a)
		if !utf8.ValidString(ea) {
			t.Fatalf("String(%q) = %q is not valid UTF-8", a, ea)
		}
		for _, r := range ea {
			if forbidden(r) {
				t.Fatalf("String(%q) = %q still holds %U", a, ea, r)
			}
		}
		back, err := unescape(ea)
		if err != nil || back != a {
			t.Fatalf("unescape(String(%q)) = %q, %v", a, back, err)
		}
		if a != b && ea == String(b) {
			t.Fatalf("String(%q) == String(%q) == %q", a, b, ea)
		}
	})
}

// unescape inverts String; it proves the mapping injective.
func unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			i++
			continue
		}
		if i+1 >= len(s) {
			return "", fmt.Errorf("lone backslash at %d", i)
		}
		switch s[i+1] {
		case '\\':
			b.WriteByte('\\')
			i += 2
		case 'n':
			b.WriteByte('\n')
			i += 2
		case 'r':
			b.WriteByte('\r')
			i += 2
		case 't':
			b.WriteByte('\t')
			i += 2
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[s[i+1]]
			if i+2+n > len(s) {
				return "", fmt.Errorf("short escape at %d", i)
			}
			v, err := strconv.ParseUint(s[i+2:i+2+n], 16, 32)
			if err != nil {
				return "", fmt.Errorf("escape at %d: %w", i, err)
			}
			if s[i+1] == 'x' {
				b.WriteByte(byte(v))
			} else {
				b.WriteRune(rune(v))
			}
			i += 2 + n
		default:
			return "", fmt.Errorf("unknown escape %q at %d", s[i:i+2], i)
		}
	}
	return b.String(), nil
}

func TestJSON(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"clean", `{"a":"東京 🎉"}`, `{"a":"東京 🎉"}`},
		{"bidi", "{\"a\":\"x\u202ey\"}", `{"a":"x\u202ey"}`},
		{"zero width in amount", "[\"0.01\u200b\"]", `["0.01\u200b"]`},
		{"tag character as a surrogate pair", "\"\U000e0041\"", `"\udb40\udc41"`},
		{"DEL", "\"a\x7fb\"", `"a\u007fb"`},
		{"indented", "{\n\t\"a\": 1\n}", "{\n\t\"a\": 1\n}"},
		{"escapes already there", `"\u0000\\"`, `"\u0000\\"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(JSON([]byte(tt.in)))
			if got != tt.want {
				t.Fatalf("JSON(%q) = %q, want %q", tt.in, got, tt.want)
			}
			var a, b any
			if err := json.Unmarshal([]byte(tt.in), &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(got), &b); err != nil || !reflect.DeepEqual(a, b) {
				t.Errorf("JSON changed the meaning: %v %v %v", a, b, err)
			}
		})
	}
}

func FuzzJSON(f *testing.F) {
	for _, s := range []string{"", "x\u202ey", "\U000e0041", "\xff", "0.01\u200b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		in, err := json.Marshal(map[string]string{s: s})
		if err != nil {
			t.Fatalf("encoding/json refused a map of strings: %v", err)
		}
		out := JSON(in)
		var a, b map[string]string
		if err := json.Unmarshal(in, &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(out, &b); err != nil || !reflect.DeepEqual(a, b) {
			t.Fatalf("JSON(%q) = %q changed the meaning (%v)", in, out, err)
		}
		for _, r := range string(out) {
			if forbidden(r) {
				t.Fatalf("JSON(%q) = %q still holds %U", in, out, r)
			}
		}
	})
}

func TestHTML(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"<p>plain</p>\n\t<p>x</p>\r\n", "<p>plain</p>\n\t<p>x</p>\r\n"},
		{`<td>C:\path</td>`, `<td>C:\path</td>`},
		{"<td>0.01\u202e00</td>", `<td>0.01\u202e00</td>`},
		{"<td>a\u200bb\u2066c\ufeff</td>", `<td>a\u200bb\u2066c\ufeff</td>`},
		{"<td>\x1b[31m\x7f</td>", `<td>\u001b[31m\u007f</td>`},
		{"<td>\U000e0041\xff</td>", `<td>\U000e0041\xff</td>`},
		{"<td>東京🎉 é</td>", "<td>東京🎉 é</td>"},
	} {
		if got := string(HTML([]byte(c.in))); got != c.want {
			t.Errorf("HTML(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func FuzzHTML(f *testing.F) {
	for _, s := range []string{"", "<p>x</p>\n", "a\u202eb", "\xff", "\U000e0041", "\t\r\n", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := HTML([]byte(in))
		if !utf8.Valid(out) {
			t.Fatalf("HTML(%q) = %q is not valid UTF-8", in, out)
		}
		for _, r := range string(out) {
			if r != '\n' && r != '\r' && r != '\t' && forbidden(r) {
				t.Fatalf("HTML(%q) = %q still holds %U", in, out, r)
			}
		}
		if utf8.ValidString(in) && !strings.ContainsFunc(in, func(r rune) bool { return r != '\n' && r != '\r' && r != '\t' && NeedsEscape(r) }) && string(out) != in {
			t.Fatalf("HTML changed clean input %q to %q", in, out)
		}
	})
}
