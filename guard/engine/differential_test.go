package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// diffPolicy sends questions every way: amounts above 2.00 to review,
// limits per payee and in all, a velocity rule, holds that lapse after ten
// minutes, and a cap on a caller's pending reviews.
const diffPolicy = `{"reviewAbove": "2.00", "perCounterpartyLimit": {"amount": "6.00", "windowHours": 1},
	"totalLimit": {"amount": "15.00", "windowHours": 1}, "velocity": {"perCounterparty": {"count": 4, "windowMinutes": 30}},
	"reservationMinutes": 10, "maxPendingReviewsPerCaller": 3}`

// TestIndexAndFoldAgree holds the PostgreSQL store's two read paths to
// each other: on one database, every question is answered first without
// recording (a dry run) by an engine that reads the reviews and receipts
// through the store's indexes with its locks, and by one whose store hides
// every index so that it reads the log's fold and the chains as the file
// store does; the two answers must be the same decision for the same
// reasons and the same review. Then one of them (in turn) answers it for
// real, and a reviewer decides some of the reviews it opens, so that the
// questions meet approvals to use, rejections that hold, limits and
// velocity windows filling and holds lapsing.
func TestIndexAndFoldAgree(t *testing.T) {
	pgtest.DSN(t)
	f := newFleet(t, pgKind, 0, diffPolicy)
	_, aliceKey, _ := ed25519.GenerateKey(rand.Reader)
	f.reviewers = reviewlog.Reviewers{"alice": aliceKey.Public().(ed25519.PublicKey)}
	indexed := f.fresh(t)
	folded := f.freshWith(t, func(s *pgstore.Store) reviewlog.Store { return foldOnly{s} })
	decider := Decider{Log: f.logs[0], Chains: &reviewlog.Chains{Signer: noa.NewKeySigner(aliceKey)}}
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(7, 8))
	payees := []string{sellerA, fmt.Sprintf("0x%040x", 0xb1), fmt.Sprintf("0x%040x", 0xb2), fmt.Sprintf("0x%040x", 0xb3)}
	amounts := []string{"0.10", "0.50", "1.00", "1.50", "2.50", "4.00"}
	seen := map[string]int{}
	decided := 0
	for step := range 240 {
		f.advance(time.Duration(rng.IntN(90)) * time.Second)
		caller := fmt.Sprintf("agent-%d", rng.IntN(3))
		q := Question{Counterparty: payees[rng.IntN(len(payees))], Amount: amounts[rng.IntN(len(amounts))]}
		a, err := indexed.CheckWith(ctx, caller, q, CheckOptions{DryRun: true})
		if err != nil {
			t.Fatalf("step %d, by index: %v", step, err)
		}
		b, err := folded.CheckWith(ctx, caller, q, CheckOptions{DryRun: true})
		if err != nil {
			t.Fatalf("step %d, by the fold: %v", step, err)
		}
		if a.Decision != b.Decision || a.ReviewID != b.ReviewID || !reflect.DeepEqual(a.Reasons, b.Reasons) {
			t.Fatalf("step %d, %s asks %s to %s: by index %s %v (review %q), by the fold %s %v (review %q)",
				step, caller, q.Amount, q.Counterparty, a.Decision, a.Reasons, a.ReviewID, b.Decision, b.Reasons, b.ReviewID)
		}
		e := indexed
		if step%2 == 1 {
			e = folded
		}
		got, err := e.Check(ctx, caller, q)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if got.Decision != a.Decision {
			t.Fatalf("step %d: answered %s %v, where the dry run said %s %v", step, got.Decision, got.Reasons, a.Decision, a.Reasons)
		}
		seen[got.Decision]++
		for _, r := range got.Reasons {
			seen["rule "+r.Rule]++
		}
		if got.Decision == guard.Review && got.ReviewID != "" && rng.IntN(3) > 0 {
			f.advance(time.Second)
			verdict := reviewlog.Approved
			if rng.IntN(3) == 0 {
				verdict = reviewlog.Rejected
			}
			if _, err := decider.Decide(ctx, got.ReviewID, verdict, "", "alice"); err == nil {
				decided++
			}
		}
	}
	// The walk met what it was meant to meet.
	for _, want := range []string{guard.Allow, guard.Review, "rule " + reviewlog.RuleHumanApproved} {
		if seen[want] == 0 {
			t.Errorf("no answer had %s: %v", want, seen)
		}
	}
	if decided == 0 {
		t.Errorf("no review was decided: %v", seen)
	}
	t.Logf("answers and rules met: %v; reviews decided: %d", seen, decided)
}
