package guard

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if len(c.Allowlist) != 0 || len(c.Denylist) != 0 {
		t.Errorf("lists not empty: %+v", c)
	}
	if c.Limit.Amount.String() != "5000000" || c.Limit.Window != 24*time.Hour {
		t.Errorf("limit %s %s", c.Limit.Amount, c.Limit.Window)
	}
	if c.MaxOpenPartial != 0 || c.ReviewAbove.String() != "1000000" {
		t.Errorf("maxOpenPartial %d reviewAbove %s", c.MaxOpenPartial, c.ReviewAbove)
	}
	if c.DefaultAsset.Key != USDCBase || c.DefaultAsset.Decimals != 6 || c.DefaultAsset.Symbol != "USDC" {
		t.Errorf("default asset %+v", c.DefaultAsset)
	}
	if _, ok := c.Assets.Lookup(USDCBaseSepolia); !ok {
		t.Errorf("Base Sepolia USDC is not built in")
	}
	if c.PolicyFile != "" {
		t.Errorf("policy %q", c.PolicyFile)
	}
}

func TestParseConfigEveryKey(t *testing.T) {
	js := `{
	  "allowlist": ["0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "https://API.example.com:8443/x"],
	  "denylist": ["evil.example."],
	  "perCounterpartyLimit": {"amount": "12.5", "windowHours": 1.5},
	  "maxOpenPartialPerCounterparty": 2,
	  "reviewAbove": "3",
	  "defaultAsset": "eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F",
	  "assets": {"eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F": {"symbol": "DAI", "decimals": 18}},
	  "policy": "rules/custom.json"
	}`
	c, err := ParseConfig([]byte(js), "/etc/haia")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Allowlist) != 2 || c.Allowlist[0] != (Counterparty{KindAddress, "0x209693bc6afc0c5328ba36faf03c514ef312287c"}) || c.Allowlist[1] != (Counterparty{KindHost, "api.example.com"}) {
		t.Errorf("allowlist %+v", c.Allowlist)
	}
	if len(c.Denylist) != 1 || c.Denylist[0].Value != "evil.example" {
		t.Errorf("denylist %+v", c.Denylist)
	}
	if c.DefaultAsset.Symbol != "DAI" || c.DefaultAsset.Key != "eip155:1/0x6b175474e89094c44da98b954eedeac495271d0f" {
		t.Errorf("default asset %+v", c.DefaultAsset)
	}
	if c.Limit.Amount.String() != "12500000000000000000" || c.Limit.Window != 90*time.Minute {
		t.Errorf("limit %s %s", c.Limit.Amount, c.Limit.Window)
	}
	if c.ReviewAbove.String() != "3000000000000000000" || c.MaxOpenPartial != 2 {
		t.Errorf("reviewAbove %s maxOpenPartial %d", c.ReviewAbove, c.MaxOpenPartial)
	}
	if c.PolicyFile != filepath.Join("/etc/haia", "rules/custom.json") {
		t.Errorf("policy %q", c.PolicyFile)
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct{ js, errHas string }{
		{`{"allowList": []}`, `unknown key "allowList"`},
		{`{"perCounterpartyLimit": {"amount": "1", "window": 2}}`, `unknown key "window" in perCounterpartyLimit`},
		{`{"assets": {"eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F": {"symbol": "DAI", "decimals": 18, "name": "Dai"}}}`, `unknown key "name" in assets`},
		{`{"reviewAbove": 1.5}`, "reviewAbove must be a string"},
		{`{"reviewAbove": "1.5e2"}`, "reviewAbove in USDC: unreadable amount"},
		{`{"reviewAbove": "-1"}`, "reviewAbove"},
		{`{"reviewAbove": "0.0000001"}`, "7 decimal places"},
		{`{"perCounterpartyLimit": {"amount": "five"}}`, "perCounterpartyLimit.amount"},
		{`{"perCounterpartyLimit": {"windowHours": 0}}`, "windowHours must be more than 0"},
		{`{"perCounterpartyLimit": {"windowHours": -1}}`, "windowHours must be more than 0"},
		{`{"perCounterpartyLimit": {"windowHours": "24"}}`, "windowHours must be a number"},
		{`{"perCounterpartyLimit": {"windowHours": 0.00001}}`, "whole number of seconds"},
		{`{"perCounterpartyLimit": {"windowHours": 1e9}}`, "windowHours must be more than 0 and at most"},
		{`{"perCounterpartyLimit": []}`, "perCounterpartyLimit must be a JSON object"},
		{`{"maxOpenPartialPerCounterparty": 1.5}`, "whole number"},
		{`{"maxOpenPartialPerCounterparty": -1}`, "between 0 and"},
		{`{"maxOpenPartialPerCounterparty": "1"}`, "must be a number"},
		{`{"defaultAsset": "eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F"}`, "neither a built-in asset nor listed under assets"},
		{`{"defaultAsset": "USDC"}`, "defaultAsset"},
		{`{"assets": {"DAI": {"symbol": "DAI", "decimals": 18}}}`, `assets["DAI"]`},
		{`{"assets": {"eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F": {"decimals": 18}}}`, "symbol is required"},
		{`{"assets": {"eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F": {"symbol": "DAI"}}}`, "decimals is required"},
		{`{"assets": {"eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F": {"symbol": "DAI", "decimals": 99}}}`, "decimals must be between 0 and 36"},
		{`{"assets": {"` + USDCBase + `": {"symbol": "USDC", "decimals": 18}}}`, "built-in USDC has 6 decimals"},
		{`{"allowlist": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"}`, "allowlist must be a list"},
		{`{"denylist": [42]}`, "denylist[0] must be a string"},
		{`{"denylist": ["ok.example", "https://u@evil.example/"]}`, "denylist[1]"},
		{`{"policy": ""}`, "policy must name a file"},
		{`{"tenants": {"acme": {"agents": []}}}`, `tenants["acme"].agents must be a JSON object`},
		{`{"tenants": {"acme": {"agents": {"bot\u0000": {}}}}}`, `tenants["acme"].agents: "bot\x00" is not a caller id`},
		{`{"tenants": {"acme": {"agents": {"bot": {"policy": "x.json"}}}}}`, `tenants["acme"].agents["bot"].policy applies to every caller`},
		{`{"tenants": {"acme": {"agents": {"bot": {"reviewAbove": "x"}}}}}`, `tenants["acme"].agents["bot"].reviewAbove`},
		{`{"tenants": {"acme": {"agents": {"bot": {"tenants": {}}}}}}`, `tenants["acme"].agents["bot"].tenants applies to every caller`},
		{`{"tenants": {"acme": {"reviewTtlMinutes": 5}}}`, `tenants["acme"].reviewTtlMinutes applies to every tenant`},
		{`{"agents": {"bot": {"agents": {}}}}`, `agents["bot"].agents applies to every caller`},
		{`{"agents": {"bot": {"allowlist": null}}}`, `agents["bot"].allowlist must be a list`},
		{`{"agents": {"bot": {"denylist": null}}}`, `agents["bot"].denylist must be a list`},
		{`{"reviewAbove": "1", "reviewAbove": "2"}`, `the key "reviewAbove" twice`},
		{`{} {}`, "data after the closing brace"},
		{`[]`, "must be a JSON object"},
		{`{"reviewAbove": }`, "not valid JSON"},
		{``, "must be a JSON object"},
	}
	for _, tc := range tests {
		_, err := ParseConfig([]byte(tc.js), "")
		if err == nil {
			t.Errorf("%s: accepted", tc.js)
			continue
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s: error %q, want one mentioning %q", tc.js, err, tc.errHas)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "haia-guard.config.json")
	if err := os.WriteFile(path, []byte(`{"reviewAbove":"2","policy":"p.json"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.ReviewAbove.String() != "2000000" || c.PolicyFile != filepath.Join(dir, "p.json") || c.Source != path {
		t.Errorf("%+v", c)
	}
	if _, err := LoadConfig(filepath.Join(dir, "absent.json")); err == nil || !errors.Is(err, ErrConfig) {
		t.Errorf("absent file: %v", err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, []byte(`{"denylist":["`+strings.Repeat("a", maxConfigBytes)+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big file: %v", err)
	}
	if c, err := LoadConfig(""); err != nil || c.Source != "built-in defaults" {
		t.Errorf("empty path: %v", err)
	}
}

// FuzzParseConfig: the loader never panics, and an accepted policy is
// internally consistent.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"allowlist":["api.example.com"],"denylist":["0x209693Bc6afc0C5328bA36FaF03C514EF312287C"]}`,
		`{"perCounterpartyLimit":{"amount":"5.00","windowHours":24},"maxOpenPartialPerCounterparty":0,"reviewAbove":"1.00"}`,
		`{"defaultAsset":"eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F","assets":{"eip155:1/0x6B175474E89094C44Da98b954EedeAC495271d0F":{"symbol":"DAI","decimals":18}}}`,
		`{"policy":"p.json"}`, `{"a":1}`, `{"reviewAbove":"1","reviewAbove":"2"}`, `[`,
		`{"totalLimit":{"amount":"50","windowHours":24},"velocity":{"perCounterparty":{"count":3,"windowMinutes":60},"total":{"count":10}},"duplicatePayment":{"windowMinutes":30}}`,
		`{"agents":{"bot":{"totalLimit":{"amount":"1"},"velocity":null,"reviewAbove":"0.5"}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "/cfg")
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
			return
		}
		if c.Limit.Amount == nil || c.ReviewAbove == nil || c.Limit.Window <= 0 || c.MaxOpenPartial < 0 {
			t.Fatalf("inconsistent config %+v", c)
		}
		if _, ok := c.Assets.Lookup(c.DefaultAsset.Key); !ok {
			t.Fatalf("default asset %q not in registry", c.DefaultAsset.Key)
		}
		for id, a := range c.Agents {
			if a.Agent != id || a.Agents != nil || a.Limit.Amount == nil || a.ReviewAbove == nil || a.DefaultAsset != c.DefaultAsset ||
				(a.TotalLimit != nil && (a.TotalLimit.Amount == nil || a.TotalLimit.Window <= 0)) {
				t.Fatalf("inconsistent agent policy %q: %+v", id, a)
			}
		}
	})
}

func TestParseConfigSafetyKeys(t *testing.T) {
	c := DefaultConfig()
	if strings.Join(c.HistoryTemplates, ",") != "x402-buyer" || c.UnreadableHistory != Review || c.UnattributableHistory != Review {
		t.Errorf("safe defaults: %+v %s %s", c.HistoryTemplates, c.UnreadableHistory, c.UnattributableHistory)
	}
	if c.ReviewTTL != 24*time.Hour || c.ApprovalTTL != time.Hour || c.RejectionHold != 24*time.Hour || c.MaxPendingReviews != 20 {
		t.Errorf("review defaults: %s %s %s %d", c.ReviewTTL, c.ApprovalTTL, c.RejectionHold, c.MaxPendingReviews)
	}
	c, err := ParseConfig([]byte(`{"historyTemplates": ["x402-buyer", "my-flow"], "unreadableHistory": "ignore", "unattributableHistory": "review",
		"reviewTtlMinutes": 30, "approvalTtlMinutes": 5, "rejectionHoldHours": 0, "maxPendingReviewsPerCaller": 3}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.HistoryTemplates, ",") != "x402-buyer,my-flow" || c.UnreadableHistory != Ignore || c.UnattributableHistory != Review ||
		c.ReviewTTL != 30*time.Minute || c.ApprovalTTL != 5*time.Minute || c.RejectionHold != 0 || c.MaxPendingReviews != 3 {
		t.Errorf("parsed: %+v", c)
	}
	for _, tc := range []struct{ js, errHas string }{
		{`{"historyTemplates": []}`, "between 1 and 16"},
		{`{"historyTemplates": "x402-buyer"}`, "list of template names"},
		{`{"historyTemplates": ["../x"]}`, "bare template name"},
		{`{"historyTemplates": ["a", "a"]}`, "twice"},
		{`{"historyTemplates": [1]}`, "must be a string"},
		{`{"unreadableHistory": "allow"}`, `"review" or "ignore"`},
		{`{"unattributableHistory": true}`, "must be a string"},
		{`{"reviewTtlMinutes": 0}`, "between 1"},
		{`{"approvalTtlMinutes": 1.5}`, "whole number"},
		{`{"maxPendingReviewsPerCaller": 0}`, "between 1"},
		{`{"historytemplates": ["x402-buyer"]}`, `unknown key "historytemplates"`},
	} {
		if _, err := ParseConfig([]byte(tc.js), ""); err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.js, err, tc.errHas)
		}
	}
}

