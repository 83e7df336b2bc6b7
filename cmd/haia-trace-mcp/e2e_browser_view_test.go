package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// The console's two widths: a 1280 × 800 laptop and a 390 × 844 phone.
var consoleWidths = []struct {
	name string
	w, h int64
}{{"1280x800", 1280, 800}, {"390x844", 390, 844}}

// ageWords is how the console says how long ago something was.
var ageWords = regexp.MustCompile(`just now|\d+ (minute|hour|day)s? ago`)

// noHorizontalScroll fails unless the page is no wider than the window.
func noHorizontalScroll(t *testing.T, bctx context.Context, what string) {
	t.Helper()
	var widths []int
	if err := chromedp.Run(bctx, chromedp.Evaluate(`[document.documentElement.scrollWidth, window.innerWidth]`, &widths)); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(widths) != 2 || widths[0] > widths[1] {
		t.Errorf("%s scrolls sideways: the page is %d px wide in a %d px window", what, widths[0], widths[1])
	}
}

// pageText is the page's visible text.
func pageText(t *testing.T, bctx context.Context) string {
	t.Helper()
	var s string
	if err := chromedp.Run(bctx, chromedp.Evaluate(`document.body.innerText`, &s)); err != nil {
		t.Fatal(err)
	}
	return s
}

