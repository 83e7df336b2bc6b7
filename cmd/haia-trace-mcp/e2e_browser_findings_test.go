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

	"github.com/haia-trace-mcp/haia-trace-mcp/dossier"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// linkBox is a link as the browser lays it out.
type linkBox struct {
	Class, Text              string
	Left, Right, Top, Height float64
	Hit                      bool // the element at its centre is the link (or inside it)
}

// layoutOf reads the page's width against the viewport's and every
// finding and dossier link's box, each scrolled into view and hit-tested
// at its centre.
const layoutOf = `(() => {
  const w = window.innerWidth;
  const links = Array.from(document.querySelectorAll("a.finding-open, a.dossier, a.review")).map(a => {
    a.scrollIntoView({block: "center"});
    const r = a.getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return {Class: a.className, Text: a.textContent, Left: r.left, Right: r.right, Top: r.top, Height: r.height,
      Hit: hit !== null && (hit === a || a.contains(hit))};
  });
  window.scrollTo(0, 0);
  // A label (a table's row heading, a list's term) on more lines than it
  // has words is broken inside a word.
  const broken = Array.from(document.querySelectorAll("main th, main dt")).filter(el => {
    const r = document.createRange(); r.selectNodeContents(el);
    const lines = new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top))).size;
    return lines > el.textContent.trim().split(/\s+/).length;
  }).map(el => el.textContent.trim());
  return {w: w, sw: document.scrollingElement.scrollWidth, links: links, broken: broken};
})()`

// checkLayout fails the test when the page is wider than the viewport, a
// label is broken inside a word, or a finding or dossier link is outside
// the viewport, covered, or (on a phone) less than 44 px tall; want is how
// many such links the page must have.
func checkLayout(t *testing.T, bctx context.Context, what string, phone bool, want int) {
	t.Helper()
	var got struct {
		W      float64   `json:"w"`
		SW     float64   `json:"sw"`
		Links  []linkBox `json:"links"`
		Broken []string  `json:"broken"`
	}
	if err := chromedp.Run(bctx, chromedp.Evaluate(layoutOf, &got)); err != nil {
		t.Fatalf("%s: read the layout: %v", what, err)
	}
	if got.SW > got.W {
		t.Errorf("%s: the page is %.0f px wide in a %.0f px viewport: it scrolls sideways", what, got.SW, got.W)
	}
	for _, l := range got.Broken {
		t.Errorf("%s: the label %q is broken inside a word", what, l)
	}
	if len(got.Links) < want {
		t.Errorf("%s: %d finding and dossier links, want at least %d: %+v", what, len(got.Links), want, got.Links)
	}
	for _, l := range got.Links {
		if l.Left < 0 || l.Right > got.W {
			t.Errorf("%s: link %q (%s) spans x %.1f–%.1f, outside the %.0f px viewport", what, l.Text, l.Class, l.Left, l.Right, got.W)
		}
		if !l.Hit {
			t.Errorf("%s: link %q (%s) is covered at its centre: a tap there does not reach it", what, l.Text, l.Class)
		}
		if phone && l.Height < 44 {
			t.Errorf("%s: link %q (%s) is %.1f px tall, a tap target under 44 px", what, l.Text, l.Class, l.Height)
		}
	}
}

// viewport is a window size the console is checked at: a desktop's and a
// phone's.
type viewport struct {
	w, h  int64
	phone bool
}

var viewports = []viewport{{1280, 800, false}, {390, 844, true}}

// emulate sets the browser's viewport to v (a phone's: mobile, touch,
// three device pixels to a CSS pixel).
func (v viewport) emulate() chromedp.Action {
	if v.phone {
		return chromedp.EmulateViewport(v.w, v.h, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulateScale(3))
	}
	return chromedp.EmulateViewport(v.w, v.h)
}

// screenshot keeps the whole page as a PNG in /tmp for a person to look at.
func screenshot(t *testing.T, bctx context.Context, name string) {
	t.Helper()
	var png []byte
	if err := chromedp.Run(bctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(os.TempDir(), name+".png"), png, 0o644); err != nil {
		t.Fatalf("keep the %s screenshot: %v", name, err)
	}
}

