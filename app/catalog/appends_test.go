package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// appendingRoot writes event lines to the runs of a Trace root one append
// at a time, in the shapes a recorder or ingest produces and some it
// should not: new runs, an operation's events spread over appends (a
// settlement arriving after its payment), times out of order, a line
// written twice, a line torn by a write and finished by the next, other
// payees, hosts and assets, and now and then a run rewritten in place or
// replaced by another file.
type appendingRoot struct {
	t    *testing.T
	dir  string
	rng  *rand.Rand
	base time.Time
	tick int
	runs []*appendingRun
}

type appendingRun struct {
	id    string
	lines [][]byte // every complete line written, in order
	torn  []byte   // the rest of a line written in part
	ops   []*appendingOp
}

type appendingOp struct {
	id      string
	stage   int // events written
	outcome int // 0 settled, 1 settle.success false, 2 declined, 3 never answered
	payTo   string
	url     string
	amount  string
	network string
}

func (r *appendingRoot) path(run *appendingRun) string {
	return filepath.Join(r.dir, "events", run.id+".ndjson")
}

// stamp is the next event's time: mostly later than the last, sometimes
// earlier (a recorder's clock, or events posted out of order).
func (r *appendingRoot) stamp() string {
	r.tick++
	at := r.base.Add(time.Duration(r.tick) * 7 * time.Second)
	if r.rng.IntN(7) == 0 {
		at = at.Add(-time.Duration(r.rng.IntN(90)) * time.Minute)
	}
	return at.UTC().Format("2006-01-02T15:04:05.000Z")
}

// next is the next event line of op (nil when it has no more).
func (r *appendingRoot) next(op *appendingOp) []byte {
	resource := map[string]any{"url": op.url, "description": "Paid resource", "mime_type": "application/json"}
	req := map[string]any{"scheme": "exact", "network": op.network, "asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
		"amount": op.amount, "pay_to": op.payTo, "max_timeout_seconds": 300}
	var typ string
	var payload map[string]any
	switch op.stage {
	case 0:
		typ, payload = "x402.payment.required", map[string]any{"x402_version": 2, "resource": resource, "accepts": []any{req}}
	case 1:
		typ, payload = "x402.payment.creating", map[string]any{"x402_version": 2, "resource": resource, "requirements": req}
	case 2:
		typ, payload = "x402.payment.submitted", map[string]any{"x402_version": 2, "resource": resource, "requirements": req}
	case 3:
		switch op.outcome {
		case 0, 1:
			settle := map[string]any{"success": op.outcome == 0, "transaction": fmt.Sprintf("0x%064x", r.tick), "network": op.network}
			typ, payload = "x402.payment.responded", map[string]any{"x402_version": 2, "resource": resource, "requirements": req, "settle": settle}
		case 2:
			typ, payload = "x402.verify.failed", map[string]any{"x402_version": 2, "resource": resource, "requirements": req, "error": "invalid_signature"}
		default:
			return nil
		}
	default:
		return nil
	}
	line := map[string]any{"event_id": fmt.Sprintf("%s-%d", op.id, op.stage), "event_type": typ, "occurred_at": r.stamp(),
		"seq": op.stage, "adapter": "trace-x402", "role": "client", "context_id": op.id, "payload": payload}
	op.stage++
	b, err := json.Marshal(line)
	if err != nil {
		r.t.Fatal(err)
	}
	return append(b, '\n')
}

