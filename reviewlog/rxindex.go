package reviewlog

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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
	// live is the store's own index of the section being read (nil: the
	// fold above answers), set by newVerifier; l.mu is held.
	live *indexSource
	// unchecked: see indexSource (tests only).
	unchecked bool
	// reserving is what the lane read of the reserving receipts through
	// the store's index.
	reserving reservingCache
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

// ReceiptIndex is a Reader whose store indexes the decision chains'
// receipts in rows (the PostgreSQL store's receipt_rows), so that a
// decision reads the receipts it needs by index instead of reading every
// receipt appended since (receiptIndex.refresh). Each method gives the
// receipt LINES the rows point to, with what the rows say of them; a row
// is an index, never a record: every line is parsed and checked against
// its row here, and signatures are verified as for the fold's receipts.
//
// It is one of the optional interfaces a store's Reader may implement
// (like ReservationIndex); the log uses it when present.
type ReceiptIndex interface {
	// ActionReceipts are the receipts of action ("review:<id>"), oldest
	// first: every HUMAN one, and the first service receipt of each
	// agent, verdict and rule (the fold's serviceKind).
	ActionReceipts(ctx context.Context, action string) ([]IndexedReceipt, error)
	// QuestionReceipts are, one a review, the first service DEFERRED
	// receipt of a review action given to agent for paramsHash, oldest
	// first.
	QuestionReceipts(ctx context.Context, agent, paramsHash string) ([]IndexedReceipt, error)
	// CredentialReceipts are the HUMAN receipts whose agent.model carries
	// an assertion by passkey credential id, oldest first.
	CredentialReceipts(ctx context.Context, credential string) ([]IndexedReceipt, error)
	// ReservingReceipts are, in one statement (one moment), the receipts
	// that reserve (ReservesOf) which a reader that counted known of them
	// (by segment) has not read: of a segment it knows, those numbered
	// past its count; of another, those of the window from and every
	// hold; in every segment, those named by ids; and each segment's
	// numbering of them (ReservingSegment).
	ReservingReceipts(ctx context.Context, from time.Time, ids []string, known map[string]int64) (ReservingReceipts, error)
}

// IndexedReceipt is one row of a receipt index with the line it points to
// (nil where the segment holds no line at the offset).
type IndexedReceipt struct {
	Segment string // the segment's file name (SegmentFile)
	Off     int64
	Line    []byte
	// What the row says of the line: unverified.
	ReceiptID, ActionID string
	// Reserves is ReservesOf as the row says it; Count how many receipts
	// of its segment reserve, up to and including this one.
	Reserves string
	Count    int64
}

// ReservingReceipts are the reserving rows a decision reads, and, for
// every segment, what numbers them.
type ReservingReceipts struct {
	Rows     []IndexedReceipt
	Segments []ReservingSegment
}

// ReservingSegment is one segment's numbering of its reserving receipts.
type ReservingSegment struct {
	Segment string
	// Head is the count the row of the segment's last line carries (-1:
	// that line has no row, or the last row does not end the segment).
	Head int64
	// Below is, for a segment not known, the newest reserving row whose
	// time is before the window (nil: none, or a segment known): every
	// reserving row after it (or after the count known) up to Head must
	// be among the rows.
	Below *IndexedReceipt
}

// Reserving kinds (ReservesOf).
const (
	ReservesAllow = "allow"
	ReservesHold  = "hold"
)

// ReservesOf says whether receipt r reserves a payment: "allow" for a
// SERVICE ALLOWED answer to a question, "hold" for one that holds an
// authorization, "" otherwise (r's time must read, too).
func ReservesOf(r *noa.Receipt) string {
	return reserves(r.Agent.Principal, r.Agent.ID, r.Governance.Verdict, r.TS, r.Action.Canonical)
}

// reservesHead is ReservesOf of a receipt's head.
func reservesHead(h noa.Head) string {
	return reserves(h.Agent.Principal, h.Agent.ID, h.Governance.Verdict, h.TS, h.Action.Canonical)
}

