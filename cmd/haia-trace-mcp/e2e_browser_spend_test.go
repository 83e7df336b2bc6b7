package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The console shows the two-person rule's progress and the spend against
// the limits legibly in Chromium, at a laptop's and a phone's width: the
// queue card of a review alice approved through the CLI says "1 of 2
// approvals (alice)" and names the payee "(Weather API)"; the panel "Spend
// against limits" gives, for all payees and per payee, what the Trace
// shows paid and what the guard holds against each limit, each line
// inside the window, at a readable size, and the page never scrolls
// sideways.
func TestConsoleQuorumAndSpendInBrowser(t *testing.T) {
	chromium := browserChromium(t)
	root := loopRoot(t) // 0.10 USDC paid to sellerB an hour ago, not settled (out of the velocity window of an hour)
	dir := t.TempDir()
	reviewers := filepath.Join(dir, "reviewers.json")
	key := filepath.Join(dir, "signing.pem")
	if out, errOut, code := runCLI(t, "reviewer", "init", "--id", "alice", "--key-file", filepath.Join(dir, "alice.pem"), "--reviewers", reviewers); code != 0 {
		t.Fatalf("reviewer init: %d %s %s", code, out, errOut)
	}
	policy := writeFile(t, "policy.json", `{"quorum": [{"above": "0.05", "approvals": 2}], "payees": {"`+sellerB+`": "Weather API"},
	  "totalLimit": {"amount": "10.00"}, "velocity": {"perCounterparty": {"count": 4}}}`)
	port := freePort(t)
	base := "http://localhost:" + port + "/console/"
	var serverErr lockedBuffer
	cs := mcpSession(t, &serverErr, "--dir", root, "--key-file", key, "--agent-id", "research-agent", "--guard-config", policy,
		"--reviewers", reviewers, "--console", "--console-addr", "127.0.0.1:"+port)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	en := startEnrol(ctx, t, base, "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "1m")
	bctx := browserRegister(ctx, t, chromium, en.link, serverErr.String)
	if err := en.wait(); err != nil {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}

	ask := func(to, amount string) checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": to, "amount": amount}), &a)
		return a
	}
	rv := ask(sellerB, "0.25")
	if rv.Decision != "review" {
		t.Fatalf("the question to sellerB: %+v", rv)
	}
	if out, errOut, code := runCLI(t, "review", "approve", rv.ReviewID, "--dir", root, "--reviewers", reviewers, "--reviewer-key", filepath.Join(dir, "alice.pem")); code != 0 || !strings.Contains(out, "1 of 2 approvals (alice)") {
		t.Fatalf("alice's approval: %d %s %s", code, out, errOut)
	}
	if a := ask(sellerA, "0.04"); a.Decision != "allow" {
		t.Fatalf("the question to sellerA: %+v", a)
	}
	if err := browserSignIn(bctx, base); err != nil {
		t.Fatalf("sign in: %v (server: %s)", err, serverErr.String())
	}

	for _, size := range consoleWidths {
		if err := chromedp.Run(bctx, chromedp.EmulateViewport(size.w, size.h), chromedp.Navigate(base),
			chromedp.WaitVisible(`#spend`, chromedp.ByQuery)); err != nil {
			t.Fatalf("queue at %s: %v", size.name, err)
		}
		text := pageText(t, bctx)
		for _, want := range []string{
			"1 of 2 approvals (alice)", "Pay 0.25 USDC to 0xb0b0…0002 (Weather API)",
			"Spend against limits", "All payees", "Total limit, 24 hours 0.14 USDC of 10.00 USDC (1%)",
			"0.10 USDC paid in the Trace · 0.04 USDC held by the guard",
			"0xb0b0…0002 Weather API", "Limit per payee, 24 hours 0.10 USDC of 5.00 USDC (2%)", "0.10 USDC paid in the Trace · 0.00 USDC held by the guard",
			"0xa11c…0001", "Limit per payee, 24 hours 0.04 USDC of 5.00 USDC (0%)", "0.00 USDC paid in the Trace · 0.04 USDC held by the guard",
			"Payments per payee, 1 hour 1 payment of 4 payments (25%)", "0 payments paid in the Trace · 1 payment held by the guard",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("the queue at %s does not say %q:\n%s", size.name, want, text)
			}
		}
		noHorizontalScroll(t, bctx, "the queue at "+size.name)
		// Every line of the panel and the quorum is on screen: laid out,
		// inside the window's width, at least 12 px, not hidden.
		var bad []string
		if err := chromedp.Run(bctx, chromedp.Evaluate(`(function(){
			const out = [];
			const els = document.querySelectorAll("#spend .q, #spend .lt, #spend strong, #spend .ph, #spend meter, .quorum");
			if (els.length < 10) out.push("only " + els.length + " elements to check");
			for (const e of els) {
				const r = e.getBoundingClientRect(), s = getComputedStyle(e);
				const what = (e.textContent || e.tagName).trim().slice(0, 40);
				if (r.width <= 0 || r.height <= 0) out.push(what + ": not laid out");
				if (r.left < 0 || r.right > window.innerWidth + 0.5) out.push(what + ": outside the window (" + r.left + " to " + r.right + ")");
				if (s.visibility !== "visible" || s.display === "none" || parseFloat(s.opacity) < 1) out.push(what + ": hidden");
				if (e.tagName !== "METER" && parseFloat(s.fontSize) < 12) out.push(what + ": " + s.fontSize);
				if (e.tagName !== "METER" && s.color === s.backgroundColor) out.push(what + ": no contrast");
			}
			return out;
		})()`, &bad)); err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Errorf("at %s: %s", size.name, b)
		}
		var shot []byte
		if err := chromedp.Run(bctx, chromedp.ScrollIntoView(`#spend`, chromedp.ByQuery), chromedp.CaptureScreenshot(&shot)); err != nil {
			t.Fatal(err)
		}
		checkScreenshot(t, "console-spend-"+size.name, shot, int(size.w), int(size.h))
	}
}
