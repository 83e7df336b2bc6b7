package noa

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Verdict is the outcome of verifying a chain.
type Verdict string

const (
	// Valid: structure, hashes, links and signatures all check against
	// the supplied keyring.
	Valid Verdict = "VALID"
	// Unverified: the chain is intact but no keyring was supplied, so no
	// signature was authenticated. Never VALID without a keyring.
	Unverified Verdict = "UNVERIFIED"
	// Tampered: an integrity check failed (including a key the keyring
	// does not know, and a head that does not match the checkpoint).
	Tampered Verdict = "TAMPERED"
	// Malformed: the input is not a well-formed chain of receipts.
	Malformed Verdict = "MALFORMED"
	// Untrusted: signatures are authentic but a key signed for an agent
	// the identity manifest does not authorize it for.
	Untrusted Verdict = "UNTRUSTED"
)

// ExitCode is the exit status of the NOA reference verifier's CLI for v.
func (v Verdict) ExitCode() int {
	switch v {
	case Valid:
		return 0
	case Unverified:
		return 1
	case Tampered:
		return 2
	case Untrusted:
		return 5
	default:
		return 3
	}
}

// Result is a verdict with a one-line reason and what was seen.
type Result struct {
	Verdict Verdict
	Reason  string
	// Chain is scope.chain when the receipts got that far.
	Chain string
	Count int
	// Head is the chain.hash of the highest seq (on success).
	Head string
	// TailChecked is true only when an authenticated checkpoint matched.
	TailChecked bool
	Warnings    []string
}

// Line renders the result as one line: "VALID: 4 receipts, chain …".
func (r Result) Line() string {
	return string(r.Verdict) + ": " + r.Reason
}

// Options are the trust inputs of a verification. A nil Keyring means "no
// keyring supplied" (UNVERIFIED at best); a non-nil empty one means every
// kid is unknown (TAMPERED). Likewise a nil Identity means no manifest.
type Options struct {
	Keyring    Keyring
	Checkpoint *Checkpoint
	Identity   Identity
	// InFileOrder additionally requires the receipts to be given in seq
	// order, as this product's append-only chain files are; the NOA array
	// form may list them in any order.
	InFileOrder bool
}

func fail(v Verdict, chain string, n int, format string, args ...any) Result {
	return Result{Verdict: v, Chain: chain, Count: n, Reason: fmt.Sprintf(format, args...)}
}