func reserves(principal, agent, verdict, ts, canonical string) string {
	if principal != noa.PrincipalService || verdict != noa.VerdictAllowed || agent == noa.ContinueAgent {
		return ""
	}
	if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		return ""
	}
	// Only the answers to questions reserve (not, say, the record of an
	// authorization signed after one).
	switch canonical {
	case canonicalPayment:
		return ReservesAllow
	case CanonicalAuthorization:
		return ReservesHold
	}
	return ""
}

// PasskeyCredential is the passkey credential id a HUMAN receipt's
// agent.model carries ("" when none), as the index keeps it.
func PasskeyCredential(r *noa.Receipt) string {
	if r.Agent.Principal != noa.PrincipalHuman {
		return ""
	}
	if a, ok, err := passkey.DecodeModel(r.Agent.Model); ok && err == nil {
		return a.CredentialID
	}
	return ""
}

// indexSource is a receipt index as one section reads it.
type indexSource struct {
	ctx context.Context
	idx ReceiptIndex
	// unchecked turns off the checks of the rows against their lines and
	// of their numbering (tests show each edit passes without them).
	unchecked bool
	// cache is the lane's (l.rx.reserving).
	cache *reservingCache
}

// parseIndexed parses the line of row (false when there is none, or it is
// no receipt).
func parseIndexed(row IndexedReceipt) (noa.Receipt, bool) {
	if row.Line == nil {
		return noa.Receipt{}, false
	}
	r, err := noa.ParseReceipt(bytes.TrimRight(row.Line, "\r\n"))
	return r, err == nil
}

// actionReceipts reads the receipts of action through the index: a row
// whose line is not a receipt of action is no receipt of it.
func (s *indexSource) actionReceipts(action string) ([]noa.Receipt, error) {
	rows, err := s.idx.ActionReceipts(s.ctx, action)
	return receiptsWhere(rows, err, func(r *noa.Receipt) bool { return s.unchecked || r.Action.ID == action })
}

