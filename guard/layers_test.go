package guard

import (
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"
)

// The policy's layers, in the order they compose (docs/policy.md).
const (
	lFile = iota
	lTenant
	lAgent
	lTenantAgent
	nLayers
)

var layerNames = [nLayers]string{"file", "tenant acme", "agent bot", "tenant acme agent bot"}

// layerState is what one layer writes for one key: absent (-1) or the index
// of one of the key's values.
type layerState int

const absent layerState = -1

// model is an independent statement of the composition rules, over plain
// values, to compare the parser against.
type model struct {
	allow       []string // nil with allowing false: off
	allowing    bool
	deny        []string
	limitAmount int64 // atomic
	limitWindow time.Duration
	openPartial int
	total       *Limit
	velPer      *CountLimit
	velTotal    *CountLimit
	dupWindow   time.Duration
	reviewAbove int64
	layers      []string
	agent       string
}

func defaultModel() model {
	return model{limitAmount: 5_000_000, limitWindow: 24 * time.Hour, reviewAbove: 1_000_000, layers: []string{"defaults", "file"}}
}

// keyCase is one key of the matrix: the values a layer may give it, how each
// is written, and how the model applies it.
type keyCase struct {
	key    string
	values int // how many values a layer may write (besides absent)
	json   func(layer, v int) string
	apply  func(m *model, layer, v int)
}

func hostsOf(names ...string) []string { return names }

func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

func quoteList(xs []string) string {
	b, _ := json.Marshal(xs)
	return string(b)
}

// Each layer's allowlist leaves out one of four hosts, so any two overlap
// and all four have nothing in common.
var allowOf = [nLayers][]string{
	hostsOf("a.example", "b.example", "c.example"),
	hostsOf("a.example", "b.example", "d.example"),
	hostsOf("a.example", "c.example", "d.example"),
	hostsOf("b.example", "c.example", "d.example"),
}

func keyCases() []keyCase {
	amount := func(layer int, base int64) int64 { return base + int64(layer+1)*1_000_000 }
	dec := func(atomic int64) string { return FormatAmount(big.NewInt(atomic), 6) }
	return []keyCase{
		{key: "allowlist", values: 2, // 0: the layer's list, 1: []
			json: func(l, v int) string {
				if v == 1 {
					return `[]`
				}
				return quoteList(allowOf[l])
			},
			apply: func(m *model, l, v int) {
				if v == 1 {
					return
				}
				if !m.allowing {
					m.allow, m.allowing = slices.Clone(allowOf[l]), true
					return
				}
				m.allow = intersect(m.allow, allowOf[l])
			}},
		{key: "denylist", values: 2, // 0: a host of its own and one shared, 1: []
			json: func(l, v int) string {
				if v == 1 {
					return `[]`
				}
				return quoteList([]string{fmt.Sprintf("deny-%d.example", l), "shared.example"})
			},
			apply: func(m *model, l, v int) {
				if v == 0 {
					m.deny = union(m.deny, []string{fmt.Sprintf("deny-%d.example", l), "shared.example"})
				}
			}},
		{key: "perCounterpartyLimit", values: 3, // 0: amount only, 1: window only, 2: both
			json: func(l, v int) string {
				switch v {
				case 0:
					return fmt.Sprintf(`{"amount": %q}`, dec(amount(l, 10_000_000)))
				case 1:
					return fmt.Sprintf(`{"windowHours": %d}`, l+2)
				}
				return fmt.Sprintf(`{"amount": %q, "windowHours": %d}`, dec(amount(l, 20_000_000)), l+10)
			},
			apply: func(m *model, l, v int) {
				switch v {
				case 0:
					m.limitAmount = amount(l, 10_000_000)
				case 1:
					m.limitWindow = time.Duration(l+2) * time.Hour
				default:
					m.limitAmount, m.limitWindow = amount(l, 20_000_000), time.Duration(l+10)*time.Hour
				}
			}},
		{key: "maxOpenPartialPerCounterparty", values: 2, // 0: l+1, 1: 0
			json: func(l, v int) string {
				if v == 1 {
					return "0"
				}
				return fmt.Sprint(l + 1)
			},
			apply: func(m *model, l, v int) {
				if v == 1 {
					m.openPartial = 0
				} else {
					m.openPartial = l + 1
				}
			}},
		{key: "totalLimit", values: 3, // 0: both, 1: amount only, 2: null
			json: func(l, v int) string {
				switch v {
				case 0:
					return fmt.Sprintf(`{"amount": %q, "windowHours": %d}`, dec(amount(l, 30_000_000)), l+3)
				case 1:
					return fmt.Sprintf(`{"amount": %q}`, dec(amount(l, 40_000_000)))
				}
				return `null`
			},
			apply: func(m *model, l, v int) {
				switch v {
				case 0:
					m.total = &Limit{Amount: big.NewInt(amount(l, 30_000_000)), Window: time.Duration(l+3) * time.Hour}
				case 1:
					w := 24 * time.Hour
					if m.total != nil {
						w = m.total.Window
					}
					m.total = &Limit{Amount: big.NewInt(amount(l, 40_000_000)), Window: w}
				default:
					m.total = nil
				}
			}},
		{key: "velocity", values: 4, // 0: perCounterparty count, 1: total count and window, 2: total null, 3: null
			json: func(l, v int) string {
				switch v {
				case 0:
					return fmt.Sprintf(`{"perCounterparty": {"count": %d}}`, l+1)
				case 1:
					return fmt.Sprintf(`{"total": {"count": %d, "windowMinutes": %d}}`, l+11, l+30)
				case 2:
					return `{"total": null}`
				}
				return `null`
			},
			apply: func(m *model, l, v int) {
				switch v {
				case 0:
					w := 60 * time.Minute
					if m.velPer != nil {
						w = m.velPer.Window
					}
					m.velPer = &CountLimit{Count: l + 1, Window: w}
				case 1:
					m.velTotal = &CountLimit{Count: l + 11, Window: time.Duration(l+30) * time.Minute}
				case 2:
					m.velTotal = nil
				default:
					m.velPer, m.velTotal = nil, nil
				}
			}},
		{key: "duplicatePayment", values: 3, // 0: a window, 1: {}, 2: null
			json: func(l, v int) string {
				switch v {
				case 0:
					return fmt.Sprintf(`{"windowMinutes": %d}`, l+5)
				case 1:
					return `{}`
				}
				return `null`
			},
			apply: func(m *model, l, v int) {
				switch v {
				case 0:
					m.dupWindow = time.Duration(l+5) * time.Minute
				case 1:
					if m.dupWindow == 0 {
						m.dupWindow = 24 * time.Hour
					}
				default:
					m.dupWindow = 0
				}
			}},
		{key: "reviewAbove", values: 2, // 0: more than the default, 1: less
			json: func(l, v int) string {
				if v == 1 {
					return fmt.Sprintf(`"0.0%d"`, l+1)
				}
				return fmt.Sprintf("%q", dec(amount(l, 50_000_000)))
			},
			apply: func(m *model, l, v int) {
				if v == 1 {
					m.reviewAbove = int64(l+1) * 10_000
				} else {
					m.reviewAbove = amount(l, 50_000_000)
				}
			}},
	}
}

