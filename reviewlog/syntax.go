package reviewlog

// The shapes of a record's hex strings and numbers, checked by hand: as
// regular expressions compiled when the package is loaded they cost every
// command (the build among them) about a millisecond and 1,600 allocations
// at start, the 130-digit and 78-digit repetitions most.

// isHex0x reports whether s is "0x" followed by exactly n lowercase hex
// digits (`^0x[0-9a-f]{n}$`).
func isHex0x(s string, n int) bool {
	return len(s) == 2+n && s[0] == '0' && s[1] == 'x' && isLowerHex(s[2:], n)
}

// isLowerHex reports whether s is exactly n lowercase hex digits
// (`^[0-9a-f]{n}$`).
func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// isAddress reports whether s is "0x" followed by 40 hex digits of either
// case (`^0x[0-9a-fA-F]{40}$`).
func isAddress(s string) bool {
	if len(s) != 42 || s[0] != '0' || s[1] != 'x' {
		return false
	}
	for i := 2; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// isUint256Digits reports whether s is a decimal integer of 1 to 78 digits
// without a leading zero (`^(0|[1-9][0-9]{0,77})$`): a uint256's width.
func isUint256Digits(s string) bool {
	if len(s) == 0 || len(s) > 78 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
