package guard

import (
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/cockroachdb/apd/v3"
)

// Bounds on amounts. A token amount on an EVM chain is a uint256, so nothing
// larger can be a real payment; the text bound keeps a hostile string cheap.
const (
	maxAmountText  = 100
	maxDecimals    = 36
	maxAtomicDigit = 78 // len("115792089237316195423570985008687907853269984665640564039457584007913129639935")
)

// maxUint256 is the largest amount a token on an EVM chain can hold.
var maxUint256 = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(1))

// ErrAmount marks every amount that cannot be read; the wrapped message says why.
var ErrAmount = errors.New("unreadable amount")

// ParseAmount reads a display-unit decimal string ("1.25") into integer
// atomic units of an asset with the given number of decimals (1250000 for 6).
// It accepts only plain decimals: digits, optionally one point followed by
// digits. Signs, exponents, spaces, empty parts and more fractional digits
// than the asset has are each refused with their own message.
func ParseAmount(s string, decimals int) (*big.Int, error) {
	if err := checkAmountSyntax(s); err != nil {
		return nil, err
	}
	if decimals < 0 || decimals > maxDecimals {
		return nil, fmt.Errorf("%w: the asset's decimals %d are out of range 0..%d", ErrAmount, decimals, maxDecimals)
	}
	frac := 0
	if i := strings.IndexByte(s, '.'); i >= 0 {
		frac = len(s) - i - 1
	}
	if frac > decimals {
		return nil, fmt.Errorf("%w: %q has %d decimal places; the asset allows at most %d", ErrAmount, s, frac, decimals)
	}
	d, _, err := apd.NewFromString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %q is not a decimal number", ErrAmount, s)
	}
	// Shift by the asset's decimals, then quantize to exponent 0: the
	// coefficient is then exactly the number of atomic units.
	d.Exponent += int32(decimals)
	ctx := apd.BaseContext.WithPrecision(uint32(maxAmountText + maxDecimals + 2))
	var q apd.Decimal
	cond, err := ctx.Quantize(&q, d, 0)
	if err != nil || cond.Inexact() {
		return nil, fmt.Errorf("%w: %q cannot be expressed in whole atomic units", ErrAmount, s)
	}
	atomic := q.Coeff.MathBigInt()
	if atomic.Cmp(maxUint256) > 0 {
		return nil, fmt.Errorf("%w: %q is larger than any token amount can be", ErrAmount, s)
	}
	return atomic, nil
}

// checkAmountSyntax gives each malformation of a display amount its own message.
func checkAmountSyntax(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: the amount is empty", ErrAmount)
	case len(s) > maxAmountText:
		return fmt.Errorf("%w: the amount is %d characters long; at most %d are accepted", ErrAmount, len(s), maxAmountText)
	case strings.TrimSpace(s) != s || strings.ContainsAny(s, " \t\r\n"):
		return fmt.Errorf("%w: %q contains white space", ErrAmount, s)
	case s[0] == '+' || s[0] == '-':
		return fmt.Errorf("%w: %q has a sign; give a plain positive decimal such as 1.50", ErrAmount, s)
	case strings.ContainsAny(s, "eE"):
		return fmt.Errorf("%w: %q has an exponent; write the number out in full", ErrAmount, s)
	}
	points := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
		case c == '.':
			points++
		case c == ',':
			return fmt.Errorf("%w: %q contains a comma; use a point as the decimal separator and no grouping", ErrAmount, s)
		default:
			return fmt.Errorf("%w: %q contains the character %q at byte %d; only digits and one point are allowed", ErrAmount, s, rune(c), i)
		}
	}
	if points > 1 {
		return fmt.Errorf("%w: %q has more than one decimal point", ErrAmount, s)
	}
	if points == 1 {
		i := strings.IndexByte(s, '.')
		if i == 0 {
			return fmt.Errorf("%w: %q has no digits before the decimal point; write 0%s", ErrAmount, s, s)
		}
		if i == len(s)-1 {
			return fmt.Errorf("%w: %q has no digits after the decimal point", ErrAmount, s)
		}
	}
	return nil
}