// fileFor writes a policy file where each layer writes states[layer] of
// k, and a layer whose state is absent has no entry at all (except that a
// tenant agent needs its tenant's entry).
func fileFor(k keyCase, states [nLayers]layerState) string {
	entry := func(l int) string {
		if states[l] == absent {
			return ""
		}
		return fmt.Sprintf("%q: %s", k.key, k.json(l, int(states[l])))
	}
	var top []string
	if e := entry(lFile); e != "" {
		top = append(top, e)
	}
	if states[lAgent] != absent {
		top = append(top, fmt.Sprintf(`"agents": {"bot": {%s}}`, entry(lAgent)))
	}
	if states[lTenant] != absent || states[lTenantAgent] != absent {
		var t []string
		if e := entry(lTenant); e != "" {
			t = append(t, e)
		}
		if states[lTenantAgent] != absent {
			t = append(t, fmt.Sprintf(`"agents": {"bot": {%s}}`, entry(lTenantAgent)))
		}
		top = append(top, fmt.Sprintf(`"tenants": {"acme": {%s}}`, strings.Join(t, ", ")))
	}
	return "{" + strings.Join(top, ", ") + "}"
}

// expect applies the layers of view (those a caller in that position gets)
// to the model, in order.
func expect(k keyCase, states [nLayers]layerState, view []int) model {
	m := defaultModel()
	for _, l := range view {
		if l != lFile {
			present := states[l] != absent || (l == lTenant && states[lTenantAgent] != absent)
			if !present {
				continue
			}
			m.layers = append(m.layers, layerNames[l])
			if l == lAgent || l == lTenantAgent {
				m.agent = "bot"
			}
		}
		if states[l] != absent {
			k.apply(&m, l, int(states[l]))
		}
	}
	return m
}

func hostSet(cps []Counterparty) []string {
	out := make([]string, 0, len(cps))
	for _, c := range cps {
		out = append(out, c.Value)
	}
	slices.Sort(out)
	return out
}

func sorted(xs []string) []string {
	out := slices.Clone(xs)
	slices.Sort(out)
	if out == nil {
		out = []string{}
	}
	return out
}

func limitString(l *Limit) string {
	if l == nil {
		return "off"
	}
	return fmt.Sprintf("%s/%s", l.Amount, l.Window)
}

func countString(l *CountLimit) string {
	if l == nil {
		return "off"
	}
	return fmt.Sprintf("%d/%s", l.Count, l.Window)
}

