package guard

import (
	"net/netip"
	"strings"
	"testing"
)

// The history reader's shortcuts (no copy when a string is already in its
// canonical form) must give exactly what the long way gives.

func FuzzAtomicDigits(f *testing.F) {
	for _, s := range []string{"0", "250000", "007", "", "-1", "+5", "1_000", "1e6", " 1",
		"115792089237316195423570985008687907853269984665640564039457584007913129639935",
		"115792089237316195423570985008687907853269984665640564039457584007913129639936",
		strings.Repeat("9", 77), strings.Repeat("9", 79)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, werr := ParseAtomic(s)
		got, gerr := AtomicDigits(s)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("AtomicDigits(%q) error %v, ParseAtomic's %v", s, gerr, werr)
		}
		if werr != nil {
			if werr.Error() != gerr.Error() {
				t.Fatalf("AtomicDigits(%q): %q, ParseAtomic: %q", s, gerr, werr)
			}
			return
		}
		if got != want.String() {
			t.Fatalf("AtomicDigits(%q) = %q, ParseAtomic prints %q", s, got, want.String())
		}
	})
}

func FuzzRemoveDotSegments(f *testing.F) {
	for _, s := range []string{"", "/", "/a/b", "/a/b/", "//a", "/a//b", "/.", "/..", "/a/./b", "/a/../b", "/.well-known/x", "/a/..", "a/b", "/a/b/.x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := removeDotSegments(s), removeDotSegmentsAll(s); got != want {
			t.Fatalf("removeDotSegments(%q) = %q, segment by segment %q", s, got, want)
		}
	})
}

func FuzzNormalizeEscapes(f *testing.F) {
	for _, s := range []string{"", "/r/0", "/a%41", "/a%2f", "/a b", "/%", "/%zz", "q=1&b=2", "/\u00fc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, gerr := normalizeEscapes(s)
		want, werr := normalizeEscapesAll(s)
		if got != want || (gerr == nil) != (werr == nil) {
			t.Fatalf("normalizeEscapes(%q) = %q, %v; byte by byte %q, %v", s, got, gerr, want, werr)
		}
	})
}

func FuzzCanonicalAddress(f *testing.F) {
	for _, s := range []string{"0x259f4329e6f4590b9a164106cf6a659eb4862b21", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
		"0X833589FCD6EDB6E08F4C7C32D4F71B54BDA02913", " 0x259f4329e6f4590b9a164106cf6a659eb4862b21 ", "0x12", "0xzz9f4329e6f4590b9a164106cf6a659eb4862b21"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := CanonicalAddress(s)
		tr := strings.TrimSpace(s)
		valid := len(tr) == 42 && (strings.HasPrefix(tr, "0x") || strings.HasPrefix(tr, "0X")) && allBytes(tr[2:], isHex)
		if valid != (err == nil) {
			t.Fatalf("CanonicalAddress(%q): %v, valid %v", s, err, valid)
		}
		if valid && got != "0x"+strings.ToLower(tr[2:]) {
			t.Fatalf("CanonicalAddress(%q) = %q", s, got)
		}
		if !valid {
			return
		}
		key, addr, err := AssetKey("eip155:8453", s)
		if err != nil || key != "eip155:8453/"+got || addr != got {
			t.Fatalf("AssetKey(eip155:8453, %q) = %q, %q, %v; want the address %q", s, key, addr, err, got)
		}
	})
}

func FuzzCanonicalHostIP(f *testing.F) {
	for _, s := range []string{"svc89.example.com", "1.2.3.4", "::1", "[::1]", "1.2.3", "0x7f.1", "01.2.3.4", "fe80::1%eth0", "::ffff:1.2.3.4", "a1.2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// What is not tried as an IP literal is not one.
		if _, err := netip.ParseAddr(s); err == nil && !mayBeIP(s) {
			t.Fatalf("%q parses as an IP literal, but mayBeIP says it cannot", s)
		}
	})
}
