package reviewlog

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// receiptIndex maps the action ids of review receipts ("review:<id>") to
// where they are: chain file and byte offset. It is brought up to date by
// reading only what each chain file gained since (chain files only grow); a
// chain file that was replaced, rewritten or removed makes it start over.
type receiptIndex struct {
	mu       sync.Mutex
	files    map[string]*chainCursor
	byAction map[string][]receiptLoc
	// byQuestion maps a caller's question (the guard's DEFERRED receipts:
	// agent.id and paramsHash) to the reviews that answered it, so a
	// signed decision is found even where the log no longer holds it.
	byQuestion map[string][]string
	// served holds, per action, the kinds of service answer (verdict and
	// rule) already indexed: a pending review or a hold given again and
	// again is one more receipt in the chain each time, but only the first
	// of each kind says anything about the review, so reading a review
	// costs the same however often it was asked about.
	served map[string]bool
	// allowed are the recent SERVICE ALLOWED receipts (and every hold):
	// each must have a reservation record.
	allowed allowIndex
	// byCredential maps a passkey's credential id to the HUMAN receipts
	// whose agent.model carries an assertion it is said to have made, so
	// its signature counter can be read back (see Log.LastSignCount).
	byCredential map[string][]receiptLoc
}

// serviceKind is what a service receipt of an action is indexed by.
func serviceKind(r *noa.Receipt) string {
	rule := ""
	if r.Governance.RuleID != nil {
		rule = *r.Governance.RuleID
	}
	return r.Action.ID + "\x00" + r.Agent.ID + "\x00" + r.Governance.Verdict + "\x00" + rule
}

func questionOf(agent, paramsHash string) string { return agent + "\x00" + paramsHash }

type chainCursor struct {
	identity string
	off      int64
	size     int64  // the stream's size when it was last read
	version  string // and its version
	anchor   []byte
}

type receiptLoc struct {
	file string
	off  int64
}

// refresh reads what the chain segments gained since the last call.
func (ix *receiptIndex) refresh(ctx context.Context, r Reader) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	infos, err := r.Segments(ctx)
	if err != nil {
		return err
	}
	present := make(map[string]StreamInfo, len(infos))
	for _, e := range infos {
		present[e.Name] = e
	}
	for name := range ix.files {
		if _, ok := present[name]; !ok {
			ix.files = nil // a segment went away: start over
			break
		}
	}
	for restart := 0; restart < 2; restart++ {
		if ix.files == nil {
			ix.files, ix.byAction, ix.byQuestion, ix.served = map[string]*chainCursor{}, map[string][]receiptLoc{}, map[string][]string{}, map[string]bool{}
			ix.byCredential = map[string][]receiptLoc{}
			ix.allowed.reset()
		}
		stale := false
		for name, e := range present {
			// Unchanged since the last read (same identity, size and
			// version, as the listing says): nothing to open.
			if cur := ix.files[name]; cur != nil && cur.identity == e.Identity && cur.size == e.Size && cur.version == e.Version {
				continue
			}
			ok, err := ix.readFile(ctx, r, e)
			if err != nil {
				return err
			}
			if !ok {
				stale = true
				break
			}
		}
		if !stale {
			return nil
		}
		ix.files = nil
	}
	return errors.New("the decision chains keep changing under the reader")
}

