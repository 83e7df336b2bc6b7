package noa

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// A long chain is split into segments, each an ordinary NOA chain of its
// own that any NOA verifier accepts. Segment 0 is the chain as it started
// (scope.chain C); segment k ≥ 1 is the partition "C.k", and its genesis
// receipt is a continuation: a signed statement naming the previous
// segment and its head hash, so that the segments verify end to end.
const (
	// ContinueCanonical is action.canonical of a continuation receipt.
	ContinueCanonical = "chain.continue"
	// ContinueAgent is agent.id of a continuation receipt: the service
	// that keeps the chain, principal SERVICE.
	ContinueAgent = "haia-trace-mcp"
)

// SegmentChain is scope.chain of segment k of chain: chain itself for
// segment 0, "chain.k" after it.
func SegmentChain(chain string, k int) string {
	if k == 0 {
		return chain
	}
	return chain + "." + strconv.Itoa(k)
}

// ContinueDraft is the genesis of segment k ≥ 1 of chain, following prev,
// the head of segment k-1: action.id names the previous segment and
// action.paramsHash is prev's chain.hash.
func ContinueDraft(chain string, k int, prev Receipt, ts time.Time, tenant string) Draft {
	return Draft{
		TS:     ts,
		Tenant: tenant,
		Chain:  SegmentChain(chain, k),
		Agent:  Agent{ID: ContinueAgent, Principal: PrincipalService},
		Action: Action{
			ID: prev.Scope.Chain, Canonical: ContinueCanonical, RiskClass: "LOW",
			ParamsHash: prev.Chain.Hash, Reversible: false,
		},
		Governance: Governance{Mode: "on", Verdict: VerdictExecuted},
	}
}

// SegmentSource is one segment file: a name for messages and a way to
// open it.
type SegmentSource struct {
	Name string
	Open func() (io.ReadCloser, error)
}

// VerifySegments verifies the segments of one chain in order, each as a
// stream (StreamVerifier) in bounded memory, and the links between them:
// segment k ≥ 1 must be the partition SegmentChain(C, k) of the chain C
// segment 0 names, and its seq-0 receipt a continuation (ContinueCanonical)
// whose action.id is the previous segment's scope.chain and whose
// action.paramsHash is the previous segment's head hash. Key pins and the
// tenant hold across segments. opt.Checkpoint is checked against the last
// segment (the tail). The error is for a segment that cannot be opened.
func VerifySegments(segs []SegmentSource, opt Options) (Result, error) {
	if len(segs) == 0 {
		return fail(Malformed, "", 0, "no chain segments given"), nil
	}
	var warnings []string
	if n := len(segs); n > 1 {
		// A last segment with no complete line is one whose first write
		// did not finish (the writer died); like a torn last line, it is
		// not part of the chain yet.
		empty, err := segmentEmpty(segs[n-1])
		if err != nil {
			return Result{}, fmt.Errorf("segment %d: %w", n-1, err)
		}
		if empty {
			warnings = append(warnings, fmt.Sprintf("segment %d (%s) holds no complete receipt yet (its first write did not finish); verified up to segment %d", n-1, segs[n-1].Name, n-2))
			segs = segs[:n-1]
		}
	}
	var prev *StreamVerifier
	total := 0
	base := ""
	var last Result
	for k, seg := range segs {
		o := opt
		if k < len(segs)-1 {
			o.Checkpoint = nil
		}
		v := NewStreamVerifier(o)
		if prev != nil {
			v.carry(prev)
		}
		f, err := seg.Open()
		if err != nil {
			return Result{}, fmt.Errorf("segment %d: %w", k, err)
		}
		lr := NewLineReader(f)
		first := true
		for {
			r, err := lr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				v.Fail(err)
				break
			}
			v.Add(&r)
			if first {
				first = false
				if k == 0 {
					base = r.Scope.Chain
				} else if bad := checkContinuation(&r, base, k, prev); bad != "" {
					v.setGlobal("%s", bad)
				}
			}
		}
		f.Close()
		res := v.Result()
		total += res.Count
		if res.Verdict != Valid && res.Verdict != Unverified {
			if len(segs) > 1 {
				res.Reason = fmt.Sprintf("segment %d (%s): %s", k, seg.Name, res.Reason)
				res.Chain = base
				res.Count = total
				res.Segments = len(segs)
			}
			return res, nil
		}
		for _, w := range res.Warnings {
			if k == len(segs)-1 || (w != warnNoCheckpoint && !strings.HasSuffix(w, warnMoreTS)) {
				warnings = appendOnce(warnings, w)
			}
		}
		last = res
		prev = v
	}
	if len(segs) == 1 {
		// warnings already holds the one segment's, each once.
		last.Warnings = warnings
		return last, nil
	}
	last.Chain = base
	last.Count = total
	last.Segments = len(segs)
	last.Warnings = warnings
	last.Reason = describeValid(total, len(segs), base, last.Head, last.TailChecked, opt.Keyring != nil)
	return last, nil
}

// segmentEmpty reports whether a segment has no complete line.
func segmentEmpty(seg SegmentSource) (bool, error) {
	f, err := seg.Open()
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = NewLineReader(f).Next()
	return err == io.EOF, nil
}

// checkContinuation says what is wrong with r as the first receipt of
// segment k of chain base after prev ("" when nothing).
func checkContinuation(r *Receipt, base string, k int, prev *StreamVerifier) string {
	want := SegmentChain(base, k)
	switch {
	case r.Scope.Chain != want:
		return fmt.Sprintf("segment %d is the partition %q, not %q: segments reordered or from another chain", k, r.Scope.Chain, want)
	case r.Action.Canonical != ContinueCanonical:
		return fmt.Sprintf("segment %d does not start with a %s receipt linking it to segment %d", k, ContinueCanonical, k-1)
	case r.Action.ID != prev.chain:
		return fmt.Sprintf("segment %d continues %q, not the previous segment %q", k, r.Action.ID, prev.chain)
	case r.Action.ParamsHash != prev.headHash:
		return fmt.Sprintf("segment %d links to head %s, but segment %d ends at %s (seq %d): segment cut, extended or replaced", k, r.Action.ParamsHash, k-1, prev.headHash, prev.headSeq)
	}
	return ""
}

func appendOnce(ws []string, w string) []string {
	for _, x := range ws {
		if x == w {
			return ws
		}
	}
	return append(ws, w)
}
