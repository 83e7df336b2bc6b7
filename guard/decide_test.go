package guard

import (
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"
)

var fixedNow = time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)

const (
	addrA    = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	addrB    = "0xB0B0000000000000000000000000000000000002"
	usdcBase = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
)

func mustConfig(t testing.TB, js string) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(js), "")
	if err != nil {
		t.Fatalf("config %s: %v", js, err)
	}
	return c
}

func at(d time.Duration) string { return fixedNow.Add(-d).Format("2006-01-02T15:04:05.000Z") }

// op is a settled x402-buyer payment of atomic units of USDC on Base to addrA
// at api.example.com, ago before fixedNow; opts adjust it.
func op(id string, atomic int64, ago time.Duration, opts ...func(*Op)) Op {
	o := Op{
		RunID: "run-1", OperationID: id, Template: "x402-buyer", Completeness: "full", RolesKnown: true,
		PaidConfirmed: true, OutcomeConfirmed: true,
		Money:       &Money{PayTos: []string{strings.ToLower(addrA)}, Hosts: []string{"api.example.com"}, Atomic: big.NewInt(atomic), Asset: USDCBase},
		LastEventAt: at(ago),
	}
	for _, f := range opts {
		f(&o)
	}
	o.classify()
	return o
}

var (
	unsettled = func(o *Op) { o.Completeness, o.OutcomeConfirmed = "partial", false }
	onlyOffer = func(o *Op) { o.Completeness, o.PaidConfirmed, o.OutcomeConfirmed = "partial", false, false }
	faulted   = func(o *Op) { o.Completeness, o.OutcomeConfirmed, o.Faulted = "partial", false, true }
	toB       = func(o *Op) {
		o.Money.PayTos, o.Money.Hosts = []string{strings.ToLower(addrB)}, []string{"other.example"}
	}
	sepolia = func(o *Op) { o.Money.Asset = USDCBaseSepolia }
	custom  = func(o *Op) {
		o.Template, o.RolesKnown, o.PaidConfirmed, o.OutcomeConfirmed, o.Completeness = "my-flow", false, false, false, "partial"
	}
	escrow = func(o *Op) {
		o.Template, o.Money, o.Unattributable = "escrow-arc", nil, "escrow receipts carry no x402 money fields"
	}
	badAmount = func(o *Op) { o.Money.Atomic, o.Money.Problem = nil, `requirements.amount "1.5" is not atomic units` }
	badTime   = func(o *Op) { o.LastEventAt = "yesterday" }
	noPayTo   = func(o *Op) { o.Money.PayTos = nil }
	noHost    = func(o *Op) { o.Money.Hosts = nil }
	inRun     = func(r string) func(*Op) { return func(o *Op) { o.RunID = r } }
)

