package noa

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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
	// Segments is how many segment files were verified end to end
	// (VerifySegments); 0 for one chain file.
	Segments int
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

	// The structure is sound and in seq order: the rest is what a stream
	// of the same receipts in file order gets.
	v := NewStreamVerifier(opt)
	for _, r := range ordered {
		v.Add(r)
	}
	return v.Result()
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
// also be in seq order, and is verified as it is read (VerifyStream), in
// memory that does not grow with its length; the NOA array form, which
// may list receipts in any order, is decoded whole (at most MaxArrayBytes).
func VerifyDocuments(d Documents) Result {
	if d.Chain == nil {
		return fail(Malformed, "", 0, "no chain given")
	}
	br := bufio.NewReaderSize(d.Chain, 64<<10)
	form, err := sniffForm(br)
	if err != nil {
		return fail(Malformed, "", 0, "%v", err)
	}
	if form == FormArray {
		rs, err := decodeArray(br)
		if err != nil {
			return fail(Malformed, "", 0, "%v", err)
		}
		opt, bad := d.trust(len(rs) > 0)
		if bad != nil {
			if len(rs) > 0 {
				bad.Chain = rs[0].Scope.Chain
			}
			bad.Count = len(rs)
			return *bad
		}
		return VerifyChain(rs, opt)
	}
	opt, bad := d.trust(true)
	if bad == nil {
		return VerifyStream(br, opt)
	}
	// A trust input is unusable; a chain that does not decode is still
	// reported as such first, as when the whole chain is decoded first.
	lr := NewLineReader(br)
	n, chain := 0, ""
	for {
		r, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail(Malformed, "", 0, "%v", err)
		}
		if n == 0 {
			chain = r.Scope.Chain
		}
		n++
	}
	if bad.Verdict == Tampered && n == 0 {
		return fail(Malformed, "", 0, "empty receipt chain")
	}
	bad.Chain, bad.Count = chain, n
	return *bad
}

// Options decodes the trust inputs of d (its Chain is not read). On a
// failure, the Result is the verdict a verification of a non-empty chain
// with these inputs gives.
func (d Documents) Options() (Options, *Result) { return d.trust(true) }

// trust decodes the keyring, checkpoint and identity manifest. A failure
// is MALFORMED, except a checkpoint that is JSON but not a valid statement:
// TAMPERED when the chain has receipts (nonEmpty), else MALFORMED.
func (d Documents) trust(nonEmpty bool) (Options, *Result) {
	var opt Options
	var err error
	bad := func(v Verdict, err error) (Options, *Result) {
		r := fail(v, "", 0, "%v", err)
		return Options{}, &r
	}
	if d.Identity != nil {
		if opt.Identity, err = ParseIdentity(d.Identity); err != nil {
			return bad(Malformed, err)
		}
	}
	if d.Keyring != nil {
		if opt.Keyring, err = ParseKeyring(d.Keyring); err != nil {
			return bad(Malformed, err)
		}
	}
	if d.Checkpoint != nil {
		cp, err := ParseCheckpoint(d.Checkpoint)
		switch {
		case errors.Is(err, ErrCheckpointInvalid):
			if !nonEmpty {
				return bad(Malformed, errors.New("empty receipt chain"))
			}
			return bad(Tampered, err)
		case err != nil:
			return bad(Malformed, err)
		}
		opt.Checkpoint = &cp
	}
	return opt, nil
}
