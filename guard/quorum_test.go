package guard

import (
	"math/big"
	"strings"
	"testing"
)

// quorumOf writes a policy's quorum as "above:approvals,…" in atomic units.
func quorumOf(c *Config) string {
	var parts []string
	for _, t := range c.Quorum {
		parts = append(parts, t.Above.String()+":"+itoa(t.Approvals))
	}
	return strings.Join(parts, ",")
}

func itoa(n int) string { return big.NewInt(int64(n)).String() }

func TestQuorumLayers(t *testing.T) {
	const policy = `{
	  "quorum": [{"above": "100.00", "approvals": 3}, {"above": "50.00", "approvals": 2}],
	  "agents": {"bot": {"quorum": [{"above": "10", "approvals": 2}]}, "free": {"quorum": null}, "none": {"reviewAbove": "2"}},
	  "tenants": {
	    "acme": {"quorum": [], "agents": {"bot": {"quorum": [{"above": "0.5", "approvals": 4}]}}},
	    "beta": {"reviewAbove": "3"}
	  }
	}`
	c, err := ParseConfig([]byte(policy), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pol  *Config
		want string
	}{
		{"file, sorted by above", c, "50000000:2,100000000:3"},
		{"agent layer replaces the list", c.For("bot"), "10000000:2"},
		{"null turns it off", c.For("free"), ""},
		{"a layer that does not name it keeps the file's", c.For("none"), "50000000:2,100000000:3"},
		{"tenant [] turns it off", c.ForTenant("acme"), ""},
		{"tenant agent layer over the top agent layer", c.ForTenant("acme").For("bot"), "500000:4"},
		{"top agent layer applies in a tenant that does not name it", c.ForTenant("beta").For("bot"), "10000000:2"},
		{"tenant without the key keeps the file's", c.ForTenant("beta"), "50000000:2,100000000:3"},
	} {
		if got := quorumOf(tc.pol); got != tc.want {
			t.Errorf("%s: quorum %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestApprovalsFor(t *testing.T) {
	c, err := ParseConfig([]byte(`{"quorum": [{"above": "50.00", "approvals": 2}, {"above": "100", "approvals": 3}]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		atomic int64
		known  bool
		want   int
	}{
		{1_000_000, true, 1},
		{50_000_000, true, 1}, // above, not at
		{50_000_001, true, 2},
		{100_000_000, true, 2},
		{100_000_001, true, 3},
		{0, false, 3}, // an amount that cannot be compared needs the largest quorum
	} {
		if got := c.ApprovalsFor(big.NewInt(tc.atomic), tc.known); got != tc.want {
			t.Errorf("ApprovalsFor(%d, %v) = %d, want %d", tc.atomic, tc.known, got, tc.want)
		}
	}
	if got := DefaultConfig().ApprovalsFor(big.NewInt(1e12), true); got != 1 {
		t.Errorf("the defaults need %d approvals, want 1", got)
	}
}

func TestQuorumErrors(t *testing.T) {
	for _, tc := range []struct{ policy, want string }{
		{`{"quorum": {"above": "1", "approvals": 2}}`, `quorum must be a list of {"above": amount, "approvals": n}`},
		{`{"quorum": [{"above": "1"}]}`, `quorum[0].approvals is required`},
		{`{"quorum": [{"approvals": 2}]}`, `quorum[0].above is required`},
		{`{"quorum": [{"above": "1", "approvals": 1}]}`, `quorum[0].approvals must be between 2 and 20`},
		{`{"quorum": [{"above": "1", "approvals": 21}]}`, `quorum[0].approvals must be between 2 and 20`},
		{`{"quorum": [{"above": "1", "approvals": 2.5}]}`, `quorum[0].approvals must be a whole number`},
		{`{"quorum": [{"above": 1, "approvals": 2}]}`, `quorum[0].above must be a string`},
		{`{"quorum": [{"above": "-1", "approvals": 2}]}`, `quorum[0].above`},
		{`{"quorum": [{"above": "1", "approvals": 2, "who": "x"}]}`, `unknown key "who"`},
		{`{"quorum": [{"above": "1", "approvals": 2}, {"above": "1.00", "approvals": 3}]}`, `quorum[1].above names an amount an earlier entry`},
		{`{"tenants": {"acme": {"quorum": [{"above": "1", "approvals": 0}]}}}`, `tenants["acme"].quorum[0].approvals must be between 2 and 20`},
		{`{"agents": {"bot": {"quorum": "2"}}}`, `agents["bot"].quorum must be a list`},
	} {
		_, err := ParseConfig([]byte(tc.policy), "")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to say %q", tc.policy, err, tc.want)
		}
	}
}