// ParseAtomic reads an amount already in atomic units (a non-negative integer
// written in decimal digits, as x402's requirements.amount is).
func ParseAtomic(s string) (*big.Int, error) {
	if err := checkAtomic(s); err != nil {
		return nil, err
	}
	v, ok := new(big.Int).SetString(s, 10)
	if !ok || v.Cmp(maxUint256) > 0 {
		return nil, fmt.Errorf("%w: the atomic amount %q is larger than any token amount can be", ErrAmount, s)
	}
	return v, nil
}

// AtomicDigits is ParseAtomic for a caller that keeps the digits: s itself
// when it is an amount ParseAtomic reads (whose big.Int prints back as s,
// having no leading zero), without making the big.Int unless s is as long
// as the largest amount.
func AtomicDigits(s string) (string, error) {
	if len(s) >= maxAtomicDigit {
		if _, err := ParseAtomic(s); err != nil {
			return "", err
		}
		return s, nil
	}
	if err := checkAtomic(s); err != nil {
		return "", err
	}
	return s, nil // fewer than 78 digits: below 10^77, below 2^256
}

// checkAtomic is ParseAtomic's check of the text: digits, no leading zero.
func checkAtomic(s string) error {
	if s == "" {
		return fmt.Errorf("%w: the atomic amount is empty", ErrAmount)
	}
	if len(s) > maxAtomicDigit {
		return fmt.Errorf("%w: the atomic amount has %d digits; at most %d are possible", ErrAmount, len(s), maxAtomicDigit)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return fmt.Errorf("%w: the atomic amount %q has the character %q at byte %d; only digits are allowed", ErrAmount, s, rune(s[i]), i)
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return fmt.Errorf("%w: the atomic amount %q has a leading zero", ErrAmount, s)
	}
	return nil
}

// FormatAmount writes atomic units as a display decimal with no trailing
// zeros in the fraction ("1250000", 6 → "1.25").
func FormatAmount(atomic *big.Int, decimals int) string {
	if atomic == nil {
		return ""
	}
	digits := atomic.String()
	if decimals <= 0 {
		return digits
	}
	if len(digits) <= decimals {
		digits = strings.Repeat("0", decimals-len(digits)+1) + digits
	}
	whole, frac := digits[:len(digits)-decimals], strings.TrimRight(digits[len(digits)-decimals:], "0")
	if frac == "" {
		return whole
	}
	return whole + "." + frac
}

// DisplayFraction is how many fraction digits an amount shown to a person
// always has (the asset's decimals when it has fewer): "0.40 USDC" beside
// "0.25 USDC", never "0.4 USDC".
const DisplayFraction = 2

// FormatDisplay writes atomic units as a person reads an amount: at least
// DisplayFraction digits in the fraction (the asset's decimals when it has
// fewer), more only where they are not zeros ("400000", 6 → "0.40";
// "125000", 6 → "0.125"; "3000000", 6 → "3.00").
func FormatDisplay(atomic *big.Int, decimals int) string {
	s := FormatAmount(atomic, decimals)
	want := min(DisplayFraction, max(decimals, 0))
	if s == "" || want == 0 {
		return s
	}
	whole, frac, _ := strings.Cut(s, ".")
	if len(frac) < want {
		frac += strings.Repeat("0", want-len(frac))
	}
	return whole + "." + frac
}

// CheckAmountSyntax reports whether s is a plain decimal string (digits,
// optionally a point and digits) — the form check_before_pay's schema
// states. A malformed amount is refused before anything is recorded; an
// amount in the right form that the asset cannot hold (too many decimals)
// stays a question for a human.
func CheckAmountSyntax(s string) error { return checkAmountSyntax(s) }
