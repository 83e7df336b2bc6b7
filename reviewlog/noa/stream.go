package noa

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"runtime"
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
	// keys caches decoded keyring entries by kid (bounded by the keyring).
	keys map[string]ed25519.PublicKey

	decodeErr *Result
	global    *Result
	first     *Result

	tsWarnings int
	warnings   []string

	// carried is true when state came from an earlier segment (carry).
	carried bool

	// Signatures are checked by other goroutines, a batch at a time,
	// while reading goes on; failures are taken in file order.
	cur      []sigJob
	inflight []*sigBatch
	// stopped: a receipt-level failure is queued, later receipts are
	// only checked structurally.
	stopped bool
}

// sigJob is one receipt's signature to check, or a receipt-level failure
// found without it: before the signature check (pre, nothing to check) or
// after it (taken only when the signature holds).
type sigJob struct {
	seq  int64
	kid  string
	pub  ed25519.PublicKey
	msg  [len(receiptDomain) + sha256.Size]byte
	sig  string
	fail *Result
}

type sigBatch struct {
	jobs []sigJob
	bad  []bool
	done chan struct{}
}

const sigBatchSize = 128

func (b *sigBatch) run() {
	defer close(b.done)
	for i := range b.jobs {
		j := &b.jobs[i]
		b.bad[i] = j.pub != nil && !verifySig(j.pub, j.msg[:], j.sig)
	}
}

// NewStreamVerifier starts a verification with opt; opt.InFileOrder is
// implied.
func NewStreamVerifier(opt Options) *StreamVerifier {
	opt.InFileOrder = true
	return &StreamVerifier{opt: opt, pinned: map[string]string{}}
}

// Count is the number of receipts fed so far.
func (v *StreamVerifier) Count() int { return v.n }

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
	if v.stopped {
		return
	}
	v.checkReceipt(r, seq, pos, prevHash, prevTS)
}

// checkReceipt runs the receipt-level checks in VerifyChain's order; the
// signature check itself is queued (settle takes the results in order).
func (v *StreamVerifier) checkReceipt(r *Receipt, seq int64, pos int, prevHash, prevTS string) {
	job := sigJob{seq: seq, kid: r.Sig.KID}
	failf := func(verdict Verdict, format string, args ...any) {
		res := fail(verdict, v.chain, 0, format, args...)
		job.fail = &res
	}
	v.check(r, &job, failf, seq, prevHash)
	v.queue(job)
	if job.fail == nil && (pos > 0 || v.carried) {
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

func (v *StreamVerifier) check(r *Receipt, job *sigJob, failf func(Verdict, string, ...any), seq int64, prevHash string) {
	input, err := r.HashInput()
	if err != nil {
		failf(Malformed, "seq %d: %v", seq, err)
		return
	}
	sum := sha256.Sum256(input)
	if "sha256:"+hex.EncodeToString(sum[:]) != r.Chain.Hash {
		failf(Tampered, "seq %d: hash mismatch (content altered)", seq)
		return
	}
	if kid, ok := v.pinned[r.Agent.ID]; !ok {
		v.pinned[r.Agent.ID] = r.Sig.KID
	} else if kid != r.Sig.KID {
		failf(Tampered, "seq %d: key swap for agent %q (kid %q -> %q)", seq, r.Agent.ID, kid, r.Sig.KID)
		return
	}
	if v.opt.Keyring != nil {
		pub, known, ok := v.key(r.Sig.KID)
		if !known {
			failf(Tampered, "seq %d: signing key %q is not in the keyring", seq, r.Sig.KID)
			return
		}
		if !ok {
			failf(Tampered, "seq %d: invalid signature (kid %q)", seq, r.Sig.KID)
			return
		}
		// From here on a failure counts only if the signature holds.
		job.pub, job.sig = pub, r.Sig.Value
		copy(job.msg[:], receiptDomain)
		copy(job.msg[len(receiptDomain):], sum[:])
		if v.opt.Identity != nil && !v.opt.Identity.allows(r.Agent.ID, r.Sig.KID) {
			failf(Untrusted, "seq %d: agent %q is not authorized for signing key %q by the identity manifest", seq, r.Agent.ID, r.Sig.KID)
			return
		}
	}
	if seq == 0 {
		if r.Chain.PrevHash != nil {
			failf(Tampered, "genesis (seq 0) prevHash must be null")
		}
	} else if r.Chain.PrevHash == nil || *r.Chain.PrevHash != prevHash {
		failf(Tampered, "seq %d: broken link (prevHash is not the hash of seq %d)", seq, seq-1)
	}
}

// queue adds a job; a full batch (or one ending in a failure) goes to a
// goroutine, and the oldest batch is settled when too many are out.
func (v *StreamVerifier) queue(job sigJob) {
	if job.pub == nil && job.fail == nil && len(v.cur) == 0 && len(v.inflight) == 0 {
		return // nothing to check, nothing before it to wait for
	}
	v.cur = append(v.cur, job)
	if job.fail != nil {
		v.stopped = true
	}
	if job.fail != nil || len(v.cur) >= sigBatchSize {
		v.dispatch()
	}
	if len(v.inflight) > runtime.GOMAXPROCS(0) {
		v.settleOldest()
	}
}

func (v *StreamVerifier) dispatch() {
	if len(v.cur) == 0 {
		return
	}
	b := &sigBatch{jobs: v.cur, bad: make([]bool, len(v.cur)), done: make(chan struct{})}
	go b.run()
	v.inflight = append(v.inflight, b)
	v.cur = make([]sigJob, 0, sigBatchSize)
}

// settleOldest waits for the oldest batch and takes its first failure.
func (v *StreamVerifier) settleOldest() {
	b := v.inflight[0]
	v.inflight = v.inflight[1:]
	<-b.done
	if v.first != nil {
		return
	}
	for i, j := range b.jobs {
		var res *Result
		switch {
		case b.bad[i]:
			r := fail(Tampered, v.chain, 0, "seq %d: invalid signature (kid %q)", j.seq, j.kid)
			res = &r
		case j.fail != nil:
			res = j.fail
		}
		if res != nil {
			v.first, v.stopped = res, true
			v.inflight = nil // later receipts: their outcome no longer counts
			return
		}
	}
}

// settle waits for every signature check queued.
func (v *StreamVerifier) settle() {
	v.dispatch()
	for len(v.inflight) > 0 {
		v.settleOldest()
	}
}

// key returns kid's public key from the keyring: known is false when the
// keyring has no such kid, ok false when its entry does not decode.
func (v *StreamVerifier) key(kid string) (pub ed25519.PublicKey, known, ok bool) {
	if pub, ok := v.keys[kid]; ok {
		return pub, true, pub != nil
	}
	b64, known := v.opt.Keyring[kid]
	if !known {
		return nil, false, false
	}
	pub, err := DecodeSPKI(b64)
	if err != nil {
		pub = nil
	}
	if v.keys == nil {
		v.keys = map[string]ed25519.PublicKey{}
	}
	v.keys[kid] = pub
	return pub, true, pub != nil
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
	if v.decodeErr == nil && v.global == nil {
		v.settle()
	}
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
