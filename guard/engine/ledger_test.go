package engine

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

// ledgerLines reads every lane of the fleet's ledger as the store holds it.
func (f *fleet) ledgerLines(t *testing.T) []ledger.Raw {
	t.Helper()
	var raws []ledger.Raw
	err := f.logs[0].Store().View(context.Background(), func(r reviewlog.Reader) error {
		var err error
		raws, err = r.Ledger().Since(context.Background(), nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return raws
}

// editLedger rewrites the ledger as whoever holds the medium can: the
// volume's files, or the tables as their owner, triggers off. fn gets the
// lines of every lane in order and gives back the lines to store, each
// at the lane and seq it names.
func (f *fleet) editLedger(t *testing.T, fn func(raws []ledger.Raw) []ledger.Raw) {
	t.Helper()
	raws := fn(f.ledgerLines(t))
	if f.kind == pgKind {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		for _, q := range []string{"ALTER TABLE ledger_entries DISABLE TRIGGER USER", "DELETE FROM ledger_entries"} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		for _, r := range raws {
			if _, err := conn.Exec(ctx, "INSERT INTO ledger_entries (lane, seq, line) VALUES ($1, $2, $3)", r.Lane, r.Seq, r.Line); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := conn.Exec(ctx, "ALTER TABLE ledger_entries ENABLE TRIGGER USER"); err != nil {
			t.Fatal(err)
		}
		return
	}
	byLane := map[int][]ledger.Raw{}
	for _, r := range raws {
		byLane[r.Lane] = append(byLane[r.Lane], r)
	}
	g := filepath.Join(f.dir, reviewlog.DirName)
	for lane := range ledger.Lanes {
		rs := byLane[lane]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].Seq < rs[j].Seq })
		var data []byte
		for _, r := range rs {
			data = append(append(data, r.Line...), '\n')
		}
		path := filepath.Join(g, filestore.LedgerLaneFile(lane))
		if len(rs) == 0 {
			_ = os.Remove(path)
			continue
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// commitments are the raws of the fleet's ledger that commit a payment.
func commitments(raws []ledger.Raw) []int {
	var out []int
	for i, r := range raws {
		if bytes.Contains(r.Line, []byte(`"kind":"hold"`)) || bytes.Contains(r.Line, []byte(`"kind":"spend"`)) || bytes.Contains(r.Line, []byte(`"kind":"authorization"`)) {
			out = append(out, i)
		}
	}
	return out
}

// Whoever writes the store without the server's key — the volume's writer,
// or the database's table owner with the triggers off — cannot hide,
// reorder, renumber, alter or replay a commitment: the next process to
// read the ledger answers review (reservation_unverified), never allow,
// and the process that read it before keeps counting it.
func TestLedgerEditsAreSeen(t *testing.T) {
	const policy = `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}, "reservationMinutes": 60}`
	cases := []struct {
		name string
		edit func(t *testing.T, raws []ledger.Raw) []ledger.Raw
	}{
		{"the last commitment removed", func(t *testing.T, raws []ledger.Raw) []ledger.Raw {
			c := commitments(raws)
			return append(raws[:c[len(c)-1]:c[len(c)-1]], raws[c[len(c)-1]+1:]...)
		}},
		{"a commitment removed, the rest renumbered", func(t *testing.T, raws []ledger.Raw) []ledger.Raw {
			c := commitments(raws)
			out := append(raws[:c[0]:c[0]], raws[c[0]+1:]...)
			for i := c[0]; i < len(out); i++ {
				out[i].Seq--
			}
			return out
		}},
		{"a commitment removed, a gap left", func(t *testing.T, raws []ledger.Raw) []ledger.Raw {
			c := commitments(raws)
			return append(raws[:c[0]:c[0]], raws[c[0]+1:]...)
		}},
		{"an amount lowered", func(t *testing.T, raws []ledger.Raw) []ledger.Raw {
			c := commitments(raws)
			raws[c[1]].Line = bytes.Replace(raws[c[1]].Line, []byte(`"atomic":"1000000"`), []byte(`"atomic":"1"`), 1)
			return raws
		}},
		{"moved to another payee", func(t *testing.T, raws []ledger.Raw) []ledger.Raw {
			c := commitments(raws)
			raws[c[1]].Line = bytes.Replace(raws[c[1]].Line, []byte(strings.ToLower(sellerA)), []byte(strings.ToLower(sellerB)), 1)
			return raws
		}},
		{"two swapped", func(t *testing.T, raws []ledger.Raw) []ledger.Raw {
			c := commitments(raws)
			raws[c[0]].Line, raws[c[1]].Line = raws[c[1]].Line, raws[c[0]].Line
			return raws
		}},
		{"the ledger emptied", func(t *testing.T, raws []ledger.Raw) []ledger.Raw { return nil }},
	}
	for _, kind := range stores(t) {
		for _, tc := range cases {
			t.Run(string(kind)+"/"+tc.name, func(t *testing.T) {
				f := newFleet(t, kind, 1, policy)
				e := f.engines[0]
				for range 3 {
					if a := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "1.00"}); a.Decision != guard.Allow {
						t.Fatalf("first three: %+v", a)
					}
				}
				// Untouched, a new process counts the three: 1.00 more fits.
				if a := check(t, f.fresh(t), "bot", Question{Counterparty: sellerA, Amount: "1.00", Resource: "https://x.example/0"}); a.Decision != guard.Allow {
					t.Fatalf("a new process on an untouched ledger: %+v", a)
				}
				f.editLedger(t, func(raws []ledger.Raw) []ledger.Raw { return tc.edit(t, raws) })
				a := check(t, f.fresh(t), "bot", Question{Counterparty: sellerA, Amount: "0.50"})
				if a.Decision == guard.Allow || reasonOf(a, guard.RuleReservationUnverified) == "" {
					t.Fatalf("the edit was not seen by the next process: %+v", a)
				}
				// The process that read the ledger before keeps counting
				// what it read: 4.00 held, 1.50 more is over 5.00.
				if b := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "1.50"}); b.Decision == guard.Allow {
					t.Fatalf("the running process forgot a commitment: %+v", b)
				}
			})
		}
	}
}

