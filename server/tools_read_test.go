package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// pagedRoot writes runs×ops payments (every seventh unsettled, every
// eleventh walked away), their clocks interleaved so that a listing mixes
// the runs, and returns the recorders and every "run/op" key.
func pagedRoot(t *testing.T, dir string, runs, ops int) ([]*simrec.Recorder, map[string]bool) {
	t.Helper()
	start := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	recs := make([]*simrec.Recorder, runs)
	keys := map[string]bool{}
	for r := range runs {
		id := fmt.Sprintf("run-%03d", r)
		rec, err := simrec.New(dir, id, start.Add(time.Duration(r)*137*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ps := make([]simrec.Payment, ops)
		for i := range ps {
			outcome := "settled"
			switch {
			case i%11 == 0:
				outcome = "walked-away"
			case i%7 == 0:
				outcome = "unsettled"
			}
			ps[i] = simrec.Payment{OperationID: fmt.Sprintf("op-%d", i), URL: "https://api.example.com/r",
				PayTo: fmt.Sprintf("0x%040x", i%9+1), Amount: "10000", Outcome: outcome}
			keys[id+"/"+ps[i].OperationID] = true
		}
		if err := rec.PayAll(ps); err != nil {
			t.Fatal(err)
		}
		recs[r] = rec
	}
	return recs, keys
}

type listPage struct {
	Operations []struct {
		RunID        string `json:"run_id"`
		OperationID  string `json:"operation_id"`
		Completeness string `json:"completeness"`
		LastEventAt  string `json:"last_event_at"`
	} `json:"operations"`
	RunsScanned int    `json:"runs_scanned"`
	NextCursor  string `json:"next_cursor"`
}

func callList(t *testing.T, s *Server, args map[string]any) (listPage, *mcp.CallToolResult) {
	t.Helper()
	h := s.wrap("list_operations", s.listOperations)
	res, err := h(context.Background(), mcp.CallToolRequest{Params: mcp.CallToolParams{Arguments: args}})
	if err != nil {
		t.Fatal(err)
	}
	var p listPage
	if !res.IsError {
		raw, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(raw, &p); err != nil {
			t.Fatal(err)
		}
	}
	return p, res
}

// walk reads every page and returns the keys in the order seen; between
// pages it calls between(page number).
func walk(t *testing.T, s *Server, args map[string]any, between func(int)) []string {
	t.Helper()
	var seen []string
	var prevAt string
	for page := 0; ; page++ {
		a := map[string]any{}
		for k, v := range args {
			a[k] = v
		}
		p, res := callList(t, s, a)
		if res.IsError {
			t.Fatalf("page %d: %v", page, res.Content)
		}
		for _, op := range p.Operations {
			if prevAt != "" && op.LastEventAt > prevAt {
				t.Fatalf("page %d: %s/%s (%s) is newer than the row before it (%s)", page, op.RunID, op.OperationID, op.LastEventAt, prevAt)
			}
			prevAt = op.LastEventAt
			seen = append(seen, op.RunID+"/"+op.OperationID)
		}
		if p.NextCursor == "" {
			return seen
		}
		if len(p.Operations) != args["limit"] {
			t.Fatalf("page %d: %d rows and a next cursor, want %v", page, len(p.Operations), args["limit"])
		}
		args["cursor"] = p.NextCursor
		if between != nil {
			between(page)
		}
	}
}

func exactlyOnce(t *testing.T, seen []string, want map[string]bool) {
	t.Helper()
	count := map[string]int{}
	for _, k := range seen {
		count[k]++
		if count[k] == 2 {
			t.Errorf("%s listed twice", k)
		}
		if !want[k] {
			t.Errorf("%s listed but did not exist when the first page was read", k)
		}
	}
	for k := range want {
		if count[k] == 0 {
			t.Errorf("%s never listed", k)
		}
	}
}

// Every page of a large root, with and without filters, lists every
// operation exactly once, newest first; and so it does while one run grows
// between pages with new operations and with late events of operations not
// listed yet (which makes them the newest, so a position alone would skip
// them).
func TestListPagesSeeEveryOperationOnce(t *testing.T) {
	dir := t.TempDir()
	const runs, ops = 12, 700
	recs, keys := pagedRoot(t, dir, runs, ops)
	s := newTestServer(t, dir)

	t.Run("unchanged root", func(t *testing.T) {
		seen := walk(t, s, map[string]any{"limit": 97}, nil)
		if len(seen) != runs*ops {
			t.Errorf("%d rows, want %d", len(seen), runs*ops)
		}
		exactlyOnce(t, seen, keys)
	})

	t.Run("partial only, one run", func(t *testing.T) {
		want := map[string]bool{}
		for i := 0; i < ops; i++ {
			if i%11 == 0 || i%7 == 0 {
				want[fmt.Sprintf("run-004/op-%d", i)] = true
			}
		}
		exactlyOnce(t, walk(t, s, map[string]any{"limit": 13, "completeness": "partial", "run": "run-004"}, nil), want)
	})

	t.Run("a run grows between pages", func(t *testing.T) {
		grow := recs[runs-1]
		extra := 0
		seen := walk(t, s, map[string]any{"limit": 100}, func(page int) {
			// Late events for an operation of the oldest part of the run
			// (not listed yet), and two new operations.
			late := fmt.Sprintf("op-%d", page%50)
			ps := []simrec.Payment{
				{OperationID: late, URL: "https://api.example.com/r", PayTo: "0x00000000000000000000000000000000000000aa", Amount: "1", Outcome: "settled"},
				{OperationID: fmt.Sprintf("new-%d-a", page), URL: "https://api.example.com/r", PayTo: "0x00000000000000000000000000000000000000aa", Amount: "1", Outcome: "settled"},
				{OperationID: fmt.Sprintf("new-%d-b", page), URL: "https://api.example.com/r", PayTo: "0x00000000000000000000000000000000000000aa", Amount: "1", Outcome: "unsettled"},
			}
			if err := grow.PayAll(ps); err != nil {
				t.Fatal(err)
			}
			extra += 2
		})
		exactlyOnce(t, seen, keys)
		// A fresh listing sees the new operations, and the late ones first.
		p, _ := callList(t, s, map[string]any{"limit": 100})
		if got := len(p.Operations); got != 100 || p.Operations[0].RunID != fmt.Sprintf("run-%03d", runs-1) {
			t.Fatalf("fresh first page: %d rows, first %+v", got, p.Operations[0])
		}
		all := walk(t, s, map[string]any{"limit": 100}, nil)
		if len(all) != runs*ops+extra {
			t.Errorf("after growth: %d rows, want %d", len(all), runs*ops+extra)
		}
	})
}

func TestListCursorRefusals(t *testing.T) {
	dir := t.TempDir()
	pagedRoot(t, dir, 2, 30)
	s := newTestServer(t, dir)
	p, _ := callList(t, s, map[string]any{"limit": 5})
	if p.NextCursor == "" {
		t.Fatal("no next_cursor on a partial page")
	}
	cases := []struct {
		name string
		args map[string]any
		want string
	}{
		{"other arguments", map[string]any{"cursor": p.NextCursor, "completeness": "full"}, "other arguments"},
		{"not base64", map[string]any{"cursor": "%%%"}, "not one list_operations returned"},
		{"not deflate", map[string]any{"cursor": "aGVsbG8"}, "not one list_operations returned"},
		{"cut short", map[string]any{"cursor": p.NextCursor[:len(p.NextCursor)/2]}, "not one list_operations returned"},
		{"not a string", map[string]any{"cursor": 7}, "cursor must be a string"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, res := callList(t, s, c.args)
			text := fmt.Sprint(res.Content)
			if !res.IsError || !strings.Contains(text, c.want) {
				t.Errorf("isError=%v %s, want an error containing %q", res.IsError, text, c.want)
			}
		})
	}
	// The last page has no next_cursor.
	all := walk(t, s, map[string]any{"limit": 100}, nil)
	if len(all) != 60 {
		t.Errorf("%d rows, want 60", len(all))
	}
}

// The same walk over the large root of ../shared/bench (60 runs of
// gen_run.py, ~84k operations, ~300k events), generated when HAIA_SHARED is
// set and python3 is there, while the newest run grows between pages.
func TestListPagesLargeRoot(t *testing.T) {
	shared := os.Getenv("HAIA_SHARED")
	if shared == "" || testing.Short() {
		t.Skip("HAIA_SHARED not set (or -short): skipping the walk over the generated large root")
	}
	dir := t.TempDir()
	for n := range 60 {
		out := filepath.Join(dir, "events", fmt.Sprintf("17940000%05d.ndjson", n))
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("python3", filepath.Join(shared, "bench", "gen_run.py"), out, "1400", strconv.Itoa(n))
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("cannot generate the large root with python3: %v: %s", err, msg)
		}
	}
	s := newTestServer(t, dir)
	// Every operation of the first listing: the keys the walk must see.
	keys := map[string]bool{}
	for _, k := range walk(t, s, map[string]any{"limit": 100}, nil) {
		keys[k] = true
	}
	if len(keys) != 60*1400 {
		t.Fatalf("%d operations listed, want %d", len(keys), 60*1400)
	}
	grow, err := simrec.New(dir, "1794000000059", time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	seen := walk(t, s, map[string]any{"limit": 100}, func(page int) {
		ps := []simrec.Payment{
			{OperationID: fmt.Sprintf("op-%07d", 30*page), URL: "https://api.example.com/r", PayTo: "0x00000000000000000000000000000000000000aa", Amount: "1", Outcome: "settled"},
			{OperationID: fmt.Sprintf("late-%d", page), URL: "https://api.example.com/r", PayTo: "0x00000000000000000000000000000000000000aa", Amount: "1", Outcome: "unsettled"},
		}
		if err := grow.PayAll(ps); err != nil {
			t.Fatal(err)
		}
	})
	exactlyOnce(t, seen, keys)
	p, _ := callList(t, s, map[string]any{"limit": 1})
	t.Logf("%d pages; a cursor over 60 runs is %d bytes", len(seen)/100, len(p.NextCursor))
}
