package server

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

// traceEvents writes a run file of the recorder's events: for each
// payment, the payment the client submitted (with the EIP-3009 nonce when
// given, as a recorder that writes the payment payload does) and the
// settlement answer it got.
type tracePayment struct {
	op, url, payTo, amount, nonce, tx, payer string
}

func writeTraceRun(t *testing.T, dir, run string, ps ...tracePayment) {
	t.Helper()
	var b strings.Builder
	at := time.Now().UTC()
	for i, p := range ps {
		req := map[string]any{"scheme": "exact", "network": "base", "asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "amount": p.amount,
			"pay_to": p.payTo, "max_timeout_seconds": 120}
		res := map[string]any{"url": p.url}
		submitted := map[string]any{"x402_version": 2, "resource": res, "requirements": req}
		if p.nonce != "" {
			submitted["payment_payload"] = map[string]any{"payload": map[string]any{"authorization": map[string]any{"nonce": p.nonce}}}
		}
		for j, ev := range []struct {
			typ     string
			payload map[string]any
		}{
			{"x402.payment.submitted", submitted},
			{"x402.payment.responded", map[string]any{"x402_version": 2, "resource": res, "requirements": req,
				"settle": map[string]any{"success": true, "transaction": p.tx, "network": "base", "payer": p.payer}}},
		} {
			line, _ := json.Marshal(map[string]any{"event_id": p.op + "-" + ev.typ, "event_type": ev.typ, "occurred_at": at.Add(time.Duration(i*2+j) * time.Millisecond).Format("2006-01-02T15:04:05.000Z"),
				"seq": i*2 + j, "adapter": "trace-x402", "role": "client", "context_id": p.op, "payload": ev.payload})
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "events", run+".ndjson"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The recorder's settlement events are bound to the authorizations this
// server signed, by nonce or by their terms, and recorded as record_receipt
// records the agent's (receipt, settled line, source "trace"); one whose
// terms differ from the authorization is a finding and keeps the hold.
func TestTraceSettlementsAreRecorded(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"100.00","maxOpenPartialPerCounterparty":0}`), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := newPolicyServer(t, dir, 0, pol)
	const (
		p1 = "0x1111111111111111111111111111111111111111"
		p2 = "0x2222222222222222222222222222222222222222"
		p3 = "0x3333333333333333333333333333333333333333"
		p9 = "0x9999999999999999999999999999999999999999"
	)
	pay := func(url, amount, payTo string) authorizeAnswer {
		t.Helper()
		a := authorize(t, s, map[string]any{"payment_required": paymentRequiredAt(url, amount, payTo), "resource": url})
		if a.Decision != "allow" || a.Authorization == nil {
			t.Fatalf("pay %s: %+v", url, a)
		}
		return a
	}
	a1 := pay("https://one.example/r", "250000", p1)
	a2 := pay("https://two.example/r", "260000", p2)
	a3 := pay("https://three.example/r", "270000", p3)
	payer := a1.Authorization.Payer
	tx := func(c string) string { return "0x" + strings.Repeat(c, 64) }
	writeTraceRun(t, dir, "run-trace",
		// bound by its nonce, terms equal
		tracePayment{"op-1", "https://one.example/r", p1, "250000", a1.Authorization.Nonce, tx("1"), payer},
		// bound by its nonce, the amount differs: a finding, the hold kept
		tracePayment{"op-2", "https://two.example/r", p2, "200000", a2.Authorization.Nonce, tx("2"), payer},
		// no nonce: bound by its terms (payer, payee, amount, asset,
		// network, resource, in the validity)
		tracePayment{"op-3", "https://three.example/r", p3, "270000", "", tx("3"), payer})
	// The next authorize_payment reads the Trace first.
	pay("https://nine.example/r", "10000", p9)
	sts, err := reviewlog.OpenStore(filestore.New(openRoot(t, dir)), reviewlog.Options{}).Settlements(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]reviewlog.SettledLine{}
	for _, st := range sts {
		got[st.Nonce] = st
	}
	if len(sts) != 3 {
		t.Fatalf("%d settlements recorded, want 3: %+v", len(sts), sts)
	}
	s1, s2, s3 := got[a1.Authorization.Nonce], got[a2.Authorization.Nonce], got[a3.Authorization.Nonce]
	if s1.Source != reviewlog.SourceTrace || s1.Trace == nil || s1.Trace.Binding != "nonce" || s1.Trace.Run != "run-trace" || s1.Trace.Operation != "op-1" ||
		s1.Transaction != tx("1") || len(s1.Findings) != 0 || s1.HoldKept || s1.Receipt == "" || s1.Caller != "test-agent" {
		t.Fatalf("the nonce-bound settlement: %+v %+v", s1, s1.Trace)
	}
	if s2.Trace == nil || s2.Trace.Binding != "nonce" || !s2.HoldKept || len(s2.Findings) != 1 || !strings.Contains(s2.Findings[0], `amount: the Trace's settlement (run run-trace, line 4) names "200000" atomic units, the authorization 260000`) {
		t.Fatalf("the settlement of other terms: %+v", s2)
	}
	if s3.Trace == nil || s3.Trace.Binding != "terms" || s3.Trace.Operation != "op-3" || len(s3.Findings) != 0 || s3.HoldKept {
		t.Fatalf("the terms-bound settlement: %+v %+v", s3, s3.Trace)
	}
	// The hold of the authorization whose Trace settlement disagrees still
	// counts as open: the next payment to its payee is reviewed for it.
	if a, rules := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt("https://two.example/r2", "260000", p2), "resource": "https://two.example/r2"}); a.Decision != "review" || !strings.Contains(strings.Join(rules, ","), guard.RuleOpenPartial) {
		t.Fatalf("a Trace settlement with a finding released the hold: %s %v", a.Decision, rules)
	}
	// The agent's record_receipt of a nonce the Trace settled is refused,
	// naming the source.
	isErr, text, _ := callTool(t, s, "record_receipt", map[string]any{"nonce": a1.Authorization.Nonce, "payment_response": map[string]any{
		"success": true, "transaction": tx("1"), "network": "eip155:8453", "payer": payer}})
	if !isErr || !strings.Contains(text, "was settled at") {
		t.Fatalf("a second settlement: %v %s", isErr, text)
	}
}

