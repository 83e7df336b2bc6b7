package strictjson

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

type inner struct {
	Amount string `json:"amount"`
	Note   string `json:"note,omitempty"`
	Hidden string `json:"-"`
}

type Embedded struct {
	Deep string `json:"deep"`
}

type outer struct {
	Embedded
	Type   string            `json:"type"`
	Inner  *inner            `json:"inner,omitempty"`
	List   []inner           `json:"list,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Free   json.RawMessage   `json:"free,omitempty"`
	Any    any               `json:"any,omitempty"`
	Plain  string
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		// want is "" for exact, "ambiguous", "shape" (an *Error that is
		// not ambiguous) or "syntax" (no *Error).
		want string
		path string
	}{
		{name: "exact", doc: `{"type":"a","inner":{"amount":"1"},"list":[{"amount":"2"}],"labels":{"X":"y","x":"z"},"free":{"A":1,"a":2},"any":[{"k":1}],"deep":"d","Plain":"p"}`},
		{name: "scalars and null are encoding/json's", doc: `{"type":1,"inner":null,"list":null}`},
		{name: "top-level repeated", doc: `{"type":"a","type":"b"}`, want: "ambiguous"},
		{name: "top-level other case beside", doc: `{"type":"a","Type":"b"}`, want: "ambiguous"},
		{name: "top-level other case alone", doc: `{"TYPE":"a"}`, want: "ambiguous"},
		{name: "nested repeated", doc: `{"inner":{"amount":"1","amount":"1000"}}`, want: "ambiguous", path: "inner"},
		{name: "nested other case", doc: `{"inner":{"amount":"1","Amount":"1000"}}`, want: "ambiguous", path: "inner"},
		{name: "in a list", doc: `{"list":[{"amount":"1"},{"amOunt":"2"}]}`, want: "ambiguous", path: "list[1]"},
		{name: "map keys repeated", doc: `{"labels":{"a":"1","a":"2"}}`, want: "ambiguous", path: "labels"},
		{name: "raw repeated", doc: `{"free":{"x":{"a":1,"a":2}}}`, want: "ambiguous", path: "free.x"},
		{name: "interface repeated", doc: `{"any":[{"a":1,"a":2}]}`, want: "ambiguous", path: "any[0]"},
		{name: "embedded other case", doc: `{"Deep":"d"}`, want: "ambiguous"},
		{name: "untagged other case", doc: `{"plain":"p"}`, want: "ambiguous"},
		{name: "a field tagged - is unknown", doc: `{"inner":{"Hidden":"h"}}`, want: "shape", path: "inner"},
		{name: "unknown", doc: `{"inner":{"extra":1}}`, want: "shape", path: "inner"},
		{name: "too deep", doc: `{"any":` + strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1) + `}`, want: "shape", path: "any" + strings.Repeat("[0]", MaxDepth-1)},
		{name: "not JSON", doc: `{"type":}`, want: "syntax"},
		{name: "ends early", doc: `{"type":"a"`, want: "syntax"},
		{name: "two values", doc: `{"type":"a"} {}`, want: "syntax"},
		{name: "empty", doc: ``, want: "syntax"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check([]byte(tc.doc), &outer{})
			var se *Error
			isErr := errors.As(err, &se)
			switch tc.want {
			case "":
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				var o outer
				if err := json.Unmarshal([]byte(tc.doc), &o); err != nil && tc.name == "exact" {
					t.Fatalf("encoding/json refuses what Check accepts: %v", err)
				}
			case "ambiguous", "shape":
				if !isErr || se.Ambiguous != (tc.want == "ambiguous") || se.Path != tc.path {
					t.Fatalf("got %#v (%v), want a %s error at %q", se, err, tc.want, tc.path)
				}
			case "syntax":
				if err == nil || isErr {
					t.Fatalf("got %v, want a syntax error", err)
				}
			}
		})
	}
}

// What encoding/json alone would read: the reason Check exists. If this
// ever fails, encoding/json became strict and Check is belt and braces.
func TestEncodingJSONAloneIsLoose(t *testing.T) {
	var o outer
	if err := json.Unmarshal([]byte(`{"inner":{"amount":"1","Amount":"1000"}}`), &o); err != nil || o.Inner.Amount != "1000" {
		t.Fatalf("%+v %v", o.Inner, err)
	}
}

// FuzzCheck: Check never panics, and what it accepts as a JSON object
// repeats no name in any object (read back by a map decoder that would
// see both) and spells every struct field exactly.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{"type":"a","inner":{"amount":"1"}}`, `{"type":"a","type":"b"}`, `{"inner":{"Amount":"1"}}`, `{"list":[{"amount":"1"}]}`, `[`, `{"any":{"a":{"a":1}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := Check(data, &outer{}); err != nil {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) != nil {
			return
		}
		known := fieldsOf(typeOfOuter)
		for k := range m {
			if _, ok := known[k]; !ok {
				t.Fatalf("accepted the field %q of no exact name", k)
			}
		}
		if raw, ok := m["inner"]; ok && string(raw) != "null" {
			var in map[string]json.RawMessage
			if json.Unmarshal(raw, &in) == nil {
				for k := range in {
					if k != "amount" && k != "note" {
						t.Fatalf("accepted inner field %q", k)
					}
				}
			}
		}
		if dup := repeated(data); dup != "" {
			t.Fatalf("accepted %q twice in %q", dup, data)
		}
	})
}
