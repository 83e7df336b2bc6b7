package jsonpos

import (
	"reflect"
	"testing"
)

const doc = `{
  "allowlist": ["0xa", "bad"],
  "tenants": {
    "acme": {"reviewAbove": "x",
             "agents": {"bot": {"velocity": {"total": {"count": 0}}}}}
  },
  "n": 1
}`

func TestLocate(t *testing.T) {
	for _, tc := range []struct {
		path  []any
		want  Pos
		exact bool
	}{
		{nil, Pos{1, 1}, true},
		{[]any{"allowlist"}, Pos{2, 3}, true},
		{[]any{"allowlist", 1}, Pos{2, 24}, true},
		{[]any{"tenants", "acme", "reviewAbove"}, Pos{4, 14}, true},
		{[]any{"tenants", "acme", "agents", "bot", "velocity", "total", "count"}, Pos{5, 56}, true},
		{[]any{"n"}, Pos{7, 3}, true},
		// A required member that is absent: its object.
		{[]any{"tenants", "acme", "perCounterpartyLimit", "amount"}, Pos{4, 5}, false},
		{[]any{"allowlist", 7}, Pos{2, 3}, false},
	} {
		got, exact := Locate([]byte(doc), tc.path)
		if got != tc.want || exact != tc.exact {
			t.Errorf("Locate(%v) = %v %v, want %v %v", tc.path, got, exact, tc.want, tc.exact)
		}
	}
	// A document that breaks: where it breaks.
	if got, _ := Locate([]byte("{\n  \"a\": 1,\n  \"b\": ]\n}"), []any{"b"}); got.Line != 3 {
		t.Errorf("a syntax error at line 3 located at %v", got)
	}
}

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []any
		ok   bool
	}{
		{"$", nil, true},
		{"$.rules[0].when.and[1].path", []any{"rules", 0, "when", "and", 1, "path"}, true},
		{`$.tenants["ac.me"].x`, []any{"tenants", "ac.me", "x"}, true},
		{"rules", nil, false},
		{"$.", nil, false},
		{"$[x]", nil, false},
	} {
		got, ok := ParsePath(tc.in)
		if ok != tc.ok || (ok && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("ParsePath(%q) = %v %v, want %v %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzLocate(f *testing.F) {
	f.Add([]byte(doc), "$.tenants.acme.reviewAbove")
	f.Add([]byte(`[1,[2,{"a":[3]}]]`), "$[1][1].a[0]")
	f.Add([]byte(`{"a":`), "$.a")
	f.Fuzz(func(t *testing.T, data []byte, path string) {
		p, ok := ParsePath(path)
		if !ok {
			return
		}
		pos, _ := Locate(data, p)
		if pos.Line < 1 || pos.Col < 1 {
			t.Fatalf("Locate(%q, %q) = %v", data, path, pos)
		}
	})
}
