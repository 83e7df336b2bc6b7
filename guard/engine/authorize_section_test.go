package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// signingTerms are testTerms whose Sign gives an authorization record of
// the decision receipt it is asked for, or fails with fail.
func signingTerms(vb time.Time, fail error, calls *int) AuthorizationTerms {
	t := testTerms(vb)
	t.Sign = func(_ context.Context, s Signing) (reviewlog.Authorized, [32]byte, error) {
		*calls++
		if fail != nil {
			return reviewlog.Authorized{}, [32]byte{}, fail
		}
		var digest [32]byte
		copy(digest[:], s.DecisionReceipt)
		return reviewlog.Authorized{
			DecisionReceipt: s.DecisionReceipt, ReviewID: s.ReviewID, Network: "eip155:8453", Token: "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
			Name: "USD Coin", Version: "2", From: testPayer, To: strings.ToLower(sellerA), Value: "1500000",
			ValidAfter: "0", ValidBefore: fmt.Sprint(vb.Unix()), Nonce: t.Nonce(s.DecisionReceipt),
			Signature: "0x" + strings.Repeat("ab", 65), Digest: fmt.Sprintf("0x%064x", digest[:]),
		}, digest, nil
	}
	return t
}

// TestAuthorizationRecordedInTheSectionThatAllowedIt: an authorization
// signed by AuthorizationTerms.Sign is recorded by the allow's own section,
// on both stores: when AuthorizeTerms returns, the review log holds its
// authorized record naming the decision receipt and the authorization's
// receipt, and the chain holds that receipt right after the decision's, as
// a fresh process reads them. A signer that fails leaves nothing: no
// entry, no receipt, no line, and the next question is judged as if it
// had not been asked (no finding, no hold).
func TestAuthorizationRecordedInTheSectionThatAllowedIt(t *testing.T) {
	kinds := []storeKind{fileKind}
	if os.Getenv("HAIA_TEST_POSTGRES") != "" {
		kinds = append(kinds, pgKind)
	}
	for _, kind := range kinds {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			ctx := context.Background()
			f := newFleet(t, kind, 1, releasePolicy)
			e := f.engines[0]
			vb := f.clock().Add(60 * time.Second).Truncate(time.Second)
			q := Question{Counterparty: sellerA, Amount: "1.50"}

			calls := 0
			_, err := e.AuthorizeTerms(ctx, "bot", q, signingTerms(vb, errors.New("the signer process is gone"), &calls))
			var nr *NotRecordedError
			if !errors.As(err, &nr) || calls != 1 || !strings.Contains(nr.Message, "nothing was recorded") {
				t.Fatalf("a failed signer: %v (%d calls)", err, calls)
			}
			if n := len(f.ledgerLines(t)); n > 1 {
				t.Fatalf("a failed signer left %d ledger lines", n)
			}
			auths, err := e.cfg.Log.Authorizations(ctx)
			if err != nil || len(auths) != 0 {
				t.Fatalf("a failed signer left authorizations: %v %v", auths, err)
			}
			// Nothing is held: the whole 2.00 limit is still there, and a
			// held authorization would make any payment to sellerA a review.
			if d, err := f.fresh(t).CheckWith(ctx, "bot", Question{Counterparty: sellerA, Amount: "2.00"}, CheckOptions{DryRun: true}); err != nil || d.Decision != guard.Allow {
				t.Fatalf("after a failed signer: %+v %v", d, err)
			}

			calls = 0
			a, err := e.AuthorizeTerms(ctx, "bot", q, signingTerms(vb, nil, &calls))
			if err != nil || a.Decision != guard.Allow || calls != 1 {
				t.Fatalf("authorize: %+v %v (%d calls)", a, err, calls)
			}
			au := a.Authorization
			if au == nil || au.DecisionReceipt != a.ReceiptID || au.Receipt == "" || au.Receipt == a.ReceiptID {
				t.Fatalf("the answer's authorization: %+v (decision %s)", au, a.ReceiptID)
			}
			// Read as a fresh process reads the store.
			g := f.fresh(t)
			auths, err = g.cfg.Log.Authorizations(ctx)
			if err != nil || len(auths) != 1 || auths[0].Receipt != au.Receipt || auths[0].DecisionReceipt != a.ReceiptID || auths[0].Caller != "bot" {
				t.Fatalf("the log's authorizations: %+v %v", auths, err)
			}
			var rcs []noa.Receipt
			err = g.cfg.Log.Store().View(ctx, func(r reviewlog.Reader) error {
				chains, err := reviewlog.ListChains(ctx, r)
				if err != nil {
					return err
				}
				for _, c := range chains {
					if err := reviewlog.EachReceipt(ctx, r, c.ID, func(_ reviewlog.Segment, _ int64, rc *noa.Receipt) error {
						rcs = append(rcs, *rc)
						return nil
					}); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			at := -1
			for i, r := range rcs {
				if r.ID == a.ReceiptID {
					at = i
				}
			}
			if at < 0 || at+1 >= len(rcs) || rcs[at+1].ID != au.Receipt || rcs[at+1].Action.ID != "x402-authorization:"+au.Nonce {
				t.Fatalf("the authorization's receipt does not follow its decision's in the chain (decision at %d of %d)", at, len(rcs))
			}
			// The authorization counts, and nothing is unverified.
			c, err := g.Check(ctx, "bot", Question{Counterparty: sellerA, Amount: "0.20"})
			if err != nil || c.Decision == guard.Allow || reasonOf(c, guard.RuleReservationUnverified) != "" {
				t.Fatalf("the authorization counts, and nothing else: %+v %v", c, err)
			}
		})
	}
}
