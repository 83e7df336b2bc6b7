package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// A tenant's console in a real browser (Debian chromium with the DevTools
// WebAuthn virtual authenticator), served by a --tenants-dir server: the
// operator enrols pat for acme at /console/t/acme/; pat signs in there,
// sees acme's review and not globex's, approves it with one assertion, and
// acme's identical question is honoured; at globex's console the same
// passkey is refused, and acme's session is none there.
func TestTenantConsoleInBrowser(t *testing.T) {
	chromium := browserChromium(t)
	ts := startTenantConsoles(t)
	p, ask, acmeBase, globexBase := ts.p, ts.ask, ts.acmeBase, ts.globexBase

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	en := startEnrol(ctx, t, acmeBase, "--id", "pat", "--tenant", "acme", "--console-url", acmeBase, "--reviewers", ts.reviewers, "--key-file", ts.key(), "--yes", "--wait", "1m")
	bctx := browserRegister(ctx, t, chromium, en.link, p.logs)
	var fp string
	if err := chromedp.Run(bctx, chromedp.Text(`#fingerprint`, &fp, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if err := en.wait(); err != nil || !strings.Contains(en.out.String(), "fingerprint: "+fp) {
		t.Fatalf("passkey add for acme: %q %v\n%s\n%s", fp, err, en.out.String(), en.errb.String())
	}

	acmeQ, globexQ := ask("acme", "2.50"), ask("globex", "2.50")
	acmeID, _ := acmeQ["review_id"].(string)
	globexID, _ := globexQ["review_id"].(string)
	if acmeQ["decision"] != "review" || globexQ["decision"] != "review" || acmeID == "" || globexID == "" {
		t.Fatalf("the questions opened no reviews: %v %v", acmeQ, globexQ)
	}

	// Signed in at acme's console: acme's queue, not globex's review.
	var shot []byte
	var queue string
	if err := chromedp.Run(bctx, chromedp.Navigate(acmeBase), chromedp.Click(`#signin`, chromedp.ByQuery),
		chromedp.WaitVisible(`[aria-label="Pending reviews"]`, chromedp.ByQuery), chromedp.Text(`main`, &queue, chromedp.ByQuery),
		chromedp.CaptureScreenshot(&shot)); err != nil {
		t.Fatalf("sign in at acme: %v\n%s", err, p.logs())
	}
	checkScreenshot(t, "tenant-queue", shot, width, height)
	if reviewLink(t, bctx, acmeID) == "" || reviewLink(t, bctx, globexID) != "" || strings.Contains(queue, globexID) {
		t.Fatalf("acme's queue: acme's review linked %q, globex's %q", reviewLink(t, bctx, acmeID), reviewLink(t, bctx, globexID))
	}
	// globex's review through acme's console does not exist there.
	var page string
	if err := chromedp.Run(bctx, chromedp.Navigate(acmeBase+"reviews/"+globexID), chromedp.Text(`body`, &page, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page, "Approve") {
		t.Fatalf("globex's review opened at acme's console: %s", page)
	}

	// Approve acme's review: one assertion, decided by pat.
	var status string
	if err := chromedp.Run(bctx, chromedp.Navigate(acmeBase+"reviews/"+acmeID), chromedp.WaitVisible(`#note`, chromedp.ByQuery),
		chromedp.SendKeys(`#note`, "approved for acme in the browser", chromedp.ByQuery),
		chromedp.Click(`button[data-decision="approved"]`, chromedp.ByQuery),
		decidedText(&status)); err != nil {
		t.Fatalf("approve at acme: %v\n%s", err, p.logs())
	}
	if !strings.Contains(status, "Status: approved by pat") || !strings.Contains(status, "passkey") {
		t.Fatalf("after Approve the page says: %s", status)
	}
	if a := ask("acme", "2.50"); a["decision"] != "allow" {
		t.Fatalf("acme's approved question: %v", a)
	}

	// At globex's console: acme's session is none, and the passkey, not
	// granted globex, cannot sign in.
	var signin string
	if err := chromedp.Run(bctx, chromedp.Navigate(globexBase), chromedp.WaitVisible(`#signin`, chromedp.ByQuery),
		chromedp.Text(`body`, &page, chromedp.ByQuery)); err != nil {
		t.Fatalf("globex's console: %v", err)
	}
	if strings.Contains(page, globexID) || strings.Contains(page, acmeID) {
		t.Fatal("acme's session read globex's console")
	}
	if err := chromedp.Run(bctx, chromedp.Click(`#signin`, chromedp.ByQuery),
		chromedp.Poll(`document.getElementById("status").textContent.startsWith("Sign-in failed")`, nil),
		chromedp.Text(`#status`, &signin, chromedp.ByQuery), chromedp.CaptureScreenshot(&shot)); err != nil {
		t.Fatalf("sign in at globex: %v\n%s", err, p.logs())
	}
	checkScreenshot(t, "tenant-refused", shot, width, height)
	if !strings.Contains(signin, "not in the trusted reviewers file") {
		t.Fatalf("pat at globex's console: %q, want the server's refusal", signin)
	}
	if err := chromedp.Run(bctx, chromedp.Navigate(globexBase+"reviews/"+globexID), chromedp.Text(`body`, &page, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page, "Approve") || strings.Contains(page, "Signed terms") {
		t.Fatalf("pat opened globex's review: %s", page)
	}
	if a := ask("globex", "2.50"); a["decision"] == "allow" {
		t.Fatalf("globex's question was allowed: %v", a)
	}
}
