package guard

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// CounterpartyKind says how a counterparty is identified.
type CounterpartyKind string

const (
	// KindAddress is a seller's pay_to address, matched against requirements.pay_to.
	KindAddress CounterpartyKind = "address"
	// KindHost is a service host, matched against the host of the resource URL.
	KindHost CounterpartyKind = "host"
)

// Counterparty is a normalised counterparty: a lower-case 0x address, or a
// lower-case host name / IP literal with no port and no trailing dot.
type Counterparty struct {
	Kind  CounterpartyKind `json:"kind"`
	Value string           `json:"value"`
}

func (c Counterparty) String() string { return c.Value }

// ErrCounterparty marks a counterparty that cannot be read.
var ErrCounterparty = errors.New("unreadable counterparty")

const maxCounterpartyText = MaxCounterpartyBytes

// ParseCounterparty reads a counterparty: a 0x address (40 hex digits, any
// case), a host name, or an http(s) URL whose host is used.
//
// The question and the history go through the same canonical forms
// (CanonicalAddress, CanonicalHost, HostOfURL), so that no spelling of one
// counterparty can miss its own history or side-step a list:
//   - surrounding white space is trimmed; "0x" and "0X" are the same prefix;
//   - host names go through IDNA (the lookup profile) to their ASCII form,
//     in lower case, with one trailing dot dropped;
//   - a URL's port is ignored — a service is identified by its host, so a
//     listed host covers every port; a bare host may not carry a port;
//   - percent-encoded host bytes are decoded, IPv4-mapped IPv6 literals are
//     written as IPv4, and IP literals are written in canonical form;
//   - a question given as a URL with user information ("https://a@b/") is
//     refused, since it is a classic way to make one host look like another
//     (history URLs are read for the host they really name).
func ParseCounterparty(s string) (Counterparty, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return Counterparty{}, fmt.Errorf("%w: the counterparty is empty", ErrCounterparty)
	case len(s) > maxCounterpartyText:
		return Counterparty{}, fmt.Errorf("%w: the counterparty is %d bytes long; at most %d are accepted", ErrCounterparty, len(s), maxCounterpartyText)
	case !utf8.ValidString(s):
		return Counterparty{}, fmt.Errorf("%w: the counterparty is not valid UTF-8", ErrCounterparty)
	case strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f || unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) }):
		return Counterparty{}, fmt.Errorf("%w: %q contains white space, control or invisible characters", ErrCounterparty, clip(s))
	}
	if (strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X")) && !strings.ContainsAny(s, ".:/") {
		a, err := CanonicalAddress(s)
		if err != nil {
			return Counterparty{}, fmt.Errorf("%w: %w", ErrCounterparty, err)
		}
		return Counterparty{Kind: KindAddress, Value: a}, nil
	}
	if len(s) == 40 && allBytes(s, isHex) {
		// 40 hex digits without 0x: an address, as EVM libraries read it.
		return Counterparty{Kind: KindAddress, Value: "0x" + strings.ToLower(s)}, nil
	}
	if strings.Contains(s, "://") {
		h, hadUser, err := hostOfURL(s)
		if err != nil {
			return Counterparty{}, fmt.Errorf("%w: %w", ErrCounterparty, err)
		}
		if hadUser {
			return Counterparty{}, fmt.Errorf("%w: URL %q carries user information before the host; it is refused because it disguises the host", ErrCounterparty, clip(s))
		}
		return hostCounterparty(s, h)
	}
	if strings.ContainsAny(s, "/?#@\\") {
		return Counterparty{}, fmt.Errorf("%w: %q is neither an address, a host nor a URL with a scheme (https://…)", ErrCounterparty, clip(s))
	}
	if strings.Contains(s, ":") {
		if a, err := netip.ParseAddr(s); err == nil && a.Is6() && a.Zone() == "" {
			return hostCounterparty(s, canonicalIP(a))
		}
		return Counterparty{}, fmt.Errorf("%w: host %q: a bare host may not carry a port; give a URL (its port is ignored)", ErrCounterparty, clip(s))
	}
	h, err := CanonicalHost(s)
	if err != nil {
		return Counterparty{}, fmt.Errorf("%w: %w", ErrCounterparty, err)
	}
	return hostCounterparty(s, h)
}