// TestConsoleFindingsInBrowser: a real browser keeps the review queue open
// at a desktop's width (1280×800) and at a phone's (390×844); the agent
// hands the real server a settlement that names another payer
// (record_receipt, through the engine), and the finding appears on the
// open page without a reload. Nothing scrolls sideways; every finding and
// dossier link is inside the viewport, reachable at its centre and, on
// the phone, at least 44 px tall. The finding's link opens its page, whose
// dossier link downloads a file package dossier's Verify (what dossier
// verify runs) finds VALID under the server's keyring, its settlement
// included. Screenshots of both pages at both widths go to the temporary
// directory (findings-queue-390.png, finding-1280.png, …).
func TestConsoleFindingsInBrowser(t *testing.T) {
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

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	en := startEnrol(ctx, t, base, "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "1m")
	bctx := browserRegister(ctx, t, chromium, en.link, serverErr.String)
	if err := en.wait(); err != nil {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}
	if err := browserSignIn(bctx, base); err != nil {
		t.Fatalf("sign in: %v (server: %s)", err, serverErr.String())
	}
	for i, size := range viewports {
		name := fmt.Sprint(size.w)
		// A long resource: its query is what a seller may well send.
		pr := e2ePaymentRequiredAt(fmt.Sprintf("https://api.seller.example/reports/2026/quarterly-revenue-by-region-%d?format=json&fields=all", i), "250000", e2eSeller)
		a := authorizeCall(t, cs, pr)
		if a.Decision != "allow" {
			t.Fatalf("%s: 0.25 USDC is below reviewAbove: %+v", name, a)
		}
		nonce := strings.ToLower(a.Authorization.Nonce)
		var kept bool
		if err := chromedp.Run(bctx, size.emulate(), chromedp.Navigate(base), chromedp.WaitVisible(`#queue`, chromedp.ByQuery),
			chromedp.Evaluate(`window.kept = "this page"; true`, nil)); err != nil {
			t.Fatalf("%s: open the queue: %v", name, err)
		}
		// The page is open; the agent hands in the seller's answer, which
		// names another payer.
		decodeStructured(t, callTool(t, cs, "record_receipt", map[string]any{"nonce": a.Authorization.Nonce, "payment_response": map[string]any{
			"success": true, "transaction": "0x" + strings.Repeat(fmt.Sprintf("%x", 0xa0+i), 32), "network": "eip155:8453", "payer": e2eDenied}}), &struct{}{})
		card := `.finding[data-nonce="` + nonce + `"]`
		wctx, wcancel := context.WithTimeout(bctx, 20*time.Second)
		err := chromedp.Run(wctx, chromedp.WaitVisible(card, chromedp.ByQuery))
		wcancel()
		if err != nil {
			t.Fatalf("%s: the finding did not appear on the open page: %v (server: %s)", name, err, serverErr.String())
		}
		var text string
		if err := chromedp.Run(bctx, chromedp.Evaluate(`window.kept === "this page"`, &kept), chromedp.Text(card, &text, chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		if !kept {
			t.Fatalf("%s: the page reloaded to show the finding", name)
		}
		if !strings.Contains(text, "0.25 USDC") || !strings.Contains(text, "payer: the settlement names "+e2eDenied) {
			t.Fatalf("%s: the finding reads %q", name, text)
		}
		checkLayout(t, bctx, name+" queue", size.phone, 3*(i+1))
		screenshot(t, bctx, "findings-queue-"+name)

		// Open it, from its card, as a reviewer taps it.
		if err := chromedp.Run(bctx, chromedp.Click(card+` .links a.finding-open`, chromedp.ByQuery),
			chromedp.WaitVisible(`a.dossier`, chromedp.ByQuery)); err != nil {
			t.Fatalf("%s: open the finding: %v (server: %s)", name, err, serverErr.String())
		}
		var loc, h1 string
		if err := chromedp.Run(bctx, chromedp.Location(&loc), chromedp.Text(`h1`, &h1, chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		if loc != base+"findings/"+nonce || !strings.HasPrefix(h1, "Seller finding on authorization ") {
			t.Fatalf("%s: the finding's link led to %s (%q)", name, loc, h1)
		}
		checkLayout(t, bctx, name+" finding", size.phone, 1)
		screenshot(t, bctx, "finding-"+name)

		var href, download, body string
		var ok bool
		if err := chromedp.Run(bctx, chromedp.AttributeValue(`a.dossier`, "href", &href, &ok, chromedp.ByQuery),
			chromedp.AttributeValue(`a.dossier`, "download", &download, &ok, chromedp.ByQuery),
			chromedp.Evaluate(`fetch(document.querySelector("a.dossier").href).then(r => r.ok ? r.text() : "HTTP " + r.status)`, &body,
				func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) })); err != nil {
			t.Fatalf("%s: the dossier link: %v (server: %s)", name, err, serverErr.String())
		}
		if href != "/console/findings/"+nonce+"/dossier" || download != "dossier-"+nonce+".json" {
			t.Fatalf("%s: the dossier link: href %q, download %q", name, href, download)
		}
		kb, err := os.ReadFile(filepath.Join(root, "guard", "keyring.json"))
		if err != nil {
			t.Fatal(err)
		}
		keyring, err := noa.ParseKeyring(kb)
		if err != nil {
			t.Fatal(err)
		}
		links := dossier.Verify([]byte(body), keyring, nil)
		var lines []string
		for _, l := range links {
			lines = append(lines, l.Verdict+" "+l.Link+" "+l.Reason)
		}
		all := strings.Join(lines, "\n")
		if w := dossier.Worst(links); w != dossier.Valid || !strings.Contains(all, "VALID settlement") || !strings.Contains(all, "VALID checkpoint ") {
			t.Fatalf("%s: the finding's dossier verifies %s:\n%s\n(the file begins %.200q)", name, w, all, body)
		}
	}
}
