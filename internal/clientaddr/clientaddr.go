// Package clientaddr finds the address of the client behind a request:
// the TCP peer, or, when the peer is a reverse proxy the operator named as
// trusted, the address that proxy reports in the one forwarding header it
// is configured to write. A header is never read from anyone else, and a
// hop a client wrote itself is never taken: the right-most address that is
// not a trusted proxy is the client.
package clientaddr

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Headers a trusted proxy may report the client in.
const (
	HeaderXForwardedFor = "X-Forwarded-For"
	HeaderForwarded     = "Forwarded"
)

// maxHops bounds the hops read from one header, so a request with an
// enormous list costs no more than a short one.
const maxHops = 32

// Resolver finds a request's client address. The zero value trusts no
// proxy: the client is the TCP peer.
type Resolver struct {
	trusted []netip.Prefix
	header  string
}

// New is a resolver that trusts the proxies at trusted (addresses or
// CIDR prefixes, each "a.b.c.d", "a.b.c.d/n", "::1" or "fd00::/8") and
// reads the client from header (HeaderXForwardedFor or HeaderForwarded)
// when the peer is one of them.
func New(trusted []string, header string) (Resolver, error) {
	var r Resolver
	switch {
	case strings.EqualFold(header, HeaderXForwardedFor):
		r.header = HeaderXForwardedFor
	case strings.EqualFold(header, HeaderForwarded):
		r.header = HeaderForwarded
	default:
		return Resolver{}, fmt.Errorf("the forwarding header %q is not one this server reads: want %s or %s", header, HeaderXForwardedFor, HeaderForwarded)
	}
	for _, s := range trusted {
		p, err := ParsePrefix(s)
		if err != nil {
			return Resolver{}, err
		}
		r.trusted = append(r.trusted, p)
	}
	return r, nil
}

// ParsePrefix reads one trusted proxy: an IP address (a prefix of its
// full length) or a CIDR prefix whose host bits are zero.
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Prefix{}, errors.New("a trusted proxy is empty: want an IP address or a CIDR prefix such as 10.0.0.0/8")
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("the trusted proxy %q is not a CIDR prefix such as 10.0.0.0/8 or fd00::/8", s)
		}
		if p.Masked() != p {
			return netip.Prefix{}, fmt.Errorf("the trusted proxy %q has host bits set: did you mean %s?", s, p.Masked())
		}
		return netip.PrefixFrom(p.Addr().Unmap(), unmappedBits(p)), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("the trusted proxy %q is not an IP address such as 10.0.0.5 or a CIDR prefix such as 10.0.0.0/8", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// unmappedBits is p's length once an IPv4-mapped IPv6 prefix is read as
// IPv4.
func unmappedBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return max(p.Bits()-96, 0)
	}
	return p.Bits()
}

// Trusts reports whether any proxy is trusted.
func (r Resolver) Trusts() bool { return len(r.trusted) > 0 }

// Header is the forwarding header read from a trusted proxy.
func (r Resolver) Header() string { return r.header }

// Trusted lists the trusted proxies as given, normalised.
func (r Resolver) Trusted() []string {
	out := make([]string, len(r.trusted))
	for i, p := range r.trusted {
		out[i] = p.String()
	}
	return out
}

func (r Resolver) isTrusted(a netip.Addr) bool {
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Addr is the client of req: the TCP peer unless it is a trusted proxy,
// else the right-most address of the configured header that is not a
// trusted proxy (the left-most when every hop is one). A trusted proxy
// that sent no readable header, or a hop that is no address, leaves the
// last trusted address read: a client cannot name itself.
func (r Resolver) Addr(req *http.Request) netip.Addr {
	peer := peerAddr(req.RemoteAddr)
	if !peer.IsValid() || !r.isTrusted(peer) {
		return peer
	}
	hops := r.hops(req.Header)
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := hops[i], hops[i].IsValid()
		if !ok {
			return client // a hop that is no address: stop at the last one a trusted proxy stands behind
		}
		client = a
		if !r.isTrusted(a) {
			return a
		}
	}
	return client
}

// hops reads the configured header's addresses, left to right, the last
// maxHops of them; an entry that is no address is an invalid Addr.
func (r Resolver) hops(h http.Header) []netip.Addr {
	var raw []string
	switch r.header {
	case HeaderXForwardedFor:
		for _, line := range h.Values(HeaderXForwardedFor) {
			for _, e := range strings.Split(line, ",") {
				raw = append(raw, strings.TrimSpace(e))
			}
		}
	case HeaderForwarded:
		for _, line := range h.Values(HeaderForwarded) {
			for _, elem := range strings.Split(line, ",") {
				raw = append(raw, forwardedFor(elem))
			}
		}
	}
	if len(raw) > maxHops {
		raw = raw[len(raw)-maxHops:]
	}
	out := make([]netip.Addr, len(raw))
	for i, s := range raw {
		out[i] = hopAddr(s)
	}
	return out
}

// forwardedFor is the for= parameter of one Forwarded element (RFC 7239),
// unquoted; "" when it has none.
func forwardedFor(elem string) string {
	for _, pair := range strings.Split(elem, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "for") {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return v
	}
	return ""
}

// hopAddr reads one hop: an address, with or without a port ("1.2.3.4",
// "1.2.3.4:80", "[2001:db8::1]:80", "2001:db8::1"). Anything else —
// "unknown", an obfuscated node name, garbage — is no address.
func hopAddr(s string) netip.Addr {
	if s == "" {
		return netip.Addr{}
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap()
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap()
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Zone() == "" {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}

func peerAddr(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap().WithZone("")
}

// Key is the rate-limit key of a client address: an IPv4 address itself,
// an IPv6 address's /64 (one host commonly holds a whole /64, so its
// addresses are one client); "unknown" when there is none.
func Key(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "unknown"
	case a.Is4():
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}
