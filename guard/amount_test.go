package guard

import (
	"errors"
	"math/big"
	"strings"
	"testing"
)

func TestParseAmount(t *testing.T) {
	tests := []struct {
		in       string
		decimals int
		want     string // atomic units; "" means an error
		errHas   string
	}{
		{"1", 6, "1000000", ""},
		{"1.00", 6, "1000000", ""},
		{"0.000001", 6, "1", ""},
		{"0", 6, "0", ""},
		{"5.000000", 6, "5000000", ""},
		{"007.5", 6, "7500000", ""},
		{"12345678901234567890.123456", 6, "12345678901234567890123456", ""},
		{"1", 0, "1", ""},
		{"", 6, "", "empty"},
		{"0.0000001", 6, "", "7 decimal places"},
		{"1.5", 0, "", "1 decimal places"},
		{"-1", 6, "", "sign"},
		{"+1", 6, "", "sign"},
		{"1e3", 6, "", "exponent"},
		{"1E3", 6, "", "exponent"},
		{" 1", 6, "", "white space"},
		{"1 ", 6, "", "white space"},
		{"1 000", 6, "", "white space"},
		{".5", 6, "", "no digits before"},
		{"5.", 6, "", "no digits after"},
		{"1.2.3", 6, "", "more than one decimal point"},
		{"1,50", 6, "", "comma"},
		{"0x10", 6, "", "character 'x'"},
		{"NaN", 6, "", "character 'N'"},
		{"Infinity", 6, "", "character"},
		{"١", 6, "", "character"},
		{strings.Repeat("9", 101), 6, "", "characters long"},
		{strings.Repeat("9", 80), 0, "", "larger than any token amount"},
	}
	for _, tc := range tests {
		got, err := ParseAmount(tc.in, tc.decimals)
		if tc.want == "" {
			if err == nil {
				t.Errorf("ParseAmount(%q, %d) = %v, want an error", tc.in, tc.decimals, got)
				continue
			}
			if !errors.Is(err, ErrAmount) {
				t.Errorf("ParseAmount(%q): error %v does not wrap ErrAmount", tc.in, err)
			}
			if !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("ParseAmount(%q): error %q does not mention %q", tc.in, err, tc.errHas)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseAmount(%q, %d): %v", tc.in, tc.decimals, err)
			continue
		}
		if got.String() != tc.want {
			t.Errorf("ParseAmount(%q, %d) = %s, want %s", tc.in, tc.decimals, got, tc.want)
		}
	}
}

func TestParseAtomic(t *testing.T) {
	good := map[string]string{"0": "0", "250000": "250000", maxUint256.String(): maxUint256.String()}
	for in, want := range good {
		got, err := ParseAtomic(in)
		if err != nil || got.String() != want {
			t.Errorf("ParseAtomic(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	over := new(big.Int).Add(maxUint256, big.NewInt(1)).String()
	for _, in := range []string{"", "01", "-1", "1.0", "1e6", " 1", over, strings.Repeat("1", 79)} {
		if _, err := ParseAtomic(in); err == nil {
			t.Errorf("ParseAtomic(%q) succeeded, want an error", in)
		}
	}
}

func TestFormatAmount(t *testing.T) {
	tests := []struct {
		atomic   int64
		decimals int
		want     string
	}{
		{1000000, 6, "1"}, {1250000, 6, "1.25"}, {1, 6, "0.000001"}, {0, 6, "0"}, {42, 0, "42"}, {100, 2, "1"},
	}
	for _, tc := range tests {
		if got := FormatAmount(big.NewInt(tc.atomic), tc.decimals); got != tc.want {
			t.Errorf("FormatAmount(%d, %d) = %q, want %q", tc.atomic, tc.decimals, got, tc.want)
		}
	}
}

// FormatDisplay gives every amount at least two fraction digits (the
// asset's decimals when fewer), and the rest only where they are not
// zeros; it reads back to the same number.
func TestFormatDisplay(t *testing.T) {
	for _, tc := range []struct {
		atomic   int64
		decimals int
		want     string
	}{
		{400000, 6, "0.40"}, {250000, 6, "0.25"}, {3000000, 6, "3.00"}, {125000, 6, "0.125"}, {1, 6, "0.000001"},
		{0, 6, "0.00"}, {42, 0, "42"}, {5, 1, "0.5"}, {100, 2, "1.00"}, {1234567890123, 6, "1234567.890123"},
	} {
		got := FormatDisplay(big.NewInt(tc.atomic), tc.decimals)
		if got != tc.want {
			t.Errorf("FormatDisplay(%d, %d) = %q, want %q", tc.atomic, tc.decimals, got, tc.want)
		}
		if back, err := ParseAmount(got, tc.decimals); err != nil || back.Int64() != tc.atomic {
			t.Errorf("FormatDisplay(%d, %d) = %q reads back as %v (%v)", tc.atomic, tc.decimals, got, back, err)
		}
	}
}

// FuzzParseAmount: never panics; whatever parses formats back to a string
// that parses to the same number.
func FuzzParseAmount(f *testing.F) {
	for _, s := range []string{"1", "1.25", "0.000001", "", "-1", "1e3", ".5", "5.", "1.2.3", "١", "99999999999999999999999999999999999999999999999999999999999999999999999999999"} {
		f.Add(s, 6)
	}
	f.Fuzz(func(t *testing.T, s string, decimals int) {
		v, err := ParseAmount(s, decimals)
		if err != nil {
			if !errors.Is(err, ErrAmount) {
				t.Fatalf("error %v does not wrap ErrAmount", err)
			}
			return
		}
		if v.Sign() < 0 || v.Cmp(maxUint256) > 0 {
			t.Fatalf("ParseAmount(%q) = %s out of range", s, v)
		}
		back, err := ParseAmount(FormatAmount(v, decimals), decimals)
		if err != nil || back.Cmp(v) != 0 {
			t.Fatalf("round trip of %q: %v, %v", s, back, err)
		}
	})
}
