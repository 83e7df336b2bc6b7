package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

// collectAfter posts collect with ?wait=wait and reports the answer and how
// long it took.
func (g *rig) collectWait(tok, wait string) (int, map[string]any, time.Duration) {
	start := time.Now()
	u := g.base + "api/enrol/collect"
	if wait != "" {
		u += "?wait=" + url.QueryEscape(wait)
	}
	resp, err := http.Post(u, "application/json", strings.NewReader(fmt.Sprintf(`{"token":%q}`, tok)))
	if err != nil {
		g.t.Error(err)
		return 0, nil, time.Since(start)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, time.Since(start)
}

// A collect request with ?wait is held until the reviewer registers (and
// answers at once then), or until the wait ends with "waiting", naming the
// console's origin and relying party; without ?wait it answers at once, as
// before; a wait outside 0..20 seconds is refused.
func TestConsoleCollectWaitsForTheRegistration(t *testing.T) {
	g := newRig(t)
	tok, err := console.NewEnrolToken(g.enrolKey, "pat", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, out, took := g.collectWait(tok, "")
	if code != http.StatusAccepted || took > time.Second || out["origin"] != g.origin || out["rp_id"] != g.rpID {
		t.Fatalf("collect without wait: %d %v in %v", code, out, took)
	}
	code, _, took = g.collectWait(tok, "1")
	if code != http.StatusAccepted || took < time.Second {
		t.Fatalf("collect?wait=1 with nobody registering: %d in %v, want 202 after a second", code, took)
	}
	for _, bad := range []string{"21", "-1", "2s", "x"} {
		if code, out, _ := g.collectWait(tok, bad); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(out["error"]), "wait") {
			t.Errorf("collect?wait=%s: %d %v, want 400 naming wait", bad, code, out)
		}
	}

	// Held across the registration: the answer comes when the reviewer
	// finishes, not when the wait ends.
	type answer struct {
		code int
		out  map[string]any
		took time.Duration
	}
	got := make(chan answer, 1)
	go func() {
		code, out, took := g.collectWait(tok, "20")
		got <- answer{code, out, took}
	}()
	time.Sleep(300 * time.Millisecond)
	b := g.browser()
	a, _ := softauthn.New()
	if code, _ := b.get("enrol?t=" + url.QueryEscape(tok)); code != 200 {
		t.Fatalf("enrol page: %d", code)
	}
	code, opts := b.post("api/enrol/begin", map[string]string{"token": tok})
	if code != 200 {
		t.Fatalf("enrol begin: %d %v", code, opts)
	}
	att, err := a.Attestation(g.rpID, g.origin, challengeOf(t, opts))
	if err != nil {
		t.Fatal(err)
	}
	registered := time.Now()
	if code, res := b.post("api/enrol/finish", map[string]any{"token": tok, "credential": json.RawMessage(att)}); code != 200 {
		t.Fatalf("enrol finish: %d %v", code, res)
	}
	select {
	case ans := <-got:
		if ans.code != http.StatusOK || ans.out["credential"] == nil || ans.took < 300*time.Millisecond || time.Since(registered) > 5*time.Second {
			t.Fatalf("the held collect: %d %v after %v", ans.code, ans.out, ans.took)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the held collect did not answer when the reviewer registered")
	}
	if code, _, took := g.collectWait(tok, "5"); code != http.StatusGone || took > time.Second {
		t.Fatalf("collect after it was collected: %d in %v, want 410 at once", code, took)
	}
}
