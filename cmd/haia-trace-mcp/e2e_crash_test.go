package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCrashSafety kills (SIGKILL) server and CLI processes in the middle of
// decisions, again and again, then checks that the review log folds, that
// no decision that was answered is missing, and that the chain verifies.
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("crash-safety rounds take a while; skipped with -short")
	}
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "key.pem")
	rng := rand.New(rand.NewSource(7))
	var mu sync.Mutex
	answeredReviews := map[string]bool{}
	answeredReceipts := map[string]bool{}
	decided := map[string]string{} // review id -> status the CLI reported as done

	const rounds = 6
	for round := 0; round < rounds; round++ {
		cmd, cs, ctx, cancel := killableSession(t, round, "--dir", root, "--key-file", key, "--log-level", "error")
		var wg sync.WaitGroup
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{
						"counterparty": sellerB, "amount": fmt.Sprintf("0.%d%d%d", round, w, i%10),
					}})
					if err != nil || res.IsError {
						return // the server was killed under us
					}
					var ans checkAnswer
					b, _ := json.Marshal(res.StructuredContent)
					if json.Unmarshal(b, &ans) != nil {
						return
					}
					mu.Lock()
					if ans.ReviewID != "" { // past the pending cap a question is blocked and opens none
						answeredReviews[ans.ReviewID] = true
					}
					answeredReceipts[ans.ReceiptID] = true
					mu.Unlock()
				}
			}()
		}
		// Humans decide some reviews at the same time; some CLI processes are killed too.
		time.Sleep(time.Duration(100+rng.Intn(250)) * time.Millisecond)
		mu.Lock()
		var ids []string
		for id := range answeredReviews {
			if _, done := decided[id]; !done {
				ids = append(ids, id)
			}
		}
		mu.Unlock()
		for i, id := range ids {
			if i >= 3 {
				break
			}
			verb := "approve"
			if i%2 == 1 {
				verb = "reject"
			}
			c := exec.Command(binPath, "review", verb, id, "--dir", root)
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			if i == 2 {
				time.Sleep(time.Duration(rng.Intn(20)) * time.Millisecond)
				c.Process.Signal(syscall.SIGKILL)
				c.Wait()
				continue
			}
			if err := c.Wait(); err == nil {
				decided[id] = map[string]string{"approve": "approved", "reject": "rejected"}[verb]
			}
		}
		time.Sleep(time.Duration(rng.Intn(150)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		wg.Wait()
		cs.Close()
		cancel()
	}

	out, errOut, code := runCLI(t, "review", "list", "--all", "--json", "--dir", root)
	if code != 0 {
		t.Fatalf("the review log does not fold after the crashes: %d %s", code, errOut)
	}
	var list struct {
		Reviews []struct {
			ID     string `json:"review_id"`
			Status string `json:"status"`
		} `json:"reviews"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	have := map[string]string{}
	for _, r := range list.Reviews {
		have[r.ID] = r.Status
	}
	for id := range answeredReviews {
		if _, ok := have[id]; !ok {
			t.Errorf("review %s was answered to the agent but is not in the log", id)
		}
	}
	for id, status := range decided {
		if have[id] != status {
			t.Errorf("review %s: the CLI reported %s, the log says %q", id, status, have[id])
		}
	}
	chain, n := chainFile(t, root)
	data, _ := os.ReadFile(chain)
	for id := range answeredReceipts {
		if !strings.Contains(string(data), `"id":"`+id+`"`) {
			t.Errorf("receipt %s was answered but is not in the chain", id)
		}
	}
	if got, code := verifyChain(t, root, chain); code != 0 {
		t.Fatalf("the chain does not verify after the crashes: %d %s", code, got)
	}
	t.Logf("%d rounds: %d reviews answered, %d decided by the CLI, %d receipts in the chain", rounds, len(answeredReviews), len(decided), n)
	if len(answeredReviews) == 0 {
		t.Fatal("no decision was answered at all; the test proved nothing")
	}
}

// killableSession starts the real binary with args and connects an MCP
// session to it through its own process, which the caller kills
// (SIGKILL) in the middle of its calls: round names the attempt in a
// failure. The caller cancels ctx and closes cs once the process is gone.
func killableSession(t *testing.T, round int, args ...string) (*exec.Cmd, *mcp.ClientSession, context.Context, context.CancelFunc) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	client := mcp.NewClient(&mcp.Implementation{Name: "crash", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		cancel()
		t.Fatalf("round %d: connect: %v", round, err)
	}
	return cmd, cs, ctx, cancel
}
