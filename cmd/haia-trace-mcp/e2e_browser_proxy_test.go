package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// proxyAddr is the loopback address the test's reverse proxy connects to
// the console from: the one trusted proxy (Chromium, the operator's
// command and the strangers reach the proxy from other addresses).
const proxyAddr = "127.0.0.9"

// startLoopbackProxy serves a reverse proxy (net/http/httputil, which
// appends the client's address to X-Forwarded-For) on 127.0.0.1, in
// front of target, connecting from proxyAddr; it returns its port.
func startLoopbackProxy(t *testing.T, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(proxyAddr)}}).DialContext}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// stranger is an HTTP client that connects from one loopback address and
// sends the console's requests as its page would (Origin, CSRF), each
// with an X-Forwarded-For it made up.
type stranger struct {
	c      *http.Client
	base   string
	origin string // the console's, which a script outside a browser sends as it likes
	csrf   string
}

func newStranger(from, base, origin string) (*stranger, error) {
	jar, _ := cookiejar.New(nil)
	s := &stranger{base: base, origin: origin, c: &http.Client{Jar: jar, Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}}}
	resp, err := s.c.Get(base)
	if err != nil {
		return nil, fmt.Errorf("a stranger at %s: %w", from, err)
	}
	resp.Body.Close()
	u, _ := url.Parse(base)
	for _, ck := range jar.Cookies(u) {
		if ck.Name == "haia_console_csrf" {
			s.csrf = ck.Value
		}
	}
	if s.csrf == "" {
		return nil, fmt.Errorf("no CSRF cookie for the stranger at %s", from)
	}
	return s, nil
}

