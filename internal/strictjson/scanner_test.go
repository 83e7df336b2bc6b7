package strictjson

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// agree fails unless Check and the token walk say the same of data read
// as v: both nil, or errors of one kind with one text.
func agree(t *testing.T, data []byte, v any) {
	t.Helper()
	got, want := Check(data, v), checkTokens(data, v)
	if (got == nil) != (want == nil) || (got != nil && (got.Error() != want.Error() || reflect.TypeOf(got) != reflect.TypeOf(want))) {
		t.Fatalf("%q as %T: Check says %v, the token walk %v", data, v, got, want)
	}
	var g, w *Error
	if got != nil && reflect.TypeOf(got) == reflect.TypeOf(w) {
		g, w = got.(*Error), want.(*Error)
		if *g != *w {
			t.Fatalf("%q: Check %#v, the token walk %#v", data, g, w)
		}
	}
}

var agreeSeeds = []string{
	`{"type":"a","inner":{"amount":"1"},"list":[{"amount":"2"}],"labels":{"X":"y","x":"z"},"free":{"A":1,"a":2},"any":[{"k":1}],"deep":"d","Plain":"p"}`,
	`{"type":"a","type":"b"}`, `{"inner":{"Amount":"1"}}`, `{"list":[{"amount":"1"},{"amOunt":"2"}]}`,
	`{"any":{"a":{"a":1}}}`, `{"\u0074ype":"a","type":"b"}`, `{"t\u00e9":1}`, "{\"t\xff\":1,\"t\xfe\":2}",
	` { "type" : "a" , "list" : [ ] , "inner" : { } } `, `[{"a":1},{"a":1,"a":2}]`, `"s"`, `12.5e3`, `null`,
	`{"labels":{"` + strings.Repeat(`a":"1","`, 3) + `b":"2"}}`,
	`{"any":` + strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1) + `}`,
	`{"type":}`, `{"type":"a"`, `{"type":"a"} {}`, ``,
}

// The scanner and the token walk agree: the same verdict, the same error,
// the same path, for the seeds and for objects of many members (past the
// scanner's short list of names).
func TestScannerAgreesWithTokens(t *testing.T) {
	for _, doc := range agreeSeeds {
		for _, v := range []any{&outer{}, new(any), new(map[string]outer), new([]inner)} {
			agree(t, []byte(doc), v)
		}
	}
	for _, n := range []int{15, 16, 17, 40} {
		var b strings.Builder
		b.WriteString(`{"labels":{`)
		for i := range n {
			fmt.Fprintf(&b, `"k%d":"v",`, i)
		}
		b.WriteString(`"k3":"again"}}`)
		agree(t, []byte(b.String()), &outer{})
		if err := Check([]byte(b.String()), &outer{}); err == nil || !strings.Contains(err.Error(), `"k3" appears twice`) {
			t.Fatalf("%d members and k3 again: %v", n, err)
		}
	}
}

// FuzzScannerAgreesWithTokens: on any bytes, Check says what the token
// walk says.
func FuzzScannerAgreesWithTokens(f *testing.F) {
	for _, s := range agreeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		agree(t, data, &outer{})
		agree(t, data, new(any))
	})
}

// BenchmarkCheck: a review-log-like line (a record with nested objects
// and a list of reasons) by the token walk and by Check.
func BenchmarkCheck(b *testing.B) {
	doc := []byte(`{"type":"opened","inner":{"amount":"0.010000","note":"a review"},"list":[` +
		strings.Repeat(`{"amount":"1","note":"open partial operation op-12 to 0x09e0000000000000000000000000000000000001"},`, 4) +
		`{"amount":"2"}],"labels":{"caller":"bench-agent-01","params_hash":"sha256:8d0e7c1f3e1b5d5a7c9e2f4a6b8c0d1e3f5a7b9c1d3e5f7a9b1c3d5e7f9a1b3c"},"deep":"2026-12-01T23:00:00.000Z","Plain":"p"}`)
	for _, walk := range []struct {
		name string
		fn   func([]byte, any) error
	}{{"tokens", checkTokens}, {"check", Check}} {
		b.Run(walk.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := walk.fn(doc, &outer{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
