package guard

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"unicode/utf8"
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

const maxCounterpartyText = 2048

// ParseCounterparty reads a counterparty: a 0x address (40 hex digits, any
// case), a host name, or an http(s) URL whose host is used.
//
// The rules are strict so that a denylist cannot be side-stepped by spelling:
//   - host names are compared in lower case; one trailing dot is dropped
//     ("api.example.com." is the same host);
//   - a URL's port is ignored — a service is identified by its host, so a
//     listed host covers every port; a bare host may not carry a port;
//   - URLs with user information ("https://a@b/") are refused, since they are
//     a classic way to make one host look like another;
//   - internationalised names must be written in their ASCII (xn--) form;
//     raw non-ASCII names are refused rather than converted;
//   - IPv4 and IPv6 literals are accepted and written in canonical form; a
//     name whose last label is numeric but is no valid IPv4 address is refused.
func ParseCounterparty(s string) (Counterparty, error) {
	switch {
	case s == "":
		return Counterparty{}, fmt.Errorf("%w: the counterparty is empty", ErrCounterparty)
	case len(s) > maxCounterpartyText:
		return Counterparty{}, fmt.Errorf("%w: the counterparty is %d bytes long; at most %d are accepted", ErrCounterparty, len(s), maxCounterpartyText)
	case !utf8.ValidString(s):
		return Counterparty{}, fmt.Errorf("%w: the counterparty is not valid UTF-8", ErrCounterparty)
	case strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return Counterparty{}, fmt.Errorf("%w: %q contains white space or control characters", ErrCounterparty, clip(s))
	}
	if (strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X")) && !strings.ContainsAny(s, ".:/") {
		a, err := ParseAddress(s)
		if err != nil {
			return Counterparty{}, fmt.Errorf("%w: %w", ErrCounterparty, err)
		}
		return Counterparty{Kind: KindAddress, Value: a}, nil
	}
	if strings.Contains(s, "://") {
		h, err := hostOfURL(s)
		if err != nil {
			return Counterparty{}, fmt.Errorf("%w: %w", ErrCounterparty, err)
		}
		return hostCounterparty(s, h)
	}
	if strings.ContainsAny(s, "/?#@") {
		return Counterparty{}, fmt.Errorf("%w: %q is neither an address, a host nor a URL with a scheme (https://…)", ErrCounterparty, clip(s))
	}
	h, err := normaliseHost(s, false)
	if err != nil {
		return Counterparty{}, fmt.Errorf("%w: %w", ErrCounterparty, err)
	}
	return hostCounterparty(s, h)
}

// hostCounterparty refuses a host that would read back as an address (a
// single label "0x…", e.g. from "0x." or "https://0x/"), so that the
// normalised value always parses to itself.
func hostCounterparty(s, h string) (Counterparty, error) {
	if strings.HasPrefix(h, "0x") && !strings.ContainsAny(h, ".:") {
		return Counterparty{}, fmt.Errorf("%w: %q names host %q, which would read as an address; give the address or a full host name", ErrCounterparty, clip(s), h)
	}
	return Counterparty{Kind: KindHost, Value: h}, nil
}

// ParseAddress reads a 0x address with exactly 40 hex digits and returns it
// in lower case (checksum case is not verified; the comparison ignores case).
func ParseAddress(s string) (string, error) {
	if !strings.HasPrefix(s, "0x") {
		if strings.HasPrefix(s, "0X") {
			return "", fmt.Errorf("address %q: write the prefix as a lower-case 0x", clip(s))
		}
		return "", fmt.Errorf("address %q does not start with 0x", clip(s))
	}
	hex := s[2:]
	if len(hex) != 40 {
		return "", fmt.Errorf("address %q has %d hex digits after 0x; an address has 40", clip(s), len(hex))
	}
	for i := 0; i < len(hex); i++ {
		if !isHex(hex[i]) {
			return "", fmt.Errorf("address %q has the non-hex character %q at position %d", clip(s), rune(hex[i]), i+2)
		}
	}
	return strings.ToLower(s), nil
}

