package console_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
)

// The two-person rule in the console: a review that needs two approvals
// shows how far it is, on the queue and on its page; a reviewer's
// passkey approval counts once, and a second reviewer's completes it.
func TestConsoleTwoPersonRule(t *testing.T) {
	g := newRig(t)
	g.approvals = 2
	alice, _ := softauthn.New()
	bob, _ := softauthn.New()
	ab, bb := g.browser(), g.browser()
	g.enrol(ab, "alice", alice)
	g.enrol(bb, "bob", bob)
	r := g.ask(7).Review
	if r.Terms == nil || r.Terms.Approvals != 2 {
		t.Fatalf("the review's terms: %+v", r.Terms)
	}
	for _, s := range []struct {
		b *browser
		a *softauthn.Authenticator
	}{{ab, alice}, {bb, bob}} {
		if code, res := g.signIn(s.b, s.a); code != 200 {
			t.Fatalf("sign in: %d %v", code, res)
		}
	}
	if _, code, res := g.decide(ab, r.ID, "approved", "", alice); code != 200 || res["status"] != "pending" {
		t.Fatalf("alice's approval: %d %v, want it recorded and the review pending", code, res)
	}
	_, page := bb.get("reviews/" + r.ID)
	if !strings.Contains(page, "Two-person rule: <strong>1 of 2 approvals (alice)</strong>") {
		t.Fatalf("the review's page does not say how far it is:\n%s", page)
	}
	if _, queue := bb.get(""); !strings.Contains(queue, `<span class="quorum">1 of 2 approvals (alice)</span>`) {
		t.Fatalf("the queue does not say how far it is:\n%s", queue)
	}
	if _, code, res := g.decide(ab, r.ID, "approved", "", alice); code == 200 || !strings.Contains(strings.ToLower(res["error"].(string)), "counts once") {
		t.Fatalf("alice's second approval: %d %v, want it refused", code, res)
	}
	// Alice's own key is alice too: her approval with it counts once.
	pub, sk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reviewlog.AddReviewer(g.reviewers, "alice", pub); err != nil {
		t.Fatal(err)
	}
	byKey := engine.Decider{Log: g.log, Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(sk), Tenant: "t1"}}
	if _, err := byKey.Decide(context.Background(), r.ID, reviewlog.Approved, "", "alice"); !errors.Is(err, reviewlog.ErrAlreadyDecided) || !strings.Contains(err.Error(), "counts once") {
		t.Fatalf("alice's approval with her key after her passkey's: %v, want it refused", err)
	}
	// Signed by hand with her key, it is read, and counted once.
	rv, err := g.log.Get(context.Background(), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	rv.Status, rv.DecidedBy, rv.DecidedAt, rv.Note = reviewlog.Approved, "alice", time.Now().UTC().Format(time.RFC3339Nano), ""
	draft, err := engine.HumanDecisionDraft(rv)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.log.WithLock(context.Background(), func(tx reviewlog.Tx) error {
		_, err := byKey.Chains.Append(context.Background(), tx.Store, draft)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := g.log.Get(context.Background(), r.ID); err != nil || got.Status != reviewlog.Pending || reviewlog.QuorumText(got) != "1 of 2 approvals (alice)" || !strings.Contains(strings.Join(got.Integrity, " "), "counts once") {
		t.Fatalf("alice's passkey and key approvals: %+v %v, want them counted once", got, err)
	}
	if _, code, res := g.decide(bb, r.ID, "approved", "looks right", bob); code != 200 || res["status"] != "approved" {
		t.Fatalf("bob's approval: %d %v", code, res)
	}
	if _, page := ab.get("reviews/" + r.ID); !strings.Contains(page, `<span class="quorum">2 of 2 approvals (alice, bob)</span>`) {
		t.Fatalf("the approved review's page:\n%s", page)
	}
}