// A settlement the recorder writes after the last authorize_payment is
// bound at the next check_before_pay (the decision that lists the Trace),
// not left until another payment is authorized; a settlement appended to
// the same run later is bound at the check after it.
func TestCheckBeforePayBindsTraceSettlements(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"100.00","maxOpenPartialPerCounterparty":0}`), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := newPolicyServer(t, dir, 0, pol)
	const (
		p1 = "0x1111111111111111111111111111111111111111"
		p2 = "0x2222222222222222222222222222222222222222"
	)
	pay := func(url, amount, payTo string) authorizeAnswer {
		t.Helper()
		a := authorize(t, s, map[string]any{"payment_required": paymentRequiredAt(url, amount, payTo), "resource": url})
		if a.Decision != "allow" || a.Authorization == nil {
			t.Fatalf("pay %s: %+v", url, a)
		}
		return a
	}
	a1 := pay("https://one.example/r", "250000", p1)
	a2 := pay("https://two.example/r", "260000", p2)
	payer := a1.Authorization.Payer
	tx := func(c string) string { return "0x" + strings.Repeat(c, 64) }
	settled := func() map[string]bool {
		t.Helper()
		sts, err := reviewlog.OpenStore(filestore.New(openRoot(t, dir)), reviewlog.Options{}).Settlements(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, st := range sts {
			out[st.Nonce] = st.Source == reviewlog.SourceTrace
		}
		return out
	}
	check := func() {
		t.Helper()
		if isErr, text, _ := callTool(t, s, "check_before_pay", map[string]any{"counterparty": "0x4444444444444444444444444444444444444444", "amount": "0.01"}); isErr {
			t.Fatalf("check_before_pay: %s", text)
		}
	}
	check() // the Trace has no run yet: a sweep over nothing
	writeTraceRun(t, dir, "run-trace", tracePayment{"op-1", "https://one.example/r", p1, "250000", a1.Authorization.Nonce, tx("1"), payer})
	check()
	if got := settled(); len(got) != 1 || !got[a1.Authorization.Nonce] {
		t.Fatalf("after check_before_pay: %v", got)
	}
	// The second settlement is appended to the same run file.
	whole, err := os.ReadFile(filepath.Join(dir, "events", "run-trace.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	writeTraceRun(t, dir, "run-tmp", tracePayment{"op-2", "https://two.example/r", p2, "260000", a2.Authorization.Nonce, tx("2"), payer})
	more, err := os.ReadFile(filepath.Join(dir, "events", "run-tmp.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "events", "run-tmp.ndjson"))
	f, err := os.OpenFile(filepath.Join(dir, "events", "run-trace.ndjson"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(more); err != nil {
		t.Fatal(err)
	}
	f.Close()
	check()
	if got := settled(); len(got) != 2 || !got[a2.Authorization.Nonce] {
		t.Fatalf("after the append (%d bytes before): %v", len(whole), got)
	}
}

// After a restart, the process's first sweep of the Trace's settlements
// (every run file read whole) runs after check_before_pay's answer instead
// of before it, and still binds the settlement the recorder wrote while
// the server was down.
func TestFirstTraceSweepAfterARestartBindsAfterTheAnswer(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"100.00"}`), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := newPolicyServer(t, dir, 0, pol)
	const p1 = "0x1111111111111111111111111111111111111111"
	a := authorize(t, s, map[string]any{"payment_required": paymentRequiredAt("https://one.example/r", "250000", p1), "resource": "https://one.example/r"})
	if a.Decision != "allow" || a.Authorization == nil {
		t.Fatalf("authorize: %+v", a)
	}
	writeTraceRun(t, dir, "run-trace", tracePayment{"op-1", "https://one.example/r", p1, "250000", a.Authorization.Nonce, "0x" + strings.Repeat("1", 64), a.Authorization.Payer})
	settledBy := func() map[string]string {
		t.Helper()
		sts, err := reviewlog.OpenStore(filestore.New(openRoot(t, dir)), reviewlog.Options{}).Settlements(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, st := range sts {
			out[st.Nonce] = st.Source
		}
		return out
	}
	restarted := newPolicyServer(t, dir, 0, pol)
	if isErr, text, _ := callTool(t, restarted, "check_before_pay", map[string]any{"counterparty": p1, "amount": "0.01"}); isErr {
		t.Fatalf("check_before_pay: %s", text)
	}
	for deadline := time.Now().Add(20 * time.Second); settledBy()[a.Authorization.Nonce] != reviewlog.SourceTrace; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the first check_before_pay, its sweep bound nothing: %v", settledBy())
		}
	}
}

