package jsjson

import (
	"math/bits"
	"testing"
)

func TestAppendString(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain", `"plain"`},
		{"q\"b\\", `"q\"b\\"`},
		{"\b\f\n\r\t\x00\x1f", `"\b\f\n\r\t\u0000\u001f"`},
		{"<&/>\u2028\u2029", "\"<&/>\u2028\u2029\""},
		{"\U0001F600é", "\"\U0001F600é\""},
		{"\xed\xa0\x80", `"\ud800"`},
		{"a\xed\xbf\xbfb", `"a\udfffb"`},
		{"\xff", "\"\ufffd\""},
		{"\x7f", "\"\x7f\""},
	}
	for _, c := range cases {
		if got := string(AppendString(nil, c.in)); got != c.want {
			t.Errorf("AppendString(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestCompareUTF16(t *testing.T) {
	cases := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"a", "b", -1},
		{"ab", "a", 1},
		// U+FF61 is above the lead surrogate of U+1F600 in UTF-16, below it in code points.
		{"\U0001F600", "\uff61", -1},
		{"\uff61", "\U0001F600", 1},
		{"\U0001F600", "\U0001F601", -1},
		{"\ue000", "\U00010000", 1},
		{"\xed\xa0\x80", "\U00010000", -1}, // lone D800 before D800 DC00
		{"z", "\xed\xa0\x80", -1},
		{"\xed\xa0\x80\uffff", "\U00010000", 1},
	}
	for _, c := range cases {
		if got := CompareUTF16(c.a, c.b); got != c.want {
			t.Errorf("CompareUTF16(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// TestCompareUTF16FastPathAgrees checks the byte fast path against the
// code-unit walk on strings that differ after a shared prefix.
func TestCompareUTF16FastPathAgrees(t *testing.T) {
	parts := []string{"", "a", "z", "é", "\uff61", "\U0001F600", "\ue000", "\xed\xa0\x80", "~", "\x00"}
	slow := compareUnits
	for _, prefix := range []string{"", "2026-07-24T", "é", "\U0001F600"} {
		for _, x := range parts {
			for _, y := range parts {
				for _, tail := range []string{"", "a", "\U0001F600"} {
					a, b := prefix+x+tail, prefix+y
					if got, want := CompareUTF16(a, b), slow(a, b); got != want {
						t.Errorf("CompareUTF16(%q, %q) = %d, want %d", a, b, got, want)
					}
				}
			}
		}
	}
}

// plain8 agrees with plainByte on every byte at every position of a word.
func TestPlain8(t *testing.T) {
	base := []byte("abcdefgh")
	for pos := 0; pos < 8; pos++ {
		for c := 0; c < 256; c++ {
			w := append([]byte(nil), base...)
			w[pos] = byte(c)
			want := true
			for _, b := range w {
				want = want && plainByte(b)
			}
			if got := plain8(string(w), 0); got != want {
				t.Fatalf("plain8(%q) = %v, want %v", w, got, want)
			}
		}
	}
	// Pairs of special bytes, where borrows could interfere.
	for _, a := range []byte{0, 0x1f, '"', '\\', 0x7f, 0x80, 0xff, ' '} {
		for _, b := range []byte{0, 0x1f, '"', '\\', 0x7f, 0x80, 0xff, ' '} {
			w := []byte{'x', a, b, 'y', 'z', a, 'q', b}
			want := true
			for _, c := range w {
				want = want && plainByte(c)
			}
			if got := plain8(string(w), 0); got != want {
				t.Fatalf("plain8(%q) = %v, want %v", w, got, want)
			}
		}
	}
}

// plainMask's lowest marked byte is the first byte that is not plainByte,
// whatever follows it: every pair of byte values at every two positions.
func TestPlainMaskFirstByte(t *testing.T) {
	for lo := 0; lo < 8; lo++ {
		for hi := lo + 1; hi < 8; hi++ {
			for a := 0; a < 256; a++ {
				for b := 0; b < 256; b += 3 {
					w := []byte("abcdefgh")
					w[lo], w[hi] = byte(a), byte(b)
					first := 8
					for i, c := range w {
						if !plainByte(c) {
							first = i
							break
						}
					}
					m := plainMask(load8(string(w), 0))
					if got := bits.TrailingZeros64(m) >> 3; got != first {
						t.Fatalf("%q: first byte not plain at %d, want %d", w, got, first)
					}
				}
			}
		}
	}
}