// hostCounterparty refuses a host that would read back as an address (a
// single label "0x…", e.g. from "0x." or "https://0x/"), so that the
// normalised value always parses to itself.
func hostCounterparty(s, h string) (Counterparty, error) {
	if (strings.HasPrefix(h, "0x") || strings.HasPrefix(h, "0X")) && !strings.ContainsAny(h, ".:") {
		return Counterparty{}, fmt.Errorf("%w: %q names host %q, which would read as an address; give the address or a full host name", ErrCounterparty, clip(s), h)
	}
	return Counterparty{Kind: KindHost, Value: h}, nil
}

// CanonicalAddress reads a 0x address: surrounding white space trimmed, the
// prefix 0x or 0X, exactly 40 hex digits. It returns the address in lower
// case (checksum case is not verified; the comparison ignores case).
func CanonicalAddress(s string) (string, error) {
	s, hex, err := addressDigits(s)
	if err != nil {
		return "", err
	}
	if s[1] == 'x' && !hasUpper(hex) {
		return s, nil // already canonical: no copy
	}
	var b strings.Builder
	b.Grow(len(s))
	writeLowerAddress(&b, hex)
	return b.String(), nil
}

// addressDigits is CanonicalAddress's check: s trimmed and its 40 hex
// digits, as written.
func addressDigits(s string) (trimmed, hex string, err error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "0x") && !strings.HasPrefix(s, "0X") {
		return "", "", fmt.Errorf("address %q does not start with 0x", clip(s))
	}
	hex = s[2:]
	if len(hex) != 40 {
		return "", "", fmt.Errorf("address %q has %d hex digits after 0x; an address has 40", clip(s), len(hex))
	}
	for i := 0; i < len(hex); i++ {
		if !isHex(hex[i]) {
			return "", "", fmt.Errorf("address %q has the non-hex character %q at position %d", clip(s), rune(hex[i]), i+2)
		}
	}
	return s, hex, nil
}

