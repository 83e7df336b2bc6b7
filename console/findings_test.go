package console_test

import (
	"bufio"
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/dossier"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// The queue page lists every settlement whose seller's answer disagrees
// with the authorization it settles: the authorization, its amount and
// payee, where the settlement came from, and each finding with the field
// it names.
func TestConsoleShowsSellerFindings(t *testing.T) {
	g := newRig(t, func(c *console.Config) {
		c.Assets = func(asset string) (string, int, bool) {
			if asset == "eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913" {
				return "USDC", 6, true
			}
			return "", 0, false
		}
	})
	ctx := context.Background()
	nonce := "0x" + strings.Repeat("ab", 32)
	payee := "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	if _, err := g.log.RecordAuthorization(ctx, "bot", reviewlog.Authorized{DecisionReceipt: "rcpt-decision", Network: "eip155:8453",
		Token: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", Name: "USD Coin", Version: "2", From: "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0",
		To: payee, Value: "250000", ValidAfter: "1", ValidBefore: "2", Nonce: nonce, Signature: "0x" + strings.Repeat("11", 65),
		Digest: "0x" + strings.Repeat("22", 32), Resource: "https://api.seller.example/data"},
		func(reviewlog.Tx) (string, error) { return "rcpt-authorization", nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := g.log.RecordSettlement(ctx, "bot", reviewlog.Settled{Nonce: nonce, AuthorizationReceipt: "rcpt-authorization", DecisionReceipt: "rcpt-decision",
		Success: true, Transaction: "0x" + strings.Repeat("33", 32), Network: "eip155:8453", Payer: "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0",
		Findings: []string{`amount: the Trace's settlement (run run-1, line 4) names "200000" atomic units, the authorization 250000`,
			"the seller's receipt does not verify: the signature is not 65 bytes"},
		Digest: "0x" + strings.Repeat("44", 32), Source: reviewlog.SourceTrace, HoldKept: true,
		Trace: &reviewlog.TraceRef{Run: "run-1", Operation: "op-2", Line: 4, Event: "x402.payment.responded", OccurredAt: "2026-12-05T10:00:00Z", Binding: "nonce"}},
		func(reviewlog.Tx) (string, error) { return "rcpt-settlement", nil }); err != nil {
		t.Fatal(err)
	}
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	_, page := b.get("")
	page = html.UnescapeString(page)
	for _, want := range []string{
		`<section aria-label="Seller findings" id="findings">`,
		`data-nonce="` + nonce + `"`,
		"<strong>0.25 USDC</strong> to",
		"Settlement read from the Trace (run run-1, operation op-2, line 4)",
		"the hold still counts as an open payment",
		`<strong class="field">amount:</strong> the Trace's settlement (run run-1, line 4) names "200000" atomic units`,
		`<strong class="field">finding:</strong> the seller's receipt does not verify`,
		"haia-trace-mcp authorization show " + nonce,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the queue page lacks %q:\n%s", want, page)
		}
	}
}

// settle records, as record_receipt does through the engine, a settlement
// of authorization a that names another payer: a finding, its receipt
// sealed into the chain over the settlement's digest.
func (g *rig) settle(a reviewlog.Authorized, payer string) reviewlog.Settled {
	g.t.Helper()
	ctx := context.Background()
	s := reviewlog.Settled{Nonce: strings.ToLower(a.Nonce), AuthorizationReceipt: a.Receipt, DecisionReceipt: a.DecisionReceipt, Success: true,
		Transaction: "0x" + strings.Repeat("5c", 32), Network: "eip155:8453", Payer: payer,
		Findings: []string{"payer: the settlement names " + payer + ", the authorization was signed by " + a.From}}
	digest := payment.SettlementDigest(s)
	s.Digest = fmt.Sprintf("0x%x", digest)
	out, err := g.log.RecordSettlement(ctx, "agent-1", s, func(tx reviewlog.Tx) (string, error) {
		rule := engine.RuleSettlementRecorded
		rc, err := g.chains.Append(ctx, tx.Store, noa.Draft{TS: tx.At, Agent: noa.Agent{ID: "agent-1", Principal: noa.PrincipalService},
			Action: noa.Action{ID: "x402-settlement:" + s.Nonce, Canonical: reviewlog.CanonicalSettlementRecorded,
				RiskClass: "IRREVERSIBLE", ParamsHash: engine.AuthorizationParamsHash(digest)},
			Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictAllowed, RuleID: &rule}})
		if err != nil {
			return "", err
		}
		return rc.ID, nil
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

// events opens the queue's event stream with b's session and sends each
// event whole (its lines, "\n" after each).
func (g *rig) events(b *browser) <-chan string {
	g.t.Helper()
	resp, err := b.c.Get(g.base + "api/events")
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		g.t.Fatalf("events: %d", resp.StatusCode)
	}
	events := make(chan string, 64)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var ev strings.Builder
		for sc.Scan() {
			if sc.Text() == "" {
				if ev.Len() > 0 {
					events <- ev.String()
				}
				ev.Reset()
				continue
			}
			ev.WriteString(sc.Text() + "\n")
		}
	}()
	return events
}

