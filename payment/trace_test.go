package payment

import (
	"bytes"
	"fmt"
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
	dir, events := eventsDir(t)
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

// A sweep keeps the settlements this server's payers can be bound to (or
// that an operation's nonce binds), not the Trace's: settlements of
// another payer in operations without a nonce are left out however many
// the Trace holds, and one whose operation later carries a nonce (in a
// later append, later in the same append, or on a line not yet ended) is
// read again, so what can bind is what the whole file gives.
func TestSweepKeepsOnlyThisPayersSettlements(t *testing.T) {
	const ours, payee = "0xA8129935a03855e2ad7aa870Ce0B217A865FABf5", "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	other, err := x402.ParseAddress("0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0")
	if err != nil {
		t.Fatal(err)
	}
	theirs := other.Hex()
	for _, p := range []string{ours, theirs} {
		if _, err := x402.ParseSettlement([]byte(`{"success":true,"transaction":"0x` + strings.Repeat("a", 64) + `","network":"base","payer":"` + p + `"}`)); err != nil {
			t.Fatalf("fixture payer %s: %v", p, err)
		}
	}
	at := "2026-07-24T09:01:00.000Z"
	url := "https://api.example.com/reports/weekly"
	settle := func(op, payer string, i int) string {
		return traceLine(op, "x402.payment.responded", url, payee, "250000", fmt.Sprintf("0x%064x", i+1), payer, at) + "\n"
	}
	nonceLine := func(op string) string {
		return `{"event_id":"n` + op + `","event_type":"x402.payment.submitted","occurred_at":"` + at + `","seq":0,"adapter":"trace-x402","role":"client","context_id":"` + op +
			`","payload":{"payment_payload":{"nonce":"0x` + strings.Repeat("7", 64) + `"}}}` + "\n"
	}
	foreign := func(from, n int) string {
		var b strings.Builder
		for i := from; i < from+n; i++ {
			b.WriteString(settle("op-f"+strconv.Itoa(i), theirs, i))
		}
		return b.String()
	}
	dir, events := eventsDir(t)
	payers := payerSet{strings.ToLower(ours): true}
	a := &Authorizer{cfg: Config{Events: events}, trace: &traceState{payers: payers}}
	path := filepath.Join(dir, "events", "run.ndjson")
	var c cachedRun
	had := false
	for _, step := range []struct {
		name, appended string
		kept           int
	}{
		{"ours among 10 of another payer", foreign(0, 5) + settle("op-o1", ours, 100) + foreign(5, 5), 1},
		{"1,000 more of another payer", foreign(10, 1000), 1},
		{"a nonce for an operation left out, in a later append", nonceLine("op-f3"), 2},
		{"a nonce later in the same append", settle("op-g1", theirs, 200) + foreign(1010, 50) + nonceLine("op-g1"), 3},
		{"a nonce on a line not ended yet", settle("op-h1", theirs, 300) + foreign(1060, 50) + strings.TrimSuffix(nonceLine("op-h1"), "\n"), 4},
		{"that line ended, and ours again", "\n" + settle("op-o2", ours, 400), 5},
	} {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(step.appended); err != nil {
			t.Fatal(err)
		}
		f.Close()
		es, err := events.ReadDir()
		if err != nil || len(es) != 1 {
			t.Fatalf("%v %v", es, err)
		}
		if c, err = a.readRun(es[0], "run", c, had); err != nil {
			t.Fatal(err)
		}
		had = true
		// What the whole file gives, with the settlements that can bind.
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		whole, err := readTraceRun(bytes.NewReader(data), "run")
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, s := range whole.Settlements {
			if _, ok := whole.Nonces[s.Operation]; ok || payers.concerns(s) {
				want = append(want, s.Operation)
			}
		}
		var got []string
		for _, s := range c.cur.view.Settlements {
			got = append(got, s.Operation)
		}
		if strings.Join(got, " ") != strings.Join(want, " ") || len(got) != step.kept || c.cur.view.Sum != whole.Sum {
			t.Fatalf("%s: kept %v, want %v (%d); sum %x, the whole file's %x", step.name, got, want, step.kept, c.cur.view.Sum, whole.Sum)
		}
		if len(c.cur.run.Settlements) > step.kept {
			t.Fatalf("%s: the cursor holds %d settlements, %d can bind", step.name, len(c.cur.run.Settlements), step.kept)
		}
	}
}

// eventsDir is a new root's events directory, opened as the Trace sweep
// reads it, with the root's path; both are closed when t ends.
func eventsDir(t *testing.T) (string, *confined.Dir) {
	t.Helper()
	dir := t.TempDir()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	events, err := root.MkdirAll("events", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.Close() })
	return dir, events
}

// A saved sweep reads back as it was written; any other bytes (cut,
// changed, another file) are refused without a panic, and nothing read
// from them places a run past its size.
func FuzzDecodeSweep(f *testing.F) {
	st := &traceState{payers: payerSet{"0xa8129935a03855e2ad7aa870ce0b217a865fabf5": true}, runs: map[string]cachedRun{}}
	c := cachedRun{size: 900, mod: time.Unix(1790000000, 5)}
	c.cur.off, c.cur.lines, c.cur.run.Sum, c.cur.run.Skipped = 800, 7, 42, 1
	c.cur.head[0], c.cur.tail[31] = 1, 2
	c.cur.run.dropped[3] = 1 << 9
	st.runs["run-a.ndjson"] = c
	kept := c
	kept.cur.run.Settlements = []traceSettlement{{Operation: "op"}}
	st.runs["run-b.ndjson"] = kept
	blob := st.encodeSweep()
	s, err := decodeSweep(blob)
	if err != nil || len(s.runs) != 1 || !s.payers["0xa8129935a03855e2ad7aa870ce0b217a865fabf5"] {
		f.Fatalf("read back: %+v %v", s, err)
	}
	want := sweptRun{size: 900, off: 800, lines: 7, mod: c.mod.UnixNano(), head: c.cur.head, tail: c.cur.tail, sum: 42, skipped: 1, dropped: c.cur.run.dropped}
	if got := s.runs["run-a.ndjson"]; got != want {
		f.Fatalf("read back %+v, want %+v", got, want)
	}
	f.Add(blob)
	f.Add(blob[:len(blob)-1])
	f.Add([]byte(sweepMagic))
	f.Add([]byte("HAIA-RUNINDEX 5\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSweep(b)
		if err != nil {
			return
		}
		for n, r := range s.runs {
			if r.off < 0 || r.off > r.size || r.lines < 0 || int64(r.lines) > r.off {
				t.Fatalf("%s: %+v", n, r)
			}
		}
	})
}
