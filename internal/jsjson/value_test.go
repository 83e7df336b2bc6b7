package jsjson

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// Expected outputs were taken from Node.js: JSON.stringify(JSON.parse(in)).
func TestNumberRoundTripLikeJavaScript(t *testing.T) {
	cases := []struct{ in, want string }{
		{"0", "0"}, {"-0", "0"}, {"1", "1"}, {"1.0", "1"}, {"-1.5", "-1.5"}, {"0.1", "0.1"},
		{"1e21", "1e+21"}, {"1e20", "100000000000000000000"},
		{"123456789012345678901", "123456789012345680000"},
		{"1e-6", "0.000001"}, {"1e-7", "1e-7"}, {"1.5e-7", "1.5e-7"}, {"0.000001", "0.000001"},
		{"5e-324", "5e-324"}, {"1.7976931348623157e308", "1.7976931348623157e+308"},
		{"1e400", "null"}, {"-1e400", "null"}, {"2.5e+25", "2.5e+25"}, {"100", "100"},
		{"1e15", "1000000000000000"}, {"1e16", "10000000000000000"}, {"12345678.9", "12345678.9"},
		{"0.30000000000000004", "0.30000000000000004"}, {"9007199254740993", "9007199254740992"},
		{"4.35", "4.35"}, {"-0.0000012345", "-0.0000012345"}, {"1e-400", "0"}, {"-1e-400", "0"},
		{"123e-20", "1.23e-18"}, {"1.234e21", "1.234e+21"}, {"99999999999999999999", "100000000000000000000"},
		{"0.1e1", "1"}, {"314159e-5", "3.14159"},
	}
	for _, c := range cases {
		v, err := ParseString(c.in)
		if err != nil {
			t.Errorf("Parse(%s): %v", c.in, err)
			continue
		}
		if got := string(AppendIndent(nil, v, "", "")); got != c.want {
			t.Errorf("%s printed as %s, want %s", c.in, got, c.want)
		}
	}
}

func TestParsePrintLikeJavaScript(t *testing.T) {
	cases := []struct{ name, in, indent, want string }{
		{"repeated key keeps first position, last value", `{"a":1,"b":2,"a":3}`, "", `{"a":3,"b":2}`},
		{"thrice repeated", `{"a":1,"b":2,"a":3,"c":0,"a":{"x":[]}}`, "", `{"a":{"x":[]},"b":2,"c":0}`},
		{"array-index keys first, ascending", `{"b":1,"2":2,"1":3,"01":4,"-1":5,"4294967294":6,"4294967295":7}`, "",
			`{"1":3,"2":2,"4294967294":6,"b":1,"01":4,"-1":5,"4294967295":7}`},
		{"escapes normalised", `["\u0041\/\"\\\b\f\n\r\t\u001f\u007f\u2028"]`, "", "[\"A/\\\"\\\\\\b\\f\\n\\r\\t\\u001f\x7f\u2028\"]"},
		{"surrogate pair escape joins", `"\ud83d\ude00"`, "", "\"\U0001F600\""},
		{"lone surrogates stay escaped", `["\ud800","\udfff x","\ud83d\ud83d\ude00"]`, "", "[\"\\ud800\",\"\\udfff x\",\"\\ud83d\U0001F600\"]"},
		{"indent", `{"a":[1,{"b":null}],"c":{},"d":[]}`, "  ", "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {},\n  \"d\": []\n}"},
		{"whitespace and CR", " \t{\"a\" : true }\r\n", "", `{"a":true}`},
		{"big object dedupe", `{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k3":"x","k17":"y"}`, "",
			`{"k0":0,"k1":1,"k2":2,"k3":"x","k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":"y"}`},
		{"escaped keys dedupe", `{"\u0061":1,"a":2}`, "", `{"a":2}`},
		{"empty and look-alike keys dedupe", `{"":1,"ab":2,"ba":3,"aab":6,"":4,"ab":5}`, "", `{"":4,"ab":5,"ba":3,"aab":6}`},
		{"__proto__ is a plain key", `{"__proto__":1}`, "", `{"__proto__":1}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := ParseString(c.in)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := string(AppendIndent(nil, v, "", c.indent)); got != c.want {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		in     string
		offset int
		msg    string
	}{
		{``, 0, "unexpected end of input"},
		{`{"a":1,}`, 7, "expected a string key"},
		{`[1,]`, 3, "expected a value"},
		{`{"a" 1}`, 5, "expected ':'"},
		{`[01]`, 2, "leading zero"},
		{`[1.]`, 3, "after '.'"},
		{`[1e]`, 3, "exponent"},
		{`[-]`, 2, "expected a digit"},
		{`"a` + "\x01" + `"`, 2, "control character"},
		{`"\x"`, 2, "invalid escape"},
		{`"\u12G4"`, 3, "four hex digits"},
		{"\"\xff\"", 1, "invalid UTF-8"},
		{"\"\xed\xa0\x80\"", 1, "invalid UTF-8"},
		{`{} x`, 3, "after the JSON value"},
		{`tru`, 0, "expected \"true\""},
		{`NaN`, 0, "expected a value"},
		{"\ufeff{}", 0, "expected a value"},
		{`"abc`, 4, "unterminated string"},
		{strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), MaxDepth, "nesting deeper than 1000"},
	}
	for _, c := range cases {
		_, err := ParseString(c.in)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q) = %v, want a SyntaxError", c.in, err)
			continue
		}
		if se.Offset != c.offset || !strings.Contains(se.Msg, c.msg) {
			t.Errorf("Parse(%q) = %v, want offset %d and %q", c.in, err, c.offset, c.msg)
		}
	}
	// Exactly MaxDepth levels is fine.
	if _, err := ParseString(strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)); err != nil {
		t.Errorf("depth %d refused: %v", MaxDepth, err)
	}
}

