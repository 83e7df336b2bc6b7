package main

import "testing"

// The server bounds its heap near the run index's budget unless the
// operator chose (GOMEMLIMIT) or it serves tenants (an index each).
func TestMemoryLimitFollowsTheIndexBudget(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     string
		mb      int64
		tenants bool
		want    int64
		ok      bool
	}{
		{name: "default budget", mb: 768, want: 768<<20 + memoryLimitHeadroom, ok: true},
		{name: "operator's GOMEMLIMIT", env: "2GiB", mb: 768},
		{name: "tenants", mb: 768, tenants: true},
		{name: "no budget", mb: 0},
	} {
		got, ok := memoryLimit(c.env, c.mb, c.tenants)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %d %v, want %d %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
