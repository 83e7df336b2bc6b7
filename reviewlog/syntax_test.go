package reviewlog

import (
	"regexp"
	"strings"
	"testing"
)

// TestSyntaxChecksMatchTheirPatterns holds each hand-written check to the
// regular expression it replaced, over strings of every nearby length and
// each kind of wrong byte.
func TestSyntaxChecksMatchTheirPatterns(t *testing.T) {
	checks := []struct {
		pattern string
		check   func(string) bool
	}{
		{`^0x[0-9a-f]{64}$`, func(s string) bool { return isHex0x(s, 64) }},
		{`^0x[0-9a-f]{130}$`, func(s string) bool { return isHex0x(s, 130) }},
		{`^[0-9a-f]{32}$`, func(s string) bool { return isLowerHex(s, 32) }},
		{`^0x[0-9a-fA-F]{40}$`, isAddress},
		{`^(0|[1-9][0-9]{0,77})$`, isUint256Digits},
	}
	var inputs []string
	for _, fill := range []string{"0", "7", "a", "f", "A", "F", "g", "x", " ", "\n", "é"} {
		for n := 0; n <= 134; n++ {
			body := strings.Repeat(fill, n)
			inputs = append(inputs, body, "0x"+body, "1"+body, "0X"+body, "x"+body, "0x"+body+"\n")
			if n > 0 {
				inputs = append(inputs, "0x"+strings.Repeat("ab", n)[:n], strings.Repeat("19", n)[:n])
			}
		}
	}
	for _, c := range checks {
		re := regexp.MustCompile(c.pattern)
		for _, in := range inputs {
			if got, want := c.check(in), re.MatchString(in); got != want {
				t.Errorf("%s on %q: %v, the pattern says %v", c.pattern, in, got, want)
			}
		}
	}
}