func TestAccessors(t *testing.T) {
	v, err := ParseString(`{"s":"x\ny","n":-2.5,"b":true,"z":null,"a":[1,"2",[3]],"o":{"k":"v","k":"w"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := v.Get("s"); !ok || s.Kind() != String {
		t.Fatalf("Get(s) = %v %v", s.Kind(), ok)
	} else if got, _ := s.Str(); got != "x\ny" {
		t.Errorf("Str = %q", got)
	}
	if n, _ := v.Get("n"); true {
		if f, ok := n.Num(); !ok || f != -2.5 {
			t.Errorf("Num = %v %v", f, ok)
		}
		if _, ok := n.Str(); ok {
			t.Error("Str on a number succeeded")
		}
	}
	if b, _ := v.Get("b"); true {
		if x, ok := b.Bool(); !ok || !x {
			t.Errorf("Bool = %v %v", x, ok)
		}
	}
	if z, ok := v.Get("z"); !ok || z.Kind() != Null {
		t.Errorf("null member: %v %v", z.Kind(), ok)
	}
	if _, ok := v.Get("missing"); ok {
		t.Error("Get(missing) found something")
	}
	a, _ := v.Get("a")
	items := a.Items()
	if len(items) != 3 || items[2].Kind() != Array || a.Len() != 3 {
		t.Fatalf("Items = %d", len(items))
	}
	if f, _ := items[2].Items()[0].Num(); f != 3 {
		t.Errorf("nested item = %v", f)
	}
	o, _ := v.Get("o")
	if o.Len() != 1 {
		t.Errorf("Len of deduped object = %d", o.Len())
	}
	if k, _ := o.Get("k"); true {
		if s, _ := k.Str(); s != "w" {
			t.Errorf("repeated key value = %q, want the last", s)
		}
	}
	ms := v.Members()
	keys := []string{}
	for _, m := range ms {
		keys = append(keys, m.Key)
	}
	if strings.Join(keys, ",") != "s,n,b,z,a,o" {
		t.Errorf("Members order = %v", keys)
	}
	var zero Value
	if zero.Kind() != Null || zero.Members() != nil || zero.Items() != nil || zero.Len() != 0 {
		t.Error("zero Value is not null")
	}
	if !Equal(v, v) || Equal(v, o) {
		t.Error("Equal is wrong")
	}
}

func TestAppendIndentPrefix(t *testing.T) {
	v, _ := ParseString(`{"a":[1]}`)
	got := string(AppendIndent([]byte("x: "), v, "    ", "  "))
	want := "x: {\n      \"a\": [\n        1\n      ]\n    }"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A document built by hand around parsed values is laid out exactly as
// the whole document parsed and printed: one printer for both.
func TestIndenterHandBuilt(t *testing.T) {
	inner, _ := ParseString(`{"x":[1,{"y":"\u2028"}],"e":{}}`)
	plain, _ := ParseString(`[true,null,"s"]`)
	whole, _ := ParseString(`{"a":{"x":[1,{"y":"\u2028"}],"e":{}},"b\"":[],"c":[2.5,[true,null,"s"]]}`)
	for _, indent := range []string{"", "  ", "\t"} {
		var w Indenter
		w.Reset([]byte("> "), "  ", indent)
		w.Open('{')
		w.Key(0, "a")
		w.Value(inner)
		w.Key(1, `b"`)
		w.Buf = append(w.Buf, '[', ']')
		w.Key(2, "c")
		w.Open('[')
		w.Item(0)
		w.Buf = AppendNumber(w.Buf, 2.5)
		w.Item(1)
		w.Value(plain)
		w.Close(']')
		w.Close('}')
		if want := string(AppendIndent([]byte("> "), whole, "  ", indent)); string(w.Buf) != want {
			t.Errorf("indent %q:\ngot  %q\nwant %q", indent, w.Buf, want)
		}
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{Null: "null", Bool: "boolean", Number: "number", String: "string", Array: "array", Object: "object", 9: "kind(9)"} {
		if k.String() != want {
			t.Errorf("%d.String() = %q", k, k.String())
		}
	}
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":[true,false,null],"a":"x"}`, `{"2":1,"1":2,"x":{}}`, `"\ud800\u0000\n"`, `[1e400,-0,5e-324,0.1]`,
		`{"event_id":"e1","seq":3.0,"payload":{"note":"<&>\u2028"}}`, `[[[[]]]]`, `"\ud83d\ude00"`, "  {}\r",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data)
		if err != nil {
			return
		}
		checkText(t, string(data))
		for _, indent := range []string{"", "  "} {
			out := AppendIndent(nil, v, "", indent)
			w, err := Parse(out)
			if err != nil {
				t.Fatalf("re-parse of %q failed: %v", out, err)
			}
			if !equalAsPrinted(v, w) {
				t.Fatalf("round trip changed the value: %q -> %q", data, out)
			}
			if again := AppendIndent(nil, w, "", indent); string(again) != string(out) {
				t.Fatalf("printing is not stable: %q vs %q", out, again)
			}
		}
	})
}

