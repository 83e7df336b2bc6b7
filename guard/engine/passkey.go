package engine

import (
	"context"
	"fmt"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// PasskeyDecider records a decision a reviewer's passkey made: the
// assertion must be by a passkey the trusted reviewers file lists, over the
// decision hash of the review's signed terms, the decision and the note, as
// they stand inside the log's lock. The HUMAN receipt, sealed into the
// server's chain, carries the assertion, so anyone holding the reviewers
// file can check offline that this passkey decided exactly these terms.
// Nothing is written when the assertion does not hold.
type PasskeyDecider struct {
	Log *reviewlog.Log
	// Chains seals with the server's key.
	Chains *reviewlog.Chains
	// Passkeys reads the trusted reviewers' passkeys (at each decision).
	Passkeys func() (reviewlog.Passkeys, error)
	// SeenCount, when set, is the highest signature counter this process
	// saw from a credential outside the chains (its sign-ins); a decision
	// must count above it as above the chains' last.
	SeenCount func(credentialID string) uint32
}

// Decide approves (status reviewlog.Approved) or rejects review id on the
// strength of assertion a. It returns the reviewer the passkey belongs to
// in the review's DecidedBy.
func (d PasskeyDecider) Decide(ctx context.Context, id, status, note string, a passkey.Assertion) (reviewlog.Review, error) {
	pks, err := d.Passkeys()
	if err != nil {
		return reviewlog.Review{}, fmt.Errorf("%w: the trusted reviewers file cannot be read: %w", reviewlog.ErrUntrusted, err)
	}
	by, cred, ok := pks.Owner(a.CredentialID)
	if !ok {
		return reviewlog.Review{}, fmt.Errorf("%w: passkey %.16s… is not in the trusted reviewers file; nothing was written", reviewlog.ErrUntrusted, a.CredentialID)
	}
	return d.Log.DecideReview(ctx, id, status, note, by, func(tx reviewlog.Tx) error {
		ph, err := reviewlog.DecisionParamsHash(tx.Review, tx.Review.Status)
		if err != nil {
			return err
		}
		if err := passkey.VerifyDecision(cred, a, ph); err != nil {
			return fmt.Errorf("%w: the passkey's assertion does not sign this decision on review %s: %w; nothing was written", reviewlog.ErrUntrusted, id, err)
		}
		// Clone detection: the authenticator's counter must grow past the
		// last decision this passkey signed (read from the chains, inside
		// the lock, so two replicas agree).
		got, err := passkey.SignCount(a)
		if err != nil {
			return err
		}
		last, err := d.Log.LastSignCount(ctx, tx.Store, cred)
		if err != nil {
			return err
		}
		if d.SeenCount != nil {
			last = max(last, d.SeenCount(cred.ID))
		}
		if err := passkey.CheckSignCount(last, got); err != nil {
			return fmt.Errorf("%w: passkey %.16s… of reviewer %q refused on review %s: %w; nothing was written — remove it (reviewer passkey remove) and enrol a new one", reviewlog.ErrUntrusted, a.CredentialID, by, id, err)
		}
		draft, err := HumanDecisionDraft(tx.Review)
		if err != nil {
			return err
		}
		model := passkey.EncodeModel(a)
		draft.Agent.Model = &model
		_, err = d.Chains.Append(ctx, tx.Store, draft)
		return err
	})
}