// writeLowerAddress writes "0x" and 40 hex digits in lower case.
func writeLowerAddress(b *strings.Builder, hex string) {
	b.WriteString("0x")
	for i := 0; i < len(hex); i++ {
		c := hex[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
}

// hasUpper says s has an ASCII upper-case letter.
func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// PayToAddress reads a payee address as the reference EVM libraries do: a
// 0x address, or exactly 40 hex digits without the prefix.
func PayToAddress(s string) (string, error) {
	t := strings.TrimSpace(s)
	if len(t) == 40 && allBytes(t, isHex) {
		return "0x" + strings.ToLower(t), nil
	}
	return CanonicalAddress(s)
}

// ParseAddress is CanonicalAddress (kept for the asset registry's callers).
func ParseAddress(s string) (string, error) { return CanonicalAddress(s) }

// HostOfURL returns the canonical host of an http(s) URL: the host the URL
// really names, whatever user information precedes it. The history reader
// uses it on resource URLs; questions use it too (and refuse user info).
func HostOfURL(raw string) (string, error) {
	h, _, err := hostOfURL(raw)
	return h, err
}

// hostOfURL splits the authority out of an http(s) URL the way a browser
// does (a backslash ends it like a slash; percent-encoded bytes are
// decoded; user information before the last '@' is dropped and reported),
// then canonicalises its host. The port is ignored.
func hostOfURL(raw string) (host string, hadUser bool, err error) {
	raw = strings.TrimSpace(raw)
	i := strings.Index(raw, "://")
	if i < 0 {
		return "", false, fmt.Errorf("URL %q has no scheme", clip(raw))
	}
	scheme := strings.ToLower(raw[:i])
	if scheme != "https" && scheme != "http" {
		return "", false, fmt.Errorf("URL %q: only http and https URLs name a service", clip(raw))
	}
	auth := raw[i+3:]
	if end := strings.IndexAny(auth, "/?#\\"); end >= 0 {
		auth = auth[:end]
	}
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		auth, hadUser = auth[at+1:], true
	}
	if strings.Contains(auth, "%") {
		dec, err := url.PathUnescape(auth)
		if err != nil {
			return "", hadUser, fmt.Errorf("URL %q: the host has a bad percent-encoding", clip(raw))
		}
		auth = dec
	}
	if auth == "" {
		return "", hadUser, fmt.Errorf("URL %q has no host", clip(raw))
	}
	if strings.HasPrefix(auth, "[") {
		end := strings.IndexByte(auth, ']')
		if end < 0 {
			return "", hadUser, fmt.Errorf("URL %q: unterminated IPv6 literal", clip(raw))
		}
		if rest := auth[end+1:]; rest != "" && !validPort(rest) {
			return "", hadUser, fmt.Errorf("URL %q: bad port %q", clip(raw), clip(rest))
		}
		a, err := netip.ParseAddr(auth[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", hadUser, fmt.Errorf("URL %q: %q is not an IPv6 address", clip(raw), clip(auth[1:end]))
		}
		return canonicalIP(a), hadUser, nil
	}
	if c := strings.LastIndexByte(auth, ':'); c >= 0 {
		if !validPort(auth[c:]) {
			return "", hadUser, fmt.Errorf("URL %q: bad port %q", clip(raw), clip(auth[c:]))
		}
		auth = auth[:c]
	}
	h, err := CanonicalHost(auth)
	if err != nil {
		return "", hadUser, fmt.Errorf("URL %q: %w", clip(raw), err)
	}
	return h, hadUser, nil
}

// validPort accepts ":" followed by at most 5 digits, or a bare ":" (an
// empty port, which browsers read as the default one). The value is not
// judged: a service is identified by its host whatever port it names.
func validPort(p string) bool {
	return len(p) >= 1 && len(p) <= 6 && p[0] == ':' && allBytes(p[1:], isDigit)
}

// canonicalIP writes an IP literal in canonical form, an IPv4-mapped IPv6
// address as the IPv4 address it maps.
func canonicalIP(a netip.Addr) string { return a.Unmap().String() }

// CanonicalHost is the one canonical form of a host name or IP literal
// (without brackets or port): one trailing dot dropped, IDNA to ASCII with
// the lookup profile (which also lower-cases), every label non-empty, and a
// name whose last label is numeric must be a dotted IPv4 address.
func CanonicalHost(h string) (string, error) {
	if h == "" {
		return "", fmt.Errorf("the host is empty")
	}
	// An IP literal has a colon (IPv6) or only digits and dots (IPv4):
	// other names are not tried as one (a failed parse costs an error).
	if mayBeIP(h) {
		if a, err := netip.ParseAddr(h); err == nil {
			if a.Zone() != "" {
				return "", fmt.Errorf("host %q: an address with a zone does not name a service", clip(h))
			}
			return canonicalIP(a), nil
		}
	}
	if strings.Contains(h, ":") {
		return "", fmt.Errorf("host %q is not a host name or an IP address", clip(h))
	}
	h = strings.TrimSuffix(h, ".")
	if !plainLDH(h) {
		// Only names that are not already plain lower-case letters, digits
		// and inner hyphens need IDNA (which gives those back unchanged).
		ascii, err := idna.Lookup.ToASCII(h)
		if err != nil {
			return "", fmt.Errorf("host %q is not a valid host name (%s)", clip(h), strings.TrimPrefix(err.Error(), "idna: "))
		}
		h = strings.ToLower(ascii)
	}
	if len(h) > 253 {
		return "", fmt.Errorf("host name is %d characters long; at most 253 are allowed", len(h))
	}
	var last string
	for rest, more := h, true; more; {
		var l string
		l, rest, more = strings.Cut(rest, ".")
		last = l
		if l == "" {
			return "", fmt.Errorf("host %q has an empty label", clip(h))
		}
		if len(l) > 63 {
			return "", fmt.Errorf("host %q has a label longer than 63 characters", clip(h))
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(isDigit(c) || (c >= 'a' && c <= 'z') || c == '-') {
				return "", fmt.Errorf("host %q contains the character %q; host names use letters, digits and hyphens", clip(h), rune(c))
			}
		}
	}
	if allBytes(last, isDigit) {
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is4() {
			return "", fmt.Errorf("host %q looks numeric but is not a dotted IPv4 address", clip(h))
		}
		return a.String(), nil
	}
	return h, nil
}

// mayBeIP says h could be an IP literal netip.ParseAddr reads: one with a
// colon, or only digits and dots.
func mayBeIP(h string) bool {
	return strings.IndexByte(h, ':') >= 0 || allBytes(h, func(c byte) bool { return isDigit(c) || c == '.' })
}

// plainLDH: every label is lower-case letters and digits with inner hyphens
// only, none with hyphens third and fourth (as IDNA's "xn--"), each 1 to 63
// characters. Such a name is
// its own IDNA lookup form.
func plainLDH(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for rest, more := h, true; more; {
		var l string
		l, rest, more = strings.Cut(rest, ".")
		// "ab--…" (hyphens third and fourth) is reserved for IDNA prefixes.
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' || (len(l) >= 4 && l[2] == '-' && l[3] == '-') {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
