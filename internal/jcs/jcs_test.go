package jcs

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestCanonicalizeBytes(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"whitespace removed", " { \"b\" : 1 ,\n\t\"a\" : [ true , false , null ] } ", `{"a":[true,false,null],"b":1}`},
		{"empty containers", `{"a":{},"b":[]}`, `{"a":{},"b":[]}`},
		{"nested sort", `{"z":{"y":1,"x":2},"a":0}`, `{"a":0,"z":{"x":2,"y":1}}`},
		{"negative zero", `-0`, `0`},
		{"integers", `[0,-1,9007199254740991,-9007199254740991]`, `[0,-1,9007199254740991,-9007199254740991]`},
		{"non-ASCII literal", `"caf\u00e9 \u00fc Å"`, `"café ü Å"`},
		{"non-ASCII raw", `"日本語"`, `"日本語"`},
		{"astral from pair", `"\ud83d\ude00"`, "\"\U0001F600\""},
		{"astral raw", "\"\U0001F600\"", "\"\U0001F600\""},
		{"controls", `"\u0000\u0001\b\t\n\u000b\f\r\u001f"`, `"\u0000\u0001\b\t\n\u000b\f\r\u001f"`},
		{"quote and backslash", `"\"\\\/"`, `"\"\\/"`},
		{"html and separators kept", `"<&>\u2028\u2029\u007f"`, "\"<&>\u2028\u2029\x7f\""},
		{"uppercase hex escape", `"\u00C9"`, `"É"`},
		// UTF-16 order: U+FF61 (one unit 0xFF61) sorts after U+1F600
		// (units 0xD83D 0xDE00), the reverse of code-point order.
		{"utf16 key order", "{\"\uff61\":1,\"\U0001F600\":2,\"\u00e9\":3,\"a\":4,\"\":5}", "{\"\":5,\"a\":4,\"\u00e9\":3,\"\U0001F600\":2,\"\uff61\":1}"},
		{"prefix keys", `{"ab":1,"a":2,"b":3}`, `{"a":2,"ab":1,"b":3}`},
		{"escaped key sorts by value", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		// RFC 8785 §3.2.3 example, minus its non-integer numbers.
		{"rfc8785 sort sample", "{\"\\u20ac\":\"Euro Sign\",\"\\r\":\"Carriage Return\",\"\\ufb33\":\"Hebrew Letter Dalet With Dagesh\",\"1\":\"One\",\"\\ud83d\\ude00\":\"Emoji: Grinning Face\",\"\\u0080\":\"Control\",\"\\u00f6\":\"Latin Small Letter O With Diaeresis\"}",
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(c.in))
			if err != nil {
				t.Fatalf("Canonicalize(%s): %v", c.in, err)
			}
			if string(got) != c.want {
				t.Fatalf("Canonicalize(%s)\n got %s\nwant %s", c.in, got, c.want)
			}
			again, err := Canonicalize(got)
			if err != nil || string(again) != string(got) {
				t.Fatalf("not idempotent: %s -> %s (%v)", got, again, err)
			}
		})
	}
}

func TestCanonicalizeRefuses(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth+2) + strings.Repeat("]", MaxDepth+2)
	cases := []struct {
		name, in, msg string
	}{
		{"duplicate key", `{"a":1,"a":2}`, "duplicate object key"},
		{"duplicate key via escape", `{"a":1,"\u0061":2}`, "duplicate object key"},
		{"proto key", `{"__proto__":{}}`, "forbidden object key"},
		{"constructor key", `{"x":{"constructor":1}}`, "forbidden object key"},
		{"fraction", `1.5`, "non-integer"},
		{"integral fraction", `1.0`, "non-integer"},
		{"exponent", `1e3`, "non-integer"},
		{"unsafe integer", `9007199254740992`, "safe range"},
		{"huge integer", `123456789012345678901234567890`, "safe range"},
		{"leading zero", `01`, "trailing characters"},
		{"lone high escape", `"\ud800"`, "unpaired surrogate"},
		{"lone low escape", `"\udc00"`, "unpaired surrogate"},
		{"reversed pair", `"\udc00\ud800"`, "unpaired surrogate"},
		{"high then letter", `"\ud800\u0041"`, "unpaired surrogate"},
		{"raw surrogate bytes", "\"\xed\xa0\x80\"", "invalid UTF-8"},
		{"bad utf8", "\"\xff\"", "invalid UTF-8"},
		{"raw control", "\"a\nb\"", "control character"},
		{"bad escape", `"\x"`, "invalid escape"},
		{"short unicode escape", `"\u12"`, "invalid \\u escape"},
		{"trailing garbage", `{} x`, "trailing characters"},
		{"two values", `1 2`, "trailing characters"},
		{"empty", ``, "unexpected end"},
		{"unterminated", `{"a":1`, "unterminated object"},
		{"NaN", `NaN`, "unexpected character"},
		{"single quotes", `'a'`, "unexpected character"},
		{"trailing comma", `[1,]`, "unexpected character"},
		{"bom", "\ufeff{}", "unexpected character"},
		{"too deep", deep, "nesting deeper"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Canonicalize([]byte(c.in))
			if err == nil {
				t.Fatalf("Canonicalize(%q) succeeded", c.in)
			}
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SyntaxError", err)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not mention %q", err, c.msg)
			}
		})
	}
}