// post sends body to path with a forged X-Forwarded-For and returns the
// status.
func (s *stranger) post(path, body, forged string) (int, string) {
	req, _ := http.NewRequest("POST", s.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", s.origin)
	req.Header.Set("X-CSRF-Token", s.csrf)
	req.Header.Set("X-Forwarded-For", forged)
	resp, err := s.c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// selfMadeToken is an enrolment token in the link's form that the
// operator never made: for even n the old three-part form, for odd n four
// parts with a MAC of made-up bytes.
func selfMadeToken(who string, n int) string {
	enc := base64.RawURLEncoding.EncodeToString
	tok := enc([]byte(who)) + "." + fmt.Sprint(time.Now().Add(9*time.Minute).Unix()) + "." + enc(fmt.Appendf(nil, "a stranger's secret %023d", n))
	if n%2 == 1 {
		tok += "." + enc(fmt.Appendf(nil, "%032d", n))
	}
	return tok
}

// The console behind a TLS-less reverse proxy on loopback, in Chromium,
// under a flood: 52 strangers at their own addresses start 1,040
// enrolments with self-made links straight at the console (each refused,
// none held: the link's signature is checked at begin) and more through
// the proxy with forged X-Forwarded-For hops (each charged to the address
// the proxy saw, so a forged hop buys no budget); one stranger shares the
// reviewer's own address and spends its whole budget. The operator's real
// link still enrols the reviewer's passkey in Chromium, the reviewer
// still signs in and approves, every step through the proxy.
func TestConsoleBehindProxyUnderFloodInBrowser(t *testing.T) {
	chromium := browserChromium(t)
	root := loopRoot(t)
	reviewers := filepath.Join(t.TempDir(), "reviewers.json")
	key := filepath.Join(t.TempDir(), "signing.pem")
	consolePort := freePort(t)
	port := startLoopbackProxy(t, "http://127.0.0.1:"+consolePort)
	origin := "http://localhost:" + port
	base := origin + "/console/"
	direct := "http://127.0.0.1:" + consolePort + "/console/"
	var serverErr lockedBuffer
	cs := mcpSession(t, &serverErr, "--dir", root, "--key-file", key, "--agent-id", "loop-agent", "--reviewers", reviewers,
		"--console", "--console-addr", "127.0.0.1:"+consolePort, "--console-url", base, "--console-trusted-proxy", proxyAddr+"/32")

	// The flood. Straight at the console, 52 addresses, 20 begins each:
	// more than the 1,024 enrolments a console holds.
	var wg sync.WaitGroup
	type tally struct{ refused, limited, other int }
	tallies := make([]tally, 52)
	for i := range 52 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := newStranger(fmt.Sprintf("127.0.1.%d", i+1), direct, origin)
			if err != nil {
				t.Error(err)
				return
			}
			for n := range 20 {
				code, body := s.post("api/enrol/begin", fmt.Sprintf(`{"token":%q}`, selfMadeToken("pat", 2*(i*100+n)+1)), "")
				switch {
				case code == http.StatusForbidden && strings.Contains(body, "not made by the operator"),
					code == http.StatusBadRequest && strings.Contains(body, "malformed"):
					tallies[i].refused++
				case code == http.StatusTooManyRequests:
					tallies[i].limited++
				default:
					tallies[i].other++
					t.Errorf("a self-made link's begin from 127.0.1.%d: %d %s", i+1, code, body)
				}
			}
		}()
	}
	wg.Wait()
	for i, ty := range tallies {
		if ty.refused+ty.limited != 20 {
			t.Fatalf("stranger 127.0.1.%d: %+v", i+1, ty)
		}
	}
	// Through the proxy, each stranger forging a new X-Forwarded-For on
	// every request: the console charges the address the proxy saw.
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := newStranger(fmt.Sprintf("127.0.2.%d", i+1), base, origin)
			if err != nil {
				t.Error(err)
				return
			}
			limited := 0
			for n := range 35 {
				forged := fmt.Sprintf("10.%d.%d.%d", i, n, n*7%250)
				code, body := s.post("api/login/finish", `{"credential":{}}`, forged)
				if code == http.StatusTooManyRequests {
					limited++
				} else if code != http.StatusBadRequest && code != http.StatusForbidden {
					t.Errorf("a stranger's sign-in through the proxy: %d %s", code, body)
				}
				code, _ = s.post("api/enrol/begin", fmt.Sprintf(`{"token":%q}`, selfMadeToken("pat", n)), forged)
				if code == http.StatusTooManyRequests {
					limited++
				}
			}
			// Its own budget (a burst of 20), and no more: the address the
			// proxy saw is the key, not the proxy's nor a forged hop.
			if limited < 30 {
				t.Errorf("the stranger at 127.0.2.%d forged a new X-Forwarded-For on each of 70 requests and was limited only %d times: the forged hop bought budget", i+1, limited)
			}
			if 70-limited < 15 {
				t.Errorf("the stranger at 127.0.2.%d was answered only %d times in 70: the clients behind the proxy share one budget", i+1, 70-limited)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// One stranger at the reviewer's own address (127.0.0.1, as Chromium
	// and the operator's command reach the proxy) keeps its budget spent
	// until the reviewer has decided.
	flooding, stopFlood := context.WithCancel(context.Background())
	var sent, limited int
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		s, err := newStranger("127.0.0.1", base, origin)
		if err != nil {
			t.Error(err)
			return
		}
		for n := 0; flooding.Err() == nil; n++ {
			if code, _ := s.post("api/login/finish", `{"credential":{}}`, fmt.Sprintf("192.0.2.%d", n%250)); code == http.StatusTooManyRequests {
				limited++
			}
			sent++
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer stopFlood()

	// The operator's real link, through the proxy, while the reviewer's
	// address has no budget left.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	en := startEnrol(ctx, t, base, "--id", "pat", "--console-url", base, "--reviewers", reviewers, "--key-file", key, "--yes", "--wait", "2m")
	bctx := browserRegister(ctx, t, chromium, en.link, serverErr.String)
	var fp string
	if err := chromedp.Run(bctx, chromedp.Text(`#fingerprint`, &fp, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if err := en.wait(); err != nil || !strings.Contains(en.out.String(), "fingerprint: "+fp) {
		t.Fatalf("passkey add: %v\n%s\n%s", err, en.out.String(), en.errb.String())
	}

	var a checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.1"}), &a)
	if a.Decision != "review" {
		t.Fatalf("first answer: %+v", a)
	}
	if err := browserSignIn(bctx, base); err != nil {
		t.Fatalf("sign in from the spent address: %v (server: %s)", err, serverErr.String())
	}
	var status string
	if err := chromedp.Run(bctx, chromedp.Navigate(base+"reviews/"+a.ReviewID), chromedp.WaitVisible(`#note`, chromedp.ByQuery),
		chromedp.Click(`button[data-decision="approved"]`, chromedp.ByQuery), decidedText(&status)); err != nil {
		t.Fatalf("approve: %v (server: %s)", err, serverErr.String())
	}
	if !strings.Contains(status, "approved by pat") {
		t.Fatalf("after Approve the page says: %s", status)
	}
	stopFlood()
	<-flooded
	if sent < 50 || limited < sent-30 {
		t.Fatalf("the stranger at the reviewer's address sent %d failed sign-ins and was limited %d times; want all but its burst", sent, limited)
	}
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.1"}), &a)
	if a.Decision != "allow" {
		t.Fatalf("the approved question: %+v", a)
	}
}

// browserSignIn opens the console at base and presses Sign in with
// passkey; it returns once the queue shows, or with what the page said.
// The sign-in navigates, so a read that meets the old document as it is
// torn down is tried again.
func browserSignIn(bctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(bctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, chromedp.Navigate(base), chromedp.Click(`#signin`, chromedp.ByQuery)); err != nil {
		return err
	}
	const read = `document.querySelector("#queue") !== null ? "signed in" : ((document.getElementById("status") || {}).textContent || "")`
	var last error
	for {
		var said string
		err := chromedp.Run(ctx, chromedp.Evaluate(read, &said))
		switch {
		case err == nil && said == "signed in":
			return nil
		case err == nil && strings.HasPrefix(said, "Sign-in failed"):
			return errors.New(said)
		case err != nil:
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the queue never showed after Sign in (last read error: %v)", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
