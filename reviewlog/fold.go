package reviewlog

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// Review states. The log alone knows Pending, Approved and Rejected; what a
// reader reports is what the signatures prove (see Verified): a decision
// without a trusted reviewer's receipt is Unverified, a pending review past
// its time to live is Expired.
const (
	Pending    = "pending"
	Approved   = "approved"
	Rejected   = "rejected"
	Unverified = "unverified"
	Expired    = "expired"
)

// Review is the state of one review: the fold of its lines.
type Review struct {
	ID        string `json:"review_id"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
	DecidedAt string `json:"decided_at,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"`
	// DecidedWith says how the decision was proven: "reviewer_key" (the
	// reviewer's own Ed25519 key signed the receipt) or "passkey" (the
	// receipt carries the reviewer's passkey assertion over the decision).
	DecidedWith string `json:"decided_with,omitempty"`
	// ReviewURL is the reviewer console's page of this review, where the
	// server knows it (--console-url); never read from the log.
	ReviewURL    string `json:"review_url,omitempty"`
	Note         string `json:"note,omitempty"`
	Counterparty string `json:"counterparty"`
	Amount       string `json:"amount"`
	Asset        string `json:"asset"`
	// AssetSymbol is the asset's symbol where the policy knows it (set by
	// whoever reads the review with a policy, for people to read).
	AssetSymbol string         `json:"asset_symbol,omitempty"`
	Template    string         `json:"template,omitempty"`
	Reasons     []guard.Reason `json:"reasons"`
	// Caller is who asked (the token subject or the stdio agent id); the
	// review answers only that caller's identical question.
	Caller string `json:"caller,omitempty"`
	// ParamsHash is the keyed hash the question's receipts carry.
	ParamsHash string `json:"params_hash,omitempty"`
	// Tenant and Resource complete the question (from its terms).
	Tenant   string `json:"tenant,omitempty"`
	Resource string `json:"resource,omitempty"`
	// Terms are the question the server signed when it opened the review
	// (nil for a review opened by an earlier version), TermsHash their
	// hash, and TermsReceipt the id of the server's receipt that signs it
	// ("" when no receipt signs these terms: see Tampered).
	Terms        *Terms `json:"terms,omitempty"`
	TermsHash    string `json:"terms_hash,omitempty"`
	TermsReceipt string `json:"terms_receipt,omitempty"`
	// Tampered is set when an unsigned record disagrees with the signed
	// receipts in a way only tampering makes (Integrity says how); such a
	// review is never decided and its approval never honoured.
	Tampered bool `json:"tampered,omitempty"`
	// PayTo is the payee address the question named beside a host.
	PayTo string `json:"pay_to,omitempty"`
	// UsedAt is when an approval was honoured (once).
	UsedAt string `json:"used_at,omitempty"`
	// Approvals is how many distinct trusted reviewers must approve the
	// review (its signed terms' quorum; omitted when one suffices), and
	// ApprovedBy those whose signed approval counts so far, in the order
	// they signed, each once.
	Approvals  int      `json:"approvals_needed,omitempty"`
	ApprovedBy []string `json:"approved_by,omitempty"`
	// Integrity lists what the log and the signatures disagree on for this
	// review; empty when they agree.
	Integrity []string `json:"integrity,omitempty"`
	// bound is set by resolve when the trusted decision signs this
	// review's signed terms and note.
	bound bool
}

// Finding is a line of the log that contradicts the rest: it is reported,
// never applied.
type Finding struct {
	Line     int    `json:"line"`
	ReviewID string `json:"review_id,omitempty"`
	What     string `json:"what"`
}

// maxFindings bounds the findings kept in memory; the count goes on.
const maxFindings = 1000

// badLine is a line that is not a usable record.
type badLine struct {
	n   int
	why string
}

// entry is what the fold keeps of one review: where its lines are and the
// little needed to find it again. The review itself is read back from its
// lines when asked for, so memory grows by tens of bytes per review, not by
// the size of its reasons.
type entry struct {
	id      string
	caller  string
	key     [16]byte // of (caller, counterparty, amount, asset, template, resource)
	created time.Time
	status  string // as the log says
	// Offsets of the review's opened, decided and used lines; -1 for none.
	opened, decided, used int64
}

// state is the fold of a log up to offset. It is fed incrementally: a log
// only grows, so a reader folds just the bytes appended since.
type state struct {
	entries         []*entry
	byID            map[string]*entry
	byKey           map[[16]byte][]*entry
	pendingByCaller map[string][]*entry
	// tail is the run of complete but unusable lines after the last record:
	// the remains of writes that did not complete. Readers skip it; the
	// next writer closes it with a repair record.
	tail []badLine
	// partial is the line number of text after the last newline that is
	// not blank (0 when none); endsClean is false when the file's last
	// byte is not a newline.
	partial   int
	endsClean bool
	// findings are contradicting lines, in file order (at most
	// maxFindings; findingCount counts them all).
	findings     []Finding
	findingCount int
	// offset is how many bytes are folded (through the last newline);
	// line is the number of the next line.
	offset int64
	line   int
	// src reads the review lines back; set by whoever refreshed the state.
	src io.ReaderAt
	// reservations are the reserved records that may still hold, in log
	// order; reserved names every receipt a record was seen for.
	reservations []resEntry
	reserved     map[string]bool
	// releases are the offsets of the released records naming a receipt
	// (pruned with the reservations: see reservationView).
	releases map[string][]int64
	// rows, when set, says this state is a scoped section's read by index
	// (withIndex): the reviews are rows's, not the fold's.
	rows *rowIndex
}

func newState() *state {
	return &state{byID: map[string]*entry{}, byKey: map[[16]byte][]*entry{}, pendingByCaller: map[string][]*entry{}, line: 1, endsClean: true, reserved: map[string]bool{}, releases: map[string][]int64{}}
}

// fold reads a whole log (tests and fuzzing use it; the Log folds
// incrementally through feed).
func fold(data []byte, name string) (*state, error) {
	st := newState()
	st.src = bytes.NewReader(data)
	if err := st.feed(bytes.NewReader(data), name); err != nil {
		return nil, err
	}
	return st, nil
}

// feed folds the bytes r holds, which continue the log at st.offset. A bad
// line followed by a record (other than a repair record that covers the
// bad lines before it) is corruption, reported by its line number; bad
// lines at the end are the torn tail.
func (st *state) feed(r io.Reader, name string) error {
	// A refresh most often reads the line or two appended since the last:
	// the buffer is no bigger than what there is to read (a 64 KiB buffer
	// made and cleared for each decision cost more than reading it).
	size := 64 << 10
	if s, ok := r.(interface{ Size() int64 }); ok {
		size = int(min(max(s.Size(), 512), int64(size)))
	}
	br := bufio.NewReaderSize(r, size)
	st.partial, st.endsClean = 0, true
	off := st.offset
	for {
		raw, err := readLine(br)
		if len(raw) == 0 && err == io.EOF {
			return nil
		}
		if err != nil && err != io.EOF && !errors.Is(err, errLineTooLong) {
			return fmt.Errorf("read %s: %w", name, err)
		}
		n := st.line
		if err == io.EOF {
			// The text after the last newline is never a complete record.
			st.endsClean = false
			if !isBlank(raw) {
				st.partial = n
			}
			return nil
		}
		lineOff := off
		off += int64(len(raw))
		st.offset, st.line = off, n+1
		if errors.Is(err, errLineTooLong) {
			st.tail = append(st.tail, badLine{n, fmt.Sprintf("line longer than %d bytes", maxLineBytes)})
			continue
		}
		line := bytes.TrimSuffix(bytes.TrimSuffix(raw, []byte{'\n'}), []byte{'\r'})
		if isBlank(line) {
			continue
		}
		rec, derr := decodeRecord(line)
		if errors.Is(derr, errNotExact) && len(st.tail) == 0 {
			// A whole line no writer makes: tampering, not a torn write.
			// Nothing of it is applied, as if it had been removed.
			st.addFinding(Finding{Line: n, What: derr.Error() + "; the line is not applied"})
			continue
		}
		if derr != nil {
			st.tail = append(st.tail, badLine{n, derr.Error()})
			continue
		}
		if rec.Type == typeRepair {
			// A repair may only void lines that are unusable. One that names
			// a record is reported and ignored, so it can never reopen a
			// decided review.
			bad := lineNumbers(st.tail)
			if !covers(rec.Lines, bad) || len(notIn(rec.Lines, bad)) > 0 {
				st.addFinding(Finding{Line: n, What: fmt.Sprintf("repair record names lines %v, but the unusable lines before it are %v; it is ignored", rec.Lines, bad)})
				if !covers(rec.Lines, bad) {
					continue
				}
			}
			st.tail = nil
			continue
		}
		if why := st.check(rec); why != "" {
			st.addFinding(Finding{Line: n, ReviewID: rec.ReviewID, What: why + "; the line is not applied"})
			continue
		}
		if len(st.tail) > 0 {
			return fmt.Errorf("%w: %s line %d: %s (a record follows it on line %d, so it is no torn tail)", ErrCorrupt, name, st.tail[0].n, st.tail[0].why, n)
		}
		st.apply(rec, lineOff)
	}
}

var errLineTooLong = errors.New("line too long")

// readLine returns the next line with its newline (or what is left at the
// end), skipping past a line longer than maxLineBytes, which it reports with
// errLineTooLong.
func readLine(br *bufio.Reader) ([]byte, error) {
	var long []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if len(long)+len(chunk) > maxLineBytes {
				// Keep only the length, then drop the rest of the line.
				n := len(long) + len(chunk)
				for err == bufio.ErrBufferFull {
					chunk, err = br.ReadSlice('\n')
					n += len(chunk)
				}
				if err == io.EOF {
					return make([]byte, n), io.EOF
				}
				return make([]byte, n), errLineTooLong
			}
			long = append(long, chunk...)
			continue
		}
		if long != nil {
			return append(long, chunk...), err
		}
		// The line is only valid until the next read: callers decode it
		// at once, so no copy is made.
		return chunk, err
	}
}

func (st *state) addFinding(f Finding) {
	st.findingCount++
	if len(st.findings) < maxFindings {
		st.findings = append(st.findings, f)
	}
}

// isBlank: only JSON white space (a line of other control bytes is no blank).
func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' {
			return false
		}
	}
	return true
}

func lineNumbers(bad []badLine) []int {
	out := make([]int, 0, len(bad))
	for _, b := range bad {
		out = append(out, b.n)
	}
	return out
}

// tailLines are the lines a writer's repair record must name: the complete
// unusable lines and the incomplete last one.
func (st *state) tailLines() []int {
	out := lineNumbers(st.tail)
	if st.partial > 0 {
		out = append(out, st.partial)
	}
	return out
}

// check enforces the fold's rules: ids are opened once, decided once and
// only after they were opened, and used once and only after an approval. It
// returns what is wrong with a contradicting record, or "".
func (st *state) check(rec record) string {
	e := st.byID[rec.ReviewID]
	switch rec.Type {
	case typeOpened:
		if e != nil {
			return fmt.Sprintf("review %s is opened a second time", rec.ReviewID)
		}
	case typeDecided:
		if e == nil {
			return fmt.Sprintf("review %s is decided but was never opened", rec.ReviewID)
		}
		if e.status != Pending {
			return fmt.Sprintf("review %s is decided a second time (%s by %s, after it was %s)", rec.ReviewID, rec.Status, clip(rec.By), e.status)
		}
	case typeReserved:
		if st.reserved[rec.Reservation.ReceiptID] {
			return fmt.Sprintf("receipt %s is reserved a second time", clip(rec.Reservation.ReceiptID))
		}
	case typeUsed:
		if e == nil || e.status != Approved {
			return fmt.Sprintf("review %s is marked used but was never approved", rec.ReviewID)
		}
		if e.used >= 0 {
			return fmt.Sprintf("review %s is marked used a second time", rec.ReviewID)
		}
	}
	return ""
}

func (st *state) apply(rec record, off int64) {
	switch rec.Type {
	case typeOpened:
		created, _ := parseTime(rec.At)
		e := &entry{id: rec.ReviewID, caller: rec.Caller, created: created, status: Pending, opened: off, decided: -1, used: -1, key: openedKey(rec)}
		st.entries = append(st.entries, e)
		st.byID[e.id] = e
		st.byKey[e.key] = append(st.byKey[e.key], e)
		st.pendingByCaller[e.caller] = append(st.pendingByCaller[e.caller], e)
	case typeDecided:
		e := st.byID[rec.ReviewID]
		e.status, e.decided = rec.Status, off
	case typeUsed:
		st.byID[rec.ReviewID].used = off
	case typeReserved:
		st.applyReservation(rec, off)
	case typeReleased:
		st.applyRelease(rec, off)
	}
}

// openedKey is the question key of an opened record.
func openedKey(rec record) [16]byte {
	resource := ""
	if rec.Terms != nil {
		resource = rec.Terms.Resource
	}
	return questionKey(rec.Caller, guard.Question{Counterparty: rec.Counterparty, Amount: *rec.Amount, Asset: rec.Asset, Template: rec.Template, PayTo: rec.PayTo}, resource)
}

// QuestionKey is the hex key of a caller's question, as ParseLineHead
// gives it for the review opened on it.
func QuestionKey(caller string, q guard.Question, resource string) string {
	k := questionKey(caller, q, resource)
	return hex.EncodeToString(k[:])
}

// questionKey identifies a caller's question.
func questionKey(caller string, q guard.Question, resource string) [16]byte {
	h := sha256.New()
	for _, s := range []string{caller, q.Counterparty, q.Amount, q.Asset, q.Template, resource} {
		fmt.Fprintf(h, "%d:%s;", len(s), s)
	}
	if q.PayTo != "" {
		// Only when named, so the key of a question without it is as it was.
		fmt.Fprintf(h, "pay_to:%d:%s;", len(q.PayTo), q.PayTo)
	}
	var k [16]byte
	copy(k[:], h.Sum(nil))
	return k
}

// pendingOf returns the caller's reviews the log still calls pending,
// dropping the decided ones from the per-caller list as it goes.
func (st *state) pendingOf(caller string) []*entry {
	list := st.pendingByCaller[caller]
	kept := list[:0]
	for _, e := range list {
		if e.status == Pending {
			kept = append(kept, e)
		}
	}
	st.pendingByCaller[caller] = kept
	return kept
}

// review reads one review back from its lines.
func (st *state) review(e *entry) (Review, error) {
	rec, err := st.recordAt(e.opened)
	if err != nil {
		return Review{}, err
	}
	reasons := rec.Reasons
	if reasons == nil {
		reasons = []guard.Reason{}
	}
	r := Review{ID: rec.ReviewID, Status: Pending, CreatedAt: rec.At, Counterparty: rec.Counterparty, Amount: *rec.Amount,
		Asset: rec.Asset, Template: rec.Template, Reasons: reasons, Caller: rec.Caller, ParamsHash: rec.ParamsHash, Terms: rec.Terms, PayTo: rec.PayTo}
	if rec.Terms != nil {
		r.Tenant, r.Resource = rec.Terms.Tenant, rec.Terms.Resource
	}
	if e.decided >= 0 {
		d, err := st.recordAt(e.decided)
		if err != nil {
			return Review{}, err
		}
		r.Status, r.DecidedAt, r.DecidedBy, r.Note = d.Status, d.At, d.By, d.Note
	}
	if e.used >= 0 {
		u, err := st.recordAt(e.used)
		if err != nil {
			return Review{}, err
		}
		r.UsedAt = u.At
	}
	return r, nil
}

// recordAt decodes the line at off.
func (st *state) recordAt(off int64) (record, error) {
	if st.src == nil {
		return record{}, errors.New("review log: no source to read a review from")
	}
	line, err := lineAt(st.src, off)
	if err != nil {
		return record{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	rec, err := decodeRecord(line)
	if err != nil {
		return record{}, fmt.Errorf("%w: the line at byte %d: %w", ErrCorrupt, off, err)
	}
	return rec, nil
}

func covers(list, want []int) bool {
	for _, w := range want {
		if !slices.Contains(list, w) {
			return false
		}
	}
	return true
}

func notIn(list, set []int) []int {
	var out []int
	for _, v := range list {
		if !slices.Contains(set, v) {
			out = append(out, v)
		}
	}
	return out
}
