package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

// TestConsoleEnrolsEveryVerifiedAlgorithm: the enrolment offers every
// algorithm the server verifies, and a passkey of each enrols, signs in
// and decides; a passkey in another algorithm (ES384) is refused at
// enrolment with a message naming the ones the server verifies, and
// nothing is left for the operator's command to collect.
func TestConsoleEnrolsEveryVerifiedAlgorithm(t *testing.T) {
	g := newRig(t)
	for i, alg := range []int{softauthn.ES256, softauthn.EdDSA, softauthn.RS256} {
		a, err := softauthn.NewAlg(alg)
		if err != nil {
			t.Fatal(err)
		}
		b := g.browser()
		who := fmt.Sprintf("alg%d", i)
		g.enrol(b, who, a)
		if code, res := g.signIn(b, a); code != 200 {
			t.Fatalf("alg %d: sign in: %d %v", alg, code, res)
		}
		r := g.ask(10 + i).Review
		if _, code, res := g.decide(b, r.ID, "approved", "", a); code != 200 || res["status"] != "approved" {
			t.Fatalf("alg %d: decide: %d %v", alg, code, res)
		}
	}

	b := g.browser()
	tok, err := console.NewEnrolToken(g.enrolKey, "carol", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, page := b.get("enrol?t=" + tok); !strings.Contains(page, "ES256, EdDSA (Ed25519) or RS256") {
		t.Fatalf("the enrolment page does not name the algorithms:\n%s", page)
	}
	code, opts := b.post("api/enrol/begin", map[string]string{"token": tok})
	if code != 200 {
		t.Fatalf("begin: %d %v", code, opts)
	}
	var offered []int
	params, _ := opts["publicKey"].(map[string]any)["pubKeyCredParams"].([]any)
	for _, p := range params {
		offered = append(offered, int(p.(map[string]any)["alg"].(float64)))
	}
	if fmt.Sprint(offered) != "[-7 -8 -257]" {
		t.Fatalf("offered algorithms %v", offered)
	}
	es384, _ := softauthn.NewAlg(softauthn.ES384)
	att, err := es384.Attestation(g.rpID, g.origin, challengeOf(t, opts))
	if err != nil {
		t.Fatal(err)
	}
	code, res := b.post("api/enrol/finish", map[string]any{"token": tok, "credential": json.RawMessage(att)})
	msg := fmt.Sprint(res["error"])
	if code != http.StatusBadRequest || !strings.Contains(msg, "ES384 (COSE algorithm -35)") || !strings.Contains(msg, "ES256, EdDSA (Ed25519) or RS256") {
		t.Fatalf("an ES384 passkey's registration: %d %v", code, res)
	}
	resp, err := http.Post(g.base+"api/enrol/collect", "application/json", strings.NewReader(fmt.Sprintf(`{"token":%q}`, tok)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("collect after a refused registration: %d, want 202 (nothing registered)", resp.StatusCode)
	}
}
