package noa

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// LineReader reads a chain in this product's line form one receipt at a
// time, so that a chain of any length is read in memory bounded by one
// line. The text after the last newline is a torn write and is never
// returned; blank lines and "\r\n" endings are accepted; every other line
// must be a valid receipt (ParseReceipt).
type LineReader struct {
	br    *bufio.Reader
	buf   []byte
	line  int   // number of the last line read
	off   int64 // bytes consumed so far
	start int64 // offset of the line of the last receipt returned
	end   int64 // offset just after the last complete line
}

// NewLineReader reads receipt lines from r.
func NewLineReader(r io.Reader) *LineReader {
	return &LineReader{br: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next receipt, or io.EOF after the last complete line.
// An error names the line; after one, the reader is not usable.
func (lr *LineReader) Next() (Receipt, error) {
	for {
		lr.buf = lr.buf[:0]
		lr.line++
		start := lr.off
		for {
			chunk, err := lr.br.ReadSlice('\n')
			if len(lr.buf)+len(chunk) > MaxLineBytes+2 {
				return Receipt{}, fmt.Errorf("chain line %d: longer than %d bytes", lr.line, MaxLineBytes)
			}
			lr.buf = append(lr.buf, chunk...)
			lr.off += int64(len(chunk))
			if err == nil {
				break
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				// The text after the last newline is never a whole record.
				return Receipt{}, io.EOF
			}
			return Receipt{}, fmt.Errorf("reading chain line %d: %w", lr.line, err)
		}
		lr.end = lr.off
		text := bytes.Trim(lr.buf, " \t\r\n")
		if len(text) == 0 {
			continue
		}
		rc, err := ParseReceipt(text)
		if err != nil {
			return Receipt{}, fmt.Errorf("chain line %d: %w", lr.line, err)
		}
		lr.start = start
		return rc, nil
	}
}

// Offset is the byte offset of the line of the receipt Next last returned.
func (lr *LineReader) Offset() int64 { return lr.start }

// End is the offset just after the last complete line read: where the
// next receipt would be appended.
func (lr *LineReader) End() int64 { return lr.end }

// maxTSWarnings bounds the timestamp warnings a verification keeps, so
// that a long chain cannot grow the result without bound.
const maxTSWarnings = 10

// StreamVerifier verifies a chain fed to it one receipt at a time in file
// order, in memory that does not grow with the chain (only with the number
// of distinct agent ids, for key pinning). It gives the verdicts
// VerifyChain gives with InFileOrder set, without its MaxReceipts limit.
//
// The precedence of VerifyChain is kept although the input is seen once:
// a decoding failure anywhere (Fail) makes the chain MALFORMED; otherwise
// a structural failure anywhere (another partition, a seq out of place, a
// tenant that changes) wins over a receipt-level failure found earlier
// (hash, key pin, signature, identity, link); after a failure, receipts
// are only checked structurally.
type StreamVerifier struct {
	opt Options

	n        int
	chain    string
	opener   string
	headSeq  int64
	headHash string
	prevTS   string

	tenant    *string
	tenantSeq int64
	pinned    map[string]string

	decodeErr *Result
	global    *Result
	first     *Result

	tsWarnings int
	warnings   []string

	// carried is true when state came from an earlier segment (carry).
	carried bool
}

// NewStreamVerifier starts a verification with opt; opt.InFileOrder is
// implied.
func NewStreamVerifier(opt Options) *StreamVerifier {
	opt.InFileOrder = true
	return &StreamVerifier{opt: opt, pinned: map[string]string{}}
}

// Count is the number of receipts fed so far.
func (v *StreamVerifier) Count() int { return v.n }

// Failed reports whether a failure has been recorded.
func (v *StreamVerifier) Failed() bool {
	return v.decodeErr != nil || v.global != nil || v.first != nil
}

// Fail records that the input could not be decoded (MALFORMED, whatever
// else was found); receipts fed after it are ignored.
func (v *StreamVerifier) Fail(err error) {
	if v.decodeErr == nil {
		r := fail(Malformed, v.chain, v.n, "%v", err)
		v.decodeErr = &r
	}
}

func (v *StreamVerifier) setGlobal(format string, args ...any) {
	if v.global == nil {
		r := fail(Tampered, v.chain, v.n, format, args...)
		v.global = &r
	}
}

func (v *StreamVerifier) setFirst(verdict Verdict, format string, args ...any) {
	if v.first == nil {
		r := fail(verdict, v.chain, v.n, format, args...)
		v.first = &r
	}
}

// Add feeds the next receipt in file order.
func (v *StreamVerifier) Add(r *Receipt) {
	if v.decodeErr != nil || v.global != nil {
		return
	}
	if r.tree == nil {
		v.Fail(fmt.Errorf("receipt[%d] is empty (not decoded)", v.n))
		return
	}
	pos := v.n
	v.n++
	if pos == 0 {
		v.chain = r.Scope.Chain
		v.opener = r.Agent.ID
	} else if r.Scope.Chain != v.chain {
		v.setGlobal("multiple chain partitions in one input (%q and %q)", v.chain, r.Scope.Chain)
		return
	}
	seq := r.Chain.Seq
	if seq != int64(pos) {
		if seq < int64(pos) {
			// Positions before this one hold seqs 0..pos-1 already.
			v.setGlobal("duplicate seq %d (position %d of the file)", seq, pos+1)
		} else {
			v.setGlobal("receipt with seq %d is out of place (position %d of the file): seq gap or reordering, seq %d is not here", seq, pos+1, pos)
		}
		return
	}
	// A tenant may be left out of some receipts, but once stated it may
	// not change: splicing another tenant's receipts in via an absent one
	// is the attack this closes.
	if t := r.Scope.Tenant; t != nil {
		if v.tenant != nil && *t != *v.tenant {
			v.setGlobal("tenant changes from %q (seq %d) to %q (seq %d) within one chain", *v.tenant, v.tenantSeq, *t, seq)
			return
		}
		tt := *t
		v.tenant, v.tenantSeq = &tt, seq
	}
	prevHash := v.headHash
	prevTS := v.prevTS
	v.headSeq, v.headHash, v.prevTS = seq, r.Chain.Hash, r.TS
	if v.first != nil {
		return
	}
	v.checkReceipt(r, seq, pos, prevHash, prevTS)
}

// checkReceipt runs the receipt-level checks in VerifyChain's order.
func (v *StreamVerifier) checkReceipt(r *Receipt, seq int64, pos int, prevHash, prevTS string) {
	input, err := r.HashInput()
	if err != nil {
		v.setFirst(Malformed, "seq %d: %v", seq, err)
		return
	}
	sum := sha256.Sum256(input)
	if "sha256:"+hex.EncodeToString(sum[:]) != r.Chain.Hash {
		v.setFirst(Tampered, "seq %d: hash mismatch (content altered)", seq)
		return
	}
	if kid, ok := v.pinned[r.Agent.ID]; !ok {
		v.pinned[r.Agent.ID] = r.Sig.KID
	} else if kid != r.Sig.KID {
		v.setFirst(Tampered, "seq %d: key swap for agent %q (kid %q -> %q)", seq, r.Agent.ID, kid, r.Sig.KID)
		return
	}
	if v.opt.Keyring != nil {
		b64, ok := v.opt.Keyring[r.Sig.KID]
		if !ok {
			v.setFirst(Tampered, "seq %d: signing key %q is not in the keyring", seq, r.Sig.KID)
			return
		}
		pub, err := DecodeSPKI(b64)
		if err != nil || !verifySig(pub, append([]byte(receiptDomain), sum[:]...), r.Sig.Value) {
			v.setFirst(Tampered, "seq %d: invalid signature (kid %q)", seq, r.Sig.KID)
			return
		}
		if v.opt.Identity != nil && !v.opt.Identity.allows(r.Agent.ID, r.Sig.KID) {
			v.setFirst(Untrusted, "seq %d: agent %q is not authorized for signing key %q by the identity manifest", seq, r.Agent.ID, r.Sig.KID)
			return
		}
	}
	if seq == 0 {
		if r.Chain.PrevHash != nil {
			v.setFirst(Tampered, "genesis (seq 0) prevHash must be null")
			return
		}
	} else if r.Chain.PrevHash == nil || *r.Chain.PrevHash != prevHash {
		v.setFirst(Tampered, "seq %d: broken link (prevHash is not the hash of seq %d)", seq, seq-1)
		return
	}
	if pos > 0 || v.carried {
		a, errA := parseInstant(prevTS)
		b, errB := parseInstant(r.TS)
		if errA == nil && errB == nil && b.Before(a) {
			v.tsWarnings++
			if v.tsWarnings <= maxTSWarnings {
				v.warnings = append(v.warnings, fmt.Sprintf("non-monotonic timestamp at seq %d (ts went backwards)", seq))
			}
		}
	}
}

// carry makes v continue the state of an earlier segment verified by
// prev: key pins, the tenant and the last timestamp hold across segments.
func (v *StreamVerifier) carry(prev *StreamVerifier) {
	v.pinned = prev.pinned
	v.tenant, v.tenantSeq = prev.tenant, prev.tenantSeq
	v.prevTS = prev.prevTS
	v.tsWarnings = prev.tsWarnings
	v.carried = true
}

// Result gives the verdict on what was fed, including the checkpoint in
// the options.
func (v *StreamVerifier) Result() Result {
	n, chain := v.n, v.chain
	switch {
	case v.decodeErr != nil:
		return *v.decodeErr
	case n == 0:
		return fail(Malformed, "", 0, "empty receipt chain")
	case v.global != nil:
		r := *v.global
		r.Count = n
		return r
	case v.first != nil:
		r := *v.first
		r.Count = n
		return r
	}
	opt := v.opt
	haveKeyring := opt.Keyring != nil
	warnings := append([]string(nil), v.warnings...)
	if extra := v.tsWarnings - maxTSWarnings; extra > 0 {
		warnings = append(warnings, strconv.Itoa(extra)+warnMoreTS)
	}
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
		if cp.HighestSeq != v.headSeq || cp.HeadHash != v.headHash {
			return fail(Tampered, chain, n, "chain head (seq %d) does not match the checkpoint (seq %d): tail truncated or extended", v.headSeq, cp.HighestSeq)
		}
		if haveKeyring && opt.Identity != nil && !opt.Identity.allows(v.opener, cp.Sig.KID) {
			return fail(Untrusted, chain, n, "checkpoint key %q is not authorized for the chain opener %q by the identity manifest", cp.Sig.KID, v.opener)
		}
		tailChecked = state == "ok"
		if !tailChecked {
			warnings = append(warnings, "checkpoint present but not authenticated (no keyring): tail not verified")
		}
	} else {
		warnings = append(warnings, warnNoCheckpoint)
	}
	warnings = append(warnings, warnFork)
	if !haveKeyring {
		warnings = append(warnings, warnNoKeyring)
	}
	res := Result{Verdict: Unverified, Chain: chain, Count: n, Head: v.headHash, TailChecked: tailChecked, Warnings: warnings}
	if haveKeyring {
		res.Verdict = Valid
	}
	res.Reason = describeValid(n, 0, chain, v.headHash, tailChecked, haveKeyring)
	return res
}

const (
	warnMoreTS       = " more non-monotonic timestamps not listed"
	warnNoCheckpoint = "no checkpoint: deleting the most recent receipts cannot be detected offline"
	warnFork         = "fork/equivocation is not detectable offline: this verifies the branch given"
	warnNoKeyring    = "no keyring: signatures were not authenticated"
)

// describeValid is the reason of a successful verification; segments is
// 0 for a chain that is not split.
func describeValid(n, segments int, chain, head string, tailChecked, haveKeyring bool) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(n))
	if n == 1 {
		b.WriteString(" receipt")
	} else {
		b.WriteString(" receipts")
	}
	if segments > 0 {
		fmt.Fprintf(&b, " in %d segments", segments)
	}
	fmt.Fprintf(&b, ", chain %q, head %s", chain, head)
	switch {
	case tailChecked:
		b.WriteString(", tail checked")
	case !haveKeyring:
		b.WriteString(", signatures not authenticated (no keyring)")
	default:
		b.WriteString(", tail not checked (no checkpoint)")
	}
	return b.String()
}