// TestConsoleLiveFindings: with the queue page's event stream open, a
// settlement recorded with a finding reaches it as a "findings" event —
// the section the page shows, its card linking to the finding's page and
// the authorization's dossier — without a reload; the page has the place
// the script puts it, even before any finding.
func TestConsoleLiveFindings(t *testing.T) {
	g := newRig(t)
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	rv := g.ask(7).Review
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	if _, page := b.get(""); !strings.Contains(page, `<div id="findings-live"></div>`) {
		t.Fatalf("the queue page has no place for live findings:\n%s", page)
	}
	if _, code, res := g.decide(b, rv.ID, "approved", "", alice); code != 200 {
		t.Fatalf("approve: %d %v", code, res)
	}
	a := g.authorize(rv.ID, 7)
	events := g.events(b)
	next := func(kind, want string) string {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("the stream ended before a %s event with %q", kind, want)
				}
				if strings.HasPrefix(ev, "event: "+kind+"\n") && strings.Contains(ev, want) {
					return ev
				}
			case <-deadline:
				t.Fatalf("no %s event with %q", kind, want)
			}
		}
	}
	// At once: the queue, and the findings (none).
	next("queue", rv.ID)
	if ev := next("findings", ""); strings.Contains(ev, "data-nonce") {
		t.Fatalf("a findings event before any finding: %q", ev)
	}
	nonce := strings.ToLower(a.Nonce)
	g.settle(a, "0x00000000000000000000000000000000000000d0")
	ev := next("findings", nonce)
	var data strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(ev, "\n"), "\n")[1:] {
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("event line %q", line)
		}
		data.WriteString(d + "\n")
	}
	got := html.UnescapeString(data.String())
	for _, want := range []string{
		`<section aria-label="Seller findings" id="findings">`,
		`data-nonce="` + nonce + `"`,
		`<a class="finding-open" href="/console/findings/` + nonce + `">Open this finding</a>`,
		`<a class="dossier" href="/console/findings/` + nonce + `/dossier" download="dossier-` + nonce + `.json">`,
		`<strong class="field">payer:</strong> the settlement names 0x00000000000000000000000000000000000000d0`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the findings event lacks %q:\n%s", want, got)
		}
	}
}