// VerifyChain verifies decoded receipts the way the NOA reference verifier
// does: one chain partition; seqs unique and contiguous from 0; a tenant,
// once stated, never replaced by another; then, in seq order, each hash
// recomputed, one kid per agent.id, each signature checked against the
// keyring (an unknown kid is TAMPERED), each (agent.id, kid) pair checked
// against the identity manifest, each link checked; finally the head
// against the checkpoint, whose signature is held to the same keyring.
func VerifyChain(rs []Receipt, opt Options) Result {
	n := len(rs)
	if n == 0 {
		return fail(Malformed, "", 0, "empty receipt chain")
	}
	if n > MaxReceipts {
		return fail(Malformed, "", n, "too many receipts (more than %d)", MaxReceipts)
	}
	for i := range rs {
		if rs[i].tree == nil {
			return fail(Malformed, "", n, "receipt[%d] is empty (not decoded)", i)
		}
	}
	chain := rs[0].Scope.Chain
	for _, r := range rs {
		if r.Scope.Chain != chain {
			return fail(Tampered, chain, n, "multiple chain partitions in one input (%q and %q)", chain, r.Scope.Chain)
		}
	}
	bySeq := make(map[int64]int, n)
	for i, r := range rs {
		if _, dup := bySeq[r.Chain.Seq]; dup {
			return fail(Tampered, chain, n, "duplicate seq %d", r.Chain.Seq)
		}
		bySeq[r.Chain.Seq] = i
	}
	ordered := make([]*Receipt, n)
	for s := range n {
		i, ok := bySeq[int64(s)]
		if !ok {
			return fail(Tampered, chain, n, "seq gap: seq %d is missing", s)
		}
		if opt.InFileOrder && i != s {
			return fail(Tampered, chain, n, "receipt with seq %d is out of place (position %d of the file)", s, i+1)
		}
		ordered[s] = &rs[i]
	}

	var warnings []string
	// A tenant may be left out of some receipts, but once stated it may
	// not change: splicing another tenant's receipts in via an absent one
	// is the attack this closes.
	var tenant *string
	var tenantSeq int64
	for _, r := range ordered {
		t := r.Scope.Tenant
		if t == nil {
			continue
		}
		if tenant != nil && *t != *tenant {
			return fail(Tampered, chain, n, "tenant changes from %q (seq %d) to %q (seq %d) within one chain", *tenant, tenantSeq, *t, r.Chain.Seq)
		}
		tenant, tenantSeq = t, r.Chain.Seq
	}

	haveKeyring := opt.Keyring != nil
	haveIdentity := opt.Identity != nil
	pinned := map[string]string{}
	var prev *Receipt
	for _, r := range ordered {
		seq := r.Chain.Seq
		input, err := r.HashInput()
		if err != nil {
			return fail(Malformed, chain, n, "seq %d: %v", seq, err)
		}
		sum := sha256.Sum256(input)
		if "sha256:"+hex.EncodeToString(sum[:]) != r.Chain.Hash {
			return fail(Tampered, chain, n, "seq %d: hash mismatch (content altered)", seq)
		}
		if kid, ok := pinned[r.Agent.ID]; !ok {
			pinned[r.Agent.ID] = r.Sig.KID
		} else if kid != r.Sig.KID {
			return fail(Tampered, chain, n, "seq %d: key swap for agent %q (kid %q -> %q)", seq, r.Agent.ID, kid, r.Sig.KID)
		}
		if haveKeyring {
			b64, ok := opt.Keyring[r.Sig.KID]
			if !ok {
				return fail(Tampered, chain, n, "seq %d: signing key %q is not in the keyring", seq, r.Sig.KID)
			}
			pub, err := DecodeSPKI(b64)
			if err != nil || !verifySig(pub, append([]byte(receiptDomain), sum[:]...), r.Sig.Value) {
				return fail(Tampered, chain, n, "seq %d: invalid signature (kid %q)", seq, r.Sig.KID)
			}
			if haveIdentity && !opt.Identity.allows(r.Agent.ID, r.Sig.KID) {
				return fail(Untrusted, chain, n, "seq %d: agent %q is not authorized for signing key %q by the identity manifest", seq, r.Agent.ID, r.Sig.KID)
			}
		}
		if seq == 0 {
			if r.Chain.PrevHash != nil {
				return fail(Tampered, chain, n, "genesis (seq 0) prevHash must be null")
			}
		} else if r.Chain.PrevHash == nil || *r.Chain.PrevHash != prev.Chain.Hash {
			return fail(Tampered, chain, n, "seq %d: broken link (prevHash is not the hash of seq %d)", seq, seq-1)
		}
		if prev != nil {
			a, errA := parseInstant(prev.TS)
			b, errB := parseInstant(r.TS)
			if errA == nil && errB == nil && b.Before(a) {
				warnings = append(warnings, fmt.Sprintf("non-monotonic timestamp at seq %d (ts went backwards)", seq))
			}
		}
		prev = r
	}

	head := ordered[n-1]
	tailChecked := false
	if cp := opt.Checkpoint; cp != nil {
		if cp.tree == nil {
			return fail(Malformed, chain, n, "checkpoint is empty (not decoded)")
		}
		state := verifyCheckpointSig(*cp, opt.Keyring)
		if haveKeyring && state != "ok" {
			return fail(Tampered, chain, n, "checkpoint not authenticated against the keyring (%s, kid %q)", state, cp.Sig.KID)
		}
		if cp.Chain != chain {
			return fail(Tampered, chain, n, "checkpoint is for chain %q, not %q", cp.Chain, chain)
		}
		if cp.HighestSeq != head.Chain.Seq || cp.HeadHash != head.Chain.Hash {
			return fail(Tampered, chain, n, "chain head (seq %d) does not match the checkpoint (seq %d): tail truncated or extended", head.Chain.Seq, cp.HighestSeq)
		}
		if haveKeyring && haveIdentity {
			opener := ordered[0].Agent.ID
			if !opt.Identity.allows(opener, cp.Sig.KID) {
				return fail(Untrusted, chain, n, "checkpoint key %q is not authorized for the chain opener %q by the identity manifest", cp.Sig.KID, opener)
			}
		}
		tailChecked = state == "ok"
		if !tailChecked {
			warnings = append(warnings, "checkpoint present but not authenticated (no keyring): tail not verified")
		}
	} else {
		warnings = append(warnings, "no checkpoint: deleting the most recent receipts cannot be detected offline")
	}
	warnings = append(warnings, "fork/equivocation is not detectable offline: this verifies the branch given")
	if !haveKeyring {
		warnings = append(warnings, "no keyring: signatures were not authenticated")
	}

	res := Result{Verdict: Unverified, Chain: chain, Count: n, Head: head.Chain.Hash, TailChecked: tailChecked, Warnings: warnings}
	if haveKeyring {
		res.Verdict = Valid
	}
	var b strings.Builder
	b.WriteString(strconv.Itoa(n))
	if n == 1 {
		b.WriteString(" receipt")
	} else {
		b.WriteString(" receipts")
	}
	fmt.Fprintf(&b, ", chain %q, head %s", chain, head.Chain.Hash)
	switch {
	case tailChecked:
		b.WriteString(", tail checked")
	case !haveKeyring:
		b.WriteString(", signatures not authenticated (no keyring)")
	default:
		b.WriteString(", tail not checked (no checkpoint)")
	}
	res.Reason = b.String()
	return res
}

