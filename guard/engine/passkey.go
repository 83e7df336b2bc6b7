package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"

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
	return d.decide(ctx, id, status, note, a, nil)
}

// DecideGranting approves review id and grants mandate g, both on the
// strength of one assertion a over passkey.BoundChallenge of the
// decision's hash and g's digest (g.PasskeyChallenge). g is the grant as
// the console proposed it: By the passkey's reviewer, KID
// mandate.PasskeyKID, Decision the decision's hash, Prev the head of the
// mandate records the challenge was made after, Tenant this guard's. The
// grant is appended to the mandate records and the decision sealed into
// the chains in the same locked section, or nothing is written: not when
// the passkey, its reviewer or their grant of the tenant is not trusted,
// not when the assertion does not cover the decision and the terms, not
// when the mandate records changed since the challenge (the reviewer
// approves again) or do not verify.
func (d PasskeyDecider) DecideGranting(ctx context.Context, id, note string, a passkey.Assertion, g mandate.Record) (reviewlog.Review, mandate.Record, error) {
	out, err := d.decide(ctx, id, reviewlog.Approved, note, a, &g)
	if err != nil {
		return out, mandate.Record{}, err
	}
	return out, g, nil
}

// MandateTenant is the tenant whose guard honours the mandates this
// decider grants (the engine's: the chains' tenant, else DefaultTenant).
func (d PasskeyDecider) MandateTenant() string {
	if d.Chains != nil && d.Chains.Tenant != "" {
		return d.Chains.Tenant
	}
	return DefaultTenant
}

func (d PasskeyDecider) decide(ctx context.Context, id, status, note string, a passkey.Assertion, g *mandate.Record) (reviewlog.Review, error) {
	a.Mandate = "" // what it binds is computed here, never taken from the client
	var digest string
	if g != nil {
		if status != reviewlog.Approved {
			return reviewlog.Review{}, fmt.Errorf("%w: a mandate is granted with an approval only", reviewlog.ErrBadInput)
		}
		if g.Kind != mandate.KindGrant || g.KID != mandate.PasskeyKID || g.Tenant != d.MandateTenant() || g.Sig != "" {
			return reviewlog.Review{}, fmt.Errorf("%w: the mandate is not a passkey's grant for tenant %q; nothing was written", reviewlog.ErrBadInput, d.MandateTenant())
		}
		var err error
		if digest, err = g.Digest(); err != nil {
			return reviewlog.Review{}, fmt.Errorf("%w: the mandate: %v; nothing was written", reviewlog.ErrBadInput, err)
		}
		a.Mandate = digest
	}
	pks, err := d.Passkeys()
	if err != nil {
		return reviewlog.Review{}, fmt.Errorf("%w: the trusted reviewers file cannot be read: %w", reviewlog.ErrUntrusted, err)
	}
	by, cred, ok := pks.Owner(a.CredentialID)
	if !ok {
		return reviewlog.Review{}, fmt.Errorf("%w: passkey %.16s… is not in the trusted reviewers file; nothing was written", reviewlog.ErrUntrusted, a.CredentialID)
	}
	if g != nil && g.By != by {
		return reviewlog.Review{}, fmt.Errorf("%w: the mandate names reviewer %q, but the passkey is %q's; nothing was written", reviewlog.ErrUntrusted, g.By, by)
	}
	return d.Log.DecideReview(ctx, id, status, note, by, func(tx reviewlog.Tx) error {
		ph, err := reviewlog.DecisionParamsHash(tx.Review, tx.Review.Status)
		if err != nil {
			return err
		}
		if g != nil && g.Decision != ph {
			return fmt.Errorf("%w: the mandate names decision %s, not this approval's %s; nothing was written", reviewlog.ErrBadInput, g.Decision, ph)
		}
		if err := passkey.VerifyDecision(cred, a, ph); err != nil {
			what := "this decision"
			if g != nil {
				what = "this approval and the mandate's terms"
			}
			return fmt.Errorf("%w: the passkey's assertion does not sign %s on review %s: %w; nothing was written", reviewlog.ErrUntrusted, what, id, err)
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
		if g != nil {
			if err := d.appendGrant(ctx, tx, g, a); err != nil {
				return err
			}
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

// appendGrant appends grant g, signed by assertion a, to the mandate
// records, inside the decision's locked section: after the records as
// the challenge was made (g.Prev), a new id, and verifying under the
// trusted reviewers as every reader will.
func (d PasskeyDecider) appendGrant(ctx context.Context, tx reviewlog.Tx, g *mandate.Record, a passkey.Assertion) error {
	trust, err := d.Log.MandateTrust()
	if err != nil {
		return err
	}
	lines, err := tx.Store.Mandates(ctx)
	if err != nil {
		return fmt.Errorf("read the mandate records: %w", err)
	}
	tenant := d.MandateTenant()
	set := mandate.Read(lines, tenant, trust, nil)
	switch {
	case len(set.Findings) > 0:
		return fmt.Errorf("%w (%s); nothing was written — run haia-trace-mcp audit", ErrMandateRecords, strings.Join(set.Findings, "; "))
	case set.Mandates[g.ID] != nil:
		return fmt.Errorf("%w: mandate %s exists already; nothing was written — approve again", reviewlog.ErrBadInput, g.ID)
	case set.Head != g.Prev:
		return fmt.Errorf("%w: the mandate records changed while the passkey signed (another mandate was granted, signed or revoked); nothing was written — approve again", ErrMandateMoved)
	}
	line, err := g.SignWithPasskey(a)
	if err != nil {
		return fmt.Errorf("%w: %v", reviewlog.ErrBadInput, err)
	}
	after := mandate.Read(append(lines, line), tenant, trust, nil)
	if len(after.Findings) > 0 || after.Mandates[g.ID] == nil {
		return fmt.Errorf("%w: the mandate is not one the guard would honour (%s); nothing was written", reviewlog.ErrUntrusted, strings.Join(after.Findings, "; "))
	}
	return tx.Store.AppendMandate(ctx, len(lines), line)
}
