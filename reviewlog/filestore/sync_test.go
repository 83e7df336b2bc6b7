package filestore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// TestSectionSyncOrder: a section's syncs run while it goes on (a receipt's
// from its append, waited for at the section's end; a ledger entry's while
// its receipt is signed), but whatever must be on disk before something
// else still is: the
// ledger entry before the receipt it stands for, a receipt before a ledger
// entry bound to it (a release), the terms receipt before the review log's
// line. A crash between two syncs then leaves at worst an entry counted,
// never a receipt without its entry. A decision's kept question, which
// commits nothing, is synced after all of them, once the section has
// ended (the last group), in the background.
func TestSectionSyncOrder(t *testing.T) {
	seg := reviewlog.ReceiptsDir + "/" + reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0)
	type step func(t *testing.T, w reviewlog.Writer)
	var off int64
	entry := func(t *testing.T, w reviewlog.Writer) {
		if err := w.LedgerAppender().Append(context.Background(), ledger.Pos{Lane: 0, Off: off}, [][]byte{[]byte(`{"entry":1}`)}); err != nil {
			t.Fatal(err)
		}
		off += int64(len(`{"entry":1}`) + 1)
	}
	var segEnd int64
	receipt := func(t *testing.T, w reviewlog.Writer) {
		if err := w.AppendSegment(context.Background(), reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0), segEnd, []byte("{\"receipt\":1}\n")); err != nil {
			t.Fatal(err)
		}
		segEnd += int64(len("{\"receipt\":1}\n"))
	}
	question := func(t *testing.T, w reviewlog.Writer) {
		if err := w.(reviewlog.QuestionKeeper).KeepQuestion(context.Background(), "rcpt_1", []byte(`{"q":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	logLine := func(t *testing.T, w reviewlog.Writer) {
		if err := w.AppendLog(context.Background(), []byte("{\"line\":1}\n")); err != nil {
			t.Fatal(err)
		}
	}
	logBeside := func(t *testing.T, w reviewlog.Writer) {
		if err := w.(reviewlog.LogBesideAppender).AppendLogBeside(context.Background(), []byte("{\"line\":1}\n")); err != nil {
			t.Fatal(err)
		}
	}
	receipts := func(t *testing.T, w reviewlog.Writer) {
		two := []byte("{\"receipt\":1}\n{\"receipt\":2}\n")
		if err := w.AppendSegment(context.Background(), reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0), segEnd, two); err != nil {
			t.Fatal(err)
		}
		segEnd += int64(len(two))
	}
	for _, tc := range []struct {
		name  string
		steps []step
		// each group's syncs complete before the next group's; within a
		// group, in any order
		want [][]string
	}{
		{"an allow: the entry, then its receipt, then its question after the section", []step{entry, receipt, question},
			[][]string{{LedgerFile}, {seg}, {reviewlog.QuestionsFile}}},
		{"a release: the outcome's receipt, then the entry bound to it", []step{receipt, entry},
			[][]string{{seg}, {LedgerFile}}},
		{"a review opened: the terms receipt, the log line, then the decision's receipt, then its question", []step{receipt, logLine, receipt, question},
			[][]string{{seg}, {reviewlog.FileName}, {seg}, {reviewlog.QuestionsFile}}},
		{"an authorization: the entry, then the decision's and the authorization's receipts together, then the log line, then its question", []step{entry, receipt, question, receipt, logLine},
			[][]string{{LedgerFile}, {seg, seg}, {reviewlog.FileName}, {reviewlog.QuestionsFile}}},
		{"an authorization: the entry, then its two receipts in one append with its log line beside them, then its question", []step{entry, receipts, question, logBeside},
			[][]string{{LedgerFile}, {seg, reviewlog.FileName}, {reviewlog.QuestionsFile}}},
		{"a plain decision: its receipt at the section's end, its question after", []step{receipt, question},
			[][]string{{seg}, {reviewlog.QuestionsFile}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sg := newSegGuard(t)
			s := New(sg.root)
			var (
				mu  sync.Mutex
				got []string
			)
			// A question's sync is heard only once the section has
			// returned; one heard before (the section waiting for it) is
			// an answer waiting for what commits nothing.
			returned, early := make(chan struct{}), false
			s.synced = func(name string) {
				if name == reviewlog.QuestionsFile {
					select {
					case <-returned:
					case <-time.After(3 * time.Second):
						early = true
					}
				}
				mu.Lock()
				got = append(got, name)
				mu.Unlock()
			}
			off, segEnd = 0, 0
			err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
				for _, st := range tc.steps {
					st(t, w)
				}
				return nil
			})
			mu.Lock()
			atReturn := len(got)
			mu.Unlock()
			close(returned)
			if err != nil {
				t.Fatal(err)
			}
			// Whatever commits the answer (every group but the question's)
			// is on disk before the section returns: an authorization's
			// receipt and log line before its signature is given.
			committing := 0
			for _, g := range tc.want {
				if !slices.Contains(g, reviewlog.QuestionsFile) {
					committing += len(g)
				}
			}
			if atReturn < committing {
				t.Fatalf("the section returned with %d of its %d committing syncs done: %v", atReturn, committing, got[:atReturn])
			}
			total := 0
			for _, g := range tc.want {
				total += len(g)
			}
			// The last group is synced in the background: wait for it.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				mu.Lock()
				n := len(got)
				mu.Unlock()
				if n >= total || time.Now().After(deadline) {
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if early {
				t.Fatal("the section waited for its question's sync")
			}
			var flat []string
			for _, g := range tc.want {
				n := len(flat)
				if len(got) < n+len(g) {
					t.Fatalf("synced %v, want the groups %v", got, tc.want)
				}
				part := slices.Clone(got[n : n+len(g)])
				slices.Sort(part)
				want := slices.Clone(g)
				slices.Sort(want)
				if !slices.Equal(part, want) {
					t.Fatalf("synced %v, want the groups %v", got, tc.want)
				}
				flat = append(flat, got[n:n+len(g)]...)
			}
			if len(flat) != len(got) {
				t.Fatalf("synced %v, want the groups %v", got, tc.want)
			}
		})
	}
}

// TestFailedSectionKeepsItsReceipts: a section that fails after appending
// a receipt has the receipt synced as before (only its ledger entries are
// cut off), and the next section appends after it.
func TestFailedSectionKeepsItsReceipts(t *testing.T) {
	sg := newSegGuard(t)
	s := New(sg.root)
	var got []string
	s.synced = func(name string) { got = append(got, name) }
	boom := errors.New("boom")
	file := reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0)
	err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
		if err := w.AppendSegment(context.Background(), file, 0, []byte("{\"receipt\":1}\n")); err != nil {
			t.Fatal(err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != reviewlog.ReceiptsDir+"/"+file {
		t.Fatalf("synced %v", got)
	}
	data, err := os.ReadFile(sg.path + "/" + reviewlog.ReceiptsDir + "/" + file)
	if err != nil || string(data) != "{\"receipt\":1}\n" {
		t.Fatalf("%q %v", data, err)
	}
}

// TestFailedSectionKeepsTheEntriesItsReceiptsStandFor: a section that
// fails after a receipt followed its ledger entry (an authorization whose
// signed record could not be appended after its allow) keeps that entry with
// the receipt, counted, and cuts off only the entries written after the last
// receipt: a signed receipt never stands without its entry, so no failure
// leaves a finding that answers every question review.
func TestFailedSectionKeepsTheEntriesItsReceiptsStandFor(t *testing.T) {
	entryA, entryB := []byte(`{"entry":"a"}`), []byte(`{"entry":"b"}`)
	file := reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0)
	for _, tc := range []struct {
		name       string
		after      bool // entry b after the receipt
		wantLedger string
	}{
		{"entry, receipt, failure", false, string(entryA) + "\n"},
		{"entry, receipt, entry, failure", true, string(entryA) + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sg := newSegGuard(t)
			s := New(sg.root)
			boom := errors.New("boom")
			err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
				ctx := context.Background()
				if err := w.LedgerAppender().Append(ctx, ledger.Pos{Lane: 0, Off: 0}, [][]byte{entryA}); err != nil {
					t.Fatal(err)
				}
				if err := w.AppendSegment(ctx, file, 0, []byte("{\"receipt\":1}\n")); err != nil {
					t.Fatal(err)
				}
				if tc.after {
					if err := w.LedgerAppender().Append(ctx, ledger.Pos{Lane: 0, Off: int64(len(entryA) + 1)}, [][]byte{entryB}); err != nil {
						t.Fatal(err)
					}
				}
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatal(err)
			}
			data, err := os.ReadFile(sg.path + "/" + LedgerFile)
			if err != nil || string(data) != tc.wantLedger {
				t.Fatalf("ledger %q %v, want %q", data, err, tc.wantLedger)
			}
			rc, err := os.ReadFile(sg.path + "/" + reviewlog.ReceiptsDir + "/" + file)
			if err != nil || string(rc) != "{\"receipt\":1}\n" {
				t.Fatalf("receipts %q %v", rc, err)
			}
		})
	}
}

// TestEntryOnDiskBeforeItsReceiptIsWritten: the ledger entry's sync runs
// while the section signs its receipt, but the receipt is written only once
// that sync is done — not merely synced after it — so no crash, at any
// instant, leaves a receipt on disk (or in the page cache, for the kernel
// to write back first) without its entry on disk.
func TestEntryOnDiskBeforeItsReceiptIsWritten(t *testing.T) {
	sg := newSegGuard(t)
	s := New(sg.root)
	file := reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0)
	segPath := sg.path + "/" + reviewlog.ReceiptsDir + "/" + file
	atEntry := sizeWhenTheEntryIsSynced(s, segPath)
	err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
		if err := w.LedgerAppender().Append(context.Background(), ledger.Pos{Lane: 0}, [][]byte{[]byte(`{"entry":1}`)}); err != nil {
			return err
		}
		return w.AppendSegment(context.Background(), file, 0, []byte("{\"receipt\":1}\n"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := atEntry(); n > 0 || n == -2 {
		t.Fatalf("the receipt file held %d bytes when the entry's sync completed (-2: never heard); want none", n)
	}
	data, err := os.ReadFile(segPath)
	if err != nil || string(data) != "{\"receipt\":1}\n" {
		t.Fatalf("%q %v", data, err)
	}
}

// TestFailedEntrySyncWritesNoReceipt: when the ledger entry's sync fails,
// the receipt it stands for is never written, the entry is cut off again
// and the section fails — whether the failure is heard by the receipt
// waiting for it or by the section's end.
func TestFailedEntrySyncWritesNoReceipt(t *testing.T) {
	file := reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0)
	bad := errors.New("EIO from the test")
	for _, tc := range []struct {
		name    string
		receipt bool // the section goes on to its receipt
	}{
		{"heard before the receipt", true},
		{"heard at the section's end", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sg := newSegGuard(t)
			s := New(sg.root)
			// A first entry that stays.
			if err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
				return w.LedgerAppender().Append(context.Background(), ledger.Pos{Lane: 0}, [][]byte{[]byte(`{"entry":0}`)})
			}); err != nil {
				t.Fatal(err)
			}
			first := int64(len(`{"entry":0}`) + 1)
			s.syncFault = func(name string) error {
				if name == LedgerFile {
					return bad
				}
				return nil
			}
			var receiptErr error
			err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
				if err := w.LedgerAppender().Append(context.Background(), ledger.Pos{Lane: 0, Seq: 1, Off: first}, [][]byte{[]byte(`{"entry":1}`)}); err != nil {
					return err
				}
				if tc.receipt {
					receiptErr = w.AppendSegment(context.Background(), file, 0, []byte("{\"receipt\":1}\n"))
					return receiptErr
				}
				return nil
			})
			if !errors.Is(err, bad) {
				t.Fatalf("the section returned %v, want the sync's failure", err)
			}
			if tc.receipt && !errors.Is(receiptErr, bad) {
				t.Fatalf("the receipt's append returned %v, want the entry's sync failure", receiptErr)
			}
			if _, err := os.Stat(sg.path + "/" + reviewlog.ReceiptsDir + "/" + file); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the receipt file exists (%v): a receipt written without its entry", err)
			}
			data, err := os.ReadFile(sg.path + "/" + LedgerFile)
			if err != nil || string(data) != "{\"entry\":0}\n" {
				t.Fatalf("the ledger holds %q (%v), want only the first entry", data, err)
			}
		})
	}
}

// TestQuestionsSyncedTogether: the questions of sections that follow one
// another are synced in the background, at most once every syncLaterEvery,
// and Close syncs what still waits.
func TestQuestionsSyncedTogether(t *testing.T) {
	sg := newSegGuard(t)
	s := New(sg.root)
	var (
		mu    sync.Mutex
		syncs int
	)
	s.synced = func(name string) {
		if name == reviewlog.QuestionsFile {
			mu.Lock()
			syncs++
			mu.Unlock()
		}
	}
	const n = 20
	start := time.Now()
	for i := range n {
		if err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
			return w.(reviewlog.QuestionKeeper).KeepQuestion(context.Background(), "rcpt_"+strconv.Itoa(i), []byte(`{"q":`+strconv.Itoa(i)+`}`))
		}); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := syncs
	mu.Unlock()
	// One sync a window of syncLaterEvery the sections took, one more by
	// Close; never one a question.
	if most := int(took/syncLaterEvery) + 2; got < 1 || got > most {
		t.Fatalf("%d syncs of the questions for %d sections in %s, want 1 to %d", got, n, took, most)
	}
	data, err := os.ReadFile(sg.path + "/" + reviewlog.QuestionsFile)
	if err != nil || bytes.Count(data, []byte("\n")) != n {
		t.Fatalf("%d questions kept (%v), want %d", bytes.Count(data, []byte("\n")), err, n)
	}
}

// TestQuestionCutsATornTail: a question appended after a line a writer
// died in the middle of replaces that torn tail, shorter or longer than
// the new line, and the file holds whole lines only.
func TestQuestionCutsATornTail(t *testing.T) {
	for _, tc := range []struct{ name, before string }{
		{"no tail", `{"q":0}` + "\n"},
		{"a short torn tail", `{"q":0}` + "\n" + `{"q"`},
		{"a torn tail longer than the line", `{"q":0}` + "\n" + `{"q":"` + strings.Repeat("x", 300)},
		{"only a torn line", `{"q":"` + strings.Repeat("x", 30)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sg := newSegGuard(t)
			path := sg.path + "/" + reviewlog.QuestionsFile
			if err := os.WriteFile(path, []byte(tc.before), 0o600); err != nil {
				t.Fatal(err)
			}
			s := New(sg.root)
			if err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
				return w.(reviewlog.QuestionKeeper).KeepQuestion(context.Background(), "rcpt_1", []byte(`{"q":1}`))
			}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			want := tc.before[:strings.LastIndexByte(tc.before, '\n')+1] + `{"q":1}` + "\n"
			if got, err := os.ReadFile(path); err != nil || string(got) != want {
				t.Fatalf("the questions file holds %q (%v), want %q", got, err, want)
			}
		})
	}
}

// TestFailedSyncCutsTwoReceiptsOnce: a chain appended to twice in one
// section (the first receipt's sync under way, the second kept for the
// section's end) is cut back to where the section found it when a sync
// fails, never extended with zeros to where its second receipt began.
func TestFailedSyncCutsTwoReceiptsOnce(t *testing.T) {
	sg := newSegGuard(t)
	s := New(sg.root)
	file := reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0)
	path := sg.path + "/" + reviewlog.ReceiptsDir + "/" + file
	first := []byte("{\"receipt\":0}\n")
	if err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
		return w.AppendSegment(context.Background(), file, 0, first)
	}); err != nil {
		t.Fatal(err)
	}
	bad := errors.New("EIO from the test")
	s.syncFault = func(name string) error {
		if name == reviewlog.ReceiptsDir+"/"+file {
			return bad
		}
		return nil
	}
	one, two := []byte("{\"receipt\":1}\n"), []byte("{\"receipt\":2}\n")
	err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
		if err := w.AppendSegment(context.Background(), file, int64(len(first)), one); err != nil {
			return err
		}
		return w.AppendSegment(context.Background(), file, int64(len(first)+len(one)), two)
	})
	if !errors.Is(err, bad) {
		t.Fatalf("the section returned %v, want the sync's failure", err)
	}
	if data, err := os.ReadFile(path); err != nil || !bytes.Equal(data, first) {
		t.Fatalf("the chain holds %q (%v), want only the first section's receipt", data, err)
	}
}

