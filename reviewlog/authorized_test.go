package reviewlog

import (
	"strings"
	"testing"
)

func TestAuthorizedRecord(t *testing.T) {
	good := `{"type":"authorized","at":"2026-12-01T10:00:00.000Z","caller":"agent","authorization":{"decision_receipt":"rcpt_1","receipt":"rcpt_2",` +
		`"network":"eip155:8453","token":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","name":"USD Coin","version":"2",` +
		`"from":"0x2c7536E3605D9C16a7a3D7b1898e529396a65c23","to":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","value":"250000",` +
		`"valid_after":"1","valid_before":"2","nonce":"0x` + strings.Repeat("ab", 32) + `","signature":"0x` + strings.Repeat("cd", 65) + `","digest":"0x` + strings.Repeat("ef", 32) + `"}}`
	if _, err := decodeRecord([]byte(good)); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"no caller":           strings.Replace(good, `"caller":"agent",`, ``, 1),
		"question fields":     strings.Replace(good, `"caller":"agent",`, `"caller":"agent","counterparty":"x",`, 1),
		"negative value":      strings.Replace(good, `"value":"250000"`, `"value":"-1"`, 1),
		"short nonce":         strings.Replace(good, `"nonce":"0xabab`, `"nonce":"0xab`, 1),
		"upper-case digest":   strings.Replace(good, `"digest":"0xef`, `"digest":"0xEF`, 1),
		"unknown field":       strings.Replace(good, `"name":"USD Coin"`, `"name":"USD Coin","extra":1`, 1),
		"no authorization":    `{"type":"authorized","at":"2026-12-01T10:00:00.000Z","caller":"agent"}`,
		"on an opened record": `{"type":"opened","review_id":"1b4e28ba-2fa1-4d2c-883f-0016d3cca427","at":"2026-12-01T10:00:00.000Z","counterparty":"a","amount":"1","authorization":{}}`,
		"address not hex":     strings.Replace(good, `"from":"0x2c75`, `"from":"0xzz75`, 1),
		"missing receipt":     strings.Replace(good, `"receipt":"rcpt_2",`, ``, 1),
	} {
		if _, err := decodeRecord([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
