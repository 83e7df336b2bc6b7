package guard

import (
	"errors"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"
)

// resourceOf sets the operation's resource URLs (already canonical).
func resourceOf(urls ...string) func(*Op) { return func(o *Op) { o.Money.Resources = urls } }

// The new rules at their boundaries: exactly at a limit is allowed, one
// atomic unit (or one payment) over is reviewed, the window's edge is
// inside and one millisecond past it is outside.
func TestDecideNewLimits(t *testing.T) {
	const (
		total    = `{"reviewAbove":"100","perCounterpartyLimit":{"amount":"1000"},"totalLimit":{"amount":"5","windowHours":24}}`
		velPer   = `{"reviewAbove":"100","perCounterpartyLimit":{"amount":"1000"},"velocity":{"perCounterparty":{"count":3,"windowMinutes":60}}}`
		velTotal = `{"reviewAbove":"100","perCounterpartyLimit":{"amount":"1000"},"velocity":{"total":{"count":2}}}`
		dup      = `{"reviewAbove":"100","perCounterpartyLimit":{"amount":"1000"},"duplicatePayment":{"windowMinutes":30}}`
		res      = "https://api.example.com/reports/weekly"
	)
	tests := []struct {
		name      string
		cfg       string
		req       RawRequest
		ops       []Op
		want      string
		rules     []string
		evidence  []Ref  // of the first fired rule, when set
		detailHas string // in some reason's detail, when set
	}{
		// total_limit
		{name: "total: exactly at the limit", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "1"},
			ops: []Op{op("o1", 3_000_000, time.Hour), op("o2", 1_000_000, 2*time.Hour, toB)}, want: Allow},
		{name: "total: one atomic unit over", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "1.000001"},
			ops: []Op{op("o1", 3_000_000, time.Hour), op("o2", 1_000_000, 2*time.Hour, toB)}, want: Review, rules: []string{RuleTotalLimit},
			evidence: []Ref{{"run-1", "o1"}, {"run-1", "o2"}}, detailHas: "4 USDC already paid to all counterparties in the last 24 hours plus 1.000001 USDC makes 5.000001 USDC, over the total limit of 5 USDC"},
		{name: "total: the window edge is inside", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "1.000001"},
			ops: []Op{op("o1", 4_000_000, 24*time.Hour, toB)}, want: Review, rules: []string{RuleTotalLimit}},
		{name: "total: one millisecond past the window is outside", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "1.000001"},
			ops: []Op{op("o1", 4_000_000, 24*time.Hour+time.Millisecond, toB)}, want: Allow},
		{name: "total: an unpaid offer is not spend", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "5"},
			ops: []Op{op("o1", 4_000_000, time.Hour, onlyOffer, toB)}, want: Allow},
		{name: "total: another asset cannot be summed", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Hour, toB, sepolia)}, want: Review, rules: []string{RuleMixedAssets}, evidence: []Ref{{"run-1", "o1"}}, detailHas: "total limit"},
		{name: "total: an unreadable amount cannot be summed", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Hour, toB, badAmount)}, want: Review, rules: []string{RuleUnparseableHistory}, detailHas: "total spend in the window is unknown"},
		{name: "total: an unreadable time cannot be placed", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Hour, toB, badTime)}, want: Review, rules: []string{RuleUnparseableHistory}, detailHas: "yesterday"},
		{name: "total: the counterparty's own unreadable amount is reported for both limits", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Hour, badAmount)}, want: Review, rules: []string{RuleUnparseableHistory, RuleUnparseableHistory}},
		{name: "total: a paid escrow deposit cannot be summed", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("e1", 0, time.Hour, escrow)}, want: Review, rules: []string{RuleUnattributable, RuleUnparseableHistory}, detailHas: "escrow receipts"},
		{name: "total: no money rule for an unknown asset", cfg: total, req: RawRequest{Counterparty: addrA, Amount: "9", Asset: "DAI"},
			ops: []Op{op("o1", 4_000_000, time.Hour)}, want: Review, rules: []string{RuleUnknownAsset}},
		{name: "total: after per_counterparty_limit, before review_above", cfg: `{"reviewAbove":"0.5","perCounterpartyLimit":{"amount":"1"},"totalLimit":{"amount":"1"}}`,
			req: RawRequest{Counterparty: addrA, Amount: "0.6"}, ops: []Op{op("o1", 500_000, time.Hour)}, want: Review,
			rules: []string{RulePerCounterparty, RuleTotalLimit, RuleReviewAbove}},

		// velocity_limit, per counterparty
		{name: "velocity: this one makes exactly the count", cfg: velPer, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute), op("o2", 1, 2*time.Minute), op("o3", 1, 3*time.Minute, toB)}, want: Allow},
		{name: "velocity: one payment over the count", cfg: velPer, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute), op("o2", 1, 2*time.Minute), op("o3", 1, 3*time.Minute)}, want: Review, rules: []string{RuleVelocity},
			evidence: []Ref{{"run-1", "o1"}, {"run-1", "o2"}, {"run-1", "o3"}}, detailHas: "3 payments to " + strings.ToLower(addrA) + " in the last 60 minutes; this one would make 4, more than the 3"},
		{name: "velocity: the window edge is inside", cfg: velPer, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute), op("o2", 1, 2*time.Minute), op("o3", 1, time.Hour)}, want: Review, rules: []string{RuleVelocity}},
		{name: "velocity: one millisecond past the window is outside", cfg: velPer, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute), op("o2", 1, 2*time.Minute), op("o3", 1, time.Hour+time.Millisecond)}, want: Allow},
		{name: "velocity: a 402 without payment is no payment", cfg: velPer, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute), op("o2", 1, 2*time.Minute), op("o3", 1, 3*time.Minute, onlyOffer)}, want: Allow},
		{name: "velocity: a time that cannot be read counts as inside", cfg: velPer, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute), op("o2", 1, 2*time.Minute), op("o3", 1, 0, badTime)}, want: Review, rules: []string{RuleUnparseableHistory, RuleVelocity}},
		{name: "velocity: counts even when the amount cannot be read", cfg: velPer, req: RawRequest{Counterparty: addrA, Amount: "1e3"},
			ops: []Op{op("o1", 1, time.Minute), op("o2", 1, 2*time.Minute), op("o3", 1, 3*time.Minute)}, want: Review, rules: []string{RuleUnparseableAmount, RuleVelocity}},

		// velocity_limit, total
		{name: "velocity total: exactly the count", cfg: velTotal, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute, toB)}, want: Allow},
		{name: "velocity total: one over, whoever was paid", cfg: velTotal, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute, toB), op("e1", 0, 59*time.Minute, escrow)}, want: Review, rules: []string{RuleUnattributable, RuleVelocity}, detailHas: "to all counterparties in the last 60 minutes"},
		{name: "velocity total: default window is 60 minutes", cfg: velTotal, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute, toB), op("o2", 1, 61*time.Minute)}, want: Allow},

		// duplicate_payment
		{name: "duplicate: the same resource paid inside the window", cfg: dup, req: RawRequest{Counterparty: addrB, Amount: "0.1", Resource: "HTTPS://API.example.com:443/reports/./weekly#top"},
			ops: []Op{op("o1", 1, 10*time.Minute, resourceOf(res)), op("o2", 1, 5*time.Minute, resourceOf(res+"?page=2"))}, want: Review, rules: []string{RuleDuplicatePayment},
			evidence: []Ref{{"run-1", "o1"}}, detailHas: res + " was already paid for in the last 30 minutes (1 payment)"},
		{name: "duplicate: the window edge is inside", cfg: dup, req: RawRequest{Counterparty: addrA, Amount: "0.1", Resource: res},
			ops: []Op{op("o1", 1, 30*time.Minute, resourceOf(res))}, want: Review, rules: []string{RuleDuplicatePayment}},
		{name: "duplicate: one millisecond past the window is outside", cfg: dup, req: RawRequest{Counterparty: addrA, Amount: "0.1", Resource: res},
			ops: []Op{op("o1", 1, 30*time.Minute+time.Millisecond, resourceOf(res))}, want: Allow},
		{name: "duplicate: another query is another resource", cfg: dup, req: RawRequest{Counterparty: addrA, Amount: "0.1", Resource: res + "?page=1"},
			ops: []Op{op("o1", 1, time.Minute, resourceOf(res+"?page=2"))}, want: Allow},
		{name: "duplicate: a 402 without payment is no payment", cfg: dup, req: RawRequest{Counterparty: addrA, Amount: "0.1", Resource: res},
			ops: []Op{op("o1", 1, time.Minute, resourceOf(res), onlyOffer)}, want: Allow},
		{name: "duplicate: without a resource the rule cannot apply, and says so", cfg: dup, req: RawRequest{Counterparty: addrA, Amount: "0.1"},
			ops: []Op{op("o1", 1, time.Minute, resourceOf(res))}, want: Allow, detailHas: "the question names no resource, so duplicate_payment could not apply"},
		{name: "duplicate: history without a resource URL is named", cfg: dup, req: RawRequest{Counterparty: addrA, Amount: "0.1", Resource: res},
			ops: []Op{op("o1", 1, time.Minute)}, want: Allow, detailHas: "1 payment in the duplicate window had no usable resource URL to compare"},
		{name: "duplicate: off unless configured", cfg: `{"reviewAbove":"100"}`, req: RawRequest{Counterparty: addrA, Amount: "0.1", Resource: res},
			ops: []Op{op("o1", 1, time.Minute, resourceOf(res))}, want: Allow},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.cfg)
			req, err := ParseRequest(tc.req, cfg)
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			d := Decide(req, History{Ops: tc.ops, Runs: 1}, cfg, fixedNow)
			if d.Decision != tc.want {
				t.Errorf("decision %s, want %s; reasons %+v", d.Decision, tc.want, d.Reasons)
			}
			var fired []string
			for _, r := range d.Reasons[:len(d.Reasons)-1] {
				fired = append(fired, r.Rule)
			}
			if !reflect.DeepEqual(fired, tc.rules) {
				t.Errorf("rules %v, want %v; reasons %+v", fired, tc.rules, d.Reasons)
			}
			if tc.evidence != nil && len(d.Reasons) > 1 && !reflect.DeepEqual(d.Reasons[0].Evidence, tc.evidence) {
				t.Errorf("evidence %v, want %v", d.Reasons[0].Evidence, tc.evidence)
			}
			if tc.detailHas != "" {
				found := false
				for _, r := range d.Reasons {
					found = found || strings.Contains(r.Detail, tc.detailHas)
				}
				if !found {
					t.Errorf("no reason mentions %q: %+v", tc.detailHas, d.Reasons)
				}
			}
			if last := d.Reasons[len(d.Reasons)-1]; last.Rule != RuleHistory || !strings.HasSuffix(last.Detail, "; policy: defaults + file") {
				t.Errorf("the history line must come last and name the policy: %+v", last)
			}
		})
	}
}

