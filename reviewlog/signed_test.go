package reviewlog

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// reviewer is a trusted reviewer for tests: its id, its key, and a hook that
// signs a decision the way the review CLI does.
type reviewer struct {
	id     string
	key    ed25519.PrivateKey
	chains *Chains
}

func newReviewer(t testing.TB, id string) *reviewer {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &reviewer{id: id, key: key, chains: &Chains{Signer: noa.NewKeySigner(key), Tenant: "test"}}
}

func trust(rs ...*reviewer) func() (Reviewers, error) {
	return func() (Reviewers, error) {
		out := Reviewers{}
		for _, r := range rs {
			out[r.id] = r.key.Public().(ed25519.PublicKey)
		}
		return out, nil
	}
}

// sign is a DecideReview hook that appends the reviewer's HUMAN receipt.
func (rv *reviewer) sign(t testing.TB) Hook {
	return func(tx Tx) error {
		at, err := time.Parse(time.RFC3339Nano, tx.Review.DecidedAt)
		if err != nil {
			return err
		}
		verdict := noa.VerdictBlocked
		if tx.Review.Status == Approved {
			verdict = noa.VerdictAllowed
		}
		rule := RuleHumanReview
		ph := tx.Review.ParamsHash
		if ph == "" {
			ph = "hmac-sha256:" + "0000000000000000000000000000000000000000000000000000000000000000"
		}
		_, err = rv.chains.Append(t.Context(), tx.Guard, noa.Draft{
			TS:     at,
			Agent:  noa.Agent{ID: rv.id, Principal: noa.PrincipalHuman},
			Action: noa.Action{ID: ActionID(tx.Review.ID), Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: ph},
			Governance: noa.Governance{Mode: "approvals_on", Verdict: verdict, RuleID: &rule,
				Approval: &noa.Approval{By: rv.id, At: noa.FormatTS(at)}},
		})
		return err
	}
}