// A release lets go of a commitment only when the server sealed it: a
// forged one is a finding, and a deleted one leaves the commitment
// counting again.
func TestLedgerReleases(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind)+"/forged", func(t *testing.T) {
			f := newFleet(t, kind, 1, releasePolicy)
			e := f.engines[0]
			a := checkCall(t, e, "1.50", "first")
			if a.Decision != guard.Allow {
				t.Fatalf("first: %+v", a)
			}
			f.editLedger(t, func(raws []ledger.Raw) []ledger.Raw {
				last := raws[len(raws)-1]
				forged := ledger.Entry{V: 1, Lane: last.Lane, Seq: last.Seq + 1, Prev: ledger.Hash(last.Line), Kind: ledger.KindRelease,
					At: ledger.FormatTime(f.clock()), Receipt: "x", Caller: "bot", Target: a.ReceiptID, Outcome: ledger.OutcomeNotRun}
				line, _ := forged.Seal([]byte("not the server's key"))
				return append(raws, ledger.Raw{Pos: ledger.Pos{Lane: last.Lane, Seq: last.Seq + 1}, Line: line})
			})
			b := checkCall(t, f.fresh(t), "1.50", "second")
			if b.Decision == guard.Allow || !strings.Contains(reasonOf(b, guard.RuleReservationUnverified), "not sealed") {
				t.Fatalf("a forged release: %+v", b)
			}
		})
		t.Run(string(kind)+"/deleted", func(t *testing.T) {
			f := newFleet(t, kind, 1, releasePolicy)
			e := f.engines[0]
			a := checkCall(t, e, "1.50", "first")
			if rec, err := e.RecordOutcome(context.Background(), "bot", a, OutcomeRefused); err != nil || !rec.Released {
				t.Fatalf("release: %+v %v", rec, err)
			}
			if b := checkCall(t, f.fresh(t), "1.50", "second"); b.Decision != guard.Allow {
				t.Fatalf("after a sealed release: %+v", b)
			}
			f.editLedger(t, func(raws []ledger.Raw) []ledger.Raw {
				var out []ledger.Raw
				for _, r := range raws {
					if !bytes.Contains(r.Line, []byte(`"kind":"release"`)) {
						out = append(out, r)
					}
				}
				return out
			})
			if b := checkCall(t, f.fresh(t), "0.60", "third"); b.Decision == guard.Allow {
				t.Fatalf("a deleted release freed the headroom: %+v", b)
			}
		})
	}
}