// VerifyStream verifies a chain in the line form read from r, one receipt
// at a time (see StreamVerifier).
func VerifyStream(r io.Reader, opt Options) Result {
	v := NewStreamVerifier(opt)
	feed(v, NewLineReader(r))
	return v.Result()
}

// feed reads every receipt of lr into v; a decoding failure is recorded
// and ends the reading.
func feed(v *StreamVerifier, lr *LineReader) {
	for {
		r, err := lr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			v.Fail(err)
			return
		}
		v.Add(&r)
	}
}

// ExportStream copies a chain in the line form from r to w in the NOA
// JSON-array form, one receipt at a time, and returns how many receipts it
// wrote. On an error, what was written is not a complete array.
func ExportStream(w io.Writer, r io.Reader) (int, error) {
	bw := bufio.NewWriterSize(w, 64<<10)
	lr := NewLineReader(r)
	if _, err := bw.WriteString("[\n"); err != nil {
		return 0, err
	}
	n := 0
	for {
		rc, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, err
		}
		b, err := rc.Bytes()
		if err != nil {
			return n, fmt.Errorf("receipt %d: %w", n, err)
		}
		if n > 0 {
			bw.WriteString(",\n")
		}
		bw.Write(b)
		n++
	}
	if n > 0 {
		bw.WriteString("\n")
	}
	bw.WriteString("]\n")
	if err := bw.Flush(); err != nil {
		return n, fmt.Errorf("writing the export: %w", err)
	}
	return n, nil
}