// receiptsWhere parses the lines of rows and keeps the receipts that are
// what the rows were looked up for (keep).
func receiptsWhere(rows []IndexedReceipt, err error, keep func(r *noa.Receipt) bool) ([]noa.Receipt, error) {
	if err != nil {
		return nil, err
	}
	var out []noa.Receipt
	for _, row := range rows {
		if r, ok := parseIndexed(row); ok && keep(&r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// reviewsOf lists the reviews the service's DEFERRED receipts say asked
// caller's question, oldest first; a row whose line does not say so names
// none.
func (s *indexSource) reviewsOf(caller, paramsHash string) ([]string, error) {
	rows, err := s.idx.QuestionReceipts(s.ctx, caller, paramsHash)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, row := range rows {
		r, ok := parseIndexed(row)
		if !ok || !strings.HasPrefix(r.Action.ID, "review:") || slices.Contains(out, r.Action.ID) {
			continue
		}
		if !s.unchecked && (r.Agent.Principal != noa.PrincipalService || r.Governance.Verdict != noa.VerdictDeferred ||
			r.Agent.ID != caller || r.Action.ParamsHash != paramsHash) {
			continue
		}
		out = append(out, r.Action.ID)
	}
	return out, nil
}

// byPasskey reads the HUMAN receipts of credential id through the index.
func (s *indexSource) byPasskey(id string) ([]noa.Receipt, error) {
	rows, err := s.idx.CredentialReceipts(s.ctx, id)
	return receiptsWhere(rows, err, func(r *noa.Receipt) bool { return PasskeyCredential(r) == id })
}

// reservingCache is what a lane keeps of the reserving receipts it read
// through a store's index: each verified against its line, and each
// segment's count of them up to which every one was read.
type reservingCache struct {
	counts  map[string]int64
	allowed allowIndex
}

// reserving reads, through the index, the reserving receipts the lane has
// not read yet — of a segment it counted, those numbered past its count;
// of another, those of the window from and every hold — and those held
// names, and checks what it read: each row against its line, and each
// segment's rows numbered without a gap from its count (or from the one
// before the window, whose line must be before it) up to the count its
// last line's row carries, which may not be less than the lane counted.
// What does not hold is a problem (the decision reads the reservations as
// unverified), and the segment's count does not move on.
func (s *indexSource) reserving(from time.Time, held []string) (allowSet, []string, error) {
	c := s.cache
	if c.counts == nil {
		c.counts = map[string]int64{}
	}
	var ids []string
	for _, id := range held {
		if _, ok := c.allowed.get(id); !ok {
			ids = append(ids, id)
		}
	}
	got, err := s.idx.ReservingReceipts(s.ctx, from, ids, maps.Clone(c.counts))
	if err != nil {
		return nil, nil, err
	}
	var problems []string
	faulty := map[string]bool{}
	bad := func(seg, format string, args ...any) {
		faulty[seg] = true
		problems = append(problems, "the decision chains' receipt index "+fmt.Sprintf(format, args...))
	}
	seen := map[string]map[int64]bool{}
	for _, row := range got.Rows {
		r, ok := parseIndexed(row)
		kind := ""
		if ok {
			kind = ReservesOf(&r)
		}
		if !s.unchecked {
			switch {
			case !ok:
				bad(row.Segment, "names receipt %s at byte %d of %s, where the segment holds no receipt", clip(row.ReceiptID), row.Off, row.Segment)
				continue
			case kind == "" || kind != row.Reserves || r.ID != row.ReceiptID:
				bad(row.Segment, "names receipt %s at byte %d of %s as one that reserves, where the segment holds another receipt (%s)", clip(row.ReceiptID), row.Off, row.Segment, clip(r.ID))
				continue
			}
			if seen[row.Segment] == nil {
				seen[row.Segment] = map[int64]bool{}
			}
			if seen[row.Segment][row.Count] {
				bad(row.Segment, "numbers two receipts of %s %d", row.Segment, row.Count)
				continue
			}
			seen[row.Segment][row.Count] = true
		} else if kind == "" {
			continue
		}
		ts, _ := time.Parse(time.RFC3339Nano, r.TS)
		c.allowed.add(allowedReceipt{id: r.ID, agent: r.Agent.ID, ts: ts, hold: kind == ReservesHold})
	}
	if s.unchecked {
		return &c.allowed, nil, nil
	}
	for _, sg := range got.Segments {
		low, counted := c.counts[sg.Segment]
		switch {
		case sg.Head < 0:
			bad(sg.Segment, "holds no row for the last receipt of %s", sg.Segment)
			continue
		case counted && sg.Head < low:
			bad(sg.Segment, "counts %d reserving receipts in %s, fewer than the %d it counted before (rows removed)", sg.Head, sg.Segment, low)
			continue
		}
		if b := sg.Below; !counted && b != nil {
			r, ok := parseIndexed(*b)
			ts, err := time.Parse(time.RFC3339Nano, r.TS)
			switch {
			case !ok || ReservesOf(&r) != b.Reserves || r.ID != b.ReceiptID:
				bad(sg.Segment, "names receipt %s at byte %d of %s as one that reserves, where the segment holds another receipt", clip(b.ReceiptID), b.Off, sg.Segment)
				continue
			case err != nil || !ts.Before(from):
				bad(sg.Segment, "dates receipt %s of %s before %s, but it was signed at %s (a row moved out of the window)", r.ID, sg.Segment, formatTime(from), clip(r.TS))
				continue
			}
			low = b.Count
		}
		var missing []string
		for n := low + 1; n <= sg.Head; n++ {
			if !seen[sg.Segment][n] {
				missing = append(missing, strconv.FormatInt(n, 10))
			}
		}
		if len(missing) > 0 {
			shown := missing
			if len(shown) > 5 {
				shown = shown[:5]
			}
			bad(sg.Segment, "lacks reserving receipts %s%s of %s, which its last receipt's row counts (a row removed or edited)", strings.Join(shown, ", "), moreText(len(missing)-len(shown)), sg.Segment)
		}
		if !faulty[sg.Segment] {
			c.counts[sg.Segment] = sg.Head
		}
	}
	return &c.allowed, problems, nil
}
