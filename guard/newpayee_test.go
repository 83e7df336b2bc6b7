package guard

import (
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
)

// seenBook is a spend ledger that has seen the scopes it lists and holds
// nothing that still counts.
type seenBook map[string]bool

func (b seenBook) Tally(string, string, time.Time, time.Time, int) ledger.Tally {
	return ledger.Tally{Atomic: new(big.Int)}
}
func (b seenBook) Seen(scope string) bool { return b[scope] }

func TestReviewNewPayee(t *testing.T) {
	const on = `{"reviewAbove": "100", "reviewNewPayee": true, "payees": {"` + addrB + `": "Weather API"}}`
	lowerA, lowerB := strings.ToLower(addrA), strings.ToLower(addrB)
	tests := []struct {
		name       string
		cfg        string
		req        RawRequest
		ops        []Op
		unreadable []UnreadableRun
		seen       seenBook
		want       string
		detail     string // in the new_payee reason, when it fires
	}{
		{name: "off: a new payee is allowed", cfg: `{"reviewAbove": "100"}`, req: RawRequest{Counterparty: addrB, Amount: "0.5"}, want: Allow},
		{name: "a payee nobody has seen goes to review, named", cfg: on, req: RawRequest{Counterparty: addrB, Amount: "0.5"},
			ops: []Op{op("o1", 1, time.Hour)}, want: Review, detail: "first payment to " + lowerB + " (Weather API)"},
		{name: "the Trace shows a payment to it", cfg: on, req: RawRequest{Counterparty: addrA, Amount: "0.5"},
			ops: []Op{op("o1", 1, 30*24*time.Hour)}, want: Allow},
		{name: "the Trace shows only an offer, no payment", cfg: on, req: RawRequest{Counterparty: addrA, Amount: "0.5"},
			ops: []Op{op("o1", 1, time.Hour, onlyOffer)}, want: Review, detail: "first payment to " + lowerA + ":"},
		{name: "the ledger saw it (an approval's use)", cfg: on, req: RawRequest{Counterparty: addrB, Amount: "0.5"},
			seen: seenBook{ledger.ScopePayTo + lowerB: true}, want: Allow},
		{name: "the ledger saw another payee", cfg: on, req: RawRequest{Counterparty: addrB, Amount: "0.5"},
			seen: seenBook{ledger.ScopePayTo + lowerA: true}, want: Review, detail: "(Weather API)"},
		{name: "a host beside a new pay_to: the address is the payee", cfg: on,
			req: RawRequest{Counterparty: "api.example.com", PayTo: addrB, Amount: "0.5"}, ops: []Op{op("o1", 1, time.Hour)},
			want: Review, detail: "first payment to " + lowerB + " (Weather API)"},
		{name: "a host alone the Trace paid", cfg: on, req: RawRequest{Counterparty: "api.example.com", Amount: "0.5"},
			ops: []Op{op("o1", 1, time.Hour)}, want: Allow},
		{name: "a host alone the ledger saw", cfg: on, req: RawRequest{Counterparty: "new.example", Amount: "0.5"},
			seen: seenBook{ledger.ScopeHost + "new.example": true}, want: Allow},
		{name: "an unreadable Trace cannot tell, even when the policy ignores it", cfg: `{"reviewAbove": "100", "reviewNewPayee": true, "unreadableHistory": "ignore"}`,
			req: RawRequest{Counterparty: addrB, Amount: "0.5"}, unreadable: []UnreadableRun{{RunID: "run-9", Error: "bad"}},
			want: Review, detail: "1 run of the Trace cannot be read"},
		{name: "a name matches nothing: the named payee is still new", cfg: `{"reviewAbove": "100", "reviewNewPayee": true, "payees": {"` + addrA + `": "Weather API"}}`,
			req: RawRequest{Counterparty: addrB, Amount: "0.5"}, ops: []Op{op("o1", 1, time.Hour)}, want: Review, detail: "first payment to " + lowerB + ":"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.cfg)
			req, err := ParseRequest(tc.req, cfg)
			if err != nil {
				t.Fatal(err)
			}
			h := History{Ops: tc.ops, Runs: 1, Unreadable: tc.unreadable}
			if tc.seen != nil {
				h.Committed = tc.seen
			}
			for _, indexed := range []bool{false, true} {
				hh := h
				if indexed {
					hh.BuildIndex()
				}
				d := Decide(req, hh, cfg, fixedNow)
				var fired *Reason
				for i := range d.Reasons {
					if d.Reasons[i].Rule == RuleNewPayee {
						fired = &d.Reasons[i]
					}
				}
				if d.Decision != tc.want {
					t.Fatalf("indexed=%v: %s, want %s\n%s", indexed, d.Decision, tc.want, d.Text())
				}
				if (fired != nil) != (tc.detail != "") {
					t.Fatalf("indexed=%v: new_payee fired=%v, want %v\n%s", indexed, fired != nil, tc.detail != "", d.Text())
				}
				if fired != nil && !strings.Contains(fired.Detail, tc.detail) {
					t.Fatalf("indexed=%v: detail %q does not say %q", indexed, fired.Detail, tc.detail)
				}
			}
		})
	}
}