// TestConsoleFindingPage: a finding's page shows the authorization it
// settles, the settlement and each finding, and links to the review and
// to the authorization's dossier; the signed-in reviewer downloads it and
// it verifies VALID offline. Nobody else gets the page or the file, nor
// any for a nonce without a finding: the same 404 as every dossier.
func TestConsoleFindingPage(t *testing.T) {
	g := newRig(t)
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	rv := g.ask(7).Review
	rv2 := g.ask(8).Review
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	for _, id := range []string{rv.ID, rv2.ID} {
		if _, code, res := g.decide(b, id, "approved", "", alice); code != 200 {
			t.Fatalf("approve: %d %v", code, res)
		}
	}
	a := g.authorize(rv.ID, 7)
	clean := g.authorize(rv2.ID, 8)
	nonce := strings.ToLower(a.Nonce)
	payer := "0x00000000000000000000000000000000000000d0"
	st := g.settle(a, payer)

	code, page := b.get("findings/" + nonce)
	page = html.UnescapeString(page)
	if code != 200 {
		t.Fatalf("the finding page: %d\n%s", code, page)
	}
	for _, want := range []string{
		"<h1>Seller finding on authorization " + nonce[:6] + "…" + nonce[len(nonce)-4:] + "</h1>",
		`<code class="hash">` + nonce + `</code>`,
		`<code class="address">` + a.To + `</code>`,
		`<a class="review" href="/console/reviews/` + rv.ID + `">`,
		`<code class="hash">` + st.Transaction + `</code>`,
		`<code class="address">` + payer + `</code>`,
		`<strong class="field">payer:</strong> the settlement names ` + payer,
		`<a class="dossier" href="/console/findings/` + nonce + `/dossier" download="dossier-` + nonce + `.json">Download its dossier</a>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the finding page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Fatal(page)
	}
	req, _ := http.NewRequest("GET", g.base+"findings/"+nonce+"/dossier", nil)
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" ||
		resp.Header.Get("Content-Disposition") != `attachment; filename="dossier-`+nonce+`.json"` {
		t.Fatalf("download: %d %v\n%s", resp.StatusCode, resp.Header, body)
	}
	links := dossier.Verify(body, g.keyring(), nil)
	var lines []string
	for _, l := range links {
		lines = append(lines, l.Verdict+" "+l.Link+" "+l.Reason)
	}
	all := strings.Join(lines, "\n")
	if w := dossier.Worst(links); w != dossier.Valid || !strings.Contains(all, "VALID settlement") || !strings.Contains(all, "VALID checkpoint ") {
		t.Fatalf("the finding's dossier verifies %s:\n%s", w, all)
	}

	notFound := func(name string, b *browser, path string) {
		t.Helper()
		code, body := b.get(path)
		if code != http.StatusNotFound || strings.Contains(body, dossier.Format) || strings.Contains(body, "0x000000000000000000000000000000000000") {
			t.Fatalf("%s: %d %s", name, code, body)
		}
	}
	notFound("the dossier, not signed in", g.browser(), "findings/"+nonce+"/dossier")
	notFound("the dossier of an authorization without a finding", b, "findings/"+strings.ToLower(clean.Nonce)+"/dossier")
	notFound("the page of an authorization without a finding", b, "findings/"+strings.ToLower(clean.Nonce))
	notFound("an unknown nonce", b, "findings/0x"+strings.Repeat("00", 32)+"/dossier")
	if code, body := g.browser().get("findings/" + nonce); code != 200 || strings.Contains(body, payer) || !strings.Contains(body, `id="signin"`) {
		t.Fatalf("the finding page, not signed in: %d %s", code, body)
	}
	g2 := newRig(t)
	bob, _ := softauthn.New()
	b2 := g2.browser()
	g2.enrol(b2, "bob", bob)
	if code, res := g2.signIn(b2, bob); code != 200 {
		t.Fatalf("bob signs in: %d %v", code, res)
	}
	notFound("another tenant's reviewer", b2, "findings/"+nonce+"/dossier")
	notFound("another tenant's reviewer, the page", b2, "findings/"+nonce)
}

// A settlement of the Trace bound to no one authorization is a finding on
// the queue page too: the authorizations it could be the payment of, with
// their amounts and payees, the transaction, the run and line, and the
// command that shows each.
func TestConsoleShowsAmbiguousSettlements(t *testing.T) {
	g := newRig(t)
	ctx := context.Background()
	payee := "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	var nonces []string
	for i, c := range []string{"a1", "a2"} {
		nonce := "0x" + strings.Repeat(c, 32)
		nonces = append(nonces, nonce)
		if _, err := g.log.RecordAuthorization(ctx, "bot", reviewlog.Authorized{DecisionReceipt: fmt.Sprintf("rcpt-decision-%d", i), Network: "eip155:8453",
			Token: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", Name: "USD Coin", Version: "2", From: "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0",
			To: payee, Value: "250000", ValidAfter: "1", ValidBefore: "2", Nonce: nonce, Signature: "0x" + strings.Repeat("11", 65),
			Digest: "0x" + strings.Repeat("22", 32), Resource: "https://api.seller.example/data"},
			func(reviewlog.Tx) (string, error) { return fmt.Sprintf("rcpt-authorization-%d", i), nil }); err != nil {
			t.Fatal(err)
		}
	}
	tx := "0x" + strings.Repeat("5e", 32)
	if ok, err := g.log.RecordAmbiguity(ctx, reviewlog.Ambiguity{Kind: reviewlog.AmbiguousSettlement, Nonces: nonces, Transactions: []string{tx},
		TraceRun: "run-amb", TraceLine: 7, Text: "the Trace's settlement has the terms of 2 authorizations"}); err != nil || !ok {
		t.Fatalf("record: %v %v", ok, err)
	}
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	_, page := b.get("")
	page = html.UnescapeString(page)
	for _, want := range []string{
		`<section aria-label="Seller findings" id="findings">`,
		"A settlement read from the Trace has the terms of 2 authorizations: none was taken as paid",
		"Run <code>run-amb</code>, line 7",
		`title="` + nonces[0] + `"`, `title="` + nonces[1] + `"`,
		"250000 atomic units to",
		tx,
		"haia-trace-mcp authorization show " + nonces[1],
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the queue page lacks %q:\n%s", want, page)
		}
	}
}