func TestDecide(t *testing.T) {
	const lenient = `{"reviewAbove": "100"}`
	tests := []struct {
		name       string
		cfg        string
		req        RawRequest
		ops        []Op
		unreadable []UnreadableRun
		want       string
		rules      []string
		evidence   []Ref  // of the first fired rule, when set
		detailHas  string // in some reason's detail, when set
	}{
		{name: "no history, small amount", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.50"}, want: Allow},
		{name: "exactly reviewAbove", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "1.00"}, want: Allow},
		{name: "one atomic unit over reviewAbove", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "1.000001"}, want: Review, rules: []string{RuleReviewAbove}},
		{name: "limit: exactly at the limit", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "1"},
			ops: []Op{op("o1", 3_000_000, time.Hour), op("o2", 1_000_000, 2*time.Hour)}, want: Allow},
		{name: "limit: one atomic unit over", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "1.000001"},
			ops: []Op{op("o1", 3_000_000, time.Hour), op("o2", 1_000_000, 2*time.Hour)}, want: Review,
			rules: []string{RulePerCounterparty}, evidence: []Ref{{"run-1", "o1"}, {"run-1", "o2"}}, detailHas: "4 USDC already paid"},
		{name: "limit: window edge is inside", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "1.000001"},
			ops: []Op{op("o1", 4_000_000, 24*time.Hour)}, want: Review, rules: []string{RulePerCounterparty}},
		{name: "limit: one millisecond past the window is outside", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "1.000001"},
			ops: []Op{op("o1", 4_000_000, 24*time.Hour+time.Millisecond)}, want: Allow},
		{name: "limit: other counterparty not counted", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "5"},
			ops: []Op{op("o1", 4_000_000, time.Hour, toB)}, want: Allow},
		{name: "limit: unpaid offers are not spend", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "5"},
			ops: []Op{op("o1", 4_000_000, time.Hour, onlyOffer)}, want: Allow},
		{name: "limit: window from config", cfg: `{"reviewAbove":"100","perCounterpartyLimit":{"amount":"2","windowHours":1}}`,
			req: RawRequest{Counterparty: addrA, Amount: "1.5"}, ops: []Op{op("o1", 1_000_000, 59*time.Minute), op("o2", 1_000_000, 61*time.Minute)},
			want: Review, rules: []string{RulePerCounterparty}, evidence: []Ref{{"run-1", "o1"}}},
		{name: "lower-case request address matches mixed-case history", cfg: lenient, req: RawRequest{Counterparty: strings.ToLower(addrA), Amount: "2"},
			ops: []Op{op("o1", 4_000_000, time.Hour)}, want: Review, rules: []string{RulePerCounterparty}},
		{name: "upper-case hex request address matches", cfg: lenient, req: RawRequest{Counterparty: "0x" + strings.ToUpper(addrA[2:]), Amount: "2"},
			ops: []Op{op("o1", 4_000_000, time.Hour)}, want: Review, rules: []string{RulePerCounterparty}},
		{name: "host matches the resource URL host", cfg: lenient, req: RawRequest{Counterparty: "api.example.com", Amount: "2"},
			ops: []Op{op("o1", 4_000_000, time.Hour)}, want: Review, rules: []string{RulePerCounterparty}},
		{name: "URL is reduced to its host", cfg: lenient, req: RawRequest{Counterparty: "https://API.example.com:443/reports/daily", Amount: "2"},
			ops: []Op{op("o1", 4_000_000, time.Hour)}, want: Review, rules: []string{RulePerCounterparty}},
		{name: "another host does not match", cfg: lenient, req: RawRequest{Counterparty: "https://example.com/", Amount: "2"},
			ops: []Op{op("o1", 4_000_000, time.Hour)}, want: Allow},
		{name: "open partial: one paid and unsettled", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops:  []Op{op("o1", 100_000, time.Hour), op("o2", 100_000, 30*time.Minute, unsettled, inRun("run-2"))},
			want: Review, rules: []string{RuleOpenPartial}, evidence: []Ref{{"run-2", "o2"}}, detailHas: "look the same"},
		{name: "open partial: tolerated by maxOpenPartialPerCounterparty", cfg: `{"maxOpenPartialPerCounterparty":1}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o2", 100_000, 30*time.Minute, unsettled)}, want: Allow},
		{name: "open partial: two over a tolerance of one", cfg: `{"maxOpenPartialPerCounterparty":1}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, unsettled), op("o2", 100_000, 30*time.Minute, unsettled)}, want: Review, rules: []string{RuleOpenPartial}},
		{name: "open partial: a 402 then nothing does not count", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, onlyOffer)}, want: Allow},
		{name: "open partial: a paid operation with a fault counts", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, faulted)}, want: Review, rules: []string{RuleOpenPartial}},
		{name: "open partial: another counterparty's does not count", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, unsettled, toB)}, want: Allow},
		{name: "custom template: every partial is open, coarse note", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, custom)}, want: Review, rules: []string{RuleOpenPartial}, detailHas: "judged coarsely"},
		{name: "custom template: a full operation counts as spend", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "2"},
			ops: []Op{op("o1", 4_000_000, time.Hour, custom, func(o *Op) { o.Completeness = "full" })}, want: Review, rules: []string{RulePerCounterparty}},
		{name: "mixed assets in the window", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour), op("o2", 100_000, time.Hour, sepolia)}, want: Review, rules: []string{RuleMixedAssets}, evidence: []Ref{{"run-1", "o2"}}},
		{name: "unparseable history amount", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, badAmount)}, want: Review, rules: []string{RuleUnparseableHistory}, detailHas: "not atomic units"},
		{name: "unparseable history time", cfg: lenient, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, badTime)}, want: Review, rules: []string{RuleUnparseableHistory}, detailHas: "yesterday"},
		{name: "escrow operation cannot be attributed", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("e1", 0, time.Hour, escrow, unsettled)}, want: Review, rules: []string{RuleUnattributable}, evidence: []Ref{{"run-1", "e1"}},
			detailHas: "1 operation could not be attributed to any address (1: escrow receipts carry no x402 money fields), 1 of them paid and not settled"},
		{name: "unattributable: ignored when the policy says so", cfg: `{"unattributableHistory":"ignore"}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("e1", 0, time.Hour, escrow, unsettled)}, want: Allow, detailHas: "which the policy says to ignore"},
		{name: "unattributable: a settled operation without pay_to does not count", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, noPayTo)}, want: Allow, detailHas: "0 of them paid and not settled"},
		{name: "unattributable: a paid, unsettled operation without pay_to reviews an address question", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, noPayTo, unsettled)}, want: Review, rules: []string{RuleUnattributable}, evidence: []Ref{{"run-1", "o1"}}},
		{name: "unattributable: the same operation matches a host question", cfg: `{}`, req: RawRequest{Counterparty: "api.example.com", Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, noPayTo, unsettled)}, want: Review, rules: []string{RuleOpenPartial}},
		{name: "unattributable: no usable host reviews a host question", cfg: `{}`, req: RawRequest{Counterparty: "api.example.com", Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, noHost, unsettled)}, want: Review, rules: []string{RuleUnattributable}, detailHas: "a usable resource URL host"},
		{name: "unattributable: a host question that matched nothing counts paid operations without a host", cfg: `{}`, req: RawRequest{Counterparty: "api.example.com", Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, noHost)}, want: Allow, detailHas: "1 paid operation had no usable host to compare"},
		{name: "several pay_to values: counts against each", cfg: `{}`, req: RawRequest{Counterparty: addrB, Amount: "0.10"},
			ops:  []Op{op("o1", 100_000, time.Hour, unsettled, func(o *Op) { o.Money.PayTos = append(o.Money.PayTos, strings.ToLower(addrB)) })},
			want: Review, rules: []string{RuleOpenPartial}},
		{name: "settlement not confirmed by payload counts as open", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops:  []Op{op("o1", 100_000, time.Hour, func(o *Op) { o.OutcomeConfirmed, o.SettlementUnconfirmed = false, true })},
			want: Review, rules: []string{RuleOpenPartial}, detailHas: "does not say settle.success is true"},
		{name: "a fault after a confirmed settlement still counts as open", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10"},
			ops: []Op{op("o1", 100_000, time.Hour, func(o *Op) { o.Faulted, o.Completeness = true, "partial" })}, want: Review, rules: []string{RuleOpenPartial}},
		{name: "unknown asset", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10", Asset: "DAI"}, want: Review, rules: []string{RuleUnknownAsset}, detailHas: "DAI"},
		{name: "unknown asset address", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10", Asset: "0x" + strings.Repeat("1", 40)}, want: Review, rules: []string{RuleUnknownAsset}},
		{name: "asset by symbol resolves to the default", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10", Asset: "usdc"}, want: Allow},
		{name: "asset by address", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10", Asset: usdcBase}, want: Allow},
		{name: "asset mismatch", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.10", Asset: USDCBaseSepolia}, want: Review, rules: []string{RuleAssetMismatch}},
		{name: "malformed amount skips the money rules", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "1e9"},
			ops: []Op{op("o1", 100_000_000, time.Hour)}, want: Review, rules: []string{RuleUnparseableAmount}, detailHas: "exponent"},
		{name: "denylist beats everything", cfg: `{"denylist":["API.example.com"],"allowlist":["other.example"]}`,
			req: RawRequest{Counterparty: "https://api.example.com/x", Amount: "-3", Asset: "DAI"},
			ops: []Op{op("o1", 100_000, time.Hour, unsettled)}, want: Block,
			rules: []string{RuleDenylist, RuleAllowlist, RuleOpenPartial, RuleUnknownAsset, RuleUnparseableAmount}},
		{name: "denylisted address alone", cfg: `{"denylist":["` + strings.ToLower(addrA) + `"]}`, req: RawRequest{Counterparty: addrA, Amount: "0.01"}, want: Block, rules: []string{RuleDenylist}},
		{name: "allowlist: listed", cfg: `{"allowlist":["` + addrA + `"]}`, req: RawRequest{Counterparty: addrA, Amount: "0.01"}, want: Allow},
		{name: "allowlist: not listed", cfg: `{"allowlist":["` + addrB + `"]}`, req: RawRequest{Counterparty: addrA, Amount: "0.01"}, want: Review, rules: []string{RuleAllowlist}},
		{name: "allowlist: a host entry does not cover an address", cfg: `{"allowlist":["api.example.com"]}`, req: RawRequest{Counterparty: addrA, Amount: "0.01"}, want: Review, rules: []string{RuleAllowlist}},
		{name: "unreadable runs are named in the history line", cfg: `{}`, req: RawRequest{Counterparty: addrA, Amount: "0.01"},
			unreadable: []UnreadableRun{{RunID: "broken", Error: "line 3: not JSON"}}, want: Review, rules: []string{RuleUnreadable}, detailHas: "1 run could not be read (broken)"},
		{name: "unreadable runs: ignored when the policy says so, and said", cfg: `{"unreadableHistory":"ignore"}`, req: RawRequest{Counterparty: addrA, Amount: "0.01"},
			unreadable: []UnreadableRun{{RunID: "broken", Error: "line 3: not JSON"}}, want: Allow, detailHas: "the policy says to ignore them"},
		{name: "unreadable runs do not hide another run's open partial", cfg: `{"unreadableHistory":"ignore"}`, req: RawRequest{Counterparty: addrA, Amount: "0.01"},
			ops: []Op{op("o1", 100_000, time.Hour, unsettled)}, unreadable: []UnreadableRun{{RunID: "broken", Error: "x"}}, want: Review, rules: []string{RuleOpenPartial}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.cfg)
			req, err := ParseRequest(tc.req, cfg)
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			d := Decide(req, History{Ops: tc.ops, Runs: 2, Unreadable: tc.unreadable}, cfg, fixedNow)
			// The index changes nothing but the work.
			indexed := History{Ops: tc.ops, Runs: 2, Unreadable: tc.unreadable}
			indexed.BuildIndex()
			if di := Decide(req, indexed, cfg, fixedNow); !reflect.DeepEqual(di, d) {
				t.Errorf("with the index: %+v\nwithout: %+v", di, d)
			}
			if d.Decision != tc.want {
				t.Errorf("decision %s, want %s; reasons %+v", d.Decision, tc.want, d.Reasons)
			}
			last := d.Reasons[len(d.Reasons)-1]
			if last.Rule != RuleHistory {
				t.Fatalf("last reason is %q, want history", last.Rule)
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
		})
	}
}

func TestDecisionText(t *testing.T) {
	d := Decision{Decision: Review, Reasons: []Reason{{Rule: RuleOpenPartial, Detail: "1 open", Evidence: []Ref{{"r", "o"}}}, {Rule: RuleHistory, Detail: "read 1"}}}
	want := "decision: review\n- open_partial: 1 open\n    run r, operation o\n- history: read 1\n"
	if got := d.Text(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestDecideFigures(t *testing.T) {
	cfg := mustConfig(t, `{"reviewAbove":"100"}`)
	req, err := ParseRequest(RawRequest{Counterparty: addrA, Amount: "0.5"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ops := []Op{op("o1", 1_000_000, time.Hour), op("o2", 250_000, 2*time.Hour, unsettled), op("o3", 7, 48*time.Hour), op("e", 0, 0, escrow)}
	d := Decide(req, History{Ops: ops, Runs: 3}, cfg, fixedNow)
	f := d.Figures
	want := Figures{Amount: big.NewInt(500_000), Matched: 3, OpenPartial: 1, WindowOperations: 2, Spend: big.NewInt(1_250_000),
		SpendWithAmount: big.NewInt(1_750_000), Operations: 4, Runs: 3, Unattributable: 1, Policy: "defaults + file"}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("figures %+v\nwant    %+v", f, want)
	}
}

func TestDecideEvidenceIsBounded(t *testing.T) {
	cfg := DefaultConfig()
	req, _ := ParseRequest(RawRequest{Counterparty: addrA, Amount: "0.01"}, cfg)
	var ops []Op
	for i := 0; i < 50; i++ {
		ops = append(ops, op(strings.Repeat("x", i+1), 1, time.Minute, unsettled))
	}
	d := Decide(req, History{Ops: ops, Runs: 1}, cfg, fixedNow)
	if d.Reasons[0].Rule != RuleOpenPartial || len(d.Reasons[0].Evidence) != maxEvidence || !strings.Contains(d.Reasons[0].Detail, "first 20 of 50") {
		t.Errorf("got %+v", d.Reasons[0])
	}
}

func TestQuestionNormalises(t *testing.T) {
	cfg := DefaultConfig()
	a, _ := ParseRequest(RawRequest{Counterparty: addrA, Amount: "1.50"}, cfg)
	b, _ := ParseRequest(RawRequest{Counterparty: strings.ToLower(addrA), Amount: "1.5", Asset: "USDC"}, cfg)
	if a.Question() != b.Question() {
		t.Errorf("%+v != %+v", a.Question(), b.Question())
	}
	c, _ := ParseRequest(RawRequest{Counterparty: addrA, Amount: "1e3", Asset: "DAI"}, cfg)
	if q := c.Question(); q.Amount != "1e3" || q.Asset != "DAI" {
		t.Errorf("unreadable parts should be kept as given: %+v", q)
	}
}

func TestParseRequestErrors(t *testing.T) {
	cfg := DefaultConfig()
	for _, raw := range []RawRequest{
		{Counterparty: "", Amount: "1"},
		{Counterparty: "0x12", Amount: "1"},
		{Counterparty: addrA, Amount: strings.Repeat("1", 3000)},
		{Counterparty: addrA, Amount: "1", Asset: "\xff"},
	} {
		if _, err := ParseRequest(raw, cfg); err == nil {
			t.Errorf("ParseRequest(%+v) succeeded", raw)
		}
	}
	req, err := ParseRequest(RawRequest{Counterparty: addrA, Amount: "1"}, cfg)
	if err != nil || req.Template != DefaultTemplate {
		t.Errorf("template default: %+v %v", req, err)
	}
}

// Each malformed amount gets its own message and sends the request to review.
func TestMalformedAmountsReview(t *testing.T) {
	cfg := DefaultConfig()
	seen := map[string]string{}
	for _, amt := range []string{"", "-1", "1e3", " 1", ".5", "5.", "1.2.3", "1,5", "abc", "0.0000001"} {
		req, err := ParseRequest(RawRequest{Counterparty: addrA, Amount: amt}, cfg)
		if err != nil {
			t.Fatalf("%q: %v", amt, err)
		}
		d := Decide(req, History{}, cfg, fixedNow)
		if d.Decision != Review || d.Reasons[0].Rule != RuleUnparseableAmount {
			t.Errorf("%q: %+v", amt, d)
			continue
		}
		msg := strings.ReplaceAll(d.Reasons[0].Detail, amt, "")
		if prev, dup := seen[msg]; dup && amt != "" {
			t.Errorf("%q and %q share the message %q", amt, prev, msg)
		}
		seen[msg] = amt
	}
}
