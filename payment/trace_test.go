package payment

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

func traceLine(op, typ, url, payTo, amount, tx, payer, at string) string {
	return `{"event_id":"` + op + typ + `","event_type":"` + typ + `","occurred_at":"` + at + `","seq":0,"adapter":"trace-x402","role":"client","context_id":"` + op +
		`","payload":{"resource":{"url":"` + url + `"},"requirements":{"scheme":"exact","network":"base","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","amount":"` + amount +
		`","pay_to":"` + payTo + `"},"settle":{"success":true,"transaction":"` + tx + `","network":"base","payer":"` + payer + `"}}}`
}

// Binding by terms is made only where it is unique: one transaction of the
// Trace that fits one authorization. Two authorizations of the same terms,
// or one authorization with two fitting transactions, bind nothing, and
// say so; an operation that carries a nonce is never bound by terms.
func TestBindTraceByTermsOnlyWhenUnique(t *testing.T) {
	const payer, payee = "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0", "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	signed := time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)
	vb := signed.Add(5 * time.Minute).Unix()
	auth := func(nonceDigit string) reviewlog.AuthorizedLine {
		return reviewlog.AuthorizedLine{At: signed.Format(time.RFC3339Nano), Caller: "bot", Authorized: reviewlog.Authorized{
			Nonce: "0x" + strings.Repeat(nonceDigit, 64), Network: "eip155:8453", Token: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
			From: payer, To: payee, Value: "250000", ValidBefore: itoa(vb), Resource: "https://api.example.com/reports/weekly"}}
	}
	at := signed.Add(time.Minute).Format("2006-01-02T15:04:05.000Z")
	late := signed.Add(time.Hour).Format("2006-01-02T15:04:05.000Z")
	tx := func(c string) string { return "0x" + strings.Repeat(c, 64) }
	read := func(lines ...string) map[string]traceRun {
		r, err := readTraceRun(strings.NewReader(strings.Join(lines, "\n")), "run-1")
		if err != nil {
			t.Fatal(err)
		}
		return map[string]traceRun{"run-1": r}
	}
	url := "https://api.example.com/reports/weekly"
	one := traceLine("op-1", "x402.payment.responded", url, payee, "250000", tx("a"), payer, at)
	for _, tc := range []struct {
		name    string
		pending []reviewlog.AuthorizedLine
		runs    map[string]traceRun
		bound   int
		amb     string
	}{
		{"one transaction, one authorization", []reviewlog.AuthorizedLine{auth("1")}, read(one), 1, ""},
		{"the same transaction seen twice (buyer and seller)", []reviewlog.AuthorizedLine{auth("1")},
			read(one, traceLine("op-9", "x402.settle.ok", url, payee, "250000", tx("a"), payer, at)), 1, ""},
		{"two authorizations of its terms", []reviewlog.AuthorizedLine{auth("1"), auth("2")}, read(one), 0, "has the terms of 2 authorizations"},
		{"two transactions of its terms", []reviewlog.AuthorizedLine{auth("1")},
			read(one, traceLine("op-2", "x402.payment.responded", url, payee, "250000", tx("b"), payer, at)), 0, "has the terms of 2 settlements"},
		{"another payer", []reviewlog.AuthorizedLine{auth("1")},
			read(traceLine("op-1", "x402.payment.responded", url, payee, "250000", tx("a"), payee, at)), 0, ""},
		{"another resource", []reviewlog.AuthorizedLine{auth("1")},
			read(traceLine("op-1", "x402.payment.responded", url+"x", payee, "250000", tx("a"), payer, at)), 0, ""},
		{"after the validity", []reviewlog.AuthorizedLine{auth("1")},
			read(traceLine("op-1", "x402.payment.responded", url, payee, "250000", tx("a"), payer, late)), 0, ""},
		{"its operation carries another nonce", []reviewlog.AuthorizedLine{auth("1")},
			read(`{"event_id":"x","event_type":"x402.payment.submitted","occurred_at":"`+at+`","seq":0,"adapter":"trace-x402","role":"client","context_id":"op-1","payload":{"payment_payload":{"nonce":"0x`+strings.Repeat("7", 64)+`"}}}`, one), 0, ""},
		{"a member twice", []reviewlog.AuthorizedLine{auth("1")},
			read(strings.Replace(one, `"amount":"250000"`, `"amount":"1","amount":"250000"`, 1)), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, ambs := bindTrace(tc.pending, tc.runs, map[string]string{})
			var amb []string
			for _, a := range ambs {
				amb = append(amb, a.Text)
			}
			if len(b) != tc.bound || (tc.amb == "") != (len(amb) == 0) || (tc.amb != "" && !strings.Contains(strings.Join(amb, "\n"), tc.amb)) {
				t.Fatalf("bound %d (want %d), ambiguous %q (want %q)", len(b), tc.bound, amb, tc.amb)
			}
			if tc.bound == 1 && b[0].by != "terms" {
				t.Fatalf("bound by %s", b[0].by)
			}
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// FuzzReadTraceRun: a run file's bytes never crash the reader, and every
// settlement it returns names its operation and a line within the file.
func FuzzReadTraceRun(f *testing.F) {
	f.Add([]byte(traceLine("op-1", "x402.payment.responded", "https://a.example/x", "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "1", "0x"+strings.Repeat("a", 64), "0x1199C34AF7B1d56A1348E1F0D8E86b6C425ac2c0", "2026-07-24T09:00:00.000Z")))
	f.Add([]byte(`{"context_id":"o","payload":{"nonce":"0x` + strings.Repeat("b", 64) + `","x":[{"nonce":1}]}}` + "\n\n{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := readTraceRun(bytes.NewReader(data), "run")
		if err != nil {
			t.Fatal(err)
		}
		lines := bytes.Count(data, []byte("\n")) + 1
		for _, s := range r.Settlements {
			if s.Operation == "" || s.Line < 1 || s.Line > lines {
				t.Fatalf("settlement %+v in %d lines", s, lines)
			}
		}
		for op, ns := range r.Nonces {
			for _, n := range ns {
				if op == "" || !traceNonceRE.MatchString(n) || n != strings.ToLower(n) {
					t.Fatalf("nonce %q of %q", n, op)
				}
			}
		}
	})
}

// The reader against the Event Contract's own fixtures (HAIA_SHARED): in
// each of the buyer's, the seller's and the facilitator's runs exactly the
// one settlement that succeeded (op-1) is a settlement; the unsettled and
// failed payments are none. (The fixtures' payer is written with a wrong
// EIP-55 checksum, so, read as a settlement answer, it binds nothing.)
func TestReadTraceRunFixtures(t *testing.T) {
	dir := os.Getenv("HAIA_SHARED")
	if dir == "" {
		t.Skip("HAIA_SHARED not set: the Event Contract fixtures are not on this machine")
	}
	for _, run := range []string{"x402-buyer", "x402-seller", "x402-facilitator"} {
		f, err := os.Open(filepath.Join(dir, "haia-trace", "fixtures", run+".ndjson"))
		if err != nil {
			t.Fatal(err)
		}
		r, err := readTraceRun(f, run)
		f.Close()
		if err != nil || r.Skipped != 0 || len(r.Settlements) != 1 {
			t.Fatalf("%s: %v, %d skipped, %+v", run, err, r.Skipped, r.Settlements)
		}
		s := r.Settlements[0]
		if s.Operation != "op-1" || s.PayTo != "0x209693Bc6afc0C5328bA36FaF03C514EF312287C" || s.Amount != "250000" || s.Network != "base" ||
			s.Resource != "https://api.example.com/reports/weekly" || !strings.Contains(string(s.Settle), "0x3f8a9c2e51b7d4066e01afbc9d21c8a55e7f2b90d4c31a6885e2f0c7b1943d2e") {
			t.Fatalf("%s: %+v", run, s)
		}
		if _, err := x402.ParseSettlement(s.Settle); err == nil || !strings.Contains(err.Error(), "EIP-55") {
			t.Fatalf("%s: the fixture's payer: %v", run, err)
		}
	}
}

// A run read piece by piece as a recorder appends to it (a line cut in
// two, then ended) reads as the whole file does, and each reading reads
// only what was appended; a file rewritten in place is read again.
func TestRunCursorReadsOnlyAppends(t *testing.T) {
	const payer, payee = "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0", "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	at := "2026-07-24T09:01:00.000Z"
	url := "https://api.example.com/reports/weekly"
	nonce := `{"event_id":"n","event_type":"x402.payment.submitted","occurred_at":"` + at + `","seq":0,"adapter":"trace-x402","role":"client","context_id":"op-2","payload":{"payment_payload":{"nonce":"0x` + strings.Repeat("7", 64) + `"}}}`
	whole := traceLine("op-1", "x402.payment.responded", url, payee, "250000", "0x"+strings.Repeat("a", 64), payer, at) + "\n" +
		`{"event_type":"other","payload":{}}` + "\n" + nonce + "\n" +
		traceLine("op-2", "x402.payment.responded", url, payee, "1", "0x"+strings.Repeat("b", 64), payer, at) + "\n"
	want, err := readTraceRun(strings.NewReader(whole), "run")
	if err != nil || len(want.Settlements) != 2 || len(want.Nonces["op-2"]) != 1 {
		t.Fatalf("the whole file: %+v %v", want, err)
	}
	dir := t.TempDir()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	events, err := root.MkdirAll("events", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	a := &Authorizer{cfg: Config{Events: events}}
	path := filepath.Join(dir, "events", "run.ndjson")
	var c cachedRun
	had := false
	read := func() traceRun {
		t.Helper()
		es, err := events.ReadDir()
		if err != nil || len(es) != 1 {
			t.Fatalf("%v %v", es, err)
		}
		if c, err = a.readRun(es[0], "run", c, had); err != nil {
			t.Fatal(err)
		}
		had = true
		return c.cur.view
	}
	// Cut in the middle of the third line, then at the end.
	cut := strings.Index(whole, nonce) + 40
	for i, end := range []int{cut, len(whole)} {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		start := 0
		if i > 0 {
			start = cut
		}
		f.WriteString(whole[start:end])
		f.Close()
		before := c.cur.off
		got := read()
		if i == 0 && (len(got.Settlements) != 1 || got.Skipped != 1 || c.cur.off != int64(strings.Index(whole, nonce))) {
			t.Fatalf("cut in a line: %+v, read to %d", got, c.cur.off)
		}
		if i == 1 && before != int64(strings.Index(whole, nonce)) {
			t.Fatalf("the second reading starts at %d", before)
		}
	}
	got := c.cur.view
	if len(got.Settlements) != 2 || got.Sum != want.Sum || got.Skipped != want.Skipped || got.Settlements[1].Line != 4 || len(got.Nonces["op-2"]) != 1 {
		t.Fatalf("read piece by piece: %+v, want %+v", got, want)
	}
	// Rewritten in place with other bytes of a greater size: read again
	// from the start.
	other := `{"event_type":"other","payload":{}}` + "\n" + strings.Replace(whole, strings.Repeat("a", 64), strings.Repeat("c", 64), 1)
	if err := os.WriteFile(path, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := read(); !strings.Contains(string(got.Settlements[0].Settle), strings.Repeat("c", 64)) {
		t.Fatalf("a rewritten run kept its old reading: %s", got.Settlements[0].Settle)
	}
}
