package proxy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
)

const sendSchema = `{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":"string"},"memo":{"type":"string"},
 "options":{"type":"object"},"list":{"type":"array","items":{"type":"object","properties":{"k":{"type":"string"}}}},
 "n":{"type":"integer"},"f":{"type":"number"},"nested":{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":["string","integer"]}}},
 "ref":{"$ref":"#/$defs/x"}}}`

func testPolicy(t *testing.T) *guard.Config {
	t.Helper()
	cfg, err := guard.LoadConfig("")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestParseMapRefuses(t *testing.T) {
	cases := []struct{ name, doc, want string }{
		{"not JSON", `{`, "strict JSON"},
		{"duplicate key", `{"tools":{},"tools":{}}`, "duplicate"},
		{"array", `[]`, "JSON object"},
		{"unknown top key", `{"tools":{},"mode":"x"}`, `unknown key "mode"`},
		{"bad unmapped", `{"tools":{},"unmapped":"allow"}`, "unmapped must be"},
		{"tools not object", `{"tools":[]}`, "tools must be an object"},
		{"tool not object", `{"tools":{"a":"to"}}`, "tools.a must be an object"},
		{"missing counterparty", `{"tools":{"a":{"amount":"x","amountUnit":"display"}}}`, "tools.a.counterparty is required"},
		{"missing amount", `{"tools":{"a":{"counterparty":"x","amountUnit":"display"}}}`, "tools.a.amount is required"},
		{"bad unit", `{"tools":{"a":{"counterparty":"x","amount":"y","amountUnit":"wei"}}}`, "amountUnit must be"},
		{"unknown tool key", `{"tools":{"a":{"counterparty":"x","amount":"y","amountUnit":"atomic","to":"z"}}}`, `unknown key "to"`},
		{"empty path segment", `{"tools":{"a":{"counterparty":"x..y","amount":"y","amountUnit":"atomic"}}}`, "empty segment"},
		{"unicode path", `{"tools":{"a":{"counterparty":"t\u043e","amount":"y","amountUnit":"atomic"}}}`, "printable ASCII"},
		{"both path and value", `{"tools":{"a":{"counterparty":{"path":"a","value":"b"},"amount":"y","amountUnit":"atomic"}}}`, "exactly one"},
		{"number field", `{"tools":{"a":{"counterparty":5,"amount":"y","amountUnit":"atomic"}}}`, "must be a string"},
		{"empty value", `{"tools":{"a":{"counterparty":{"value":""},"amount":"y","amountUnit":"atomic"}}}`, "non-empty"},
		{"bad errors", `{"tools":{"a":{"counterparty":"x","amount":"y","amountUnit":"atomic","errors":"paid"}}}`, "tools.a.errors must be"},
		{"errors not a string", `{"tools":{"a":{"counterparty":"x","amount":"y","amountUnit":"atomic","errors":false}}}`, "tools.a.errors must be"},
		{"bad newTools", `{"tools":{},"newTools":"allow"}`, `newTools must be "refuse" or "forward"`},
		{"newTools not a string", `{"tools":{},"newTools":true}`, `newTools must be`},
		{"newTools forward beside unmapped refuse", `{"tools":{},"unmapped":"refuse","newTools":"forward"}`, `say one`},
		{"newTools in another case", `{"tools":{},"NewTools":"forward"}`, `unknown key "NewTools"`},
	}
	for _, c := range cases {
		_, err := ParseMap([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error saying %q, got %v", c.name, c.want, err)
		}
	}
	m, err := ParseMap([]byte(`{"tools":{"a":{"counterparty":"to","amount":{"path":"nested.amount"},"amountUnit":"atomic","asset":"USDC"}},"unmapped":"refuse"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Unmapped != UnmappedRefuse || strings.Join(m.Tools["a"].Amount.Path, ".") != "nested.amount" || m.Tools["a"].Asset.Plain != "USDC" {
		t.Fatalf("parsed %+v", m)
	}
	// A tool the upstream adds later is refused unless the map says so.
	for doc, want := range map[string]string{
		`{"tools":{}}`:                                           NewToolsRefuse,
		`{"tools":{},"newTools":"refuse"}`:                       NewToolsRefuse,
		`{"tools":{},"newTools":"forward"}`:                      NewToolsForward,
		`{"tools":{},"unmapped":"refuse"}`:                       NewToolsRefuse,
		`{"tools":{},"unmapped":"forward","newTools":"forward"}`: NewToolsForward,
	} {
		m, err := ParseMap([]byte(doc))
		if err != nil || m.NewTools != want {
			t.Errorf("%s: newTools %v %v, want %q", doc, m, err, want)
		}
	}
	// An error answer may follow a payment unless the map says otherwise.
	for doc, want := range map[string]string{
		`{"tools":{"a":{"counterparty":"to","amount":"y","amountUnit":"atomic"}}}`:                    ErrorsUnknown,
		`{"tools":{"a":{"counterparty":"to","amount":"y","amountUnit":"atomic","errors":"unknown"}}}`: ErrorsUnknown,
		`{"tools":{"a":{"counterparty":"to","amount":"y","amountUnit":"atomic","errors":"unpaid"}}}`:  ErrorsUnpaid,
	} {
		m, err := ParseMap([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		if got := m.Tools["a"].Errors; got != want {
			t.Errorf("%s: errors %q, want %q", doc, got, want)
		}
	}
}

func TestResolveAgainstSchema(t *testing.T) {
	pol := testPolicy(t)
	cases := []struct{ name, tm, want string }{
		{"ok", `{"counterparty":"to","amount":"amount","amountUnit":"display","asset":"USDC"}`, ""},
		{"nested ok", `{"counterparty":"nested.to","amount":"nested.amount","amountUnit":"atomic"}`, ""},
		{"fixed counterparty", `{"counterparty":{"value":"0xA11CE00000000000000000000000000000000001"},"amount":"amount","amountUnit":"display"}`, ""},
		{"asset path", `{"counterparty":"to","amount":"amount","amountUnit":"display","asset":"memo"}`, ""},
		{"no such property", `{"counterparty":"payee","amount":"amount","amountUnit":"display"}`, `no property "payee"`},
		{"through a string", `{"counterparty":"to.x","amount":"amount","amountUnit":"display"}`, "not an object"},
		{"through $ref", `{"counterparty":"ref.x","amount":"amount","amountUnit":"display"}`, "$ref"},
		{"into free-form object", `{"counterparty":"options.to","amount":"amount","amountUnit":"display"}`, "declares no properties"},
		{"display in integer", `{"counterparty":"to","amount":"n","amountUnit":"display"}`, "cannot carry amount"},
		{"atomic in number", `{"counterparty":"to","amount":"f","amountUnit":"atomic"}`, "cannot carry amount"},
		{"counterparty in integer", `{"counterparty":"n","amount":"amount","amountUnit":"display"}`, "cannot carry counterparty"},
		{"unknown asset", `{"counterparty":"to","amount":"amount","amountUnit":"display","asset":"DOGE"}`, "neither an asset"},
		{"fixed amount", `{"counterparty":"to","amount":{"value":"1"},"amountUnit":"display"}`, "not a fixed value"},
		{"bad fixed counterparty", `{"counterparty":{"value":"not a payee"},"amount":"amount","amountUnit":"display"}`, "counterparty"},
	}
	for _, c := range cases {
		m, err := ParseMap([]byte(`{"tools":{"t":` + c.tm + `}}`))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		_, err = m.Tools["t"].resolve("t", json.RawMessage(sendSchema), pol)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: want %q, got %v", c.name, c.want, err)
		}
	}
	// A name that is both an asset and a path must be said explicitly.
	m, _ := ParseMap([]byte(`{"tools":{"t":{"counterparty":"to","amount":"amount","amountUnit":"display","asset":"USDC"}}}`))
	if _, err := m.Tools["t"].resolve("t", json.RawMessage(`{"type":"object","properties":{"to":{},"amount":{},"USDC":{"type":"string"}}}`), pol); err == nil || !strings.Contains(err.Error(), "both an asset") {
		t.Fatalf("ambiguous asset: %v", err)
	}
}

func mustResolve(t testing.TB, tm string) *resolved {
	t.Helper()
	m, err := ParseMap([]byte(`{"tools":{"t":` + tm + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := guard.LoadConfig("")
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Tools["t"].resolve("t", json.RawMessage(sendSchema), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestReadArguments(t *testing.T) {
	pol := testPolicy(t)
	disp := mustResolve(t, `{"counterparty":"to","amount":"amount","amountUnit":"display","asset":"USDC"}`)
	atom := mustResolve(t, `{"counterparty":"nested.to","amount":"nested.amount","amountUnit":"atomic"}`)
	const a = "0xA11CE00000000000000000000000000000000001"
	cases := []struct {
		name    string
		r       *resolved
		args    string
		amount  string
		canon   string
		wantErr string
	}{
		{"plain", disp, `{"amount":"0.25", "to":"` + a + `"}`, "0.25", `{"amount":"0.25","to":"` + a + `"}`, ""},
		{"null arguments", disp, `null`, "", "", "missing"},
		{"free-form extra", disp, `{"to":"` + a + `","amount":"1","options":{"note":"x"}}`, "1", "", ""},
		{"items declared", disp, `{"to":"` + a + `","amount":"1","list":[{"k":"v"}]}`, "1", "", ""},
		{"items undeclared key", disp, `{"to":"` + a + `","amount":"1","list":[{"to":"v"}]}`, "", "", "not in the input schema"},
		{"copy in free-form array", disp, `{"to":"` + a + `","amount":"1","options":{"xs":[{"AMOUNT":"9"}]}}`, "", "", "repeats the mapped name"},
		{"atomic string", atom, `{"nested":{"to":"` + a + `","amount":"1500000"}}`, "1.5", "", ""},
		{"atomic integer", atom, `{"nested":{"to":"` + a + `","amount":250000}}`, "0.25", "", ""},
		{"atomic leading zero", atom, `{"nested":{"to":"` + a + `","amount":"0250000"}}`, "", "", "leading zeros"},
		{"atomic negative", atom, `{"nested":{"to":"` + a + `","amount":-5}}`, "", "", "negative"},
		{"atomic bool", atom, `{"nested":{"to":"` + a + `","amount":true}}`, "", "", "integer count"},
		{"too large", disp, `{"to":"` + a + `","amount":"1","memo":"` + strings.Repeat("x", maxArgBytes) + `"}`, "", "", "at most"},
		// The guard's own checks of a question's arguments (guard.Arg).
		{"counterparty past the guard's bound", disp, `{"to":"` + strings.Repeat("a", guard.MaxCounterpartyBytes+1) + `","amount":"1"}`, "", "", `argument "to": counterparty is longer than 2048 bytes; nothing was forwarded`},
		{"display amount past the guard's bound", disp, `{"to":"` + a + `","amount":"` + strings.Repeat("1", guard.MaxAmountBytes+1) + `"}`, "", "", `argument "amount": amount is longer than 64 bytes`},
		{"escaped key spelled the same", disp, `{"t\u006f":"` + a + `","amount":"1"}`, "1", `{"amount":"1","to":"` + a + `"}`, ""},
	}
	for _, c := range cases {
		q, canon, err := c.r.read([]byte(c.args), pol, time.Now())
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: want %q, got %v", c.name, c.wantErr, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if q.Amount != c.amount || q.Counterparty != a {
			t.Errorf("%s: question %+v", c.name, q)
		}
		if c.canon != "" && string(canon) != c.canon {
			t.Errorf("%s: forwarded %s, want %s", c.name, canon, c.canon)
		}
	}
}

// A schema may declare a property that differs from a mapped one only in
// letter case; a call that gives it is refused, since the guard reads the
// mapped name exactly and the upstream may not.
func TestReadArgumentsRefusesACaseTwin(t *testing.T) {
	pol := testPolicy(t)
	m, err := ParseMap([]byte(`{"tools":{"t":{"counterparty":"pay.to","amount":"pay.amount","amountUnit":"display","asset":"USDC"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Tools["t"].resolve("t", json.RawMessage(`{"type":"object","properties":{"Amount":{"type":"string"},"pay":{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":"string"},"Amount":{"type":"string"},"TO":{"type":"string"}}}}}`), pol)
	if err != nil {
		t.Fatal(err)
	}
	const a = "0xA11CE00000000000000000000000000000000001"
	for args, want := range map[string]string{
		`{"pay":{"to":"` + a + `","amount":"0.01","Amount":"1000"}}`:                                   `"pay.Amount" of paying tool t is the mapped argument "pay.amount" spelled in another case`,
		`{"pay":{"to":"` + a + `","amount":"0.01","TO":"0xB0B0000000000000000000000000000000000002"}}`: `"pay.TO"`,
		`{"pay":{"to":"` + a + `","amount":"0.01"},"Amount":"1000"}`:                                   "",
	} {
		_, _, err := r.read([]byte(args), pol, time.Now())
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
}

// FuzzReadArguments: whatever the bytes, read never panics, and when it
// accepts them the forwarded bytes are canonical, hold the question's
// counterparty and amount at the mapped paths, and nowhere else under
// another spelling of a mapped name.
func FuzzReadArguments(f *testing.F) {
	const a = "0xA11CE00000000000000000000000000000000001"
	for _, s := range []string{
		`{"to":"` + a + `","amount":"0.25"}`, `{"to":"` + a + `","to":"x","amount":"1"}`, `{"to":"` + a + `","amount":0.25}`,
		`{"to":"` + a + `","amount":"1","options":{"amount":"2"}}`, `{"nested":{"to":"` + a + `","amount":"5"}}`, `null`, `[]`,
		`{"to":"` + a + `","amount":"1","t\u043e":"x"}`,
	} {
		f.Add([]byte(s))
	}
	pol, err := guard.LoadConfig("")
	if err != nil {
		f.Fatal(err)
	}
	disp := mustResolve(f, `{"counterparty":"to","amount":"amount","amountUnit":"display","asset":"USDC"}`)
	atom := mustResolve(f, `{"counterparty":"nested.to","amount":"nested.amount","amountUnit":"atomic"}`)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, r := range []*resolved{disp, atom} {
			q, canon, err := r.read(data, pol, time.Now())
			if err != nil {
				continue
			}
			v, err := jcs.Parse(canon)
			if err != nil {
				t.Fatalf("forwarded bytes are not strict JSON: %v", err)
			}
			again, _ := jcs.Marshal(v)
			if string(again) != string(canon) {
				t.Fatalf("forwarded bytes are not canonical")
			}
			args := v.(map[string]any)
			if got, _ := lookup(args, r.m.Counterparty.Path); got != q.Counterparty {
				t.Fatalf("counterparty %q is not what is forwarded (%v)", q.Counterparty, got)
			}
			if _, ok := lookup(args, r.m.Amount.Path); !ok {
				t.Fatal("the amount is not where the map says")
			}
			countNames(t, args, r)
		}
	})
}

// countNames fails when a mapped name appears, in any case, at a key the
// schema does not declare.
func countNames(t *testing.T, v any, r *resolved) {
	var walk func(v any, schema schemaNode, free bool)
	walk = func(v any, schema schemaNode, free bool) {
		switch x := v.(type) {
		case map[string]any:
			props := schema.properties()
			for k, c := range x {
				if !free && props != nil {
					if _, ok := props[k]; !ok {
						t.Fatalf("undeclared key %q forwarded", k)
					}
					walk(c, schemaNode{v: props[k]}, false)
					continue
				}
				for _, l := range r.leaves {
					if strings.EqualFold(k, l) {
						t.Fatalf("a copy of %q forwarded", l)
					}
				}
				walk(c, schemaNode{}, true)
			}
		case []any:
			for _, it := range x {
				walk(it, schemaNode{}, true)
			}
		}
	}
	walk(v, r.schema, false)
}

func FuzzParseMap(f *testing.F) {
	f.Add([]byte(`{"tools":{"a":{"counterparty":"to","amount":"x.y","amountUnit":"display","asset":{"value":"USDC"}}},"unmapped":"refuse"}`))
	f.Add([]byte(`{"tools":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMap(data)
		if err != nil {
			return
		}
		if m.Unmapped != UnmappedForward && m.Unmapped != UnmappedRefuse {
			t.Fatalf("unmapped %q", m.Unmapped)
		}
		for name, tm := range m.Tools {
			if tm.Counterparty.IsZero() || tm.Amount.IsZero() || (tm.AmountUnit != UnitDisplay && tm.AmountUnit != UnitAtomic) {
				t.Fatalf("tool %s accepted incomplete: %+v", name, tm)
			}
		}
	})
}

// A tool that passes the seller's 402 is judged on the 402: the map names
// where the 402 is, and nothing of the payment beside it; the schema must
// hold it as an object or a string; and the 402's members are read by the
// 402 reader, not refused as copies of a mapped name.
func TestPaymentRequiredMapping(t *testing.T) {
	for _, c := range []struct{ name, doc, want string }{
		{"amount beside it", `{"tools":{"a":{"paymentRequired":"pr","amount":"x","amountUnit":"atomic"}}}`, "tools.a: amount cannot stand beside paymentRequired"},
		{"counterparty beside it", `{"tools":{"a":{"paymentRequired":"pr","counterparty":"to"}}}`, "counterparty cannot stand beside paymentRequired"},
		{"a fixed value", `{"tools":{"a":{"paymentRequired":{"value":"x"}}}}`, "must be a path"},
		{"bad errors", `{"tools":{"a":{"paymentRequired":"pr","errors":"paid"}}}`, "tools.a.errors must be"},
	} {
		if _, err := ParseMap([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error saying %q, got %v", c.name, c.want, err)
		}
	}
	pol := testPolicy(t)
	m, err := ParseMap([]byte(`{"tools":{"a":{"paymentRequired":"pr","resource":"url","errors":"unpaid"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	tm := m.Tools["a"]
	if _, err := tm.resolve("a", json.RawMessage(`{"type":"object","properties":{"pr":{"type":"number"},"url":{"type":"string"}}}`), pol); err == nil || !strings.Contains(err.Error(), "paymentRequired path") {
		t.Fatalf("a 402 typed number: %v", err)
	}
	r, err := tm.resolve("a", json.RawMessage(`{"type":"object","properties":{"pr":{"type":"object"},"url":{"type":"string"},"memo":{"type":"string"}}}`), pol)
	if err != nil {
		t.Fatal(err)
	}
	pr := `{"x402Version":2,"resource":{"url":"https://api.seller.example/data"},"accepts":[{"scheme":"exact","network":"eip155:8453","amount":"250000",` +
		`"asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","payTo":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","maxTimeoutSeconds":120,"extra":{"name":"USD Coin","version":"2"}}]}`
	q, canon, err := r.read([]byte(`{"pr":`+pr+`,"url":"https://api.seller.example/data"}`), pol, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if q.Counterparty != "api.seller.example" || q.PayTo != "0x209693bc6afc0c5328ba36faf03c514ef312287c" || q.Amount != "0.25" || q.Offer == nil || q.Offer.Carried {
		t.Fatalf("question %+v (offer %+v)", q, q.Offer)
	}
	if !strings.Contains(string(canon), `"amount":"250000"`) {
		t.Fatalf("forwarded %s", canon)
	}
	// Without the resource, the one the 402 declares is judged.
	if q, _, err := r.read([]byte(`{"pr":`+pr+`}`), pol, time.Now()); err != nil || q.Counterparty != "api.seller.example" || q.Resource != "https://api.seller.example/data" {
		t.Fatalf("without a resource: %+v %v", q, err)
	}
	for _, c := range []struct{ name, args, want string }{
		{"missing", `{"url":"https://api.seller.example/data"}`, `the seller's 402 (argument "pr") is missing`},
		{"not a 402", `{"pr":{"x402Version":2}}`, `the seller's 402 (argument "pr")`},
		{"another resource", `{"pr":` + pr + `,"url":"https://other.example/data"}`, "not the \"https://other.example/data\" you requested"},
		{"a float inside", `{"pr":{"x402Version":2.5}}`, "cannot be read exactly"},
	} {
		if _, _, err := r.read([]byte(c.args), pol, time.Now()); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "nothing was forwarded") {
			t.Errorf("%s: want an error saying %q, got %v", c.name, c.want, err)
		}
	}
}