func TestReviewNewPayeeLayers(t *testing.T) {
	c := mustConfig(t, `{"reviewNewPayee": true,
	  "agents": {"batch": {"reviewNewPayee": false}, "plain": {"reviewAbove": "2"}},
	  "tenants": {"acme": {"reviewNewPayee": null}, "beta": {"agents": {"plain": {"reviewNewPayee": false}}}}}`)
	for _, tc := range []struct {
		name string
		pol  *Config
		want bool
	}{
		{"file", c, true},
		{"agent turns it off", c.For("batch"), false},
		{"agent that does not name it keeps it", c.For("plain"), true},
		{"tenant null turns it off", c.ForTenant("acme"), false},
		{"tenant agent layer", c.ForTenant("beta").For("plain"), false},
		{"tenant keeps the file's", c.ForTenant("beta"), true},
	} {
		if tc.pol.ReviewNewPayee != tc.want {
			t.Errorf("%s: reviewNewPayee %v, want %v", tc.name, tc.pol.ReviewNewPayee, tc.want)
		}
	}
	_, err := ParseConfig([]byte(`{"reviewNewPayee": "yes"}`), "")
	if err == nil || !strings.Contains(err.Error(), "reviewNewPayee must be true or false") {
		t.Fatalf("a string: %v", err)
	}
}

func TestPayeesLayersAndLabel(t *testing.T) {
	c := mustConfig(t, `{"payees": {"`+addrA+`": "Weather API", "`+addrB+`": "Maps"},
	  "tenants": {"acme": {"payees": {"`+strings.ToLower(addrB)+`": "Acme maps"}}, "beta": {"payees": null}, "gamma": {"reviewAbove": "2"}}}`)
	lowerA := strings.ToLower(addrA)
	for _, tc := range []struct {
		name, value, want string
		pol               *Config
	}{
		{"file, checksum case", addrA, addrA + " (Weather API)", c},
		{"file, lower case", lowerA, lowerA + " (Weather API)", c},
		{"tenant renames one", addrB, addrB + " (Acme maps)", c.ForTenant("acme")},
		{"tenant keeps the others", addrA, addrA + " (Weather API)", c.ForTenant("acme")},
		{"tenant null clears", addrA, addrA, c.ForTenant("beta")},
		{"tenant without the key", addrB, addrB + " (Maps)", c.ForTenant("gamma")},
		{"a host has no name", "api.example.com", "api.example.com", c},
	} {
		if got := tc.pol.Label(tc.value); got != tc.want {
			t.Errorf("%s: Label(%s) = %q, want %q", tc.name, tc.value, got, tc.want)
		}
	}
	if c.Payees[lowerA] != "Weather API" || c.ForTenant("acme").Payees[strings.ToLower(addrB)] != "Acme maps" || c.Payees[strings.ToLower(addrB)] != "Maps" {
		t.Fatalf("a tenant's names changed the file's: %v / %v", c.Payees, c.ForTenant("acme").Payees)
	}
}

