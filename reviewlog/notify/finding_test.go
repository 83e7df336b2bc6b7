package notify

import (
	"strings"
	"testing"
)

// A settlement.finding message carries the findings' words with every
// URL's query, fragment and user information cut, names each finding's
// field, and is a message the sinks accept.
func TestSettlementMessageCutsURLSecrets(t *testing.T) {
	m, err := NewSettlementMessage(SettlementFinding{Nonce: "0x" + strings.Repeat("AB", 32), Source: "agent", Amount: "0.25 USDC", Payee: "0xabc",
		Findings: []string{
			`resourceUrl: the seller's receipt is for "https://user:pw@api.example/r?apikey=K1#frag", the authorization paid for "https://api.example/r?token=K2"`,
			"the seller's receipt does not verify: bad signature",
		}})
	if err != nil {
		t.Fatal(err)
	}
	body := string(m.Review) + m.Text
	for _, secret := range []string{"K1", "K2", "user:pw", "frag"} {
		if strings.Contains(body, secret) {
			t.Errorf("the message carries %q: %s", secret, body)
		}
	}
	for _, want := range []string{`"review_id":"settlement:0x` + strings.Repeat("ab", 32) + `"`, `"fields":["resourceUrl","finding"]`, `https://api.example/r?…`} {
		if !strings.Contains(string(m.Review), want) {
			t.Errorf("the message lacks %s: %s", want, m.Review)
		}
	}
	if m.Event != EventSettlementFinding || !strings.Contains(m.Text, "(2 findings: resourceUrl, finding)") {
		t.Errorf("%s %s", m.Event, m.Text)
	}
}