// TestEntryOnDiskBeforeTheLineBeside: a line synced beside the receipts
// (AppendLogBeside) is written only once the ledger entries under way are
// on disk, as a receipt is, so no crash leaves an authorized line whose
// entry is not on disk.
func TestEntryOnDiskBeforeTheLineBeside(t *testing.T) {
	sg := newSegGuard(t)
	s := New(sg.root)
	logPath := sg.path + "/" + reviewlog.FileName
	atEntry := sizeWhenTheEntryIsSynced(s, logPath)
	err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
		if err := w.LedgerAppender().Append(context.Background(), ledger.Pos{Lane: 0}, [][]byte{[]byte(`{"entry":1}`)}); err != nil {
			return err
		}
		return w.(reviewlog.LogBesideAppender).AppendLogBeside(context.Background(), []byte("{\"line\":1}\n"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := atEntry(); n != 0 {
		t.Fatalf("the log held %d bytes when the entry's sync completed (-1: no file, -2: never heard); want 0", n)
	}
	if data, err := os.ReadFile(logPath); err != nil || string(data) != "{\"line\":1}\n" {
		t.Fatalf("%q %v", data, err)
	}
}

// TestFailedSyncCutsTheLineBeside: when the receipts' sync or the line's
// own fails, the section fails and what it appended to the chain and to the
// log is cut off again: the log keeps no authorized line of an answer not
// given, and the chain no receipt of it.
func TestFailedSyncCutsTheLineBeside(t *testing.T) {
	file := reviewlog.SegmentFile("decisions-haia-0123456789abcdef", 0)
	seg := reviewlog.ReceiptsDir + "/" + file
	bad := errors.New("EIO from the test")
	for _, failing := range []string{seg, reviewlog.FileName} {
		t.Run(failing, func(t *testing.T) {
			sg := newSegGuard(t)
			s := New(sg.root)
			first, line0 := []byte("{\"receipt\":0}\n"), []byte("{\"line\":0}\n")
			if err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
				if err := w.AppendSegment(context.Background(), file, 0, first); err != nil {
					return err
				}
				return w.AppendLog(context.Background(), line0)
			}); err != nil {
				t.Fatal(err)
			}
			s.syncFault = func(name string) error {
				if name == failing {
					return bad
				}
				return nil
			}
			err := s.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
				if err := w.AppendSegment(context.Background(), file, int64(len(first)), []byte("{\"receipt\":1}\n{\"receipt\":2}\n")); err != nil {
					return err
				}
				return w.(reviewlog.LogBesideAppender).AppendLogBeside(context.Background(), []byte("{\"line\":1}\n"))
			})
			if !errors.Is(err, bad) {
				t.Fatalf("the section returned %v, want the sync's failure", err)
			}
			if data, err := os.ReadFile(sg.path + "/" + seg); err != nil || !bytes.Equal(data, first) {
				t.Fatalf("the chain holds %q (%v), want only the first section's receipt", data, err)
			}
			if data, err := os.ReadFile(sg.path + "/" + reviewlog.FileName); err != nil || !bytes.Equal(data, line0) {
				t.Fatalf("the log holds %q (%v), want only the first section's line", data, err)
			}
		})
	}
}

// sizeWhenTheEntryIsSynced makes s's ledger syncs slow (the section reaches
// what follows the entry meanwhile) and returns what path's size was when
// the entry's sync completed: -1 when the file did not exist, -2 when no
// ledger sync completed.
func sizeWhenTheEntryIsSynced(s *Store, path string) func() int64 {
	var (
		mu   sync.Mutex
		size = int64(-2)
	)
	s.syncFault = func(name string) error {
		if name == LedgerFile {
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}
	s.synced = func(name string) {
		if name != LedgerFile {
			return
		}
		st, err := os.Stat(path)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case errors.Is(err, os.ErrNotExist):
			size = -1
		case err == nil:
			size = st.Size()
		}
	}
	return func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return size
	}
}
