package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Errors of MandateSigner.
var (
	// ErrUnknownMandate: no mandate has that id.
	ErrUnknownMandate = errors.New("no such mandate")
	// ErrMandateRecords: the store's mandate records do not verify, so
	// nothing is added to them until the operator looks.
	ErrMandateRecords = errors.New("the mandate records do not verify")
	// ErrMandateDone: the mandate is revoked, or already signed by this
	// reviewer.
	ErrMandateDone = errors.New("nothing to do")
	// ErrMandateMoved: the mandate records changed between the passkey's
	// challenge and its assertion, so the assertion signs a place that is
	// taken; the reviewer signs again.
	ErrMandateMoved = errors.New("the mandate records changed")
)

// MandateSigner writes one reviewer's mandate records: a grant, a
// further signature, a revocation, each signed with the reviewer's own
// key and appended under the store's lock after the records as read, or
// nothing at all.
type MandateSigner struct {
	Log *reviewlog.Log
	// Key is the reviewer's key; By the id the trusted reviewers file
	// knows it by.
	Key ed25519.PrivateKey
	By  string
	// Tenant is the tenant whose guard honours the records.
	Tenant string
}

// Grant signs g's terms (PayTo, Host, Agent, Asset, MaxAtomic,
// BudgetAtomic, Count, NotBefore, Expires, Approvals, Note, Source,
// Reference) as a new mandate and returns it as recorded.
func (s MandateSigner) Grant(ctx context.Context, g mandate.Record) (mandate.Record, error) {
	id, err := mandate.NewID()
	if err != nil {
		return mandate.Record{}, err
	}
	g.Kind, g.ID, g.Terms = mandate.KindGrant, id, ""
	out, _, err := s.write(ctx, func(set mandate.Set) (mandate.Record, error) { return g, nil })
	return out, err
}

// Sign adds the reviewer's signature to mandate id's terms (for a mandate
// a quorum asks several reviewers for); it returns the mandate as it
// stands after.
func (s MandateSigner) Sign(ctx context.Context, id string) (*mandate.Mandate, error) {
	_, m, err := s.write(ctx, func(set mandate.Set) (mandate.Record, error) {
		m, err := s.find(set, id)
		if err != nil {
			return mandate.Record{}, err
		}
		for _, by := range m.Signers {
			if by == s.By {
				return mandate.Record{}, fmt.Errorf("%w: %s signed mandate %s already (%s)", ErrMandateDone, s.By, id, signedText(m))
			}
		}
		return mandate.Record{Kind: mandate.KindSign, ID: id, Terms: m.TermsHash}, nil
	})
	return m, err
}

// Revoke ends mandate id: nothing is allowed under it from the next
// question on, on every replica.
func (s MandateSigner) Revoke(ctx context.Context, id string) (*mandate.Mandate, error) {
	_, m, err := s.write(ctx, func(set mandate.Set) (mandate.Record, error) {
		m, err := s.find(set, id)
		if err != nil {
			return mandate.Record{}, err
		}
		return mandate.Record{Kind: mandate.KindRevoke, ID: id, Terms: m.TermsHash}, nil
	})
	return m, err
}

func (s MandateSigner) find(set mandate.Set, id string) (*mandate.Mandate, error) {
	if err := mandate.CheckID(id); err != nil {
		return nil, fmt.Errorf("%w: %v", reviewlog.ErrBadID, err)
	}
	m := set.Mandates[id]
	switch {
	case m == nil:
		return nil, fmt.Errorf("%w: %s", ErrUnknownMandate, id)
	case m.Revoked != nil:
		return nil, fmt.Errorf("%w: mandate %s was revoked by %s at %s", ErrMandateDone, id, m.Revoked.By, m.Revoked.At)
	}
	return m, nil
}

func signedText(m *mandate.Mandate) string {
	return fmt.Sprintf("signed by %s, %d of %d", strings.Join(m.Signers, ", "), len(m.Signers), m.Needs())
}

// write checks the reviewer, reads the records under the lock, has next
// make the record, signs it after the last one and appends it; it returns
// the record and its mandate as they stand after.
func (s MandateSigner) write(ctx context.Context, next func(set mandate.Set) (mandate.Record, error)) (mandate.Record, *mandate.Mandate, error) {
	trust, err := s.Log.MandateTrust()
	if err != nil {
		return mandate.Record{}, nil, err
	}
	pub, ok := trust.Keys[s.By]
	switch {
	case !ok || !bytes.Equal(pub, s.Key.Public().(ed25519.PublicKey)):
		return mandate.Record{}, nil, fmt.Errorf("%w: the key is not reviewer %q's in the trusted reviewers file; nothing was written", reviewlog.ErrUntrusted, s.By)
	case trust.Granted != nil && !trust.Granted(s.By):
		return mandate.Record{}, nil, fmt.Errorf("%w: reviewer %q is trusted, but the trusted reviewers file does not grant them tenant %q; nothing was written", reviewlog.ErrUntrusted, s.By, s.Tenant)
	}
	var rec mandate.Record
	var m *mandate.Mandate
	err = s.Log.WithLock(ctx, func(tx reviewlog.Tx) error {
		lines, err := tx.Store.Mandates(ctx)
		if err != nil {
			return fmt.Errorf("read the mandate records: %w", err)
		}
		set := mandate.Read(lines, s.Tenant, trust, nil)
		if len(set.Findings) > 0 {
			return fmt.Errorf("%w (%s); nothing was written — run haia-trace-mcp audit", ErrMandateRecords, strings.Join(set.Findings, "; "))
		}
		if rec, err = next(set); err != nil {
			return err
		}
		rec.Prev, rec.Tenant, rec.At = set.Head, s.Tenant, mandate.FormatTime(tx.At)
		rec.By, rec.KID = s.By, noa.KeyID(pub)
		line, err := rec.Sign(s.Key)
		if err != nil {
			return fmt.Errorf("%w: %v", reviewlog.ErrBadInput, err)
		}
		if err := tx.Store.AppendMandate(ctx, len(lines), line); err != nil {
			return err
		}
		after := mandate.Read(append(lines, line), s.Tenant, trust, nil)
		m = after.Mandates[rec.ID]
		if len(after.Findings) > 0 || m == nil {
			return fmt.Errorf("the mandate record just signed does not verify: %v", after.Findings)
		}
		return nil
	})
	if err != nil {
		return mandate.Record{}, nil, err
	}
	return rec, m, nil
}