// step makes one change to the root and says what it was.
func (r *appendingRoot) step() string {
	rng := r.rng
	if len(r.runs) == 0 || rng.IntN(12) == 0 {
		r.runs = append(r.runs, &appendingRun{id: fmt.Sprintf("run-%02d", rng.IntN(40))})
		for _, o := range r.runs[:len(r.runs)-1] {
			if o.id == r.runs[len(r.runs)-1].id {
				r.runs = r.runs[:len(r.runs)-1] // that id is taken: append to it instead
				break
			}
		}
	}
	run := r.runs[rng.IntN(len(r.runs))]
	switch k := rng.IntN(40); {
	case k == 0 && len(run.lines) > 1 && run.torn == nil:
		// Rewritten in place: one line dropped, the file written again.
		drop := rng.IntN(len(run.lines))
		run.lines = append(run.lines[:drop:drop], run.lines[drop+1:]...)
		r.rewrite(run, false)
		return "rewrite " + run.id
	case k == 1 && len(run.lines) > 1 && run.torn == nil:
		// Replaced: another file renamed over it, the lines shuffled.
		rng.Shuffle(len(run.lines), func(i, j int) { run.lines[i], run.lines[j] = run.lines[j], run.lines[i] })
		r.rewrite(run, true)
		return "replace " + run.id
	}
	var out []byte
	if run.torn == nil && rng.IntN(150) == 0 {
		// A line that is no event: the run cannot be read from there on.
		run.lines = append(run.lines, []byte("{\"not\": \"an event\"}\n"))
		out = append(out, run.lines[len(run.lines)-1]...)
	}
	if run.torn != nil {
		out, run.torn = append(out, run.torn...), nil
	}
	for range 1 + rng.IntN(4) {
		var line []byte
		switch {
		case len(run.lines) > 0 && rng.IntN(15) == 0:
			line = run.lines[rng.IntN(len(run.lines))] // written twice
		default:
			var open []*appendingOp
			for _, o := range run.ops {
				if o.stage < 4 && !(o.stage == 3 && o.outcome == 3) {
					open = append(open, o)
				}
			}
			if len(open) == 0 || rng.IntN(3) == 0 {
				n := len(run.ops)
				o := &appendingOp{id: fmt.Sprintf("op-%d", n), outcome: rng.IntN(4), payTo: fmt.Sprintf("0x%040x", 1+rng.IntN(3)),
					url: fmt.Sprintf("https://svc%d.example.com/r/%d", rng.IntN(3), rng.IntN(2)), amount: fmt.Sprint(10000 * (1 + rng.IntN(4))), network: "base"}
				if rng.IntN(10) == 0 {
					o.network = "base-sepolia" // another asset
				}
				if rng.IntN(12) == 0 {
					o.payTo = "not an address"
				}
				run.ops = append(run.ops, o)
				open = append(open, o)
			}
			line = r.next(open[rng.IntN(len(open))])
			if line == nil {
				continue
			}
		}
		run.lines = append(run.lines, line)
		out = append(out, line...)
	}
	if len(out) > 1 && rng.IntN(8) == 0 {
		// The last line is torn: its rest comes with the next append (it
		// stays in lines, whole, as it will be).
		cut := max(1, len(out)-1-rng.IntN(20))
		run.torn = append([]byte(nil), out[cut:]...)
		out = out[:cut]
	}
	f, err := os.OpenFile(r.path(run), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := f.Write(out); err != nil {
		r.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		r.t.Fatal(err)
	}
	return fmt.Sprintf("append %d bytes to %s", len(out), run.id)
}

// rewrite writes run's lines again, in place (the same file, truncated)
// or as a new file renamed over it.
func (r *appendingRoot) rewrite(run *appendingRun, replace bool) {
	var all []byte
	for _, l := range run.lines {
		all = append(all, l...)
	}
	p := r.path(run)
	if replace {
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, all, 0o644); err != nil {
			r.t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil {
			r.t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(p, all, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// The guard's history as a long-lived catalog keeps it — its run index
// brought up to each append (the appended lines read, the operations they
// touch assembled again), its history kept while no run changes and
// indexed again when one does — is after every change the history a
// catalog opened on the root at that moment reads: the same operations in
// the same order, the same unreadable runs, and the same decisions for
// questions on every payee and host, from History and from HistorySince.
func TestHistoryAfterEveryAppendIsAFreshReading(t *testing.T) {
	ctx := context.Background()
	cfg, err := guard.ParseConfig([]byte(`{"reviewAbove":"100","maxOpenPartialPerCounterparty":1,"perCounterpartyLimit":{"amount":"0.05","windowHours":1},"totalLimit":{"amount":"0.2","windowHours":2},"velocity":{"perCounterparty":{"count":3,"windowMinutes":30},"total":{"count":9,"windowMinutes":60}},"duplicatePayment":{"windowMinutes":20},"reviewNewPayee":true}`), "")
	if err != nil {
		t.Fatal(err)
	}
	var questions []guard.RawRequest
	for p := 1; p <= 4; p++ {
		addr := fmt.Sprintf("0x%040x", p)
		questions = append(questions, guard.RawRequest{Counterparty: addr, Amount: "0.01"},
			guard.RawRequest{Counterparty: fmt.Sprintf("svc%d.example.com", p%4), Amount: "0.02", PayTo: addr, Resource: fmt.Sprintf("https://svc%d.example.com/r/1", p%4)},
			guard.RawRequest{Counterparty: fmt.Sprintf("svc%d.example.com", p%4), Amount: "0.04"})
	}
	steps := 300
	if testing.Short() {
		steps = 80
	}
	for seed := range uint64(4) {
		base := time.Date(2026, 7, 25, 9, 0, 0, 0, time.UTC)
		r := &appendingRoot{t: t, dir: t.TempDir(), rng: rand.New(rand.NewPCG(seed, 77)), base: base}
		if err := os.MkdirAll(filepath.Join(r.dir, "events"), 0o755); err != nil {
			t.Fatal(err)
		}
		live := openCatalog(t, r.dir)
		tmpl, err := live.Template("")
		if err != nil {
			t.Fatal(err)
		}
		var did []string
		for i := range steps {
			did = append(did, r.step())
			if r.rng.IntN(4) == 0 && i < steps-1 {
				continue // several changes between two readings
			}
			now := base.Add(time.Duration(r.tick)*7*time.Second + time.Minute)
			since := now.Add(-3 * time.Hour)
			fresh := openCatalog(t, r.dir)
			want, err := fresh.History(ctx, tmpl)
			if err != nil {
				t.Fatal(err)
			}
			got, err := live.History(ctx, tmpl)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Ops, want.Ops) || got.Runs != want.Runs || !reflect.DeepEqual(got.Unreadable, want.Unreadable) {
				t.Fatalf("seed %d, step %d (%v): the kept history differs from a fresh reading:\n%d operations, %d runs, unreadable %v\nfresh: %d operations, %d runs, unreadable %v",
					seed, i, did[max(0, len(did)-5):], len(got.Ops), got.Runs, got.Unreadable, len(want.Ops), want.Runs, want.Unreadable)
			}
			gotSince, err := live.HistorySince(ctx, tmpl, since)
			if err != nil {
				t.Fatal(err)
			}
			wantSince, err := fresh.HistorySince(ctx, tmpl, since)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range questions {
				req, err := guard.ParseRequest(q, cfg)
				if err != nil {
					t.Fatal(err)
				}
				dw := guard.Decide(req, want, cfg, now)
				for name, h := range map[string]guard.History{"History": got, "HistorySince": gotSince, "a fresh HistorySince": wantSince} {
					if d := guard.Decide(req, h, cfg, now); !reflect.DeepEqual(d, dw) {
						t.Fatalf("seed %d, step %d (%v), %+v: from the kept %s:\n%+v\nfrom a fresh reading:\n%+v", seed, i, did[max(0, len(did)-5):], q, name, d, dw)
					}
				}
			}
		}
		h, _ := live.History(ctx, tmpl)
		st := live.Stats()
		t.Logf("seed %d: %d operations in %d runs (%d unreadable); the run index read appended lines %d times", seed, len(h.Ops), h.Runs, len(h.Unreadable), st.IncrementalRs)
		if len(h.Ops) < 50 || st.IncrementalRs < int64(steps/4) {
			t.Fatalf("seed %d: only %d operations, %d runs read from where they were, after %d changes: the test proves little", seed, len(h.Ops), st.IncrementalRs, steps)
		}
	}
}