// An approval is used once even where every trace of its use the review
// log keeps is erased: the use is a sealed ledger entry that names the
// review, and a new process refuses a second allow.
func TestApprovalUseIsInTheLedger(t *testing.T) {
	l := newLoop(t, `{"reviewAbove": "0.05", "perCounterpartyLimit": {"amount": "100.00"}, "maxOpenPartialPerCounterparty": 5}`)
	first := l.ask(t, "agent-1")
	l.advance(time.Minute)
	if _, err := l.decider.Decide(context.Background(), first.ReviewID, reviewlog.Approved, "", "alice"); err != nil {
		t.Fatal(err)
	}
	if use := l.ask(t, "agent-1"); use.Decision != guard.Allow {
		t.Fatalf("use: %+v", use)
	}
	path := filepath.Join(l.dir, reviewlog.DirName, reviewlog.FileName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var kept []byte
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if !bytes.Contains(line, []byte(`"type":"used"`)) {
			kept = append(kept, line...)
		}
	}
	if len(kept) == len(data) {
		t.Fatal("no used line to erase")
	}
	if err := os.WriteFile(path, kept, 0o600); err != nil {
		t.Fatal(err)
	}
	again := l.fresh(t).ask(t, "agent-1")
	if again.Decision == guard.Allow {
		t.Fatalf("an approval whose use the review log lost was honoured again: %+v", again)
	}
}

// A crash between a commitment's entry and its receipt (the file store
// writes the entry first) leaves the commitment counted, never lost and
// never a finding.
func TestEntryWithoutReceiptCounts(t *testing.T) {
	f := newFleet(t, fileKind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}}`)
	e := f.engines[0]
	if a := check(t, e, "bot", Question{Counterparty: sellerA, Amount: "1.00"}); a.Decision != guard.Allow {
		t.Fatalf("first: %+v", a)
	}
	// What a process killed after the entry and before the receipt leaves.
	err := e.cfg.Log.WithLock(context.Background(), func(tx reviewlog.Tx) error {
		if err := e.catchUp(context.Background(), tx.Store); err != nil {
			return err
		}
		req, err := e.parse(e.Policy(), Question{Counterparty: sellerA, Amount: "3.50"})
		if err != nil {
			return err
		}
		en, err := e.commitment(req, "bot", "rcpt_crashed", reviewlog.Tx{At: tx.At}, e.Policy(), ledger.KindHold)
		if err != nil {
			return err
		}
		_, err = e.appendEntry(context.Background(), tx.Store, en)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	a := check(t, f.fresh(t), "bot", Question{Counterparty: sellerA, Amount: "1.00"})
	if a.Decision != guard.Review || reasonOf(a, guard.RulePerCounterparty) == "" || reasonOf(a, guard.RuleReservationUnverified) != "" {
		t.Fatalf("after a crash between entry and receipt: %+v", a)
	}
}

// An entry carries, under its seal, the tenant whose store it was written
// to: read as another tenant's store, it is a finding.
func TestLedgerEntryNamesItsTenant(t *testing.T) {
	f := newFleet(t, fileKind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}}`)
	acme := f.engineFor(t, "acme")
	if a := check(t, acme, "bot", Question{Counterparty: sellerA, Amount: "4.00"}); a.Decision != guard.Allow {
		t.Fatalf("first: %+v", a)
	}
	if a := check(t, acme, "bot", Question{Counterparty: sellerA, Amount: "1.50"}); a.Decision != guard.Review || reasonOf(a, guard.RuleReservationUnverified) != "" {
		t.Fatalf("the tenant's own: %+v", a)
	}
	globex := f.engineFor(t, "globex")
	a := check(t, globex, "bot", Question{Counterparty: sellerA, Amount: "0.10"})
	if a.Decision != guard.Review || !strings.Contains(reasonOf(a, guard.RuleReservationUnverified), `for tenant "acme", not this store's "globex"`) {
		t.Fatalf("an entry moved to another tenant's store: %+v", a)
	}
}

