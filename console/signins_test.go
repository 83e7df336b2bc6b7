package console_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

// ledger is a console.SignIns in memory, shared by the consoles given it
// (as replicas share a database), or failing.
type ledger struct {
	mu   sync.Mutex
	used map[string]time.Time
	err  error
}

func (l *ledger) UseSignIn(_ context.Context, id []byte, exp time.Time) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false, l.err
	}
	if len(id) != 32 {
		return false, errors.New("not a SHA-256")
	}
	if _, ok := l.used[string(id)]; ok {
		return false, nil
	}
	l.used[string(id)] = exp
	return true, nil
}

// With Config.SignIns, a sign-in is recorded there, only once its
// assertion holds; a ledger that cannot record refuses the sign-in (no
// session) rather than let a replay through.
func TestConsoleSignInsRecordedInTheLedger(t *testing.T) {
	l := &ledger{used: map[string]time.Time{}}
	g := newRig(t, func(c *console.Config) { c.SignIns = l })
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	if code, res := g.signIn(b, alice); code != http.StatusOK {
		t.Fatalf("sign in: %d %v", code, res)
	}
	if len(l.used) != 1 {
		t.Fatalf("the ledger holds %d sign-ins, want 1", len(l.used))
	}
	// A stranger's assertion over a fresh challenge writes nothing.
	mallory, _ := softauthn.New()
	if code, _ := g.signIn(g.browser(), mallory); code == http.StatusOK || len(l.used) != 1 {
		t.Fatalf("a stranger's sign-in: %d, ledger %d rows", code, len(l.used))
	}
	l.err = errors.New("database down")
	c := g.browser()
	code, res := g.signIn(c, alice)
	if msg, _ := res["error"].(string); code != http.StatusServiceUnavailable || !strings.Contains(msg, "could not be recorded") {
		t.Fatalf("sign-in with the ledger down: %d %v, want 503", code, res)
	}
	if code, page := c.get(""); code != http.StatusOK || !strings.Contains(page, "Sign in with passkey") {
		t.Fatalf("a session was set though the sign-in was refused: %d", code)
	}
}