// The reviewer reads a review as the question it is, in Chromium at a
// laptop's and a phone's width: the queue's pending rows give amount and
// symbol (USDC, not the CAIP id), the payee, the caller, the age and the
// rules that asked in words; the review page leads with "Pay 0.25 USDC to
// 0xb0b0…0002?", the hosts the Trace knows for that payee, the resource,
// the caller and how long ago, then each reason in words with the setting
// that fired it (the history line is what the guard read, not a rule).
// Times show their age and the reviewer's local time (the browser's time
// zone is Asia/Kolkata), the UTC instant on hover. No page scrolls
// sideways at either width; the screenshots are the ones in
// docs/console.md (HAIA_SCREENSHOTS=DIR writes them).
func TestConsoleReadsAsAQuestionInBrowser(t *testing.T) {
	chromium := browserChromium(t)
	root := loopRoot(t)
	reviewers := filepath.Join(t.TempDir(), "reviewers.json")
	key := filepath.Join(t.TempDir(), "signing.pem")
	port := freePort(t)
	base := "http://localhost:" + port + "/console/"
	var serverErr lockedBuffer
	cs := mcpSession(t, &serverErr, "--dir", root, "--key-file", key, "--agent-id", "research-agent",
		"--reviewers", reviewers, "--console", "--console-addr", "127.0.0.1:"+port)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	en := startEnrol(ctx, t, base, "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "1m")
	bctx := browserRegister(ctx, t, chromium, en.link, serverErr.String)
	if err := en.wait(); err != nil {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}
	ist := time.FixedZone("IST", 5*3600+1800) // Asia/Kolkata keeps no daylight saving time
	if err := chromedp.Run(bctx, emulation.SetTimezoneOverride("Asia/Kolkata")); err != nil {
		t.Fatal(err)
	}

	ask := func(amount string) checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": amount,
			"resource": "https://b.example.net/reports/q3"}), &a)
		if a.Decision != "review" {
			t.Fatalf("check_before_pay %s: %+v", amount, a)
		}
		return a
	}
	small, large := ask("0.25"), ask("2.5")
	if err := browserSignIn(bctx, base); err != nil {
		t.Fatalf("sign in: %v (server: %s)", err, serverErr.String())
	}

	for _, size := range consoleWidths {
		if err := chromedp.Run(bctx, chromedp.EmulateViewport(size.w, size.h), chromedp.Navigate(base),
			chromedp.WaitVisible(`[aria-label="Pending reviews"]`, chromedp.ByQuery)); err != nil {
			t.Fatalf("queue at %s: %v", size.name, err)
		}
		queue := pageText(t, bctx)
		if !ageWords.MatchString(queue) {
			t.Errorf("the queue at %s says no age:\n%s", size.name, queue)
		}
		for _, want := range []string{"0.25 USDC", "2.50 USDC", "0xb0b0…0002", "research-agent",
			"Earlier payments to this payee are still open", "More than a payment may be without a review"} {
			if !strings.Contains(queue, want) {
				t.Errorf("the queue at %s does not say %q:\n%s", size.name, want, queue)
			}
		}
		for _, not := range []string{"eip155:", small.ReviewID, "open_partial", "review_above", "T0", "Z\n"} {
			if strings.Contains(queue, not) {
				t.Errorf("the queue at %s shows %q:\n%s", size.name, not, queue)
			}
		}
		noHorizontalScroll(t, bctx, "the queue at "+size.name)
		var shot []byte
		if err := chromedp.Run(bctx, chromedp.CaptureScreenshot(&shot)); err != nil {
			t.Fatal(err)
		}
		checkScreenshot(t, "console-queue-"+size.name, shot, int(size.w), int(size.h))

		if err := chromedp.Run(bctx, chromedp.Navigate(base+"reviews/"+small.ReviewID), chromedp.WaitVisible(`#note`, chromedp.ByQuery)); err != nil {
			t.Fatalf("review page at %s: %v", size.name, err)
		}
		var h1 string
		if err := chromedp.Run(bctx, chromedp.Text(`h1`, &h1, chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		if h1 != "Pay 0.25 USDC to 0xb0b0…0002?" {
			t.Errorf("the review page at %s is titled %q", size.name, h1)
		}
		page := pageText(t, bctx)
		for _, want := range []string{"b.example.net", "https://b.example.net/reports/q3", "research-agent",
			"Earlier payments to this payee are still open", "maxOpenPartialPerCounterparty", "What the guard read",
			"0xb0b0000000000000000000000000000000000002"} {
			if !strings.Contains(page, want) {
				t.Errorf("the review page at %s does not say %q:\n%s", size.name, want, page)
			}
		}
		var ruleTitles []string
		if err := chromedp.Run(bctx, chromedp.Evaluate(`Array.from(document.querySelectorAll("#reasons > li .rule")).map(e => e.textContent)`, &ruleTitles)); err != nil {
			t.Fatal(err)
		}
		if len(ruleTitles) == 0 {
			t.Errorf("the review page at %s lists no reason", size.name)
		}
		for _, r := range ruleTitles {
			if r == "history" || strings.Contains(r, "_") {
				t.Errorf("the review page at %s lists the reason %q by its id, not in words", size.name, r)
			}
		}
		// The time the review opened: its age and the local time, the UTC
		// instant on hover.
		var opened struct {
			Datetime string `json:"datetime"`
			Title    string `json:"title"`
			Text     string `json:"text"`
		}
		if err := chromedp.Run(bctx, chromedp.Evaluate(`(function(){const e = document.querySelector("#opened time"); return {datetime: e.getAttribute("datetime"), title: e.getAttribute("title"), text: e.textContent};})()`, &opened)); err != nil {
			t.Fatal(err)
		}
		at, err := time.Parse(time.RFC3339Nano, opened.Datetime)
		if err != nil {
			t.Fatalf("the opened time's datetime %q: %v", opened.Datetime, err)
		}
		if local := at.In(ist).Format("15:04"); opened.Text != ageWords.FindString(opened.Text)+" ("+local+")" || ageWords.FindString(opened.Text) == "" {
			t.Errorf("the opened time reads %q; want its age and the local time %s", opened.Text, local)
		}
		if utc := at.UTC().Format("2006-01-02 15:04:05") + " UTC"; opened.Title != utc {
			t.Errorf("the opened time's hover says %q, want %q", opened.Title, utc)
		}
		if regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:`).MatchString(page) {
			t.Errorf("the review page at %s shows a raw ISO time:\n%s", size.name, page)
		}
		noHorizontalScroll(t, bctx, "the review page at "+size.name)
		if err := chromedp.Run(bctx, chromedp.CaptureScreenshot(&shot)); err != nil {
			t.Fatal(err)
		}
		checkScreenshot(t, "console-review-"+size.name, shot, int(size.w), int(size.h))
	}
	if large.ReviewID == small.ReviewID {
		t.Fatal("two questions, one review")
	}
}

// The console has a favicon (the page links it; it is served as SVG),
// a Sign out button that ends the session on the server (the old cookie
// no longer reads the queue), and its sign-in and enrolment pages do not
// scroll sideways at either width either.
func TestConsoleSignOutAndFaviconInBrowser(t *testing.T) {
	chromium := browserChromium(t)
	root := loopRoot(t)
	reviewers := filepath.Join(t.TempDir(), "reviewers.json")
	key := filepath.Join(t.TempDir(), "signing.pem")
	port := freePort(t)
	base := "http://localhost:" + port + "/console/"
	var serverErr lockedBuffer
	mcpSession(t, &serverErr, "--dir", root, "--key-file", key, "--agent-id", "research-agent",
		"--reviewers", reviewers, "--console", "--console-addr", "127.0.0.1:"+port)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	en := startEnrol(ctx, t, base, "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "1m")
	bctx := browserRegister(ctx, t, chromium, en.link, serverErr.String)
	if err := en.wait(); err != nil {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}
	for _, size := range consoleWidths {
		if err := chromedp.Run(bctx, chromedp.EmulateViewport(size.w, size.h), chromedp.Navigate(en.link), chromedp.WaitVisible(`#register`, chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		noHorizontalScroll(t, bctx, "the enrolment page at "+size.name)
		if err := chromedp.Run(bctx, chromedp.Navigate(base), chromedp.WaitVisible(`#signin`, chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		noHorizontalScroll(t, bctx, "the sign-in page at "+size.name)
	}

	var icon struct {
		Href   string `json:"href"`
		Status int    `json:"status"`
		Type   string `json:"type"`
		Bytes  int    `json:"bytes"`
	}
	if err := chromedp.Run(bctx, chromedp.Evaluate(`(async function(){const l = document.querySelector('link[rel="icon"]'); if (!l) { return {}; }
		const r = await fetch(l.href); const b = await r.text(); return {href: l.href, status: r.status, type: r.headers.get("content-type"), bytes: b.length};})()`, &icon,
		func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) })); err != nil {
		t.Fatal(err)
	}
	if icon.Status != 200 || icon.Type != "image/svg+xml" || icon.Bytes == 0 || !strings.HasPrefix(icon.Href, base) {
		t.Fatalf("favicon: %+v", icon)
	}

	if err := browserSignIn(bctx, base); err != nil {
		t.Fatalf("sign in: %v (server: %s)", err, serverErr.String())
	}
	var cookie string
	if err := chromedp.Run(bctx, chromedp.ActionFunc(func(ctx context.Context) error {
		cs, err := network.GetCookies().WithURLs([]string{base}).Do(ctx)
		for _, c := range cs {
			if c.Name == "haia_console" {
				cookie = c.Value
			}
		}
		return err
	})); err != nil || cookie == "" {
		t.Fatalf("no session cookie after sign-in: %v", err)
	}
	readsQueue := func() bool {
		req, _ := http.NewRequest("GET", base, nil)
		req.AddCookie(&http.Cookie{Name: "haia_console", Value: cookie})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), `id="queue"`)
	}
	if !readsQueue() {
		t.Fatal("the session cookie does not read the queue")
	}
	if err := chromedp.Run(bctx, chromedp.Click(`#signout`, chromedp.ByQuery), chromedp.WaitVisible(`#signin`, chromedp.ByQuery)); err != nil {
		t.Fatalf("sign out: %v (server: %s)", err, serverErr.String())
	}
	if readsQueue() {
		t.Fatal("after Sign out the old session cookie still reads the queue")
	}
}