func TestPayeesRefused(t *testing.T) {
	long := strings.Repeat("n", 65)
	for _, tc := range []struct {
		name, policy, want string
	}{
		{"a name as the key", `{"payees": {"Weather API": "0x` + strings.Repeat("a", 40) + `"}}`, `payees["Weather API"]: the key "Weather API" is not a payee address`},
		{"a short address", `{"payees": {"0xabc": "Weather API"}}`, `the key "0xabc" is not a payee address`},
		{"a host", `{"payees": {"api.example.com": "Weather API"}}`, `the key "api.example.com" is not a payee address`},
		{"one address twice in two cases", `{"payees": {"` + addrA + `": "A", "` + strings.ToLower(addrA) + `": "B"}}`, "names the address"},
		{"an empty name", `{"payees": {"` + addrA + `": ""}}`, "is empty"},
		{"a blank name", `{"payees": {"` + addrA + `": "   "}}`, "is empty"},
		{"a long name", `{"payees": {"` + addrA + `": "` + long + `"}}`, "has 65 characters; at most 64"},
		{"a newline", `{"payees": {"` + addrA + `": "Weather\nAPI"}}`, "control or format character U+000A"},
		{"a bidi override", `{"payees": {"` + addrA + `": "Weather \u202e IPA"}}`, "control or format character U+202E"},
		{"an address inside a name", `{"payees": {"` + addrA + `": "pay 0xB0B0000000"}}`, "shows an address"},
		{"a number", `{"payees": {"` + addrA + `": 7}}`, "must be a string"},
		{"not an object", `{"payees": ["` + addrA + `"]}`, "payees must be a JSON object"},
		{"in an agent's layer", `{"agents": {"bot": {"payees": {"` + addrA + `": "A"}}}}`, `agents["bot"].payees names payees for every caller of its tenant`},
		{"in a tenant's agent layer", `{"tenants": {"acme": {"agents": {"bot": {"payees": {}}}}}}`, "not per agent"},
		{"a tenant's bad key", `{"tenants": {"acme": {"payees": {"0xzz": "A"}}}}`, `tenants["acme"].payees["0xzz"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.policy), "")
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A policy file with a bad payee key is refused with a message naming the
// file and the key.
func TestPayeesErrorNamesFileAndKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "guard.json")
	if err := os.WriteFile(path, []byte(`{"tenants": {"acme": {"payees": {"0xWeather": "Weather API"}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if err == nil || !strings.Contains(err.Error(), path+":") || !strings.Contains(err.Error(), `tenants["acme"].payees["0xWeather"]`) {
		t.Fatalf("err %v, want one naming %s and the key", err, path)
	}
}

// A payee's name stands beside its address in every reason that names it,
// the history line included; the rules still match by address.
func TestPayeeNameInReasons(t *testing.T) {
	cfg := mustConfig(t, `{"reviewAbove": "100", "perCounterpartyLimit": {"amount": "0.5"}, "denylist": ["`+addrA+`"],
	  "payees": {"`+addrA+`": "Weather API"}}`)
	req, err := ParseRequest(RawRequest{Counterparty: strings.ToUpper("0x" + addrA[2:]), Amount: "1"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := Decide(req, History{Ops: []Op{op("o1", 1, time.Hour)}, Runs: 1}, cfg, fixedNow)
	want := strings.ToLower(addrA) + " (Weather API)"
	got := map[string]bool{}
	for _, r := range d.Reasons {
		got[r.Rule] = strings.Contains(r.Detail, want)
	}
	if d.Decision != Block || !got[RuleDenylist] || !got[RulePerCounterparty] || !got[RuleHistory] {
		t.Fatalf("%s: the name is not beside the address in %v\n%s", d.Decision, got, d.Text())
	}
}