// compare lists every difference between a composed policy and the model.
func compare(got *Config, want model) []string {
	var diffs []string
	check := func(what string, g, w any) {
		if fmt.Sprint(g) != fmt.Sprint(w) {
			diffs = append(diffs, fmt.Sprintf("%s: got %v, want %v", what, g, w))
		}
	}
	check("allowlist", hostSet(got.Allowlist), sorted(want.allow))
	check("allowlist on", got.Allowlisting, want.allowing)
	check("denylist", hostSet(got.Denylist), sorted(want.deny))
	check("perCounterpartyLimit", limitString(&got.Limit), limitString(&Limit{Amount: big.NewInt(want.limitAmount), Window: want.limitWindow}))
	check("maxOpenPartialPerCounterparty", got.MaxOpenPartial, want.openPartial)
	check("totalLimit", limitString(got.TotalLimit), limitString(want.total))
	check("velocity.perCounterparty", countString(got.Velocity.PerCounterparty), countString(want.velPer))
	check("velocity.total", countString(got.Velocity.Total), countString(want.velTotal))
	check("duplicatePayment", got.DuplicateWindow, want.dupWindow)
	check("reviewAbove", got.ReviewAbove, want.reviewAbove)
	check("layers", got.Name(), strings.Join(want.layers, " + "))
	check("agent", got.Agent, want.agent)
	return diffs
}

// TestPolicyLayersMatrix composes every key of a layer over every
// combination of the four layers (file, tenant, agent, tenant's agent), each
// absent or writing each of the key's kinds of value (a list, an empty list,
// a partial object, null, a tighter or a looser amount), and compares the
// policy of each caller position with an independent model of the rules:
// a key a layer does not name keeps the wider layers' value; nested keys
// compose one by one; null turns a rule off; denylists add up; allowlists
// only narrow. Then, for the caller under every layer, every denylisted
// counterparty is blocked and every counterparty off the allowlist goes to
// review, whatever layer listed it.
func TestPolicyLayersMatrix(t *testing.T) {
	views := []struct {
		name   string
		layers []int
		pick   func(c *Config) *Config
	}{
		{"file only (another caller, no tenant)", []int{lFile}, func(c *Config) *Config { return c.For("someone") }},
		{"a tenant the file does not name", []int{lFile}, func(c *Config) *Config { return c.ForTenant("globex").For("someone") }},
		{"tenant, another caller", []int{lFile, lTenant}, func(c *Config) *Config { return c.ForTenant("acme").For("someone") }},
		{"agent, no tenant", []int{lFile, lAgent}, func(c *Config) *Config { return c.For("bot") }},
		{"agent in another tenant", []int{lFile, lAgent}, func(c *Config) *Config { return c.ForTenant("globex").For("bot") }},
		{"agent in its tenant", []int{lFile, lTenant, lAgent, lTenantAgent}, func(c *Config) *Config { return c.ForTenant("acme").For("bot") }},
	}
	cases := 0
	for _, k := range keyCases() {
		// Every layer is absent or writes one of k's values: (values+1)^4.
		n := 1
		for range nLayers {
			n *= k.values + 1
		}
		for combo := range n {
			var states [nLayers]layerState
			rest := combo
			for l := range nLayers {
				states[l] = layerState(rest%(k.values+1)) - 1
				rest /= k.values + 1
			}
			file := fileFor(k, states)
			c, err := ParseConfig([]byte(file), "")
			if err != nil {
				t.Fatalf("%s %v: %s: %v", k.key, states, file, err)
			}
			for _, v := range views {
				cases++
				want := expect(k, states, v.layers)
				got := v.pick(c)
				if diffs := compare(got, want); len(diffs) > 0 {
					t.Errorf("%s, layers %v, %s\n  file %s\n  %s", k.key, states, v.name, file, strings.Join(diffs, "\n  "))
					continue
				}
				decideAgrees(t, got, want, k.key+" "+file+" "+v.name)
			}
		}
	}
	// 8 keys: (2+1)^4 * 4 + (3+1)^4 * 3 + (4+1)^4 = 324 + 768 + 625 = 1717 files.
	if cases != 1717*len(views) {
		t.Fatalf("%d cases checked, want %d", cases, 1717*len(views))
	}
}

// decideAgrees asks the composed policy about every counterparty of the
// lists: each denylisted one is blocked, each one off an active allowlist
// is reviewed with rule allowlist, and one on it is not.
func decideAgrees(t *testing.T, cfg *Config, want model, where string) {
	t.Helper()
	candidates := union(union(want.deny, []string{"a.example", "b.example", "c.example", "d.example"}), nil)
	for _, host := range candidates {
		req, err := ParseRequest(RawRequest{Counterparty: host, Amount: "0.01"}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		d := Decide(req, History{}, cfg, fixedNow)
		denied := slices.Contains(want.deny, host)
		if denied != (d.Decision == Block) {
			t.Errorf("%s: %s is %s; denylisted by the model: %v", where, host, d.Decision, denied)
		}
		offList := want.allowing && !slices.Contains(want.allow, host)
		if got := hasRule(d, RuleAllowlist); got != offList {
			t.Errorf("%s: %s allowlist rule fired %v, want %v (%+v)", where, host, got, offList, d.Reasons)
		}
		if !strings.HasSuffix(d.Reasons[len(d.Reasons)-1].Detail, "; policy: "+strings.Join(want.layers, " + ")) {
			t.Errorf("%s: the history line does not name the layers %v: %s", where, want.layers, d.Reasons[len(d.Reasons)-1].Detail)
		}
	}
}

func hasRule(d Decision, rule string) bool {
	for _, r := range d.Reasons {
		if r.Rule == rule {
			return true
		}
	}
	return false
}
