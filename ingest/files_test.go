package ingest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

func lineEvent(run, id string, seq int) Event {
	return Event{Run: run, ID: id, Line: fmt.Appendf(nil, `{"event_id":%q,"event_type":"a.b.c","occurred_at":"2026-12-05T17:00:01.000Z","seq":%d,"adapter":"t","payload":{}}`, id, seq)}
}

func readRun(t *testing.T, path string) []receipt.Event {
	t.Helper()
	_, evs, err := receipt.ReadRunFile(path, receipt.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestFileSinkDedupesRetries: a batch sent again stores nothing twice,
// even from a new process (a sink that has to read the file to know).
func TestFileSinkDedupesRetries(t *testing.T) {
	root := t.TempDir()
	s := NewFileSink(map[string]string{"": root})
	defer s.Close()
	batch := []Event{lineEvent("r1", "a", 0), lineEvent("r2", "b", 0), lineEvent("r1", "c", 1), lineEvent("r1", "a", 0)}
	dup, err := s.Store(context.Background(), "", batch)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(dup) != "[false false false true]" {
		t.Fatalf("dup %v", dup)
	}
	dup, _ = s.Store(context.Background(), "", batch)
	if fmt.Sprint(dup) != "[true true true true]" {
		t.Fatalf("retry dup %v", dup)
	}
	fresh := NewFileSink(map[string]string{"": root})
	defer fresh.Close()
	dup, _ = fresh.Store(context.Background(), "", append(batch, lineEvent("r1", "d", 2)))
	if fmt.Sprint(dup) != "[true true true true false]" {
		t.Fatalf("new process dup %v", dup)
	}
	if n := len(readRun(t, filepath.Join(root, "events", "r1.ndjson"))); n != 3 {
		t.Fatalf("r1 holds %d events, want 3", n)
	}
	if n := len(readRun(t, filepath.Join(root, "events", "r2.ndjson"))); n != 1 {
		t.Fatalf("r2 holds %d events, want 1", n)
	}
}

// TestFileSinkCutsATornLine: a line half written by a process that died
// is cut off, and the retried event written whole after the complete ones.
func TestFileSinkCutsATornLine(t *testing.T) {
	root := t.TempDir()
	ev := filepath.Join(root, "events")
	if err := os.MkdirAll(ev, 0o755); err != nil {
		t.Fatal(err)
	}
	a, b := lineEvent("r", "a", 0), lineEvent("r", "b", 1)
	torn := string(a.Line) + "\n" + string(b.Line[:20])
	if err := os.WriteFile(filepath.Join(ev, "r.ndjson"), []byte(torn), 0o644); err != nil {
		t.Fatal(err)
	}
	s := NewFileSink(map[string]string{"": root})
	defer s.Close()
	dup, err := s.Store(context.Background(), "", []Event{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(dup) != "[true false]" {
		t.Fatalf("dup %v", dup)
	}
	got, _ := os.ReadFile(filepath.Join(ev, "r.ndjson"))
	if want := string(a.Line) + "\n" + string(b.Line) + "\n"; string(got) != want {
		t.Fatalf("file:\n%s\nwant\n%s", got, want)
	}
}

// TestFileSinkReplicasShareARoot: two sinks (two replicas on one volume)
// storing the same batches at once hold each event once.
func TestFileSinkReplicasShareARoot(t *testing.T) {
	root := t.TempDir()
	var batches [][]Event
	for b := range 20 {
		var batch []Event
		for i := range 25 {
			batch = append(batch, lineEvent("r", fmt.Sprintf("e%d-%d", b, i), b*25+i))
		}
		batches = append(batches, batch)
	}
	var wg sync.WaitGroup
	accepted := make([]int, 2)
	for k := range 2 {
		s := NewFileSink(map[string]string{"": root})
		defer s.Close()
		wg.Go(func() {
			for _, batch := range batches {
				dup, err := s.Store(context.Background(), "", batch)
				if err != nil {
					t.Error(err)
					return
				}
				for _, d := range dup {
					if !d {
						accepted[k]++
					}
				}
			}
		})
	}
	wg.Wait()
	evs := readRun(t, filepath.Join(root, "events", "r.ndjson"))
	if len(evs) != 500 || accepted[0]+accepted[1] != 500 {
		t.Fatalf("%d events stored, %d + %d accepted; want 500", len(evs), accepted[0], accepted[1])
	}
}

// TestFileSinkRefusesASymlinkedRun: a run file that is a symbolic link is
// not followed.
func TestFileSinkRefusesASymlinkedRun(t *testing.T) {
	root := t.TempDir()
	ev := filepath.Join(root, "events")
	os.MkdirAll(ev, 0o755)
	outside := filepath.Join(t.TempDir(), "target")
	os.WriteFile(outside, nil, 0o644)
	if err := os.Symlink(outside, filepath.Join(ev, "r.ndjson")); err != nil {
		t.Fatal(err)
	}
	s := NewFileSink(map[string]string{"": root})
	defer s.Close()
	_, err := s.Store(context.Background(), "", []Event{lineEvent("r", "a", 0)})
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("err %v", err)
	}
	if b, _ := os.ReadFile(outside); len(b) != 0 {
		t.Fatal("wrote through the link")
	}
}
