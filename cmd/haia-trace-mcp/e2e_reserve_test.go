package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The concurrency proof of reservations over real binaries: ten questions
// of 1.00 asked at once under perCounterpartyLimit 5.00, totalLimit 5.00
// and velocity 3 per hour get exactly three allow — spread over three
// server processes on one Trace root (file store), and over three HTTP
// replicas on one PostgreSQL store.
const reservePolicy = `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "5.00"}, "totalLimit": {"amount": "5.00"},
  "velocity": {"perCounterparty": {"count": 3, "windowMinutes": 60}}}`

const freshPayee = "0xf5e5000000000000000000000000000000000007"

func writePolicyFile(t *testing.T, policy string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "haia-guard.config.json")
	if err := os.WriteFile(p, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// burst asks the same question ten times at once over the sessions and
// counts decisions; every allow must say what it reserves.
func burst(t *testing.T, sessions []*mcp.ClientSession) map[string]int {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	start := make(chan struct{})
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := sessions[i%len(sessions)].CallTool(context.Background(), &mcp.CallToolParams{Name: "check_before_pay",
				Arguments: map[string]any{"counterparty": freshPayee, "amount": "1.00"}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil || res.IsError {
				t.Errorf("check_before_pay: %v %s", err, resultText(res))
				return
			}
			var a struct {
				Decision    string          `json:"decision"`
				Reservation json.RawMessage `json:"reservation"`
			}
			raw, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(raw, &a); err != nil {
				t.Errorf("answer: %v", err)
				return
			}
			if a.Decision == "allow" && (len(a.Reservation) == 0 || !strings.Contains(resultText(res), "reserved: this allow reserves 1 USDC")) {
				t.Errorf("an allow that does not say what it reserves: %s", resultText(res))
			}
			got[a.Decision]++
		}()
	}
	close(start)
	wg.Wait()
	return got
}

func TestReservationsAcrossProcessesEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing.pem")
	runCLI(t, "chain", "checkpoint", "none", "--dir", root, "--key-file", key) // one key for every process
	cfg := writePolicyFile(t, reservePolicy)
	var sessions []*mcp.ClientSession
	for range 3 {
		sessions = append(sessions, mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg))
	}
	if got := burst(t, sessions); got["allow"] != 3 || got["review"] != 7 {
		t.Fatalf("3 processes on one root: %v, want 3 allow and 7 review", got)
	}
	// A dry run now says review, and records nothing.
	res := callTool(t, sessions[0], "check_before_pay", map[string]any{"counterparty": freshPayee, "amount": "1.00", "dry_run": true})
	if text := resultText(res); res.IsError || !strings.HasPrefix(text, "DRY RUN") || !strings.Contains(text, "Decision: REVIEW") || !strings.Contains(text, "3 amounts held by earlier allows") {
		t.Fatalf("dry run: %s", text)
	}
	// The review that question opens shows the reservations bearing on it,
	// to the agent and to the human.
	var a struct {
		ReviewID string `json:"review_id"`
	}
	decodeStructured(t, callTool(t, sessions[1], "check_before_pay", map[string]any{"counterparty": freshPayee, "amount": "1.00"}), &a)
	if a.ReviewID == "" {
		t.Fatal("no review opened")
	}
	var st struct {
		Reservations  []map[string]any `json:"reservations"`
		ReservedTotal int              `json:"reserved_total"`
		Moot          bool             `json:"moot"`
	}
	res = callTool(t, sessions[2], "get_review_status", map[string]any{"review_id": a.ReviewID})
	decodeStructured(t, res, &st)
	if len(st.Reservations) != 3 || st.ReservedTotal != 3 || st.Moot || !strings.Contains(resultText(res), "Reservations held to anyone: 3") {
		t.Fatalf("get_review_status: %+v %s", st, resultText(res))
	}
	out, errOut, code := runCLI(t, "review", "show", a.ReviewID, "--dir", root, "--json")
	var shown struct {
		Reservations  []map[string]any `json:"reservations"`
		ReservedTotal int              `json:"reserved_total"`
	}
	if err := json.Unmarshal([]byte(out), &shown); code != 0 || err != nil || len(shown.Reservations) != 3 || shown.ReservedTotal != 3 {
		t.Fatalf("review show --json: %d %v %s %s", code, err, out, errOut)
	}
	if out, _, _ := runCLI(t, "review", "show", a.ReviewID, "--dir", root); !strings.Contains(out, "reservations: 3 amounts held to anyone") || !strings.Contains(out, "1.00 USDC to "+strings.ToLower(freshPayee)) {
		t.Fatalf("review show: %s", out)
	}
}

func TestReservationsAcrossPostgresReplicasEndToEnd(t *testing.T) {
	dsn := e2eDatabase(t)
	rs := startReplicas(t, dsn, 3, "--guard-config", writePolicyFile(t, reservePolicy))
	if got := burst(t, rs.sessions); got["allow"] != 3 || got["review"] != 7 {
		t.Fatalf("3 replicas on one PostgreSQL store: %v, want 3 allow and 7 review", got)
	}
}
