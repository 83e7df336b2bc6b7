package main

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestAuthorizeCrashSafety kills (SIGKILL) the server in the middle of
// authorize_payment calls, round after round, on the file store, where an
// authorization is signed and recorded in the section that allows it (the
// entry, then the two receipts, then the log line). Every signature an
// agent was given has its authorization receipt in the chain and its line
// in the review log; audit finds at worst what a crash leaves (exit 0 or
// 4, never 2); and a fresh server still allows a payment to a new seller:
// no crash left a receipt without its entry, which would answer review
// (reservation_unverified) for ever.
func TestAuthorizeCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("crash rounds take a while; skipped with -short")
	}
	root := t.TempDir()
	key := filepath.Join(t.TempDir(), "key.pem")
	payerKey := writeSecret(t, "payer.key", e2ePayerKey)
	rng := rand.New(rand.NewSource(34))
	var (
		mu     sync.Mutex
		signed = map[string]string{} // authorization receipt -> decision receipt
		seller int
	)
	next := func() int { mu.Lock(); defer mu.Unlock(); seller++; return seller }
	const rounds = 5
	for round := 0; round < rounds; round++ {
		cmd, cs, ctx, cancel := killableSession(t, round, "--dir", root, "--key-file", key, "--payer-key", payerKey, "--log-level", "error")
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next()
					res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "authorize_payment", Arguments: map[string]any{
						"payment_required": e2ePaymentRequiredAt(fmt.Sprintf("https://c%d.example/data", i), "10000", fmt.Sprintf("0x%040x", 0x1000+i))}})
					if err != nil {
						return // killed
					}
					var a authorizeAnswer
					b, _ := json.Marshal(res.StructuredContent)
					if res.IsError || json.Unmarshal(b, &a) != nil || a.Authorization == nil {
						continue
					}
					mu.Lock()
					signed[a.Authorization.ReceiptID] = a.ReceiptID
					mu.Unlock()
				}
			}()
		}
		time.Sleep(time.Duration(150+rng.Intn(300)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		wg.Wait()
		cs.Close()
		cancel()
	}
	if len(signed) == 0 {
		t.Fatal("no authorization was given at all; the test proved nothing")
	}
	chain, _ := chainFile(t, root)
	receipts, err := os.ReadFile(chain)
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(filepath.Join(root, "guard", "decisions.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	for auth, decision := range signed {
		if !strings.Contains(string(receipts), `"id":"`+auth+`"`) || !strings.Contains(string(receipts), `"id":"`+decision+`"`) {
			t.Errorf("authorization %s (decision %s) was given but its receipts are not both in the chain", auth, decision)
		}
		if !strings.Contains(string(log), `"receipt":"`+auth+`"`) {
			t.Errorf("authorization %s was given but the review log has no line of it", auth)
		}
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", root, "--key-file", key); code != 0 && code != 4 {
		t.Fatalf("audit after the crashes: exit %d\n%s\n%s", code, out, errOut)
	}
	cs := mcpSession(t, &lockedBuffer{}, "--dir", root, "--key-file", key, "--payer-key", payerKey)
	var a authorizeAnswer
	decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{
		"payment_required": e2ePaymentRequiredAt("https://after.example/data", "10000", fmt.Sprintf("0x%040x", 0xafe))}), &a)
	if a.Decision != "allow" || a.Authorization == nil {
		t.Fatalf("after the crashes a new seller is not allowed: %+v", a)
	}
	t.Logf("%d rounds: %d authorizations given", rounds, len(signed))
}