func TestDecideNewFigures(t *testing.T) {
	cfg := mustConfig(t, `{"reviewAbove":"100","totalLimit":{"amount":"50"},"velocity":{"perCounterparty":{"count":9},"total":{"count":9,"windowMinutes":120}},"duplicatePayment":{}}`)
	req, err := ParseRequest(RawRequest{Counterparty: addrA, Amount: "0.5", Resource: "https://api.example.com/a"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ops := []Op{
		op("o1", 1_000_000, 30*time.Minute, resourceOf("https://api.example.com/a")),
		op("o2", 2_000_000, 90*time.Minute, toB),
		op("o3", 7, 48*time.Hour, resourceOf("https://api.example.com/a")),
		op("o4", 5, 10*time.Minute, sepolia, toB),
	}
	d := Decide(req, History{Ops: ops, Runs: 1}, cfg, fixedNow)
	f := d.Figures
	one, two, three := 1, 2, 3
	want := Figures{Total: &TotalFigures{WindowOperations: 3, Spend: big.NewInt(3_000_000), SpendWithAmount: big.NewInt(3_500_000), MixedAssets: 1},
		PaymentsInWindow: &one, PaymentsTotalInWindow: &three, DuplicatePayments: &one, PaidWithoutResource: &two, Policy: "defaults + file"}
	got := Figures{Total: f.Total, PaymentsInWindow: f.PaymentsInWindow, PaymentsTotalInWindow: f.PaymentsTotalInWindow,
		DuplicatePayments: f.DuplicatePayments, PaidWithoutResource: f.PaidWithoutResource, Policy: f.Policy}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("figures %+v %+v\nwant    %+v %+v", got, *got.Total, want, *want.Total)
	}
	// Off by default: no figures at all.
	d = Decide(req, History{Ops: ops, Runs: 1}, mustConfig(t, `{"reviewAbove":"100"}`), fixedNow)
	if f := d.Figures; f.Total != nil || f.PaymentsInWindow != nil || f.PaymentsTotalInWindow != nil || f.DuplicatePayments != nil {
		t.Errorf("figures of rules not configured: %+v", f)
	}
}

func TestCanonicalResource(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://api.example.com/reports/weekly", "https://api.example.com/reports/weekly"},
		{"HTTPS://API.Example.COM./reports/weekly", "https://api.example.com/reports/weekly"},
		{"https://api.example.com:443/reports/weekly#part", "https://api.example.com/reports/weekly"},
		{"https://api.example.com", "https://api.example.com/"},
		{"https://api.example.com?q=1", "https://api.example.com/?q=1"},
		{"https://api.example.com/a?", "https://api.example.com/a"},
		{"https://api.example.com/a/./b/../c", "https://api.example.com/a/c"},
		{"https://api.example.com/a/%2E%2E/c", "https://api.example.com/c"},
		{"https://api.example.com/%7Euser/%2f", "https://api.example.com/~user/%2F"},
		{"https://api.example.com/bücher?q=ü", "https://api.example.com/b%C3%BCcher?q=%C3%BC"},
		{"https://api.example.com/b%c3%bccher", "https://api.example.com/b%C3%BCcher"},
		{"https://api.example.com\\a\\b", "https://api.example.com/a/b"},
		{"https://bücher.example/x", "https://xn--bcher-kva.example/x"},
		{"https://[::ffff:10.1.2.3]:8443/x", "https://10.1.2.3/x"},
		{"https://[2001:DB8::1]/x", "https://[2001:db8::1]/x"},
		{"http://api.example.com/x", "http://api.example.com/x"},
		{"  https://api.example.com/x?b=2&a=1  ", "https://api.example.com/x?b=2&a=1"},
	} {
		got, err := CanonicalResource(tc.in, false)
		if err != nil || got != tc.want {
			t.Errorf("CanonicalResource(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, errHas string }{
		{"api.example.com/x", "no scheme"},
		{"ftp://api.example.com/x", "only http and https"},
		{"https:///x", "no host"},
		{"https://api.example.com/%zz", "the path has a % that does not start an escape"},
		{"https://api.example.com/x?a=%2", "the query has a %"},
		{"https://user:pw@api.example.com/x", "user information"},
	} {
		if _, err := CanonicalResource(tc.in, false); err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("CanonicalResource(%q): error %v, want one mentioning %q", tc.in, err, tc.errHas)
		}
	}
	// History may carry user information; it names the host it names.
	if got, err := CanonicalResource("https://agent:pw@api.example.com/x", true); err != nil || got != "https://api.example.com/x" {
		t.Errorf("history URL with user information: %q, %v", got, err)
	}
	// A question's resource goes through the same function.
	if _, err := ParseRequest(RawRequest{Counterparty: addrA, Amount: "1", Resource: "ftp://x.example/"}, DefaultConfig()); !errors.Is(err, ErrRequest) || !strings.Contains(err.Error(), "resource:") {
		t.Errorf("bad resource: %v", err)
	}
}

func TestParseConfigNewLimits(t *testing.T) {
	c := mustConfig(t, `{"totalLimit": {"amount": "50"}, "velocity": {"perCounterparty": {"count": 5}, "total": {"count": 30, "windowMinutes": 1440}},
		"duplicatePayment": {}}`)
	if c.TotalLimit == nil || c.TotalLimit.Amount.String() != "50000000" || c.TotalLimit.Window != 24*time.Hour {
		t.Errorf("totalLimit %+v", c.TotalLimit)
	}
	if v := c.Velocity; v.PerCounterparty == nil || *v.PerCounterparty != (CountLimit{5, time.Hour}) || v.Total == nil || *v.Total != (CountLimit{30, 24 * time.Hour}) {
		t.Errorf("velocity %+v", c.Velocity)
	}
	if c.DuplicateWindow != 24*time.Hour {
		t.Errorf("duplicate window %s", c.DuplicateWindow)
	}
	if d := DefaultConfig(); d.TotalLimit != nil || d.Velocity != (Velocity{}) || d.DuplicateWindow != 0 || d.Agents != nil || d.Name() != "defaults" {
		t.Errorf("the new rules must be off by default: %+v", d)
	}
	for _, tc := range []struct{ js, errHas string }{
		{`{"totalLimit": {}}`, "totalLimit.amount is required"},
		{`{"totalLimit": {"amount": "1", "window": 2}}`, `unknown key "window" in totalLimit`},
		{`{"totalLimit": {"amount": "1.0000001"}}`, "totalLimit.amount in USDC"},
		{`{"totalLimit": {"amount": "1", "windowHours": 0}}`, "totalLimit.windowHours must be more than 0"},
		{`{"totalLimit": "5"}`, "totalLimit must be a JSON object"},
		{`{"velocity": {"perCounterparty": {}}}`, "velocity.perCounterparty.count is required"},
		{`{"velocity": {"total": {"count": 0}}}`, "velocity.total.count must be between 1"},
		{`{"velocity": {"total": {"count": 2, "windowMinutes": 1.5}}}`, "velocity.total.windowMinutes must be a whole number"},
		{`{"velocity": {"total": {"count": 2, "windowHours": 1}}}`, `unknown key "windowHours" in velocity.total`},
		{`{"velocity": {"perAgent": {"count": 1}}}`, `unknown key "perAgent" in velocity`},
		{`{"duplicatePayment": {"windowMinutes": 0}}`, "duplicatePayment.windowMinutes must be between 1"},
		{`{"duplicatePayment": {"window": 5}}`, `unknown key "window" in duplicatePayment`},
		{`{"totallimit": {"amount": "1"}}`, `unknown key "totallimit"`},
	} {
		if _, err := ParseConfig([]byte(tc.js), ""); err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.js, err, tc.errHas)
		}
	}
}

