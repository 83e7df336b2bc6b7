package proxy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// A paying tool whose map names the URL it pays for (or a fixed one) has
// the payee address judged with that URL's host, as check_before_pay
// judges a host with its pay_to: a seller that names a new address on
// every call still meets its own limits, open payments and lists.
func TestReadArgumentsJudgesTheSellerHost(t *testing.T) {
	pol := testPolicy(t)
	const schema = `{"type":"object","properties":{"to":{"type":"string"},"amount":{"type":"string"},"url":{"type":"string"},"host":{"type":"string"}}}`
	resolve := func(tm string) *resolved {
		t.Helper()
		m, err := ParseMap([]byte(`{"tools":{"t":` + tm + `}}`))
		if err != nil {
			t.Fatal(err)
		}
		r, err := m.Tools["t"].resolve("t", json.RawMessage(schema), pol)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	const a = "0xA11CE00000000000000000000000000000000001"
	byURL := resolve(`{"counterparty":"to","amount":"amount","amountUnit":"display","resource":"url"}`)
	fixed := resolve(`{"counterparty":"to","amount":"amount","amountUnit":"display","resource":{"value":"https://Pay.Seller.example/api"}}`)
	byHost := resolve(`{"counterparty":"host","amount":"amount","amountUnit":"display","payTo":"to"}`)
	for _, c := range []struct {
		name                string
		r                   *resolved
		args                string
		cp, payTo, resource string
		wantErr             string
	}{
		{"address and URL", byURL, `{"to":"` + a + `","amount":"1","url":"https://API.seller.example:8443/x?n=1"}`, "api.seller.example", a, "https://API.seller.example:8443/x?n=1", ""},
		{"fixed resource", fixed, `{"to":"` + a + `","amount":"1"}`, "pay.seller.example", a, "https://Pay.Seller.example/api", ""},
		{"host and payTo", byHost, `{"host":"api.seller.example","to":"` + a + `","amount":"1"}`, "api.seller.example", a, "", ""},
		{"resource without a host", byURL, `{"to":"` + a + `","amount":"1","url":"/x"}`, "", "", "", "names no host to judge beside the payee"},
		{"resource missing", byURL, `{"to":"` + a + `","amount":"1"}`, "", "", "", `the resource (argument "url") is missing`},
		{"payTo missing", byHost, `{"host":"api.seller.example","amount":"1"}`, "", "", "", `the pay_to (argument "to") is missing`},
	} {
		q, _, err := c.r.read([]byte(c.args), pol, time.Now())
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
		if !strings.EqualFold(q.Counterparty, c.cp) || !strings.EqualFold(q.PayTo, c.payTo) || q.Resource != c.resource {
			t.Errorf("%s: question %+v", c.name, q)
		}
		// The engine reads it as a host with its pay_to.
		req, err := guard.ParseRequest(q, pol)
		if err != nil || req.Counterparty.Kind != guard.KindHost || req.PayTo != strings.ToLower(a) {
			t.Errorf("%s: the engine reads %+v (%v)", c.name, req, err)
		}
	}
	for _, bad := range []string{
		`{"counterparty":"to","amount":"amount","amountUnit":"display","resource":"nope"}`,
		`{"counterparty":"to","amount":"amount","amountUnit":"display","resource":{"value":"ftp://x/"}}`,
		`{"counterparty":"host","amount":"amount","amountUnit":"display","payTo":{"value":"0x12"}}`,
	} {
		m, err := ParseMap([]byte(`{"tools":{"t":` + bad + `}}`))
		if err == nil {
			_, err = m.Tools["t"].resolve("t", json.RawMessage(schema), pol)
		}
		if err == nil {
			t.Errorf("map %s accepted", bad)
		}
	}
}