func TestQuestionTemplate(t *testing.T) {
	reading := func(names ...string) *Config {
		c := DefaultConfig()
		c.HistoryTemplates = names
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  *Config
		want string
	}{
		{"no policy", nil, DefaultTemplate},
		{"the defaults", DefaultConfig(), DefaultTemplate},
		{"the default among others", reading("x402-seller", DefaultTemplate), DefaultTemplate},
		{"history under others only", reading("x402-seller", "escrow-arc"), "x402-seller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.cfg.QuestionTemplate(); got != tc.want {
				t.Fatalf("QuestionTemplate() = %q, want %q", got, tc.want)
			}
			if tc.cfg == nil {
				return
			}
			req, err := ParseRequest(RawRequest{Counterparty: "0x" + strings.Repeat("1", 40), Amount: "0.10"}, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if req.Template != tc.want {
				t.Fatalf("a question naming no template is judged under %q, want %q", req.Template, tc.want)
			}
		})
	}
}

// The loader goes on past a mistake: a file with several gives every one,
// each with its path (the one its message names), in the order read.
func TestParseConfigReportsEveryMistake(t *testing.T) {
	_, err := ParseConfig([]byte(`{"reviewAbove": "x", "allowlist": ["0xzz", "ok.example", 3],
		"velocity": {"total": {"count": 0, "windowMinutes": 0}}, "nope": 1,
		"agents": {"bot": {"reviewAbove": "y", "historyTemplates": ["a"]}},
		"tenants": {"acme": {"denylist": [1]}, "b c": {}}}`), "")
	var ces ConfigErrors
	if !errors.As(err, &ces) || !errors.Is(err, ErrConfig) {
		t.Fatalf("%v: want ConfigErrors wrapping ErrConfig", err)
	}
	var got []string
	for _, p := range ces {
		got = append(got, p.Path.JSONPath())
		if !strings.Contains(p.Err.Error(), p.Path.String()) && len(p.Path) > 0 && p.Path[0] != "tenants" {
			t.Errorf("%s: the message %q does not name its path", p.Path.JSONPath(), p.Err)
		}
	}
	want := []string{`$.reviewAbove`, `$.allowlist[0]`, `$.allowlist[2]`, `$.velocity.total.count`, `$.velocity.total.windowMinutes`, `$.nope`,
		`$.agents["bot"].historyTemplates`, `$.agents["bot"].reviewAbove`, `$.tenants["acme"].denylist[0]`, `$.tenants["b c"]`}
	if !slices.Equal(got, want) {
		t.Errorf("paths %q\nwant   %q", got, want)
	}
}