// A settlement the sweep read before the log named its payer (another
// signer's authorization recorded later in the same log: a key changed, a
// replica with its own) is bound once the log names it: the sweep, which
// keeps only its payers' settlements, reads the Trace again whole.
func TestTraceSweepReadsAgainForANewPayer(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"100.00","maxOpenPartialPerCounterparty":0}`), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const otherKey = "0x8da4ef21b864d2cc526dbdb2a120bd2874c36c9d0a1fb7f8c63d7f7a8b41de8f"
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a := newPayingServer(t, dir, 0, pol, key, testPayerKey)
	b := newPayingServer(t, dir, 0, pol, key, otherKey)
	const p1, p9 = "0x1111111111111111111111111111111111111111", "0x9999999999999999999999999999999999999999"
	k, err := x402.ParseKey([]byte(otherKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	bPayer := x402.NewKeySigner(k).Address().Hex()
	url := "https://one.example/r"
	// b's coming payment, as the recorder will date it: read by a's sweep
	// before b authorizes it, when the log names only a's payer.
	req := map[string]any{"scheme": "exact", "network": "base", "asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "amount": "250000", "pay_to": p1, "max_timeout_seconds": 120}
	line, _ := json.Marshal(map[string]any{"event_id": "b-1", "event_type": "x402.payment.responded", "occurred_at": time.Now().UTC().Add(30 * time.Second).Format("2006-01-02T15:04:05.000Z"),
		"seq": 0, "adapter": "trace-x402", "role": "client", "context_id": "op-b", "payload": map[string]any{"x402_version": 2, "resource": map[string]any{"url": url}, "requirements": req,
			"settle": map[string]any{"success": true, "transaction": "0x" + strings.Repeat("b", 64), "network": "base", "payer": bPayer}}})
	if err := os.WriteFile(filepath.Join(dir, "events", "run-b.ndjson"), append(line, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	pay := func(s *Server, url, amount, payTo string) authorizeAnswer {
		t.Helper()
		a, rules := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt(url, amount, payTo), "resource": url})
		if a.Decision != "allow" || a.Authorization == nil {
			t.Fatalf("pay %s: %+v %v", url, a, rules)
		}
		return a
	}
	pay(a, "https://nine.example/r", "10000", p9) // a's sweep reads run-b
	ab := pay(b, url, "250000", p1)
	if !strings.EqualFold(ab.Authorization.Payer, bPayer) {
		t.Fatalf("b's payer %s, want %s", ab.Authorization.Payer, bPayer)
	}
	// Something that can bind changes in the Trace, so a's next sweep
	// reads the log: it names b's payer.
	writeTraceRun(t, dir, "run-x", tracePayment{"op-x", "https://x.example/r", p9, "1", "", "0x" + strings.Repeat("9", 64), p9})
	pay(a, "https://eight.example/r", "10000", "0x8888888888888888888888888888888888888888")
	sts, err := reviewlog.OpenStore(filestore.New(openRoot(t, dir)), reviewlog.Options{}).Settlements(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 1 || !strings.EqualFold(sts[0].Nonce, ab.Authorization.Nonce) || sts[0].Trace == nil || sts[0].Trace.Binding != "terms" || sts[0].Trace.Run != "run-b" {
		t.Fatalf("settlements recorded: %+v, want b's by its terms from run-b", sts)
	}
}

// A restart takes from the sweep saved in guard/ the run files an earlier
// process swept and that hold nothing that can bind, and reads of them only
// what was appended since; never over the events: a run file rewritten
// where it was swept (at its size and time), or cut shorter, is read again
// whole, as is one where a nonce comes later for an operation whose
// settlement was left out; a run that holds a settlement of this server's
// payer is read whole at every start; a saved sweep written over, or not
// one at all, is said in the log, naming the file, and saved anew; and a
// payer the saved sweep did not keep has every run read again.
func TestTraceSweepRestartReadsOnlyWhatItDidNotSweep(t *testing.T) {
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"100.00"}`), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := x402.ParseKey([]byte(testPayerKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	ours := x402.NewKeySigner(k).Address().Hex()
	const p9, other = "0x9999999999999999999999999999999999999999", "0x8da4ef21b864d2cc526dbdb2a120bd2874c36c9d0a1fb7f8c63d7f7a8b41de8f"
	url := "https://nine.example/r"
	pay := func(op, payer string, i int) tracePayment {
		return tracePayment{op, url, p9, "10000", "", fmt.Sprintf("0x%064x", i), payer}
	}
	for _, d := range []string{"events", "guard"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	writeTraceRun(t, dir, "run-1", pay("op-1a", p9, 1), pay("op-1b", p9, 2))
	writeTraceRun(t, dir, "run-2", pay("op-2a", p9, 3), pay("op-2b", p9, 4))
	writeTraceRun(t, dir, "run-3", pay("op-3a", p9, 5))
	writeTraceRun(t, dir, "run-ours", pay("op-o", ours, 6))
	path := func(run string) string { return filepath.Join(dir, "events", run+".ndjson") }
	size := func(runs ...string) int64 {
		var n int64
		for _, r := range runs {
			fi, err := os.Stat(path(r))
			if err != nil {
				t.Fatal(err)
			}
			n += fi.Size()
		}
		return n
	}
	saved := filepath.Join(dir, "guard", payment.SweepFile)
	// restart starts a server on dir, sweeps the Trace as its first
	// check_before_pay does, and stops it.
	restart := func(payerKey string) (payment.TraceReads, string) {
		t.Helper()
		var logs syncBuffer
		s := newPayingServerLog(t, dir, 0, pol, key, payerKey, slog.New(slog.NewTextHandler(&logs, nil)))
		if _, err := s.guard.Payments.SettleFromTrace(context.Background()); err != nil {
			t.Fatal(err)
		}
		s.guard.Payments.Close()
		return s.guard.Payments.TraceReads(), logs.String()
	}
	all := size("run-1", "run-2", "run-3", "run-ours")
	if got, logs := restart(testPayerKey); got != (payment.TraceReads{Bytes: all, Whole: 4}) {
		t.Fatalf("the first start read %+v, want every run whole (%d bytes)", got, all)
	} else if _, err := os.Stat(saved); err != nil {
		t.Fatalf("the sweep is not saved: %v\n%s", err, logs)
	}
	appended := func(run, text string) {
		t.Helper()
		f, err := os.OpenFile(path(run), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(text); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	more := `{"event_id":"x","event_type":"other","occurred_at":"2026-07-24T09:01:00.000Z","seq":9,"adapter":"trace-x402","role":"client","context_id":"op-1c","payload":{}}` + "\n"
	nonce := `{"event_id":"n","event_type":"x402.payment.submitted","occurred_at":"2026-07-24T09:01:00.000Z","seq":10,"adapter":"trace-x402","role":"client","context_id":"op-1a","payload":{"payment_payload":{"nonce":"0x` + strings.Repeat("7", 64) + `"}}}` + "\n"
	// unended is the line run-3 ends with once cut, read again at each
	// start until it is ended.
	var unended int64
	for _, step := range []struct {
		name   string
		change func()
		payer  string
		want   func() payment.TraceReads
		log    string
	}{
		{"unchanged", func() {}, testPayerKey,
			func() payment.TraceReads { return payment.TraceReads{Bytes: size("run-ours"), Whole: 1, Saved: 3} }, ""},
		{"unchanged again", func() {}, testPayerKey,
			func() payment.TraceReads { return payment.TraceReads{Bytes: size("run-ours"), Whole: 1, Saved: 3} }, ""},
		{"a run appended to", func() { appended("run-1", more) }, testPayerKey,
			func() payment.TraceReads {
				return payment.TraceReads{Bytes: size("run-ours") + int64(len(more)), Whole: 1, Saved: 3}
			}, ""},
		{"a run rewritten where it was swept, at its size and time", func() {
			fi, err := os.Stat(path("run-2"))
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(path("run-2"))
			if err != nil {
				t.Fatal(err)
			}
			data = []byte(strings.Replace(string(data), fmt.Sprintf("0x%064x", 4), fmt.Sprintf("0x%064x", 44), 1))
			if err := os.WriteFile(path("run-2"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(path("run-2"), fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
			if size("run-2") != fi.Size() {
				t.Fatal("the rewrite changed the size")
			}
		}, testPayerKey,
			func() payment.TraceReads {
				return payment.TraceReads{Bytes: size("run-2", "run-ours"), Whole: 2, Saved: 2}
			}, ""},
		{"a run cut shorter", func() {
			data, err := os.ReadFile(path("run-3"))
			if err != nil {
				t.Fatal(err)
			}
			data = data[:len(data)/2]
			if err := os.WriteFile(path("run-3"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			unended = int64(len(data) - strings.LastIndexByte(string(data), '\n') - 1)
		}, testPayerKey,
			func() payment.TraceReads {
				return payment.TraceReads{Bytes: size("run-3", "run-ours"), Whole: 2, Saved: 2}
			}, ""},
		{"a nonce for an operation whose settlement was left out", func() { appended("run-1", nonce) }, testPayerKey,
			// Read from where it was swept, then whole.
			func() payment.TraceReads {
				return payment.TraceReads{Bytes: int64(len(nonce)) + size("run-1", "run-ours") + unended, Whole: 2, Saved: 3}
			}, ""},
		{"the saved sweep written over", func() {
			data, err := os.ReadFile(saved)
			if err != nil {
				t.Fatal(err)
			}
			data[len(data)/2] ^= 1
			if err := os.WriteFile(saved, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}, testPayerKey,
			func() payment.TraceReads {
				return payment.TraceReads{Bytes: size("run-1", "run-2", "run-3", "run-ours"), Whole: 4}
			}, "SHA-256 does not match"},
		{"saved anew", func() {}, testPayerKey,
			// run-1 carries a nonce now: read whole at every start.
			func() payment.TraceReads {
				return payment.TraceReads{Bytes: size("run-1", "run-ours") + unended, Whole: 2, Saved: 2}
			}, ""},
		{"not a saved sweep", func() {
			if err := os.WriteFile(saved, []byte("HAIA-RUNINDEX 5\n..."), 0o600); err != nil {
				t.Fatal(err)
			}
		}, testPayerKey,
			func() payment.TraceReads {
				return payment.TraceReads{Bytes: size("run-1", "run-2", "run-3", "run-ours"), Whole: 4}
			}, "not a saved sweep"},
		{"a payer the saved sweep did not keep", func() {}, other,
			func() payment.TraceReads {
				return payment.TraceReads{Bytes: size("run-1", "run-2", "run-3", "run-ours"), Whole: 4}
			}, "fewer payers"},
	} {
		step.change()
		got, logs := restart(step.payer)
		if want := step.want(); got != want {
			t.Fatalf("%s: read %+v, want %+v\n%s", step.name, got, want, logs)
		}
		if step.log != "" && (!strings.Contains(logs, step.log) || !strings.Contains(logs, saved)) {
			t.Fatalf("%s: the log does not say %q naming %s:\n%s", step.name, step.log, saved, logs)
		}
	}
}
