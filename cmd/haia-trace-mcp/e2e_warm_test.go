package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// TestNotReadyWhileTheRootIsReadAtTheStart: a server over HTTP reads its
// Trace root before its first question. One whose root takes longer than
// the wait before serving (here four runs, each read slowly by the test
// hook) serves /healthz at once but answers /readyz 503, saying how far
// the reading went, until every run is read; then it is ready and lists
// every run's operations. A root read in time is read before it serves.
func TestNotReadyWhileTheRootIsReadAtTheStart(t *testing.T) {
	root := filepath.Join(t.TempDir(), ".trace")
	for i := range 4 {
		rec, err := simrec.New(root, fmt.Sprintf("run-%d", i+1), time.Date(2026, 7, 24, 9, i, 0, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.Pay(simrec.Payment{OperationID: fmt.Sprintf("op-%d", i+1), URL: "https://a.example.com/report", PayTo: sellerA, Amount: "250000", Outcome: "settled"}); err != nil {
			t.Fatal(err)
		}
	}
	key := filepath.Join(t.TempDir(), "signing.pem")
	p := startHTTPCommandEnv(t, []string{readDelayEnv + "=1500ms"}, "--http", "127.0.0.1:0", "--dir", root, "--key-file", key, "--http-insecure-no-auth")
	if code, body := getText(t, p.base+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz while the root is read: %d %q", code, body)
	}
	code, body := getText(t, p.base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "the Trace root's runs are being read since the start (") || !strings.Contains(body, " of 4 read)") {
		t.Fatalf("readyz while the root is read: %d %q", code, body)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		code, body = getText(t, p.base+"/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %d %q\n%s", code, body, p.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cs, err := httpSession(t, p.resource, func() string { return "" })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	defer cs.Close()
	res := callTool(t, cs, "list_operations", map[string]any{"limit": 10})
	text := resultText(res)
	for i := range 4 {
		if !strings.Contains(text, fmt.Sprintf("op-%d", i+1)) {
			t.Errorf("list_operations lacks op-%d: %s", i+1, text)
		}
	}

	// A restart finds the index saved and is ready as it serves.
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d\n%s", code, p.logs())
	}
	again := startHTTPCommandEnv(t, []string{readDelayEnv + "=1500ms"}, "--http", "127.0.0.1:0", "--dir", root, "--key-file", key, "--http-insecure-no-auth")
	if code, body := getText(t, again.base+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz after a restart: %d %q\n%s", code, body, again.logs())
	}
}
