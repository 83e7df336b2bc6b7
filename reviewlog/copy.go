package reviewlog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// ErrChainInvalid: a chain of the store being copied does not verify
// VALID, so nothing was copied.
var ErrChainInvalid = errors.New("a chain does not verify VALID")

// ErrStoreNotEmpty: the store copied into already holds guard state.
var ErrStoreNotEmpty = errors.New("the destination store is not empty")

// CopyReport says what CopyStore copied.
type CopyReport struct {
	LogLines, Archives, Chains, Receipts, Keys, LedgerEntries, Mandates int
	// Questions are the decisions' kept questions (QuestionKeeper).
	Questions int
}

// outboxSettler is a writer whose store notifies opened reviews: a copy
// brings reviews that were notified where they came from.
type outboxSettler interface {
	SettleNotifications(ctx context.Context) error
}

// CopyStore copies everything src holds into dst, which must be empty:
// the review log, its archives and every chain segment byte for byte, and
// the keyring. Every chain must verify VALID (with src's keyring) before
// anything is written, and verify VALID in dst with the same head after;
// every stream must read back with the same SHA-256. The copy is one
// locked section of dst, so for a database it commits whole or not at
// all.
func CopyStore(ctx context.Context, src, dst Store) (CopyReport, error) {
	var rep CopyReport
	before, err := chainDigests(ctx, src)
	if err != nil {
		return rep, fmt.Errorf("%s: %w", src.Describe(), err)
	}
	err = dst.Locked(Bulk(ctx), defaultLockWait, func(w Writer) error {
		if err := checkEmpty(ctx, w); err != nil {
			return fmt.Errorf("%s: %w", dst.Describe(), err)
		}
		return src.View(ctx, func(r Reader) error {
			kr, err := r.Keyring(ctx)
			if err != nil {
				return err
			}
			kids := make([]string, 0, len(kr))
			for kid := range kr {
				kids = append(kids, kid)
			}
			sort.Strings(kids)
			for _, kid := range kids {
				if err := w.AddKey(ctx, kid, kr[kid]); err != nil {
					return err
				}
				rep.Keys++
			}
			// The policy the server recorded travels with the store, so the
			// review commands on the copy decide under the same one.
			if rec, ok, err := r.Policy(ctx); err != nil {
				return err
			} else if ok {
				if err := w.SetPolicy(ctx, rec); err != nil {
					return err
				}
			}
			segs, err := r.Segments(ctx)
			if err != nil {
				return err
			}
			for _, s := range segs {
				data, err := readStream(ctx, func() (Stream, error) { return r.Segment(ctx, s.Name) })
				if err != nil {
					return fmt.Errorf("chain file %s: %w", s.Name, err)
				}
				if len(data) == 0 {
					continue
				}
				if err := w.AppendSegment(ctx, s.Name, 0, data); err != nil {
					return err
				}
			}
			logData, err := readStream(ctx, func() (Stream, error) { return r.Log(ctx) })
			if err != nil {
				return fmt.Errorf("the review log: %w", err)
			}
			if len(logData) > 0 {
				if logData[len(logData)-1] != '\n' {
					return fmt.Errorf("%w: the review log ends in an unfinished line; let the next decision repair it, then copy", ErrBadInput)
				}
				if err := w.AppendLog(ctx, logData); err != nil {
					return err
				}
				rep.LogLines = bytes.Count(logData, []byte{'\n'})
			}
			names, err := r.Archives(ctx)
			if err != nil {
				return err
			}
			for _, name := range names {
				data, err := readStream(ctx, func() (Stream, error) { return r.Archive(ctx, name) })
				if err != nil {
					return fmt.Errorf("archive %s: %w", name, err)
				}
				if err := w.ReplaceLog(ctx, name, data, logData); err != nil {
					return err
				}
				rep.Archives++
			}
			// The spend ledger, lane by lane, line for line.
			raws, err := r.Ledger().Since(ctx, nil)
			if err != nil {
				return fmt.Errorf("the spend ledger: %w", err)
			}
			if err := copyLedger(Bulk(ctx), w.LedgerAppender(), raws); err != nil {
				return err
			}
			rep.LedgerEntries = len(raws)
			// The mandate records, line for line (each is signed and
			// linked to the one before it).
			ms, err := r.Mandates(ctx)
			if err != nil {
				return err
			}
			for i, line := range ms {
				if err := w.AppendMandate(ctx, i, line); err != nil {
					return err
				}
			}
			rep.Mandates = len(ms)
			// The kept questions, line for line, in the order kept (each
			// is sealed, and bound to its receipt, by the engine).
			if rep.Questions, err = copyQuestions(ctx, r, w); err != nil {
				return err
			}
			if s, ok := w.(outboxSettler); ok {
				return s.SettleNotifications(ctx)
			}
			return nil
		})
	})
	if err != nil {
		return rep, err
	}
	after, err := chainDigests(ctx, dst)
	if err != nil {
		return rep, fmt.Errorf("%s, after the copy: %w", dst.Describe(), err)
	}
	for name, d := range before {
		if after[name] != d {
			return rep, fmt.Errorf("%s: stream %s does not read back as it was copied", dst.Describe(), name)
		}
		if d.chain {
			rep.Chains++
			rep.Receipts += d.receipts
		}
	}
	if len(after) != len(before) {
		return rep, fmt.Errorf("%s: holds %d streams after the copy, %d were copied", dst.Describe(), len(after), len(before))
	}
	return rep, nil
}

