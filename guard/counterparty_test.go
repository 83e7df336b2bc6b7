package guard

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/net/idna"
)

func TestParseCounterparty(t *testing.T) {
	tests := []struct {
		in     string
		kind   CounterpartyKind
		want   string
		errHas string
	}{
		{"0x209693Bc6afc0C5328bA36FaF03C514EF312287C", KindAddress, "0x209693bc6afc0c5328ba36faf03c514ef312287c", ""},
		{"0x209693bc6afc0c5328ba36faf03c514ef312287c", KindAddress, "0x209693bc6afc0c5328ba36faf03c514ef312287c", ""},
		{"api.example.com", KindHost, "api.example.com", ""},
		{"API.Example.COM", KindHost, "api.example.com", ""},
		{"api.example.com.", KindHost, "api.example.com", ""},
		{"https://api.example.com/reports/weekly?x=1#f", KindHost, "api.example.com", ""},
		{"https://API.example.com:8443/", KindHost, "api.example.com", ""},
		{"http://api.example.com./x", KindHost, "api.example.com", ""},
		{"0X.", "", "", "would read as an address"},
		{"https://0x/", "", "", "would read as an address"},
		{"0x.example.com", KindHost, "0x.example.com", ""},
		{"https://[2001:db8::1]:443/x", KindHost, "2001:db8::1", ""},
		{"2001:0db8::0001", KindHost, "2001:db8::1", ""},
		{"https://192.168.001.1/", KindHost, "", "numeric"},
		{"10.0.0.1", KindHost, "10.0.0.1", ""},
		{"localhost", KindHost, "localhost", ""},
		{"xn--bcher-kva.example", KindHost, "xn--bcher-kva.example", ""},
		{"0xsite.example", KindHost, "0xsite.example", ""},
		{"", "", "", "empty"},
		{"0x1234", "", "", "40"},
		{"0X209693Bc6afc0C5328bA36FaF03C514EF312287C", KindAddress, "0x209693bc6afc0c5328ba36faf03c514ef312287c", ""},
		{"  0x209693Bc6afc0C5328bA36FaF03C514EF312287C ", KindAddress, "0x209693bc6afc0c5328ba36faf03c514ef312287c", ""},
		{"https://%61pi.example.com/x", KindHost, "api.example.com", ""},
		{"https://[::ffff:10.0.0.1]:8443/", KindHost, "10.0.0.1", ""},
		{"::ffff:10.0.0.1", KindHost, "10.0.0.1", ""},
		{"HTTPS://API.EXAMPLE.COM.:443/", KindHost, "api.example.com", ""},
		{"https://api.example.com\\@evil.example/", KindHost, "api.example.com", ""},
		{"0x209693bc6afc0c5328ba36faf03c514ef312287c\u200b", "", "", "invisible"},
		{"0x209693Bc6afc0C5328bA36FaF03C514EF31228zz", "", "", "non-hex"},
		{"api.example.com:443", "", "", "port"},
		{"https://user@api.example.com/", "", "", "user information"},
		{"https://api.example.com@evil.example/", "", "", "user information"},
		{"ftp://api.example.com/", "", "", "only http and https"},
		{"https:///path", "", "", "no host"},
		{"https://api.example.com:99999/", KindHost, "api.example.com", ""},
		{"https://api.example.com:/", KindHost, "api.example.com", ""},
		{"https://api.example.com:12x/", "", "", "bad port"},
		{"bücher.example", KindHost, "xn--bcher-kva.example", ""},
		{"https://BÜCHER.example/", KindHost, "xn--bcher-kva.example", ""},
		{"api..example.com", "", "", "empty label"},
		{"api.example.com..", "", "", "empty label"},
		{"-api.example.com", "", "", "not a valid host name"},
		{"api_x.example.com", "", "", "not a valid host name"},
		{"api.example.com/path", "", "", "scheme"},
		{"api example.com", "", "", "white space"},
		{"1.2.3", "", "", "numeric"},
		{"999.1.1.1", "", "", "numeric"},
		{strings.Repeat("a", 64) + ".example", "", "", "longer than 63"},
		{strings.Repeat("a", 3000), "", "", "bytes long"},
		{"\xff", "", "", "UTF-8"},
	}
	for _, tc := range tests {
		got, err := ParseCounterparty(tc.in)
		if tc.errHas != "" {
			if err == nil {
				t.Errorf("ParseCounterparty(%q) = %+v, want an error mentioning %q", tc.in, got, tc.errHas)
			} else if !errors.Is(err, ErrCounterparty) || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("ParseCounterparty(%q): error %q, want one mentioning %q", tc.in, err, tc.errHas)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseCounterparty(%q): %v", tc.in, err)
			continue
		}
		if got.Kind != tc.kind || got.Value != tc.want {
			t.Errorf("ParseCounterparty(%q) = %+v, want {%s %s}", tc.in, got, tc.kind, tc.want)
		}
	}
}

// FuzzParseRequest: request parsing never panics, and a parsed counterparty
// is a fixed point (parsing its value again gives the same counterparty).
func FuzzParseRequest(f *testing.F) {
	cfg := DefaultConfig()
	seeds := [][3]string{
		{"0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "0.25", ""},
		{"https://api.example.com:8443/x", "1", "USDC"},
		{"api.example.com.", "1e3", "eip155:84532/0x036cbd53842c5426634e7929541ec2318f3dcf7e"},
		{"https://u@h/", "-1", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"},
		{"[::1]", "", "DAI"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, cp, amount, asset string) {
		req, err := ParseRequest(RawRequest{Counterparty: cp, Amount: amount, Asset: asset}, cfg)
		if err != nil {
			if !errors.Is(err, ErrRequest) {
				t.Fatalf("error %v does not wrap ErrRequest", err)
			}
			return
		}
		again, err := ParseCounterparty(req.Counterparty.Value)
		if err != nil || again != req.Counterparty {
			t.Fatalf("counterparty %q → %+v is not a fixed point: %+v, %v", cp, req.Counterparty, again, err)
		}
		if req.AmountErr == nil && req.AssetErr == nil && req.Atomic == nil {
			t.Fatalf("no amount and no error for %q", amount)
		}
		_ = Decide(req, History{}, cfg, fixedNow)
	})
}

// The plain fast path gives what IDNA gives, for names that take it.
func FuzzPlainHostsMatchIDNA(f *testing.F) {
	for _, s := range []string{"api.example.com", "a-b.c", "x", "1.2.3", "a--b.example", "-a.b", "xn--bcher-kva.example"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		if !plainLDH(h) {
			return
		}
		ascii, err := idna.Lookup.ToASCII(h)
		if err != nil || strings.ToLower(ascii) != h {
			t.Fatalf("plain %q: IDNA gives %q, %v", h, ascii, err)
		}
	})
}