// Documents are the inputs of a verification as files hold them. Chain
// is read as DecodeChain reads it; a nil Keyring, Checkpoint or Identity
// means that input was not supplied.
type Documents struct {
	Chain      io.Reader
	Keyring    []byte
	Checkpoint []byte
	Identity   []byte
}

// VerifyDocuments decodes and verifies raw inputs, mapping decoding
// failures to the verdicts the reference verifier gives: unreadable chain,
// keyring or manifest → MALFORMED; a checkpoint that is JSON but not a
// valid statement → TAMPERED. A chain in this product's line form must
// also be in seq order.
func VerifyDocuments(d Documents) Result {
	if d.Chain == nil {
		return fail(Malformed, "", 0, "no chain given")
	}
	rs, form, err := DecodeChain(d.Chain)
	if err != nil {
		return fail(Malformed, "", 0, "%v", err)
	}
	opt := Options{InFileOrder: form == FormLines}
	if d.Identity != nil {
		if opt.Identity, err = ParseIdentity(d.Identity); err != nil {
			return fail(Malformed, "", len(rs), "%v", err)
		}
	}
	if d.Keyring != nil {
		if opt.Keyring, err = ParseKeyring(d.Keyring); err != nil {
			return fail(Malformed, "", len(rs), "%v", err)
		}
	}
	if d.Checkpoint != nil {
		cp, err := ParseCheckpoint(d.Checkpoint)
		switch {
		case errors.Is(err, ErrCheckpointInvalid):
			if len(rs) == 0 {
				return fail(Malformed, "", 0, "empty receipt chain")
			}
			return fail(Tampered, rs[0].Scope.Chain, len(rs), "%v", err)
		case err != nil:
			return fail(Malformed, "", len(rs), "%v", err)
		}
		opt.Checkpoint = &cp
	}
	return VerifyChain(rs, opt)
}
