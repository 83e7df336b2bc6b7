package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// TestConsoleDossierInBrowser: a real browser approves a review with a
// passkey; the agent's payment signed with that approval then appears on
// the review page with "Download its dossier"; the file the browser gets
// through that link, with the reviewer's session, is one dossier verify
// accepts (VALID under the server's keyring, its checkpoints included).
func TestConsoleDossierInBrowser(t *testing.T) {
	chromium := browserChromium(t)
	root := sampleRoot(t)
	dir := t.TempDir()
	reviewers := filepath.Join(dir, "reviewers.json")
	key := filepath.Join(dir, "signing.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	policy := writeFile(t, "policy.json", `{"reviewAbove": "1.00"}`)
	port := freePort(t)
	base := "http://localhost:" + port + "/console/"
	var serverErr lockedBuffer
	cs := mcpSession(t, &serverErr, "--dir", root, "--key-file", key, "--agent-id", "research-agent", "--guard-config", policy,
		"--payer-key", payerKey, "--reviewers", reviewers, "--console", "--console-addr", "127.0.0.1:"+port)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	en := startEnrol(ctx, t, base, "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "1m")
	bctx := browserRegister(ctx, t, chromium, en.link, serverErr.String)
	if err := en.wait(); err != nil {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}
	pr := e2ePaymentRequired("2500000", e2eSeller)
	first := authorizeCall(t, cs, pr)
	if first.Decision != "review" {
		t.Fatalf("2.50 is above reviewAbove: %+v", first)
	}
	if err := browserSignIn(bctx, base); err != nil {
		t.Fatalf("sign in: %v (server: %s)", err, serverErr.String())
	}
	var status string
	if err := chromedp.Run(bctx, chromedp.Navigate(base+"reviews/"+first.ReviewID), chromedp.WaitVisible(`button[data-decision="approved"]`, chromedp.ByQuery),
		chromedp.Click(`button[data-decision="approved"]`, chromedp.ByQuery), decidedText(&status)); err != nil {
		t.Fatalf("approve: %v (server: %s)", err, serverErr.String())
	}
	if strings.Contains(status, "Download its dossier") {
		t.Fatal("a dossier link before any payment was signed")
	}
	allow := authorizeCall(t, cs, pr)
	if allow.Decision != "allow" {
		t.Fatalf("after the approval: %+v", allow)
	}
	nonce := strings.ToLower(allow.Authorization.Nonce)

	var href, download, body string
	var ok bool
	if err := chromedp.Run(bctx, chromedp.Navigate(base+"reviews/"+first.ReviewID), chromedp.WaitVisible(`a.dossier`, chromedp.ByQuery),
		chromedp.AttributeValue(`a.dossier`, "href", &href, &ok, chromedp.ByQuery),
		chromedp.AttributeValue(`a.dossier`, "download", &download, &ok, chromedp.ByQuery),
		// The file as the link fetches it: the reviewer's session, this origin.
		chromedp.Evaluate(`fetch(document.querySelector("a.dossier").href).then(r => r.ok ? r.text() : "HTTP " + r.status)`, &body,
			func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) })); err != nil {
		t.Fatalf("the review page's dossier link: %v (server: %s)", err, serverErr.String())
	}
	if href != "/console/reviews/"+first.ReviewID+"/dossier/"+nonce || download != "dossier-"+nonce+".json" {
		t.Fatalf("the link: href %q, download %q", href, download)
	}
	// The review page's dossier link at a desktop's and a phone's width:
	// inside the viewport, reachable, a tap target of 44 px.
	for _, v := range viewports {
		if err := chromedp.Run(bctx, v.emulate(), chromedp.Navigate(base+"reviews/"+first.ReviewID), chromedp.WaitVisible(`a.dossier`, chromedp.ByQuery)); err != nil {
			t.Fatalf("the review page at %d px: %v", v.w, err)
		}
		checkLayout(t, bctx, fmt.Sprintf("the review page at %d px", v.w), v.phone, 1)
		var card string
		if err := chromedp.Run(bctx, chromedp.Text(`ul[aria-label="Dossiers"] .q`, &card, chromedp.ByQuery)); err != nil || !strings.Contains(card, ": 2.50 USDC to ") {
			t.Fatalf("the dossier's card at %d px reads %q (%v), not its amount with the symbol", v.w, card, err)
		}
		screenshot(t, bctx, fmt.Sprintf("review-dossier-%d", v.w))
	}
	file := filepath.Join(t.TempDir(), download)
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, "dossier", "verify", file, "--keyring", filepath.Join(root, "guard", "keyring.json"), "--reviewers", reviewers)
	if code != 0 || !strings.Contains(out, "VALID      checkpoint ") || !strings.Contains(out, "VALID      human decision") {
		t.Fatalf("dossier verify of the downloaded file: %d\n%s%s\n(the file begins %.200q)", code, out, errOut, body)
	}
}