// HostOfURL returns the normalised host of an http(s) URL, by the same rules
// as ParseCounterparty. The history reader uses it on resource URLs.
func HostOfURL(raw string) (string, error) { return hostOfURL(raw) }

func hostOfURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("URL %q cannot be parsed", clip(raw))
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "https" && scheme != "http" {
		return "", fmt.Errorf("URL %q: only http and https URLs name a service", clip(raw))
	}
	if u.User != nil {
		return "", fmt.Errorf("URL %q carries user information before the host; it is refused because it disguises the host", clip(raw))
	}
	if u.Opaque != "" || u.Host == "" {
		return "", fmt.Errorf("URL %q has no host", clip(raw))
	}
	host := u.Host
	// Drop the port: a service is identified by its host.
	if strings.HasPrefix(host, "[") {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return "", fmt.Errorf("URL %q: unterminated IPv6 literal", clip(raw))
		}
		if rest := host[end+1:]; rest != "" && !validPort(rest) {
			return "", fmt.Errorf("URL %q: bad port %q", clip(raw), clip(rest))
		}
		host = host[:end+1]
	} else if i := strings.LastIndexByte(host, ':'); i >= 0 {
		if !validPort(host[i:]) {
			return "", fmt.Errorf("URL %q: bad port %q", clip(raw), clip(host[i:]))
		}
		host = host[:i]
	}
	return normaliseHost(host, true)
}

// validPort accepts ":" followed by 1..5 digits of a value 1..65535.
func validPort(p string) bool {
	if len(p) < 2 || len(p) > 6 || p[0] != ':' || !allBytes(p[1:], isDigit) {
		return false
	}
	n := 0
	for _, c := range p[1:] {
		n = n*10 + int(c-'0')
	}
	return n >= 1 && n <= 65535
}

func normaliseHost(h string, fromURL bool) (string, error) {
	if h == "" {
		return "", fmt.Errorf("the host is empty")
	}
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		if !fromURL {
			return "", fmt.Errorf("host %q: write a bare IPv6 address without brackets", clip(h))
		}
		h = h[1 : len(h)-1]
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", fmt.Errorf("host [%s] is not an IPv6 address", clip(h))
		}
		return a.String(), nil
	}
	if strings.Contains(h, ":") {
		if a, err := netip.ParseAddr(h); err == nil && a.Is6() && a.Zone() == "" && !fromURL {
			return a.String(), nil
		}
		return "", fmt.Errorf("host %q: a bare host may not carry a port; give a URL (its port is ignored)", clip(h))
	}
	for i := 0; i < len(h); i++ {
		if h[i] >= utf8.RuneSelf {
			return "", fmt.Errorf("host %q is not ASCII; write an internationalised name in its xn-- form", clip(h))
		}
	}
	h = strings.ToLower(h)
	h = strings.TrimSuffix(h, ".")
	if len(h) > 253 {
		return "", fmt.Errorf("host name is %d characters long; at most 253 are allowed", len(h))
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" {
			return "", fmt.Errorf("host %q has an empty label", clip(h))
		}
		if len(l) > 63 {
			return "", fmt.Errorf("host %q has a label longer than 63 characters", clip(h))
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("host %q has a label that starts or ends with a hyphen", clip(h))
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(isDigit(c) || (c >= 'a' && c <= 'z') || c == '-') {
				return "", fmt.Errorf("host %q contains the character %q; host names use letters, digits and hyphens", clip(h), rune(c))
			}
		}
	}
	if last := labels[len(labels)-1]; allBytes(last, isDigit) {
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is4() {
			return "", fmt.Errorf("host %q looks numeric but is not a dotted IPv4 address", clip(h))
		}
		return a.String(), nil
	}
	return h, nil
}
