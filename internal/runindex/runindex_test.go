package runindex

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

type item struct{ op string }

func line(op string, seq int) string {
	at := time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC).Add(time.Duration(seq) * time.Millisecond)
	return fmt.Sprintf(`{"event_id":"%s-%d","event_type":"x402.payment.required","occurred_at":%q,"seq":%d,"adapter":"a","context_id":%q,"payload":{}}`+"\n",
		op, seq, at.Format("2006-01-02T15:04:05.000Z"), seq, op)
}

func newIndex(t testing.TB) (*Index[item, string], string, *receipt.Template) {
	t.Helper()
	dir := t.TempDir()
	d, tmpl := openEvents(t, dir)
	ix := New(Options[item, string]{
		Events:  d,
		Limits:  receipt.DefaultLimits(),
		Extract: func(e receipt.Event, _ func(string) string) string { return "facts of " + e.ID },
		Summarize: func(_ string, r *receipt.Receipt, facts func(*receipt.Event) string) item {
			for i := range r.Events {
				if got, want := facts(&r.Events[i]), "facts of "+r.Events[i].ID; got != want {
					panic("facts " + got + " handed for " + want)
				}
			}
			return item{op: r.Operation.OperationID}
		},
	})
	return ix, dir, tmpl
}

func ops(t *testing.T, ix *Index[item, string], tmpl *receipt.Template) ([]string, []Unreadable) {
	t.Helper()
	l, err := ix.List(context.Background(), tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, rv := range l.Runs {
		for _, it := range rv.Items {
			out = append(out, rv.RunID+"/"+it.op)
		}
	}
	return out, l.Unreadable
}

// rewriteInPlace truncates the file and writes new content to the same inode,
// as an editor or a misbehaving recorder might, then gives it a later mtime.
func rewriteInPlace(t *testing.T, path, content string, mtime time.Time) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// A file rewritten in place (same inode, larger size) is not an append: the
// index must read it again from the start rather than from its old offset.
func TestRewriteInPlaceIsReadAgain(t *testing.T) {
	cases := []struct {
		name    string
		before  string
		after   string
		wantOps []string
	}{
		{
			name:    "aligned",
			before:  line("old", 1),
			after:   line("new", 1) + line("new2", 2),
			wantOps: []string{"r/new", "r/new2"},
		},
		{
			name:    "misaligned",
			before:  line("old", 1),
			after:   line("longer-name", 1) + line("longer-name", 2),
			wantOps: []string{"r/longer-name"},
		},
		{
			name:    "bad then good",
			before:  "not json\n",
			after:   line("fixed", 1),
			wantOps: []string{"r/fixed"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ix, dir, tmpl := newIndex(t)
			path := filepath.Join(dir, "r.ndjson")
			if err := os.WriteFile(path, []byte(c.before), 0o644); err != nil {
				t.Fatal(err)
			}
			ops(t, ix, tmpl)
			rewriteInPlace(t, path, c.after, time.Now().Add(time.Hour))
			got, bad := ops(t, ix, tmpl)
			if len(bad) != 0 || strings.Join(got, ",") != strings.Join(c.wantOps, ",") {
				t.Fatalf("after rewrite: ops %v, unreadable %v; want ops %v", got, bad, c.wantOps)
			}
		})
	}
}

// Appends are read incrementally, and the line numbers of later errors count
// the lines read before.
func TestAppendIsIncremental(t *testing.T) {
	ix, dir, tmpl := newIndex(t)
	path := filepath.Join(dir, "r.ndjson")
	if err := os.WriteFile(path, []byte(line("a", 1)+line("b", 2)+`{"torn`), 0o644); err != nil {
		t.Fatal(err)
	}
	got, bad := ops(t, ix, tmpl)
	if len(got) != 2 || len(bad) != 0 {
		t.Fatalf("first listing: %v %v", got, bad)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Finish the torn line as a valid one would be impossible here, so the
	// writer starts over on a new line after it: that line is bad (line 3).
	fmt.Fprint(f, "\n"+line("c", 3))
	f.Close()
	_, bad = ops(t, ix, tmpl)
	if len(bad) != 1 || !strings.Contains(bad[0].Err.Error(), "line 3") {
		t.Fatalf("completed torn line: %v", bad)
	}
	if s := ix.Stats(); s.IncrementalRs != 1 || s.FullReads != 1 {
		t.Fatalf("stats %+v, want one full and one incremental read", s)
	}
}

// Compacted events must not keep their lines alive: the index's memory
// budget counts only what it keeps, so the rest must really be freed.
func TestCompactedEventsDoNotPinLines(t *testing.T) {
	dir := t.TempDir()
	d, tmpl := openEvents(t, dir)
	const lines, pad = 2000, 10 << 10 // about 20 MiB of payload
	var b strings.Builder
	for i := 1; i <= lines; i++ {
		l := line(fmt.Sprintf("op-%d", i%20), i)
		b.WriteString(strings.Replace(l, `"payload":{}`, `"payload":{"pad":"`+strings.Repeat("x", pad)+`"}`, 1))
	}
	if err := os.WriteFile(filepath.Join(dir, "r.ndjson"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	b = strings.Builder{}
	ix := New(Options[item, string]{
		Events:  d,
		Limits:  receipt.DefaultLimits(),
		Compact: func(e receipt.Event) receipt.Event { e.Raw = jsjson.Value{}; return e },
		Extract: func(e receipt.Event, _ func(string) string) string { return "facts of " + e.ID },
		Summarize: func(_ string, r *receipt.Receipt, facts func(*receipt.Event) string) item {
			for i := range r.Events {
				if got, want := facts(&r.Events[i]), "facts of "+r.Events[i].ID; got != want {
					panic("facts " + got + " handed for " + want)
				}
			}
			return item{op: r.Operation.OperationID}
		},
	})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got, bad := ops(t, ix, tmpl)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if len(got) != 20 || len(bad) != 0 {
		t.Fatalf("ops %d, unreadable %v", len(got), bad)
	}
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	est := ix.Stats().Bytes
	t.Logf("heap grew by %d KiB for an estimated %d KiB of kept events", grew>>10, est>>10)
	if grew > 4*est+(1<<20) {
		t.Fatalf("the index keeps %d KiB alive, far over its %d KiB estimate: lines are pinned", grew>>10, est>>10)
	}
}

type sumItem struct {
	op, last string
	events   int
}

func sortedIndex(t *testing.T, dir string) (*Index[sumItem, string], *receipt.Template) {
	t.Helper()
	d, tmpl := openEvents(t, dir)
	return New(Options[sumItem, string]{
		Events:  d,
		Limits:  receipt.DefaultLimits(),
		Compact: func(e receipt.Event) receipt.Event { e.Raw = jsjson.Value{}; return e },
		Extract: func(e receipt.Event, _ func(string) string) string { return e.ID },
		Summarize: func(_ string, r *receipt.Receipt, _ func(*receipt.Event) string) sumItem {
			return sumItem{op: r.Operation.OperationID, last: r.LastEventAt(), events: len(r.Events)}
		},
		Compare: func(a, b *sumItem) int {
			if c := strings.Compare(b.last, a.last); c != 0 {
				return c
			}
			return strings.Compare(a.op, b.op)
		},
		Facet:       func(s *sumItem) string { return fmt.Sprint(s.events % 2) },
		OperationID: func(s *sumItem) string { return s.op },
	}), tmpl
}

// Appends update a run's sorted view in place of a rebuild, and the result
// is the view a fresh index builds; ListAt lists a run as it was at a line.
func TestAppendUpdatesSortedView(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ndjson")
	ix, tmpl := sortedIndex(t, dir)
	var text strings.Builder
	seq := 0
	add := func(n int) {
		for range n {
			seq++
			text.WriteString(line(fmt.Sprintf("op-%d", (seq*7)%23), seq))
		}
		if err := os.WriteFile(path, []byte(text.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := func(ix *Index[sumItem, string], at map[string]int) RunView[sumItem] {
		l, err := ix.ListAt(context.Background(), tmpl, at)
		if err != nil || len(l.Runs) != 1 {
			t.Fatalf("list: %v %+v", err, l)
		}
		return l.Runs[0]
	}
	add(10)
	first := snapshot(ix, nil)
	firstItems := fmt.Sprint(first.Items)
	for round := 0; round < 6; round++ {
		add(5 + round)
		got := snapshot(ix, nil)
		fresh, _ := sortedIndex(t, dir)
		want := snapshot(fresh, nil)
		if fmt.Sprint(got.Items) != fmt.Sprint(want.Items) || fmt.Sprint(got.ByFacet) != fmt.Sprint(want.ByFacet) || got.Lines != want.Lines {
			t.Fatalf("round %d: updated view\n%v %v %d\nfresh view\n%v %v %d", round, got.Items, got.ByFacet, got.Lines, want.Items, want.ByFacet, want.Lines)
		}
		if then := snapshot(ix, map[string]int{"r": first.Lines}); fmt.Sprint(then.Items) != firstItems {
			t.Fatalf("round %d: as of line %d: %v, want %v", round, first.Lines, then.Items, firstItems)
		}
	}
	if s := ix.Stats(); s.FullReads != 1 {
		t.Errorf("stats %+v, want the run read in full once", s)
	}
	if l, _ := ix.ListAt(context.Background(), tmpl, map[string]int{}); len(l.Runs) != 0 {
		t.Errorf("a run missing from the snapshot was listed: %+v", l.Runs)
	}
}

// Views handed out stay valid and unchanged while later listings update the
// index (run with -race).
func TestViewsStayValidWhileTheIndexUpdates(t *testing.T) {
	dir := t.TempDir()
	ix, tmpl := sortedIndex(t, dir)
	for r := range 3 {
		var b strings.Builder
		for i := range 200 {
			b.WriteString(line(fmt.Sprintf("op-%d", i%40), i+1))
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("r%d.ndjson", r)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	first, err := ix.List(context.Background(), tmpl)
	if err != nil {
		t.Fatal(err)
	}
	before := fmt.Sprint(first.Runs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.OpenFile(filepath.Join(dir, "r1.ndjson"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		for i := range 20 {
			fmt.Fprint(f, line(fmt.Sprintf("op-%d", i), 1000+i))
			if _, err := ix.List(context.Background(), tmpl); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 50 {
		if got := fmt.Sprint(first.Runs); got != before {
			t.Fatal("a view handed out earlier changed")
		}
	}
	<-done
}

// Progress counts the runs a refresh reads: every run when the index is
// cold, nothing when nothing changed, the one run that grew after an
// append.
func TestProgressCountsTheRunsRead(t *testing.T) {
	dir := t.TempDir()
	d, tmpl := openEvents(t, dir)
	var mu sync.Mutex
	var calls [][2]int
	ix := New(Options[item, string]{
		Events: d,
		Limits: receipt.DefaultLimits(),
		Summarize: func(_ string, r *receipt.Receipt, _ func(*receipt.Event) string) item {
			return item{op: r.Operation.OperationID}
		},
		Progress: func(done, total int) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, [2]int{done, total})
		},
	})
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("r%d.ndjson", i)), []byte(line("a", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	refresh := func() [][2]int {
		t.Helper()
		mu.Lock()
		calls = nil
		mu.Unlock()
		if got, bad := ops(t, ix, tmpl); len(got) != 5 || len(bad) != 0 {
			t.Fatalf("listing: %v %v", got, bad)
		}
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls) // in order: one call at a time

	}
	for _, tc := range []struct {
		name   string
		before func()
		want   [][2]int
	}{
		{name: "cold: every run", want: [][2]int{{1, 5}, {2, 5}, {3, 5}, {4, 5}, {5, 5}}},
		{name: "warm: nothing read", want: nil},
		{name: "one run grew", before: func() {
			f, err := os.OpenFile(filepath.Join(dir, "r3.ndjson"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprint(f, line("a", 2))
			f.Close()
		}, want: [][2]int{{1, 1}}},
	} {
		if tc.before != nil {
			tc.before()
		}
		if got := refresh(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: progress %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The index keeps no event: after a listing, what stays in memory is the
// summaries and the places of the operations' lines, a few bytes an event,
// not the events (the index before kept each one, ~400 bytes).
func TestIndexKeepsNoEvents(t *testing.T) {
	dir := t.TempDir()
	const events = 40_000
	var b strings.Builder
	for i := 1; i <= events; i++ {
		b.WriteString(line(fmt.Sprintf("op-%d", i/4), i))
	}
	if err := os.WriteFile(filepath.Join(dir, "r.ndjson"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	b = strings.Builder{}
	ix, tmpl := sortedIndex(t, dir)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l, err := ix.List(context.Background(), tmpl)
	if err != nil || len(l.Runs) != 1 || len(l.Runs[0].Items) != events/4+1 {
		t.Fatalf("listing: %v, %d runs", err, len(l.Runs))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	// The summaries (sumItem: two strings and an int, ~60 bytes with the
	// time's copy) for a quarter of the events, and 16 bytes a place.
	perEvent := grew / events
	t.Logf("heap grew by %d KiB: %d bytes an event; estimate %d KiB", grew>>10, perEvent, ix.Stats().Bytes>>10)
	if perEvent > 80 {
		t.Fatalf("the index holds %d bytes an event after listing: it keeps the events", perEvent)
	}
	runtime.KeepAlive(l)
}

// An append re-reads the earlier lines of the operations it touches, and
// only those; a file whose earlier lines changed under an append (the
// anchors still hold) is read again from the start, never summarised from
// lines that are not the ones read before.
func TestAppendRereadsOnlyTouchedOperations(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ndjson")
	var b strings.Builder
	for i := 1; i <= 400; i++ {
		b.WriteString(line(fmt.Sprintf("op-%03d", i%100), i))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ix, tmpl := sortedIndex(t, dir)
	list := func() []sumItem {
		t.Helper()
		l, err := ix.List(context.Background(), tmpl)
		if err != nil || len(l.Runs) != 1 {
			t.Fatalf("list: %v %+v", err, l)
		}
		return l.Runs[0].Items
	}
	list()
	b.WriteString(line("op-007", 401) + line("op-new", 402))
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	items := list()
	if st := ix.Stats(); st.LinesReread != 4 || st.FullReads != 1 || st.IncrementalRs != 1 {
		t.Fatalf("stats %+v: want op-007's 4 earlier lines read again, one full and one incremental read", st)
	}
	for _, it := range items {
		if it.op == "op-007" && it.events != 5 {
			t.Fatalf("op-007 after the append: %+v, want 5 events", it)
		}
	}
	// Rewrite op-007's second line to another operation of the same
	// length, keep the first and last 512 bytes, and append.
	text := b.String()
	old := line("op-007", 107)
	if !strings.Contains(text, old) {
		t.Fatal("test line missing")
	}
	text = strings.Replace(text, old, strings.Replace(old, "op-007", "op-999", 2), 1) + line("op-007", 403)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	got := list()
	fresh, _ := sortedIndex(t, dir)
	l, err := fresh.List(context.Background(), tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(l.Runs[0].Items) {
		t.Fatalf("after a change under an append:\n%v\nwant what a fresh index reads:\n%v", got, l.Runs[0].Items)
	}
	if st := ix.Stats(); st.FullReads != 2 {
		t.Fatalf("stats %+v: the changed run was not read again from the start", st)
	}
}

// Reading is told, before a refresh reads, about how many bytes it will
// read, and its done is called once the reads are over: a cold index
// reads every file, a grown run only what was appended, a warm index
// nothing (no call).
func TestReadingToldTheBytesARefreshReads(t *testing.T) {
	dir := t.TempDir()
	d, tmpl := openEvents(t, dir)
	var told []int64
	open := 0
	ix := New(Options[item, string]{
		Events: d,
		Limits: receipt.DefaultLimits(),
		Summarize: func(_ string, r *receipt.Receipt, _ func(*receipt.Event) string) item {
			if open != 1 {
				panic("a run was read outside Reading")
			}
			return item{op: r.Operation.OperationID}
		},
		Reading: func(bytes int64) func() {
			told = append(told, bytes)
			open++
			return func() { open-- }
		},
	})
	var size int64
	for i := range 3 {
		l := line(fmt.Sprintf("op%d", i), 1)
		size += int64(len(l))
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("r%d.ndjson", i)), []byte(l), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	appended := line("op1", 2)
	for _, tc := range []struct {
		name   string
		before func()
		want   []int64
	}{
		{name: "cold: every file", want: []int64{size}},
		{name: "warm: nothing read", want: nil},
		{name: "one run grew: what was appended", before: func() {
			f, err := os.OpenFile(filepath.Join(dir, "r1.ndjson"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprint(f, appended)
			f.Close()
		}, want: []int64{int64(len(appended))}},
	} {
		if tc.before != nil {
			tc.before()
		}
		told = nil
		if got, bad := ops(t, ix, tmpl); len(got) != 3 || len(bad) != 0 {
			t.Fatalf("%s: listing %v %v", tc.name, got, bad)
		}
		if !slices.Equal(told, tc.want) || open != 0 {
			t.Errorf("%s: Reading told %v (%d left open), want %v", tc.name, told, open, tc.want)
		}
	}
}

// openEvents opens dir as the events' root (closed when the test ends)
// and resolves the x402-buyer template the tests read runs with.
func openEvents(t testing.TB, dir string) (*confined.Dir, *receipt.Template) {
	t.Helper()
	d, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	tmpl, err := receipt.Resolver{}.Resolve("x402-buyer")
	if err != nil {
		t.Fatal(err)
	}
	return d, tmpl
}

// sorted moves items into Compare order where they are, keeping equal
// items in their order, whatever cycles the permutation has.
func TestSortedInPlace(t *testing.T) {
	type kv struct{ k, v int }
	ix := New(Options[kv, string]{Compare: func(a, b *kv) int { return cmp.Compare(a.k, b.k) }})
	for _, keys := range [][]int{
		nil,
		{1},
		{2, 1},
		{1, 2, 3},
		{3, 2, 1},
		{2, 2, 1, 1, 0, 0},
		{5, 0, 4, 1, 3, 2, 2, 6, 0},
		{1, 1, 1, 1},
	} {
		items := make([]kv, len(keys))
		for i, k := range keys {
			items[i] = kv{k, i}
		}
		want := slices.Clone(items)
		slices.SortStableFunc(want, func(a, b kv) int { return cmp.Compare(a.k, b.k) })
		got := ix.sorted(items)
		if !slices.Equal(got, want) {
			t.Errorf("sorted(%v) = %v, want %v", keys, got, want)
		}
	}
	// A larger shuffle, with many ties.
	r := rand.New(rand.NewPCG(1, 2))
	items := make([]kv, 5000)
	for i := range items {
		items[i] = kv{r.IntN(300), i}
	}
	want := slices.Clone(items)
	slices.SortStableFunc(want, func(a, b kv) int { return cmp.Compare(a.k, b.k) })
	if got := ix.sorted(items); !slices.Equal(got, want) {
		t.Error("sorted a shuffle of 5000 out of order")
	}
}

// intern returns a string equal to the one it is given, the same copy for
// equal strings (slot collisions included), and a copy of its own, not
// the caller's bytes.
func TestInternSharesOneCopy(t *testing.T) {
	in := newIntern(0)
	buf := []byte("x402.payment.required")
	first := in.of(unsafe.String(&buf[0], len(buf))) // the caller's bytes, as a read buffer's
	for _, s := range []string{"", "a", "b", "q", "ab", "ba", "x402.payment.required", "trace-x402", "client", "a", "", "ab"} {
		got := in.of(strings.Clone(s))
		if got != s {
			t.Fatalf("of(%q) = %q", s, got)
		}
		if again := in.of(strings.Clone(s)); s != "" && unsafe.StringData(again) != unsafe.StringData(got) {
			t.Errorf("of(%q) twice gave two copies", s)
		}
	}
	copy(buf, "XXXX")
	if got := in.of("x402.payment.required"); got != "x402.payment.required" || unsafe.StringData(got) != unsafe.StringData(first) {
		t.Errorf("of kept the caller's bytes or made a second copy: %q", got)
	}
}
