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

// TestOfferSealRecord: an authorized record's offer seal names the digest
// of the offer beside it, its format, and the signer recorded; the digest
// is the same for the offer compact, indented, or with &, <, > escaped.
func TestOfferSealRecord(t *testing.T) {
	offer := `{"format":"eip712","payload":{"resourceUrl":"https://s.example/a?b=1&c=<2>"},"signature":"0x01"}`
	d, err := OfferDigest([]byte(offer))
	if err != nil {
		t.Fatal(err)
	}
	for _, same := range []string{
		"{\n  \"format\": \"eip712\",\n  \"payload\": {\"resourceUrl\": \"https://s.example/a?b=1\\u0026c=\\u003c2\\u003e\"},\n  \"signature\": \"0x01\"\n}",
		` ` + offer + "\n",
	} {
		if got, err := OfferDigest([]byte(same)); err != nil || got != d {
			t.Errorf("OfferDigest(%q) = %s %v, want %s", same, got, err, d)
		}
	}
	for _, other := range []string{strings.Replace(offer, `0x01`, `0x02`, 1), strings.Replace(offer, `b=1`, `b=2`, 1)} {
		if got, _ := OfferDigest([]byte(other)); got == d {
			t.Errorf("OfferDigest(%q) is the digest of another offer", other)
		}
	}
	base := `{"type":"authorized","at":"2026-12-01T10:00:00.000Z","caller":"agent","authorization":{"decision_receipt":"rcpt_1","receipt":"rcpt_2",` +
		`"network":"eip155:8453","token":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","name":"USD Coin","version":"2",` +
		`"from":"0x2c7536E3605D9C16a7a3D7b1898e529396a65c23","to":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","value":"250000",` +
		`"valid_after":"1","valid_before":"2","nonce":"0x` + strings.Repeat("ab", 32) + `","signature":"0x` + strings.Repeat("cd", 65) + `","digest":"0x` + strings.Repeat("ef", 32) + `",` +
		`"offer":` + offer + `,"offer_signer":"0xabc (EIP-712)","offer_seal":{"offer":"` + d + `","format":"eip712","signer":"0xabc (EIP-712)","key":"0xabc"}}}`
	rec, err := decodeRecord([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if s := rec.Authorization.OfferSeal; s == nil || s.Offer != d || s.Key != "0xabc" {
		t.Fatalf("the seal read back: %+v", s)
	}
	for name, bad := range map[string]string{
		"another offer's digest": strings.Replace(base, `"offer":"`+d, `"offer":"sha256:`+strings.Repeat("0", 64), 1),
		"no offer":               strings.Replace(base, `"offer":`+offer+`,`, ``, 1),
		"another signer":         strings.Replace(base, `"signer":"0xabc (EIP-712)"`, `"signer":"0xdef (EIP-712)"`, 1),
		"another format":         strings.Replace(base, `"format":"eip712","signer"`, `"format":"jws","signer"`, 1),
		"a format none has":      strings.Replace(base, `"format":"eip712","signer"`, `"format":"pgp","signer"`, 1),
		"a signer without a key": strings.Replace(base, `"key":"0xabc"`, `"key":""`, 1),
		"a key with a newline":   strings.Replace(base, `"key":"0xabc"`, `"key":"0xabc\n"`, 1),
	} {
		if _, err := decodeRecord([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestOnlyAuthorizedLinesSyncBesideTheirReceipts: the lines a store may
// sync in the same wait as the section's receipts are authorized lines
// alone, after a log that ends clean. A used line (an approval spent), an
// opened or a decided one, or a repair of a torn tail, reaches the disk only
// after the receipts it follows, as audit expects of them.
func TestOnlyAuthorizedLinesSyncBesideTheirReceipts(t *testing.T) {
	auth := record{Type: typeAuthorized}
	for _, tc := range []struct {
		name  string
		recs  []record
		clean bool
		tail  []int
		want  bool
	}{
		{"an authorized line", []record{auth}, true, nil, true},
		{"two authorized lines", []record{auth, auth}, true, nil, true},
		{"an approval used, then its authorization", []record{{Type: typeUsed}, auth}, true, nil, false},
		{"a review opened", []record{{Type: typeOpened}}, true, nil, false},
		{"an authorized line after a torn tail", []record{auth}, false, nil, false},
		{"an authorized line after lines to repair", []record{auth}, true, []int{7}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newState()
			st.endsClean = tc.clean
			for _, n := range tc.tail {
				st.partial = n
			}
			if got := besideReceipts(st, tc.recs); got != tc.want {
				t.Fatalf("besideReceipts = %v, want %v", got, tc.want)
			}
		})
	}
}
