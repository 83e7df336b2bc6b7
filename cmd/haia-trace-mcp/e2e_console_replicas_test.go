package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// The PostgreSQL store records the console's used sign-ins for every
// replica.
var _ console.SignIns = (*pgstore.Store)(nil)

// A sign-in assertion signs in once, on whichever replica it reaches: two
// real replicas on one PostgreSQL store, behind one console URL (each
// reached as a load balancer would send a request to it). An assertion
// finished on one is refused when replayed on the other, either way
// round, and on the first again; sign-ins begun on one and finished on
// the other still work.
func TestConsoleSignInOnceAcrossReplicas(t *testing.T) {
	dsn := e2eDatabase(t)
	root := loopRoot(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "signing.pem")
	runCLI(t, "chain", "checkpoint", "none", "--dir", root, "--key-file", key) // one key for both
	reviewers := filepath.Join(dir, "reviewers.json")
	portA, portB := freePort(t), freePort(t)
	base := "http://localhost:" + portA + "/console/"
	for _, port := range []string{portA, portB} {
		startHTTPBinary(t, "--dir", root, "--key-file", key, "--store", dsn, "--http-insecure-no-auth", "--reviewers", reviewers,
			"--console", "--console-addr", "127.0.0.1:"+port, "--console-url", base)
	}
	// Enrolled through replica A (enrolment is held by the replica that
	// served the link).
	a := enrolThroughCommand(t, base, reviewers, key, "alice")
	replica := map[string]*softauthn.Browser{"A": a}
	b, err := softauthn.NewBrowserThrough(base, "127.0.0.1:"+portB, a.Auth)
	if err != nil {
		t.Fatal(err)
	}
	replica["B"] = b
	if err := b.SignIn(); err != nil {
		t.Fatalf("sign in on replica B: %v", err)
	}
	// assertion begins a sign-in on replica on and answers it.
	assertion := func(on string) map[string]any {
		t.Helper()
		code, opts, err := replica[on].Post("api/login/begin", map[string]any{})
		if err != nil || code != http.StatusOK {
			t.Fatalf("begin on %s: %d %v %v", on, code, opts, err)
		}
		pk, _ := opts["publicKey"].(map[string]any)
		s, _ := pk["challenge"].(string)
		ch, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		x, err := a.Auth.Assert(a.RPID, a.Origin, ch)
		if err != nil {
			t.Fatal(err)
		}
		j, _ := x.JSON()
		return map[string]any{"credential": json.RawMessage(j)}
	}
	for _, tc := range []struct{ begin, first, replays string }{
		{"A", "A", "BA"}, {"A", "B", "AB"}, {"B", "A", "BA"}, {"B", "B", "AB"},
	} {
		body := assertion(tc.begin)
		if code, res, err := replica[tc.first].Post("api/login/finish", body); err != nil || code != http.StatusOK {
			t.Fatalf("begun on %s, finished on %s: %d %v %v", tc.begin, tc.first, code, res, err)
		}
		for _, on := range tc.replays {
			code, res, err := replica[string(on)].Post("api/login/finish", body)
			if err != nil || code != http.StatusForbidden || !strings.Contains(fmt.Sprint(res["error"]), "used already") {
				t.Fatalf("begun on %s, finished on %s, replayed on %c: %d %v %v; want 403, used already", tc.begin, tc.first, on, code, res, err)
			}
		}
	}
}
