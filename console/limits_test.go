package console_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/clientaddr"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

// forgedToken is an enrolment token in the link's form that no operator
// signed: a reviewer, an expiry and random bytes where the MAC goes.
func forgedToken(who string, n int) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(who)) + "." + fmt.Sprint(time.Now().Add(5*time.Minute).Unix()) + "." + enc([]byte(fmt.Sprintf("nonce-%020d", n))) + "." + enc([]byte(fmt.Sprintf("%032d", n)))
}

// TestConsoleLimitsPerClientAndReviewer: behind a trusted proxy each
// client address has its own sign-in and enrolment budget (a forged
// X-Forwarded-For hop buys none); a link the operator did not sign is
// refused at begin and holds nothing; a stranger who spends the
// reviewer's address's budget delays neither the reviewer's real link nor
// a sign-in that verifies, and a failed assertion under the reviewer's
// credential spends nothing of the reviewer's.
func TestConsoleLimitsPerClientAndReviewer(t *testing.T) {
	clients, err := clientaddr.New([]string{"127.0.0.1"}, clientaddr.HeaderXForwardedFor)
	if err != nil {
		t.Fatal(err)
	}
	g := newRig(t, func(c *console.Config) { c.Clients = clients })
	from := func(addr string) *browser {
		b := g.browser()
		b.header = http.Header{"X-Forwarded-For": {addr}}
		return b
	}
	garbage := map[string]any{"credential": map[string]any{}}
	spend := func(b *browser) (refused int) {
		for range 40 {
			if code, _ := b.post("api/login/finish", garbage); code == http.StatusTooManyRequests {
				refused++
			}
		}
		return refused
	}

	// One stranger spends its own budget; forged hops left of the proxy's
	// do not buy more; another client is untouched.
	stranger := from("198.51.100.7")
	if n := spend(stranger); n < 15 {
		t.Fatalf("a stranger's 40 failed sign-ins were refused %d times; want the limit (burst 20)", n)
	}
	for i := range 10 {
		f := from(fmt.Sprintf("10.9.9.%d, 198.51.100.7", i))
		if code, _ := f.post("api/login/finish", garbage); code != http.StatusTooManyRequests {
			t.Fatalf("a forged hop bought a fresh budget: %d", code)
		}
	}
	if code, res := from("198.51.100.8").post("api/login/finish", garbage); code == http.StatusTooManyRequests {
		t.Fatalf("another client is limited by the stranger's attempts: %d %v", code, res)
	}

	// Self-made links are refused at begin, hold nothing, and are charged
	// to their sender's address.
	refused, forbidden := 0, 0
	for i := range 1300 {
		b := from(fmt.Sprintf("203.0.113.%d", i%52))
		code, res := b.post("api/enrol/begin", map[string]string{"token": forgedToken("alice", i)})
		switch code {
		case http.StatusTooManyRequests:
			refused++
		case http.StatusForbidden:
			forbidden++
			if !strings.Contains(fmt.Sprint(res["error"]), "not made by the operator") {
				t.Fatalf("a forged link: %v", res)
			}
		default:
			t.Fatalf("a forged link's begin: %d %v", code, res)
		}
	}
	// Each address its burst (and what refilled meanwhile, 0.5 a second).
	if forbidden < 52*20 || refused == 0 {
		t.Fatalf("forged begins: %d refused as forged, %d rate limited; want at least %d and some", forbidden, refused, 52*20)
	}

	// The reviewer shares the stranger's address, whose budget is spent:
	// the operator's real link still enrols, and the sign-in that
	// verifies still signs in.
	alice, _ := softauthn.New()
	b := from("198.51.100.7")
	g.enrol(b, "alice", alice)
	// A stranger's assertion under alice's credential fails and spends
	// nothing of alice's budget.
	mallory, _ := softauthn.New()
	spend(stranger)
	limitedForged := 0
	for range 30 {
		_, opts := stranger.post("api/login/begin", map[string]any{})
		x, _ := mallory.Assert(g.rpID, g.origin, challengeOf(t, opts))
		x.CredentialID = alice.CredentialID()
		j, _ := x.JSON()
		switch code, res := stranger.post("api/login/finish", map[string]any{"credential": json.RawMessage(j)}); code {
		case http.StatusTooManyRequests:
			limitedForged++
		case http.StatusForbidden: // a token the address got back meanwhile (0.5 a second)
		default:
			t.Fatalf("a forged assertion from a spent address: %d %v", code, res)
		}
	}
	if limitedForged < 25 {
		t.Fatalf("only %d of 30 forged assertions from a spent address were refused by the limit", limitedForged)
	}
	for i := range 3 {
		if code, res := g.signIn(b, alice); code != 200 {
			t.Fatalf("alice's sign-in %d from the spent address: %d %v", i, code, res)
		}
	}
}

// TestEnrolTokenSigned: a token made under another key, edited, or in the
// old three-part form is refused before anything is held; the page says
// the link is not the operator's.
func TestEnrolTokenSigned(t *testing.T) {
	g := newRig(t)
	b := g.browser()
	other, err := console.NewEnrolToken(console.EnrolKey([]byte("another guard")), "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	good, err := console.NewEnrolToken(g.enrolKey, "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	renamed := base64.RawURLEncoding.EncodeToString([]byte("mallory")) + "." + strings.Join(parts[1:], ".")
	for _, tc := range []struct {
		name, tok string
		code      int
		want      string
	}{
		{"another key", other, http.StatusForbidden, "not made by the operator"},
		{"reviewer edited", renamed, http.StatusForbidden, "not made by the operator"},
		{"three parts", strings.Join(parts[:3], "."), http.StatusBadRequest, "malformed"},
	} {
		if code, res := b.post("api/enrol/begin", map[string]string{"token": tc.tok}); code != tc.code || !strings.Contains(fmt.Sprint(res["error"]), tc.want) {
			t.Errorf("%s: begin %d %v", tc.name, code, res)
		}
		if code, page := b.get("enrol?t=" + tc.tok); code != tc.code || !strings.Contains(page, tc.want) {
			t.Errorf("%s: page %d %s", tc.name, code, page)
		}
	}
	if code, res := b.post("api/enrol/begin", map[string]string{"token": good}); code != 200 {
		t.Fatalf("the operator's link: %d %v", code, res)
	}
	if _, err := console.NewEnrolToken([]byte("short"), "alice", time.Now()); err == nil {
		t.Fatal("a short key made a link")
	}
}