// A forwarded paying call is spend: it counts for the policy's whole
// window, not for reservationMinutes, so an agent that spaces its calls
// past the reservation time still meets a 24-hour limit. A check_before_pay
// allow the agent never used lapses as before.
func TestForwardedCallCountsForItsWindow(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 1, `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00", "windowHours": 24}, "reservationMinutes": 15}`)
			e := f.engines[0]
			if a := checkCall(t, e, "5.00", "first"); a.Decision != guard.Allow {
				t.Fatalf("first: %+v", a)
			} else if _, err := e.RecordOutcome(context.Background(), "bot", a, OutcomeExecuted); err != nil {
				t.Fatal(err)
			}
			f.advance(16 * time.Minute)
			if a := checkCall(t, e, "5.00", "second"); a.Decision != guard.Review || reasonOf(a, guard.RulePerCounterparty) == "" {
				t.Fatalf("16 minutes after a forwarded 5.00, another 5.00 under 5.00 a day: %+v", a)
			}
			if a := checkCall(t, f.fresh(t), "0.01", "third"); a.Decision != guard.Review {
				t.Fatalf("a new process forgot the forwarded call: %+v", a)
			}
			f.advance(24 * time.Hour)
			if a := checkCall(t, e, "5.00", "fourth"); a.Decision != guard.Allow {
				t.Fatalf("a day later: %+v", a)
			}
			// Its outcome is never recorded (the proxy signs it after the
			// call's answer, and a crash came first): it counts all the same,
			// past reservationMinutes, in a new process too.
			f.advance(16 * time.Minute)
			if a := checkCall(t, f.fresh(t), "0.01", "fifth"); a.Decision != guard.Review || reasonOf(a, guard.RulePerCounterparty) == "" {
				t.Fatalf("a forwarded call without its outcome was forgotten: %+v", a)
			}
			// A check_before_pay allow still lapses after reservationMinutes.
			if a := check(t, e, "bot", Question{Counterparty: sellerB, Amount: "5.00"}); a.Decision != guard.Allow {
				t.Fatalf("check: %+v", a)
			}
			f.advance(16 * time.Minute)
			if a := check(t, e, "bot", Question{Counterparty: sellerB, Amount: "5.00"}); a.Decision != guard.Allow {
				t.Fatalf("a hold did not lapse: %+v", a)
			}
		})
	}
}

// Many reviews opened at once: along every chain, a receipt is never dated
// before the one it follows (verify warned "ts went backwards").
func TestReceiptTimesNeverGoBackwards(t *testing.T) {
	for _, kind := range stores(t) {
		t.Run(string(kind), func(t *testing.T) {
			f := newFleet(t, kind, 3, `{"reviewAbove": "0.01", "maxPendingReviewsPerCaller": 1000}`)
			// A clock that jitters backwards by up to a millisecond between
			// readings, as two goroutines reading one clock can see it.
			var mu sync.Mutex
			tick := 0
			for _, e := range f.engines {
				e.cfg.Now = func() time.Time {
					mu.Lock()
					defer mu.Unlock()
					tick++
					return f.clock().Add(time.Duration(tick%3) * time.Millisecond * -1)
				}
			}
			var wg sync.WaitGroup
			for i := range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := f.engines[i%3].Check(context.Background(), fmt.Sprintf("bot-%d", i), Question{Counterparty: sellerA, Amount: fmt.Sprintf("1.%02d", i)})
					if err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			err := f.logs[0].Store().View(context.Background(), func(r reviewlog.Reader) error {
				chains, err := reviewlog.ListChains(context.Background(), r)
				if err != nil {
					return err
				}
				for _, c := range chains {
					rs, err := reviewlog.ReadChainFile(context.Background(), r, c.ID)
					if err != nil {
						return err
					}
					for i := 1; i < len(rs); i++ {
						if rs[i].TS < rs[i-1].TS {
							t.Errorf("chain %s: receipt %d at %s follows one at %s", c.ID, i, rs[i].TS, rs[i-1].TS)
						}
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