// equalAsPrinted is Equal except that a non-finite number equals null, since
// JSON.stringify prints it as null.
func equalAsPrinted(a, b Value) bool {
	norm := func(k Kind, v Value) Kind {
		if f, ok := v.Num(); ok && (f > 1.7976931348623157e308 || f < -1.7976931348623157e308) {
			return Null
		}
		return k
	}
	ka, kb := norm(a.Kind(), a), norm(b.Kind(), b)
	if ka != kb {
		return false
	}
	switch ka {
	case Array:
		x, y := a.Items(), b.Items()
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalAsPrinted(x[i], y[i]) {
				return false
			}
		}
		return true
	case Object:
		x, y := a.Members(), b.Members()
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i].Key != y[i].Key || !equalAsPrinted(x[i].Value, y[i].Value) {
				return false
			}
		}
		return true
	case Null:
		return true
	}
	return Equal(a, b)
}

// checkText: a document kept as text only prints, reads and compares exactly
// as the parsed document does, at any indentation and prefix.
func checkText(t *testing.T, in string) {
	t.Helper()
	var dec Decoder
	v, err := dec.Scratch(in)
	if err != nil {
		return
	}
	kept := dec.Keep(v)
	full, _ := ParseString(in)
	if kept.Plain() != full.Plain() {
		t.Fatalf("%q: Keep changed Plain from %v to %v", in, full.Plain(), kept.Plain())
	}
	// As a text-only line among others.
	block := "[0]\n" + in + "\n{}"
	sv, err := dec.Scratch(block[4 : 4+len(in)])
	if err != nil {
		t.Fatal(err)
	}
	txt := NewLines(block).Line(sv, 4)
	if oneLine := !strings.Contains(in, "\n"); txt.Plain() != full.Plain() || (full.Plain() && txt.d.text != oneLine) {
		t.Fatalf("%q: Line kept plain %v as text %v", in, full.Plain(), txt.d.text)
	}
	for _, c := range []struct{ prefix, indent string }{{"", ""}, {"", "  "}, {"    ", "  "}, {"\t", "\t"}} {
		want := string(AppendIndent(nil, full, c.prefix, c.indent))
		if got := string(AppendIndent(nil, kept, c.prefix, c.indent)); got != want {
			t.Fatalf("%q kept from scratch prints %q, want %q", in, got, want)
		}
		if got := string(AppendIndent(nil, txt, c.prefix, c.indent)); got != want {
			t.Fatalf("%q as text (plain %v) prints %q, want %q", in, full.Plain(), got, want)
		}
	}
	if txt.Kind() != full.Kind() || !equalAsPrinted(txt, full) {
		t.Fatalf("%q as text reads differently from the parsed document", in)
	}
}

