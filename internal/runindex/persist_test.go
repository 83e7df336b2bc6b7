package runindex

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// savingIndex opens an index over dir/events that saves itself in
// dir/guard, as a process of its own would.
func savingIndex(t *testing.T, dir string) (*Index[item, string], *receipt.Template) {
	t.Helper()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	events, err := root.MkdirAll("events", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	state, err := root.MkdirAll("guard", 0o700)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.Close(); state.Close(); root.Close() })
	tmpl, err := receipt.Resolver{}.Resolve("x402-buyer")
	if err != nil {
		t.Fatal(err)
	}
	ix := New(Options[item, string]{
		Events: events,
		Limits: receipt.DefaultLimits(),
		Summarize: func(_ string, r *receipt.Receipt, _ func(*receipt.Event) string) item {
			return item{op: r.Operation.OperationID}
		},
		Compare:     func(a, b *item) int { return strings.Compare(a.op, b.op) },
		OperationID: func(it *item) string { return it.op },
		State:       state,
		EncodeItem:  func(e *Enc, it *item) { e.Str(it.op) },
		DecodeItem:  func(_ string, d *Dec) item { return item{op: d.Str()} },
		Version:     func() string { return "test" },
	})
	return ix, tmpl
}

// writeRuns writes runs run-0..run-(n-1), each with operations op-<run>-0..2.
func writeRuns(t *testing.T, dir string, n int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	for r := range n {
		var b strings.Builder
		for i := range 6 {
			b.WriteString(line(fmt.Sprintf("op-%d-%d", r, i%3), r*100+i+1))
		}
		if err := os.WriteFile(filepath.Join(dir, "events", fmt.Sprintf("run-%d.ndjson", r)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// listed is every run's operations, from a listing with every run decoded.
func listed(t *testing.T, ix *Index[item, string], tmpl *receipt.Template) string {
	t.Helper()
	l, err := ix.List(context.Background(), tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, rv := range l.Runs {
		if rv.Pending {
			t.Fatalf("run %s left undecoded by List", rv.RunID)
		}
		fmt.Fprintf(&b, "%s:%d:", rv.RunID, rv.Lines)
		for _, it := range rv.Items {
			b.WriteString(it.op + ",")
		}
		b.WriteString(";")
	}
	return b.String()
}

// A restart decodes from the saved index only the runs a listing asks for:
// the others stay Pending, with their first item from the authenticated
// headers, until asked for.
func TestRestartDecodesOnlyTheRunsAsked(t *testing.T) {
	dir := t.TempDir()
	writeRuns(t, dir, 5)
	first, tmpl := savingIndex(t, dir)
	want := listed(t, first, tmpl)
	first.WaitSaved()
	// The save's scratch files (its runs' parts and headers, written
	// there as they were encoded) are gone with it.
	ents, err := os.ReadDir(filepath.Join(dir, "guard"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != IndexFile+" "+KeyFile {
		t.Fatalf("guard/ holds %v after a save, want %s and %s alone", names, IndexFile, KeyFile)
	}

	second, _ := savingIndex(t, dir)
	l, err := second.ListSome(context.Background(), tmpl, nil, func(runs []RunView[item]) []bool {
		need := make([]bool, len(runs))
		for i, rv := range runs {
			need[i] = rv.RunID == "run-3"
		}
		return need
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, rv := range l.Runs {
		switch {
		case rv.RunID == "run-3" && (rv.Pending || len(rv.Items) != 3 || rv.Items[0].op != "op-3-0"):
			t.Errorf("run-3, asked for, is %+v; want its three operations", rv)
		case rv.RunID != "run-3" && (!rv.Pending || rv.Items != nil || rv.First == nil || rv.First.op != "op-"+rv.RunID[4:]+"-0" || rv.Lines != 6):
			t.Errorf("run %s, not asked for, is %+v; want it pending with its first operation", rv.RunID, rv)
		}
	}
	if st := second.Stats(); st.Adopted != 5 || st.Decoded != 1 || st.FullReads != 0 || st.ResidentRuns != 5 || st.Events != 30 {
		t.Fatalf("after a listing that needs one run: %+v; want 5 adopted, 1 decoded, none read", st)
	}
	if got := listed(t, second, tmpl); got != want {
		t.Fatalf("restart listed\n%s\nwant\n%s", got, want)
	}
	if st := second.Stats(); st.Decoded != 5 || st.FullReads != 0 {
		t.Fatalf("after a listing of every run: %+v; want all 5 decoded, none read", st)
	}
}

// A run whose part of the saved index was changed is not trusted when it
// is first used: the run is read from its file, the others decoded, and
// the listing is what the files say. The headers still authenticate, so
// the change is only found when the part is read.
func TestTamperedRunPartIsReadFromItsFile(t *testing.T) {
	dir := t.TempDir()
	writeRuns(t, dir, 4)
	first, tmpl := savingIndex(t, dir)
	want := listed(t, first, tmpl)
	first.WaitSaved()

	// The last run's part ends the file: an operation id of its, changed
	// to another of the same length (it would decode cleanly).
	p := filepath.Join(dir, "guard", IndexFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	bodies := len(indexMagic) + 8 + int(binary.LittleEndian.Uint64(b[len(indexMagic):])) + 32
	i := bytes.LastIndex(b, []byte("op-"))
	if i < bodies {
		t.Fatal("no operation id in the runs' parts")
	}
	b[i+len("op-x-")] = '7'
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}

	second, _ := savingIndex(t, dir)
	if _, err := second.ListSome(context.Background(), tmpl, nil, func(runs []RunView[item]) []bool { return make([]bool, len(runs)) }); err != nil {
		t.Fatal(err)
	}
	if st := second.Stats(); st.Adopted != 4 || st.Rejected != 0 || st.FullReads != 0 {
		t.Fatalf("before any run is used: %+v; want 4 adopted, none rejected or read", st)
	}
	if got := listed(t, second, tmpl); got != want {
		t.Fatalf("with a run's part tampered with, the restart listed\n%s\nwant what the files say\n%s", got, want)
	}
	if st := second.Stats(); st.Rejected != 1 || st.FullReads != 1 || st.Decoded != 3 {
		t.Fatalf("after listing every run: %+v; want 1 rejected and read from its file, 3 decoded", st)
	}
	// That read was a full one: the index is saved again, and a third
	// process adopts and decodes every run.
	second.WaitSaved()
	third, _ := savingIndex(t, dir)
	if got := listed(t, third, tmpl); got != want {
		t.Fatalf("third process listed\n%s\nwant\n%s", got, want)
	}
	if st := third.Stats(); st.Decoded != 4 || st.Rejected != 0 || st.FullReads != 0 {
		t.Fatalf("third process: %+v; want every run decoded from the index saved again", st)
	}
}

// A saved index cut inside the runs' parts is not used at all: its
// headers say where the parts end.
func TestSavedIndexCutInItsPartsIsNotUsed(t *testing.T) {
	dir := t.TempDir()
	writeRuns(t, dir, 3)
	first, tmpl := savingIndex(t, dir)
	want := listed(t, first, tmpl)
	first.WaitSaved()
	p := filepath.Join(dir, "guard", IndexFile)
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, st.Size()-3); err != nil {
		t.Fatal(err)
	}
	second, _ := savingIndex(t, dir)
	if got := listed(t, second, tmpl); got != want {
		t.Fatalf("listed\n%s\nwant\n%s", got, want)
	}
	if st := second.Stats(); st.Adopted != 0 || st.FullReads != 3 {
		t.Fatalf("%+v; want nothing adopted, every run read", st)
	}
}