func TestParseConfigAgents(t *testing.T) {
	c := mustConfig(t, `{
	  "perCounterpartyLimit": {"amount": "10", "windowHours": 48},
	  "totalLimit": {"amount": "100", "windowHours": 12},
	  "velocity": {"total": {"count": 20}},
	  "duplicatePayment": {"windowMinutes": 60},
	  "maxOpenPartialPerCounterparty": 1,
	  "agents": {
	    "bot-small": {"perCounterpartyLimit": {"amount": "1"}, "totalLimit": {"amount": "2"}, "reviewAbove": "0.25",
	                  "velocity": {"perCounterparty": {"count": 2}}, "denylist": ["evil.example"]},
	    "bot-free": {"totalLimit": null, "velocity": null, "duplicatePayment": null}
	  }
	}`)
	if c.For("someone else") != c || c.Name() != "defaults + file" {
		t.Fatalf("an unknown caller gets the default policy")
	}
	s := c.For("bot-small")
	if s.Name() != "defaults + file + agent bot-small" || s.Limit.Amount.String() != "1000000" || s.Limit.Window != 48*time.Hour {
		t.Errorf("bot-small limit %s %s", s.Limit.Amount, s.Limit.Window)
	}
	if s.TotalLimit.Amount.String() != "2000000" || s.TotalLimit.Window != 12*time.Hour || s.ReviewAbove.String() != "250000" {
		t.Errorf("bot-small total %+v reviewAbove %s", s.TotalLimit, s.ReviewAbove)
	}
	if *s.Velocity.PerCounterparty != (CountLimit{2, time.Hour}) || *s.Velocity.Total != (CountLimit{20, time.Hour}) {
		t.Errorf("bot-small velocity %+v %+v", s.Velocity.PerCounterparty, s.Velocity.Total)
	}
	if s.DuplicateWindow != time.Hour || s.MaxOpenPartial != 1 || len(s.Denylist) != 1 || s.Agents != nil {
		t.Errorf("bot-small inherits the rest: %+v", s)
	}
	if f := c.For("bot-free"); f.TotalLimit != nil || f.Velocity != (Velocity{}) || f.DuplicateWindow != 0 || f.Limit.Amount.String() != "10000000" {
		t.Errorf("bot-free: %+v", f)
	}
	// The agent's policy does not change the default one.
	if c.TotalLimit.Amount.String() != "100000000" || c.Limit.Amount.String() != "10000000" || c.Velocity.PerCounterparty != nil || len(c.Denylist) != 0 {
		t.Errorf("the default policy changed: %+v", c)
	}
	for _, tc := range []struct{ js, errHas string }{
		{`{"agents": {"bot": {"reviewabove": "1"}}}`, `unknown key "reviewabove" in agents["bot"]`},
		{`{"agents": {"bot": {"historyTemplates": ["x402-buyer"]}}}`, `agents["bot"].historyTemplates applies to every caller`},
		{`{"agents": {"bot": {"agents": {}}}}`, `agents["bot"].agents applies to every caller`},
		{`{"agents": {"bot": {"totalLimit": {"windowHours": 1}}}}`, `agents["bot"].totalLimit.amount is required`},
		{`{"agents": {"bot": {"perCounterpartyLimit": {"amount": "x"}}}}`, `agents["bot"].perCounterpartyLimit.amount in USDC`},
		{`{"agents": {"bot": {"denylist": [1]}}}`, `agents["bot"].denylist[0] must be a string`},
		{`{"agents": {"bot": []}}`, `agents["bot"] must be a JSON object`},
		{`{"agents": {"": {}}}`, "is not a caller id"},
		{`{"agents": {"a\u0000b": {}}}`, "is not a caller id"},
		{`{"agents": {"bot": {}, "bot": {}}}`, `the key "bot" twice`},
		{`{"agents": []}`, "agents must be a JSON object"},
	} {
		if _, err := ParseConfig([]byte(tc.js), ""); err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.js, err, tc.errHas)
		}
	}
}

// The answering policy is named in the history line.
func TestDecideNamesTheAgentPolicy(t *testing.T) {
	c := mustConfig(t, `{"agents": {"bot-1": {"reviewAbove": "0.05"}}}`)
	req, err := ParseRequest(RawRequest{Counterparty: addrA, Amount: "0.10"}, c)
	if err != nil {
		t.Fatal(err)
	}
	for caller, want := range map[string]struct{ decision, policy string }{
		"bot-1": {Review, "policy: defaults + file + agent bot-1"}, "bot-2": {Allow, "policy: defaults + file"},
	} {
		d := Decide(req, History{}, c.For(caller), fixedNow)
		if last := d.Reasons[len(d.Reasons)-1].Detail; d.Decision != want.decision || !strings.HasSuffix(last, want.policy) {
			t.Errorf("%s: %s, %q; want %s and %q", caller, d.Decision, last, want.decision, want.policy)
		}
	}
}
