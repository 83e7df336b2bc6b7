package console

import (
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// Every rule the guard or the engine can give a review is named in words,
// and every rule an operator turns on or off names its policy setting.
func TestEveryRuleHasWords(t *testing.T) {
	rules := append(guard.Rules(), guard.RuleReserved, guard.RuleReservationUnverified, engine.RuleQueueFull, ruleCustom)
	for _, r := range rules {
		if r == guard.RuleHistory {
			continue // what the guard read, shown apart: no rule
		}
		v := describeRule(r)
		if v.Title == "" || strings.Contains(v.Title, "_") || v.Title == r {
			t.Errorf("rule %s reads %q", r, v.Title)
		}
		if v.Setting == "" && r != guard.RuleReservationUnverified {
			t.Errorf("rule %s names no policy setting", r)
		}
	}
	if v := describeRule("some_new_rule"); v.Title != "some new rule" {
		t.Errorf("an unknown rule reads %q", v.Title)
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "just now"}, {59 * time.Second, "just now"}, {time.Minute, "1 minute ago"}, {2 * time.Minute, "2 minutes ago"},
		{time.Hour, "1 hour ago"}, {47 * time.Hour, "47 hours ago"}, {48 * time.Hour, "2 days ago"}, {-10 * time.Minute, "in 10 minutes"},
	} {
		if got := age(now.Add(-tc.d), now); got != tc.want {
			t.Errorf("age %s = %q, want %q", tc.d, got, tc.want)
		}
	}
	if tv := newTime("2026-12-05T11:22:05.123Z", now); tv.UTC != "2026-12-05 11:22:05 UTC" || tv.Age != "37 minutes ago" || tv.ISO != "2026-12-05T11:22:05.123Z" {
		t.Errorf("newTime: %+v", tv)
	}
	if tv := newTime("", now); tv.Set() {
		t.Errorf("no time: %+v", tv)
	}
}

func TestQuestion(t *testing.T) {
	c := &Console{cfg: Config{Assets: func(a string) (string, int, bool) { return "USDC", 6, a == "eip155:8453/usdc" },
		AssetSymbol: func(string) string { return "" }}}
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	payee := "0xb0b0000000000000000000000000000000000002"
	for _, tc := range []struct {
		name     string
		rv       reviewlog.Review
		headline string
		payee    string
		host     string
		rules    string
	}{
		{"an address", reviewlog.Review{Counterparty: payee, Amount: "0.25", Asset: "eip155:8453/usdc",
			Reasons: []guard.Reason{{Rule: guard.RuleOpenPartial}, {Rule: guard.RuleHistory}}},
			"Pay 0.25 USDC to 0xb0b0…0002", payee, "", "Earlier payments to this payee are still open"},
		{"a host and its payee", reviewlog.Review{Counterparty: "b.example.net", PayTo: payee, Amount: "2", Asset: "eip155:8453/usdc",
			Terms: &reviewlog.Terms{Rules: []string{guard.RuleReviewAbove, guard.RuleVelocity}}},
			"Pay 2.00 USDC to 0xb0b0…0002 at b.example.net", payee, "b.example.net", "More than a payment may be without a review|Too many payments in a short time"},
		{"a host alone, an asset the policy does not name", reviewlog.Review{Counterparty: "0xdead.example", Amount: "7", Asset: "eip155:1/0xfeed"},
			"Pay 7 of eip155:1/0xfeed to 0xdead.example", "", "0xdead.example", ""},
	} {
		q := c.question(tc.rv, now)
		var rules []string
		for _, r := range q.Rules {
			rules = append(rules, r.Title)
		}
		if q.Headline != tc.headline || q.Payee != tc.payee || q.Host != tc.host || strings.Join(rules, "|") != tc.rules {
			t.Errorf("%s: %q payee %q host %q rules %q", tc.name, q.Headline, q.Payee, q.Host, rules)
		}
	}
}

func TestKnownFor(t *testing.T) {
	payee := "0xb0b0000000000000000000000000000000000002"
	h := guard.History{Ops: []guard.Op{
		{Money: &guard.Money{PayTos: []string{payee}, Hosts: []string{"b.example.net", "cdn.b.example.net"}}},
		{Money: &guard.Money{PayTos: []string{payee}, Hosts: []string{"b.example.net"}}},
		{Money: &guard.Money{PayTos: []string{"0xcafe000000000000000000000000000000000003"}, Hosts: []string{"other.example"}}},
		{Unattributable: "no requirements"},
	}, Reserved: []guard.Op{{Money: &guard.Money{PayTos: []string{"0xfeed000000000000000000000000000000000004"}, Hosts: []string{"b.example.net"}}}}}
	if got := knownFor(h, questionView{Payee: payee}); strings.Join(got, ",") != "b.example.net,cdn.b.example.net" {
		t.Errorf("hosts of the payee: %v", got)
	}
	if got := knownFor(h, questionView{Host: "b.example.net"}); strings.Join(got, ",") != payee+",0xfeed000000000000000000000000000000000004" {
		t.Errorf("payees of the host: %v", got)
	}
	if got := knownFor(h, questionView{Payee: "0x0000000000000000000000000000000000000009"}); len(got) != 0 {
		t.Errorf("an unknown payee: %v", got)
	}
}