func TestDepthLimitExact(t *testing.T) {
	ok := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	if _, err := Canonicalize([]byte(ok)); err != nil {
		t.Fatalf("%d nested arrays refused: %v", MaxDepth+1, err)
	}
}

func TestSizeLimit(t *testing.T) {
	big := make([]byte, MaxSize+1)
	_, err := Canonicalize(big)
	if err == nil || !strings.Contains(err.Error(), "exceeds the limit") {
		t.Fatalf("oversized input: err = %v", err)
	}
}

func TestMarshal(t *testing.T) {
	type inner struct {
		B string `json:"b"`
		A int    `json:"a"`
	}
	cases := []struct {
		name string
		in   any
		want string
	}{
		{"tree", map[string]any{"b": []any{int64(1), "x", nil}, "a": true}, `{"a":true,"b":[1,"x",null]}`},
		{"integral float", map[string]any{"n": 3.0, "z": math.Copysign(0, -1)}, `{"n":3,"z":0}`},
		{"uint", uint32(7), `7`},
		{"json number", json.Number("-12"), `-12`},
		{"struct via encoding/json", inner{B: "<é>", A: 2}, `{"a":2,"b":"<é>"}`},
		{"pointer to struct", &inner{B: "\U0001F600"}, "{\"a\":0,\"b\":\"\U0001F600\"}"},
		{"typed map", map[string]string{"\uff61": "1", "\U0001F600": "2"}, "{\"\U0001F600\":\"2\",\"\uff61\":\"1\"}"},
		{"raw message", json.RawMessage(`{"b":1, "a":2}`), `{"a":2,"b":1}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Marshal(c.in)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if string(got) != c.want {
				t.Fatalf("got %s want %s", got, c.want)
			}
		})
	}
}

func TestMarshalRefuses(t *testing.T) {
	cases := []struct {
		name string
		in   any
		msg  string
	}{
		{"float", map[string]any{"x": 1.5}, "$.x: non-integer"},
		{"unsafe int", []any{int64(1) << 60}, "$[0]: integer"},
		{"unsafe uint", uint64(1) << 54, "safe range"},
		{"invalid utf8", map[string]any{"k": "\xed\xa0\x80"}, "$.k: string is not valid UTF-8"},
		{"invalid key", map[string]any{"\xff": 1}, "object key"},
		{"struct with float", struct{ F float64 }{F: 0.25}, "non-integer"},
		{"bad json number", json.Number("1e2"), "not an integer"},
		{"channel", make(chan int), "unsupported type"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Marshal(c.in)
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("err = %v, want mention of %q", err, c.msg)
			}
		})
	}
}

func TestParseTypes(t *testing.T) {
	v, err := Parse([]byte(`{"s":"x","n":-5,"b":false,"z":null,"a":[1]}`))
	if err != nil {
		t.Fatal(err)
	}
	m := v.(map[string]any)
	if m["s"] != "x" || m["n"] != int64(-5) || m["b"] != false || m["z"] != nil {
		t.Fatalf("unexpected tree %#v", m)
	}
	if a, ok := m["a"].([]any); !ok || len(a) != 1 || a[0] != int64(1) {
		t.Fatalf("unexpected array %#v", m["a"])
	}
}

func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,null,"x"]}`, `"\ud83d\ude00"`, `"\ud800"`, `{"a":1,"a":2}`,
		`-0`, `1.5`, `9007199254740992`, "\"\xed\xa0\x80\"", `{"__proto__":1}`, `[[[[]]]]`,
		"{\"\uff61\":1,\"\U0001F600\":2}", `"\u0000\u001f\"\\"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := Canonicalize(data)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("canonical output is not JSON: %q", out)
		}
		again, err := Canonicalize(out)
		if err != nil {
			t.Fatalf("canonical output refused: %q: %v", out, err)
		}
		if string(again) != string(out) {
			t.Fatalf("not idempotent: %q -> %q", out, again)
		}
	})
}
