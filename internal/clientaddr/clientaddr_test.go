package clientaddr

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func TestAddr(t *testing.T) {
	xff, err := New([]string{"10.0.0.5", "192.168.0.0/16", "fd00::/8"}, "x-forwarded-for")
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := New([]string{"10.0.0.5"}, "Forwarded")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		r      Resolver
		remote string
		header map[string][]string
		want   string
	}{
		{"no proxy trusted: the peer, headers ignored", Resolver{}, "203.0.113.7:5000", map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, "203.0.113.7"},
		{"an untrusted peer's header is ignored", xff, "203.0.113.7:5000", map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, "203.0.113.7"},
		{"the trusted proxy's hop", xff, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}, "198.51.100.9"},
		{"forged hops to the left are not taken", xff, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"1.1.1.1, 2.2.2.2, 198.51.100.9"}}, "198.51.100.9"},
		{"forged hops on another header line", xff, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"1.1.1.1", "198.51.100.9"}}, "198.51.100.9"},
		{"a chain of trusted proxies is walked", xff, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"1.1.1.1, 198.51.100.9, 192.168.3.4"}}, "198.51.100.9"},
		{"every hop trusted: the left-most", xff, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"192.168.1.1, 192.168.3.4"}}, "192.168.1.1"},
		{"no header: the proxy itself", xff, "10.0.0.5:5000", nil, "10.0.0.5"},
		{"a hop that is no address stops the walk", xff, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"1.1.1.1, unknown"}}, "10.0.0.5"},
		{"garbage behind a trusted hop", xff, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"1.1.1.1, nope, 192.168.3.4"}}, "192.168.3.4"},
		{"ports and brackets", xff, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"[2001:db8::7]:443"}}, "2001:db8::7"},
		{"IPv4-mapped peer", xff, "[::ffff:10.0.0.5]:5000", map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}, "198.51.100.9"},
		{"the other header is not read", xff, "10.0.0.5:5000", map[string][]string{"Forwarded": {"for=1.1.1.1"}}, "10.0.0.5"},
		{"Forwarded: the right-most for=", fwd, "10.0.0.5:5000", map[string][]string{"Forwarded": {`for=1.1.1.1, for="[2001:db8::7]:443";proto=https`}}, "2001:db8::7"},
		{"Forwarded: X-Forwarded-For is not read", fwd, "10.0.0.5:5000", map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, "10.0.0.5"},
		{"Forwarded: an obfuscated node", fwd, "10.0.0.5:5000", map[string][]string{"Forwarded": {"for=1.1.1.1, for=_hidden"}}, "10.0.0.5"},
		{"IPv6 trusted prefix", xff, "[fd00::1]:5000", map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}, "198.51.100.9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
			for k, vs := range tc.header {
				for _, v := range vs {
					req.Header.Add(k, v)
				}
			}
			if got := tc.r.Addr(req); got.String() != tc.want {
				t.Fatalf("Addr = %v, want %s", got, tc.want)
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		trusted []string
		header  string
		want    string
	}{
		{[]string{"10.0.0.5"}, "X-Real-IP", "not one this server reads"},
		{[]string{"10.0.0.1/8"}, HeaderXForwardedFor, "did you mean 10.0.0.0/8"},
		{[]string{"proxy.internal"}, HeaderXForwardedFor, `"proxy.internal" is not an IP address`},
		{[]string{"10.0.0.0/40"}, HeaderXForwardedFor, "not a CIDR prefix"},
		{[]string{" "}, HeaderXForwardedFor, "empty"},
		{[]string{"fe80::1%eth0"}, HeaderXForwardedFor, "not an IP address"},
	} {
		if _, err := New(tc.trusted, tc.header); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%q, %q) = %v, want an error naming %q", tc.trusted, tc.header, err, tc.want)
		}
	}
}

func TestKey(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"198.51.100.9", "198.51.100.9"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"},
	} {
		if got := Key(netip.MustParseAddr(tc.in)); got != tc.want {
			t.Errorf("Key(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
	if Key(netip.Addr{}) != "unknown" {
		t.Error("no address")
	}
}

// FuzzAddr: whatever the headers say, the answer is the peer or an
// address a header named, never a panic, and never a hop left of an
// untrusted one.
func FuzzAddr(f *testing.F) {
	f.Add("1.1.1.1, 198.51.100.9", `for=1.1.1.1;proto=http, for="[::1]:80"`)
	f.Add("", "")
	f.Add(strings.Repeat("1.1.1.1,", 100), strings.Repeat("for=a,", 100))
	r1, _ := New([]string{"10.0.0.5", "192.168.0.0/16"}, HeaderXForwardedFor)
	r2, _ := New([]string{"10.0.0.5", "192.168.0.0/16"}, HeaderForwarded)
	f.Fuzz(func(t *testing.T, xff, fwd string) {
		for _, r := range []Resolver{r1, r2} {
			req := &http.Request{RemoteAddr: "10.0.0.5:1", Header: http.Header{"X-Forwarded-For": {xff}, "Forwarded": {fwd}}}
			got := r.Addr(req)
			if !got.IsValid() {
				t.Fatalf("no address for %q %q", xff, fwd)
			}
			if got.String() == "10.0.0.5" {
				continue
			}
			hops := r.hops(req.Header)
			found := false
			for i := len(hops) - 1; i >= 0; i-- {
				if hops[i] == got {
					found = true
					break
				}
				if !hops[i].IsValid() || !r.isTrusted(hops[i]) {
					t.Fatalf("%v taken from behind the untrusted or unreadable hop %v (%q %q)", got, hops[i], xff, fwd)
				}
			}
			if !found {
				t.Fatalf("%v is in no hop of %q %q", got, xff, fwd)
			}
		}
	})
}