// readFile indexes what a segment gained; false when it is not the one
// indexed before (the caller starts over).
func (ix *receiptIndex) readFile(ctx context.Context, r Reader, info StreamInfo) (bool, error) {
	name := info.Name
	f, err := r.Segment(ctx, name)
	if err != nil {
		return false, fmt.Errorf("chain %s: %w", name, err)
	}
	defer f.Close()
	size := f.Size()
	cur := ix.files[name]
	if cur == nil {
		cur = &chainCursor{identity: f.Identity()}
		ix.files[name] = cur
	} else if cur.identity != f.Identity() || size < cur.off || !bytes.Equal(readAnchor(f, cur.off), cur.anchor) {
		return false, nil
	}
	cur.size, cur.version = size, info.Version
	if size == cur.off {
		return true, nil
	}
	// A buffer no larger than what is new (a decision or two, most often):
	// readLine reads a line of any length through any buffer.
	br := bufio.NewReaderSize(io.NewSectionReader(f, cur.off, size-cur.off), int(min(size-cur.off+1, 64<<10)))
	off := cur.off
	for {
		line, err := readLine(br)
		if err == io.EOF {
			break // a torn last line is no receipt yet
		}
		if err != nil && !errors.Is(err, errLineTooLong) {
			return false, fmt.Errorf("chain %s: %w", name, err)
		}
		at := off
		off += int64(len(line))
		if err == nil {
			ix.allowed.see(line)
		}
		if err != nil || !bytes.Contains(line, []byte(`"review:`)) {
			continue
		}
		r, perr := noa.ParseReceipt(bytes.TrimRight(line, "\r\n"))
		if perr != nil || !strings.HasPrefix(r.Action.ID, "review:") {
			continue // the chain's verifier reports what is malformed
		}
		if r.Agent.Principal == noa.PrincipalService {
			k := serviceKind(&r)
			if ix.served[k] {
				continue // the same answer again: the first one is indexed
			}
			ix.served[k] = true
		}
		ix.byAction[r.Action.ID] = append(ix.byAction[r.Action.ID], receiptLoc{file: name, off: at})
		if r.Agent.Principal == noa.PrincipalHuman {
			if a, ok, err := passkey.DecodeModel(r.Agent.Model); ok && err == nil {
				ix.byCredential[a.CredentialID] = append(ix.byCredential[a.CredentialID], receiptLoc{file: name, off: at})
			}
		}
		if r.Agent.Principal == noa.PrincipalService && r.Governance.Verdict == noa.VerdictDeferred {
			k := questionOf(r.Agent.ID, r.Action.ParamsHash)
			if !slices.Contains(ix.byQuestion[k], r.Action.ID) {
				ix.byQuestion[k] = append(ix.byQuestion[k], r.Action.ID)
			}
		}
	}
	cur.off = off
	cur.anchor = readAnchor(f, off)
	return true, nil
}

// receipts reads back the receipts of one action, in chain order.
func (ix *receiptIndex) receipts(ctx context.Context, r Reader, action string) ([]noa.Receipt, error) {
	ix.mu.Lock()
	locs := append([]receiptLoc(nil), ix.byAction[action]...)
	ix.mu.Unlock()
	return readLocs(ctx, r, locs)
}

// byPasskey reads back the HUMAN receipts that carry an assertion naming
// credential id, in chain order.
func (ix *receiptIndex) byPasskey(ctx context.Context, r Reader, id string) ([]noa.Receipt, error) {
	ix.mu.Lock()
	locs := append([]receiptLoc(nil), ix.byCredential[id]...)
	ix.mu.Unlock()
	return readLocs(ctx, r, locs)
}

func readLocs(ctx context.Context, r Reader, locs []receiptLoc) ([]noa.Receipt, error) {
	if len(locs) == 0 {
		return nil, nil
	}
	out := make([]noa.Receipt, 0, len(locs))
	for _, loc := range locs {
		f, err := r.Segment(ctx, loc.file)
		if err != nil {
			return nil, fmt.Errorf("chain %s: %w", loc.file, err)
		}
		line, err := lineAt(f, loc.off)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("chain %s: %w", loc.file, err)
		}
		rc, err := noa.ParseReceipt(line)
		if err != nil {
			return nil, fmt.Errorf("chain %s at byte %d: %w", loc.file, loc.off, err)
		}
		out = append(out, rc)
	}
	return out, nil
}

// reviewsOf lists the action ids of the reviews the chains say answered
// caller's question (by its paramsHash), oldest first.
func (ix *receiptIndex) reviewsOf(caller, paramsHash string) []string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return append([]string(nil), ix.byQuestion[questionOf(caller, paramsHash)]...)
}

// actions lists the indexed action ids.
func (ix *receiptIndex) actions() []string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make([]string, 0, len(ix.byAction))
	for a := range ix.byAction {
		out = append(out, a)
	}
	return out
}

// lineAt reads the line that starts at off (without its newline).
func lineAt(src io.ReaderAt, off int64) ([]byte, error) {
	buf := make([]byte, 4096)
	var line []byte
	for {
		n, err := src.ReadAt(buf, off+int64(len(line)))
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return bytes.TrimSuffix(append(line, buf[:i]...), []byte{'\r'}), nil
		}
		line = append(line, buf[:n]...)
		if err != nil || len(line) > maxLineBytes {
			return nil, fmt.Errorf("the line at byte %d can no longer be read: the file changed under the reader", off)
		}
		if len(buf) < 64<<10 {
			buf = make([]byte, 64<<10)
		}
	}
}
