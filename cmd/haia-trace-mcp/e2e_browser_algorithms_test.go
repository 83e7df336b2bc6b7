package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

// offerOnly makes the page's authenticator one that signs only with COSE
// algorithm alg: the registration options the server sent are narrowed to
// it before the browser asks the (virtual) authenticator, which takes the
// first algorithm it supports.
func offerOnly(alg string) string {
	return `(function(){const create = navigator.credentials.create.bind(navigator.credentials);
	navigator.credentials.create = function(o){o.publicKey.pubKeyCredParams = [{type: "public-key", alg: ` + alg + `}]; return create(o);};})()`
}

// Passkey algorithms in Chromium (its virtual authenticator makes ES256,
// EdDSA and RS256 keys): a reviewer whose authenticator signs only with
// EdDSA, and one whose signs only with RS256, enrol, sign in and approve
// — the server verifies every algorithm it offers; a reviewer whose
// authenticator offers none of them (ES512 only) is told, on the page,
// the algorithms the server takes, and nothing is enrolled. The server
// refuses a registration in an algorithm it does not verify (ES384, from
// a software authenticator against the real binary) with the same names.
func TestConsolePasskeyAlgorithmsInBrowser(t *testing.T) {
	chromium := browserChromium(t)
	root := loopRoot(t)
	reviewers := filepath.Join(t.TempDir(), "reviewers.json")
	key := filepath.Join(t.TempDir(), "signing.pem")
	port := freePort(t)
	base := "http://localhost:" + port + "/console/"
	var serverErr lockedBuffer
	cs := mcpSession(t, &serverErr, "--dir", root, "--key-file", key, "--agent-id", "loop-agent",
		"--reviewers", reviewers, "--console", "--console-addr", "127.0.0.1:"+port)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	for i, tc := range []struct{ who, alg, amount string }{{"eddsa-reviewer", "-8", "0.11"}, {"rs256-reviewer", "-257", "0.12"}} {
		en := startEnrol(ctx, t, base, "--id", tc.who, "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "1m")
		bctx, said := browserRegisterWith(ctx, t, chromium, en.link, serverErr.String, offerOnly(tc.alg))
		if err := en.wait(); err != nil || !strings.Contains(en.out.String(), "(added") {
			t.Fatalf("%s: passkey add: %v (page: %q)\n%s\n%s", tc.who, err, said, en.out.String(), en.errb.String())
		}
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": tc.amount}), &a)
		if err := browserSignIn(bctx, base); err != nil {
			t.Fatalf("%s: sign in: %v (server: %s)", tc.who, err, serverErr.String())
		}
		var status string
		if err := chromedp.Run(bctx, chromedp.Navigate(base+"reviews/"+a.ReviewID), chromedp.WaitVisible(`#note`, chromedp.ByQuery),
			chromedp.Click(`button[data-decision="approved"]`, chromedp.ByQuery), decidedText(&status)); err != nil {
			t.Fatalf("%s: approve: %v (server: %s)", tc.who, err, serverErr.String())
		}
		if !strings.Contains(status, "approved by "+tc.who) {
			t.Fatalf("%s: after Approve the page says: %s", tc.who, status)
		}
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": tc.amount}), &a)
		if a.Decision != "allow" {
			t.Fatalf("%s (%d): the approved question: %+v", tc.who, i, a)
		}
	}

	// An authenticator with none of the server's algorithms.
	en := startEnrol(ctx, t, base, "--id", "es512-reviewer", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "10s")
	_, said := browserRegisterWith(ctx, t, chromium, en.link, serverErr.String, offerOnly("-36"))
	if !strings.HasPrefix(said, "Registration failed") || !strings.Contains(said, "ES256, EdDSA (Ed25519) or RS256") {
		t.Fatalf("an authenticator without the server's algorithms: the page says %q", said)
	}
	if err := en.wait(); err == nil || strings.Contains(en.out.String(), "(added") {
		t.Fatalf("passkey add for a failed registration: %v\n%s", err, en.out.String())
	}

	// A registration in an algorithm the server does not verify is refused
	// by the server, naming the ones it does.
	en = startEnrol(ctx, t, base, "--id", "es384-reviewer", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "10s")
	es384, err := softauthn.NewAlg(softauthn.ES384)
	if err != nil {
		t.Fatal(err)
	}
	b, err := softauthn.NewBrowser(base, es384)
	if err != nil {
		t.Fatal(err)
	}
	token := en.link[strings.Index(en.link, "t=")+2:]
	if _, err := b.Enrol(token); err == nil || !strings.Contains(err.Error(), "ES384 (COSE algorithm -35)") || !strings.Contains(err.Error(), "ES256, EdDSA (Ed25519) or RS256") {
		t.Fatalf("an ES384 registration: %v", err)
	}
	if err := en.wait(); err == nil || strings.Contains(en.out.String(), "(added") {
		t.Fatalf("passkey add for a refused registration: %v\n%s", err, en.out.String())
	}
}