func TestPlainAndText(t *testing.T) {
	cases := []struct {
		in    string
		plain bool
	}{
		{`{"a":1,"b":[true,false,null],"c":{"d":"x y","e":[]},"f":{}}`, true},
		{` { "a" : [ 1 , 2 ] , "b" : { } , "c" : [ ] } `, true},
		{`{"event_id":"e1","seq":3,"payload":{"amount":"10000","note":"<&>  é 😀"}}`, true},
		{`[-1,0,1.5,-0.25,123456789012345,1e+21,1e-7,0.000001]`, true},
		{`[1e21]`, false},
		{`"plain"`, true},
		{`17`, true},
		{`{"a":1,"a":2}`, false},  // repeated key
		{`{"1":1,"b":2}`, false},  // array-index key
		{`{"a":"\u0041"}`, false}, // escape
		{`{"a\n":1}`, false},      // escaped key
		{`[1.0]`, false},          // not the shortest form
		{`[-0]`, false},
		{`[1E3]`, false},
		{`[1e400]`, false},
		{`[1234567890123456789]`, false},
		{`[100000000000000000000]`, true}, // 1e20 prints in full
	}
	for _, c := range cases {
		v, err := ParseString(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if v.Plain() != c.plain {
			t.Errorf("%s: Plain() = %v, want %v", c.in, v.Plain(), c.plain)
		}
		checkText(t, c.in)
	}
	// Scratch storage is reused: a second document does not disturb a kept first.
	var dec Decoder
	a, _ := dec.Scratch(`{"a":[1,2,3]}`)
	a = dec.Keep(a)
	if _, err := dec.Scratch(`{"zzz":{"y":[4,5,6,7,8]}}`); err != nil {
		t.Fatal(err)
	}
	if got := string(AppendIndent(nil, a, "", "")); got != `{"a":[1,2,3]}` {
		t.Errorf("kept value changed after the next Scratch: %s", got)
	}
}

// TestSmallIntegerAgreesWithParseFloat holds the parser's integer shortcut
// to strconv.ParseFloat and to the literals it must leave to it.
func TestSmallIntegerAgreesWithParseFloat(t *testing.T) {
	for _, lit := range []string{"1", "-1", "7", "300", "-300", "250000", "999999999999999", "-999999999999999",
		"123456789012345", "9007199254740"} {
		f, ok := smallInteger(lit)
		want, err := strconv.ParseFloat(lit, 64)
		if !ok || err != nil || f != want {
			t.Errorf("smallInteger(%s) = %v, %v; ParseFloat %v, %v", lit, f, ok, want, err)
		}
	}
	for _, lit := range []string{"0", "-0", "01", "1000000000000000", "1.5", "1e3", "-", "", "12a"} {
		if f, ok := smallInteger(lit); ok {
			t.Errorf("smallInteger(%s) = %v, want it left to ParseFloat", lit, f)
		}
	}
}

func TestSource(t *testing.T) {
	const line = `{"a":[1,{"b":"c"}]}`
	v, err := ParseString(line)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := v.Get("a")
	lines := NewLines("x\n" + line + "\nnext")
	if got := lines.Line(v, 2).Source(); got != line {
		t.Errorf("a line's Source = %q", got)
	}
	for _, c := range []struct {
		v    Value
		want string
	}{{v, line}, {a, ""}, {Value{}, ""}} {
		if got := c.v.Source(); got != c.want {
			t.Errorf("Source = %q, want %q", got, c.want)
		}
	}
}

// TestTextChangedSinceParsed: a line kept as text and changed after it was
// parsed (a mapped file rewritten) prints something, never a panic; its
// reader tells the change by its sum.
func TestTextChangedSinceParsed(t *testing.T) {
	for _, s := range []string{`}}]]`, `{"a":"b}`, `"`, `{]}}`, `[1,2]]]`} {
		var w Indenter
		w.Reset(nil, "  ", "  ")
		w.text(s)
	}
}