// copyQuestions copies the kept questions where both stores keep them.
func copyQuestions(ctx context.Context, r Reader, w Writer) (int, error) {
	src, ok := r.(QuestionSource)
	keeper, ok2 := w.(QuestionKeeper)
	if !ok || !ok2 {
		return 0, nil
	}
	n := 0
	err := src.Questions(ctx, func(line []byte) error {
		var head struct {
			Receipt string `json:"receipt"`
		}
		if err := json.Unmarshal(line, &head); err != nil || head.Receipt == "" {
			return fmt.Errorf("%w: kept question %d is not a question line", ErrBadInput, n+1)
		}
		if err := keeper.KeepQuestion(ctx, head.Receipt, bytes.Clone(line)); err != nil {
			return fmt.Errorf("kept question %d: %w", n+1, err)
		}
		n++
		return nil
	})
	return n, err
}

// copyLedger appends every lane's lines to the destination's lane of the
// same number, from its start (a bulk copy may write any lane). A lane
// the source holds cut short is refused: it is not copied as if whole.
func copyLedger(ctx context.Context, app ledger.Appender, raws []ledger.Raw) error {
	byLane := map[int][][]byte{}
	next := map[int]int64{}
	var lanes []int
	for _, r := range raws {
		if r.Line == nil {
			return fmt.Errorf("%w: the spend ledger's lane %d is cut short", ErrBadInput, r.Lane)
		}
		if r.Seq != next[r.Lane] {
			return fmt.Errorf("%w: the spend ledger's lane %d goes from entry %d to %d", ErrBadInput, r.Lane, next[r.Lane]-1, r.Seq)
		}
		if _, ok := byLane[r.Lane]; !ok {
			lanes = append(lanes, r.Lane)
		}
		next[r.Lane] = r.Seq + 1
		byLane[r.Lane] = append(byLane[r.Lane], r.Line)
	}
	for _, lane := range lanes {
		if err := app.Append(ctx, ledger.Pos{Lane: lane}, byLane[lane]); err != nil {
			return fmt.Errorf("the spend ledger's lane %d: %w", lane, err)
		}
	}
	return nil
}

func checkEmpty(ctx context.Context, r Reader) error {
	l, err := r.Log(ctx)
	if err != nil {
		return err
	}
	size := l.Size()
	l.Close()
	segs, err := r.Segments(ctx)
	if err != nil {
		return err
	}
	kr, err := r.Keyring(ctx)
	if err != nil {
		return err
	}
	arch, err := r.Archives(ctx)
	if err != nil {
		return err
	}
	led, err := r.Ledger().Since(ctx, nil)
	if err != nil {
		return err
	}
	if size > 0 || len(segs) > 0 || len(kr) > 0 || len(arch) > 0 || len(led) > 0 {
		return fmt.Errorf("%w: it holds a review log of %d bytes, %d chain segments, %d keys, %d archives and %d ledger entries; copy only into an empty store", ErrStoreNotEmpty, size, len(segs), len(kr), len(arch), len(led))
	}
	return nil
}

func readStream(ctx context.Context, open func() (Stream, error)) ([]byte, error) {
	s, err := open()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return io.ReadAll(io.NewSectionReader(s, 0, s.Size()))
}

type streamDigest struct {
	sum      [32]byte
	chain    bool
	receipts int
}

// chainDigests verifies every chain of s VALID with s's keyring and
// returns the SHA-256 of every stream (chain segments, log, archives).
func chainDigests(ctx context.Context, s Store) (map[string]streamDigest, error) {
	out := map[string]streamDigest{}
	err := s.View(ctx, func(r Reader) error {
		kr, err := r.Keyring(ctx)
		if err != nil {
			return err
		}
		chains, err := ListChains(ctx, r)
		if err != nil {
			return err
		}
		for _, c := range chains {
			res, err := VerifySegments(ctx, r, c.ID, noa.Options{Keyring: kr, InFileOrder: true})
			if err != nil {
				return fmt.Errorf("chain %s: %w", c.ID, err)
			}
			segs, err := ChainSegments(ctx, r, c.ID)
			if err != nil {
				return err
			}
			var total int64
			for i, sg := range segs {
				d, size, err := digest(ctx, func() (Stream, error) { return r.Segment(ctx, sg.File) })
				if err != nil {
					return err
				}
				total += size
				if size == 0 {
					continue // a segment whose first write did not finish: not copied
				}
				d.chain = i == 0
				if d.chain {
					d.receipts = res.Count
				}
				out[ReceiptsDir+"/"+sg.File] = d
			}
			// Only a chain with no bytes at all is empty: one whose first
			// receipt cannot be read verifies no receipt (a count of 0)
			// and is refused like any other.
			if total > 0 && res.Verdict != noa.Valid {
				return fmt.Errorf("%w: chain %s: %s", ErrChainInvalid, c.ID, res.Line())
			}
		}
		d, _, err := digest(ctx, func() (Stream, error) { return r.Log(ctx) })
		if err != nil {
			return err
		}
		out[FileName] = d
		names, err := r.Archives(ctx)
		if err != nil {
			return err
		}
		for _, name := range names {
			d, _, err := digest(ctx, func() (Stream, error) { return r.Archive(ctx, name) })
			if err != nil {
				return err
			}
			out[name] = d
		}
		return nil
	})
	return out, err
}

func digest(ctx context.Context, open func() (Stream, error)) (streamDigest, int64, error) {
	s, err := open()
	if err != nil {
		return streamDigest{}, 0, err
	}
	defer s.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(s, 0, s.Size())); err != nil {
		return streamDigest{}, 0, err
	}
	var d streamDigest
	copy(d.sum[:], h.Sum(nil))
	return d, s.Size(), nil
}
