package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// A real browser approves a review and, in the same passkey gesture,
// grants a standing approval of its payee: the review page offers "and
// allow this payee" prefilled from the review; the reviewer sets the
// bounds and presses Approve once (one assertion, from the DevTools
// virtual authenticator); the page then shows the mandate live. The
// agent's next question of the payee inside the bounds is allowed under
// it, one above them is not; mandate list and show, audit and verify
// accept the passkey's mandate and its approval; a budget raised in the
// store afterwards makes audit exit 2 and the guard honour no mandate.
func TestConsoleMandateInBrowser(t *testing.T) {
	chromium := browserChromium(t)
	root := sampleRoot(t)
	dir := t.TempDir()
	reviewers := filepath.Join(dir, "reviewers.json")
	key := filepath.Join(dir, "signing.pem")
	policy := writeFile(t, "policy.json", `{"reviewAbove": "0.05"}`)
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
	ask := func(amount string) checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": amount, "asset": "USDC"}), &a)
		return a
	}
	rv := ask("0.10")
	if rv.Decision != "review" || !hasRule(rv, "review_above") {
		t.Fatalf("the first question: %+v", rv)
	}
	if err := browserSignIn(bctx, base); err != nil {
		t.Fatalf("sign in: %v (server: %s)", err, serverErr.String())
	}
	var maxValue, countValue string
	if err := chromedp.Run(bctx, chromedp.Navigate(base+"reviews/"+rv.ReviewID), chromedp.WaitVisible(`#m-on`, chromedp.ByQuery),
		chromedp.Value(`#m-max`, &maxValue, chromedp.ByQuery), chromedp.Value(`#m-count`, &countValue, chromedp.ByQuery)); err != nil {
		t.Fatalf("the review page: %v (server: %s)", err, serverErr.String())
	}
	if maxValue != "0.10" || countValue != "10" {
		t.Fatalf("the mandate part is prefilled with %q a payment, %q payments; want the review's 0.10 and 10", maxValue, countValue)
	}
	names, err := accessibleNames(bctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range [][2]string{{"checkbox", "and allow this payee up to a bound, without a review, for a while"}, {"textbox", "Most per payment (USDC)"},
		{"textbox", "Budget, all payments (USDC)"}, {"combobox", "For"}, {"button", "Approve"}} {
		if !hasName(names, want[0], want[1]) {
			t.Fatalf("the review page has no %s named %q: %v", want[0], want[1], names)
		}
	}
	var disabled bool
	if err := chromedp.Run(bctx, chromedp.Evaluate(`document.getElementById("m-max").disabled && document.getElementById("m-expires").disabled`, &disabled)); err != nil || !disabled {
		t.Fatalf("the mandate's bounds are editable before it is asked for (%v)", err)
	}
	var shot []byte
	var status string
	if err := chromedp.Run(bctx, chromedp.Click(`#m-on`, chromedp.ByQuery),
		chromedp.SetValue(`#m-max`, "0.20", chromedp.ByQuery), chromedp.SetValue(`#m-budget`, "0.50", chromedp.ByQuery),
		chromedp.SetValue(`#m-count`, "3", chromedp.ByQuery), chromedp.SetValue(`#m-expires`, "24h", chromedp.ByQuery),
		chromedp.ScrollIntoView(`#mandate`, chromedp.ByQuery), chromedp.CaptureScreenshot(&shot),
		chromedp.Click(`button[data-decision="approved"]`, chromedp.ByQuery), decidedText(&status)); err != nil {
		t.Fatalf("approve with a mandate: %v (server: %s)", err, serverErr.String())
	}
	checkScreenshot(t, "console-mandate", shot, width, height)
	id := regexp.MustCompile(`Mandate (m_[0-9a-f]{16}): live`).FindStringSubmatch(status)
	if !strings.Contains(status, "Status: approved by pat") || id == nil ||
		!strings.Contains(status, "up to 0.20 USDC a payment to "+strings.ToLower(sellerA)+" by research-agent, 0.50 USDC in all in at most 3 payments") {
		t.Fatalf("after Approve the page says:\n%s\n(server: %s)", status, serverErr.String())
	}

	a := ask("0.15")
	if a.Decision != "allow" || !hasRule(a, "mandate") || !strings.Contains(resultReasons(a), "mandate "+id[1]+": 0.35 USDC and 2 payments left after this one (signed by pat") {
		t.Fatalf("a question inside the mandate: %+v", a)
	}
	if a := ask("0.30"); a.Decision != "review" || !strings.Contains(resultReasons(a), "mandate "+id[1]+" does not cover it (more than its most per payment)") {
		t.Fatalf("a question above the mandate's most per payment: %+v", a)
	}
	cli := func(args ...string) (string, string, int) {
		return runCLI(t, append(args, "--dir", root, "--reviewers", reviewers)...)
	}
	if out, errOut, code := cli("mandate", "list"); code != 0 || !strings.Contains(out, id[1]+"  live") || !strings.Contains(out, "0.15 USDC in 1 payment") || !strings.Contains(out, "pat") {
		t.Fatalf("mandate list: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := cli("mandate", "show", id[1]); code != 0 || !strings.Contains(out, "signed by    1 of 1 signatures (pat)") || !strings.Contains(out, "reference    "+rv.ReviewID+" (console approval)") {
		t.Fatalf("mandate show: %d %s %s", code, out, errOut)
	}
	audit := func() (string, string, int) { return cli("audit", "--key-file", key) }
	if out, errOut, code := audit(); code != 0 || !strings.Contains(out, "1 mandate record, every use within a signed mandate") {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
	if out, code := verifyChains(t, root, "--reviewers", reviewers); code != 0 {
		t.Fatalf("verify --reviewers: exit %d\n%s", code, out)
	}

	// A writer of the volume raises the mandate's budget: the passkey's
	// assertion no longer covers its terms.
	path := filepath.Join(root, "guard", "mandates.ndjson")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), `"budget_atomic":"500000"`, `"budget_atomic":"500000000"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := audit(); code != 2 || !strings.Contains(out, "MANDATE mandate record 1: grant of mandate "+id[1]+` is not trusted: not signed by reviewer "pat"'s passkey`) {
		t.Fatalf("audit of an edited mandate: %d %s %s, want exit 2", code, out, errOut)
	}
	if a := ask("0.12"); a.Decision != "review" || !strings.Contains(resultReasons(a), "the mandate records do not verify") {
		t.Fatalf("the question after the edit: %+v", a)
	}
}
