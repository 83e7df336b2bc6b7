package reviewlog

import (
	"context"
	"fmt"
	"sort"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// LastSignCount is the highest signature counter among the decisions the
// chains record as made by passkey cred: only an assertion that verifies
// under cred's key over its receipt's paramsHash counts, so a line nobody
// signed cannot raise (or lower) it. 0 when cred decided nothing. r is
// the store as a transaction sees it (nil: read the store now).
func (l *Log) LastSignCount(ctx context.Context, r Reader, cred passkey.Credential) (uint32, error) {
	if r == nil {
		var n uint32
		err := l.store.View(ctx, func(r Reader) error {
			var err error
			n, err = l.LastSignCount(ctx, r, cred)
			return err
		})
		return n, err
	}
	var rcs []noa.Receipt
	if idx, ok := r.(ReceiptIndex); ok {
		src := indexSource{ctx: ctx, idx: idx}
		got, err := src.byPasskey(cred.ID)
		if err != nil {
			return 0, fmt.Errorf("read the decision chains' receipt index: %w", err)
		}
		rcs = got
	} else {
		if err := l.rx.refresh(ctx, r); err != nil {
			return 0, fmt.Errorf("read decision chains: %w", err)
		}
		got, err := l.rx.byPasskey(ctx, r, cred.ID)
		if err != nil {
			return 0, err
		}
		rcs = got
	}
	var last uint32
	for _, rc := range rcs {
		if n, ok := verifiedCount(rc, cred); ok && n > last {
			last = n
		}
	}
	return last, nil
}

// verifiedCount is the signature counter of the assertion rc carries,
// when it verifies under cred over rc's paramsHash.
func verifiedCount(rc noa.Receipt, cred passkey.Credential) (uint32, bool) {
	a, ok, err := passkey.DecodeModel(rc.Agent.Model)
	if !ok || err != nil || a.CredentialID != cred.ID {
		return 0, false
	}
	if passkey.VerifyDecision(cred, a, rc.Action.ParamsHash) != nil {
		return 0, false
	}
	n, err := passkey.SignCount(a)
	return n, err == nil
}

// signCountFindings checks, for every trusted passkey, that the signature
// counters of the decisions it made grow in chain order (WebAuthn's clone
// detection): a counter that does not grow means two authenticators hold
// the same key.
func signCountFindings(ctx context.Context, ix *receiptIndex, r Reader, pks Passkeys) ([]string, error) {
	var out []string
	for who, creds := range pks {
		for _, cred := range creds {
			rcs, err := ix.byPasskey(ctx, r, cred.ID)
			if err != nil {
				return nil, err
			}
			var last uint32
			prev := ""
			for _, rc := range rcs {
				n, ok := verifiedCount(rc, cred)
				if !ok {
					continue
				}
				if prev != "" && passkey.CheckSignCount(last, n) != nil {
					out = append(out, fmt.Sprintf("passkey %s of reviewer %q: receipt %s carries signature counter %d, not above the %d of receipt %s — the authenticator may have been cloned; remove this passkey and enrol a new one",
						clip(cred.ID), clip(who), rc.ID, n, last, prev))
				}
				if n > last || prev == "" {
					last = n
				}
				prev = rc.ID
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
