package reviewlog

import (
	"bytes"
	"fmt"
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
	ID           string         `json:"review_id"`
	Status       string         `json:"status"`
	CreatedAt    string         `json:"created_at"`
	DecidedAt    string         `json:"decided_at,omitempty"`
	DecidedBy    string         `json:"decided_by,omitempty"`
	Note         string         `json:"note,omitempty"`
	Counterparty string         `json:"counterparty"`
	Amount       string         `json:"amount"`
	Asset        string         `json:"asset"`
	Template     string         `json:"template,omitempty"`
	Reasons      []guard.Reason `json:"reasons"`
	// Caller is who asked (the token subject or the stdio agent id); the
	// review answers only that caller's identical question.
	Caller string `json:"caller,omitempty"`
	// ParamsHash is the keyed hash the question's receipts carry.
	ParamsHash string `json:"params_hash,omitempty"`
	// UsedAt is when an approval was honoured (once).
	UsedAt string `json:"used_at,omitempty"`
	// Integrity lists what the log and the signatures disagree on for this
	// review; empty when they agree.
	Integrity []string `json:"integrity,omitempty"`
}

// Finding is a line of the log that contradicts the rest: it is reported,
// never applied.
type Finding struct {
	Line     int    `json:"line"`
	ReviewID string `json:"review_id,omitempty"`
	What     string `json:"what"`
}

// badLine is a line that is not a usable record.
type badLine struct {
	n   int
	why string
}

// state is the fold of a whole log.
type state struct {
	reviews []*Review
	byID    map[string]*Review
	// tail is the run of unusable lines after the last record: the remains
	// of writes that did not complete. Readers skip it; the next writer
	// closes it with a repair record.
	tail []badLine
	// endsClean is false when the file's last byte is not a newline.
	endsClean bool
	// findings are contradicting lines, in file order.
	findings []Finding
}

// fold reads a whole log. A bad line followed by a record (other than a
// repair record naming exactly the bad lines before it) is corruption and
// is reported by its line number; bad lines at the end are the torn tail.
func fold(data []byte, name string) (*state, error) {
	st := &state{byID: map[string]*Review{}, endsClean: len(data) == 0 || data[len(data)-1] == '\n'}
	voided := voidedLines(data)
	var pending []badLine
	n := 0
	for len(data) > 0 {
		n++
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			// The text after the last newline is never a complete record.
			if !isBlank(data) {
				pending = append(pending, badLine{n, "incomplete last line"})
			}
			break
		}
		line := bytes.TrimSuffix(data[:i], []byte{'\r'})
		data = data[i+1:]
		if isBlank(line) {
			continue
		}
		if len(line) > maxLineBytes {
			pending = append(pending, badLine{n, fmt.Sprintf("line longer than %d bytes", maxLineBytes)})
			continue
		}
		rec, err := decodeRecord(line)
		if err != nil {
			if m, ok := voided[n]; ok {
				// Text that was a torn tail when a writer found it stays void
				// even though a newline now ends it.
				pending = append(pending, badLine{n, fmt.Sprintf("the remains of an incomplete write (repair record on line %d)", m)})
			} else {
				pending = append(pending, badLine{n, err.Error()})
			}
			continue
		}
		if rec.Type == typeRepair {
			// A repair may only void lines that are unusable. One that
			// names a record is reported and ignored, so it can never
			// reopen a decided review.
			if extra := notIn(rec.Lines, lineNumbers(pending)); len(extra) > 0 || !covers(rec.Lines, lineNumbers(pending)) {
				st.findings = append(st.findings, Finding{Line: n, What: fmt.Sprintf("repair record names lines %v, but the unusable lines before it are %v; it is ignored", rec.Lines, lineNumbers(pending))})
				if !covers(rec.Lines, lineNumbers(pending)) {
					continue
				}
			}
			pending = nil
			continue
		}
		if why := st.check(rec); why != "" {
			st.findings = append(st.findings, Finding{Line: n, ReviewID: rec.ReviewID, What: why + "; the line is not applied"})
			continue
		}
		if len(pending) > 0 {
			return nil, fmt.Errorf("%w: %s line %d: %s (a record follows it on line %d, so it is no torn tail)", ErrCorrupt, name, pending[0].n, pending[0].why, n)
		}
		st.apply(rec)
	}
	st.tail = pending
	return st, nil
}

// voidedLines maps each line a repair record names to the repair's line.
// Whether the repair is legitimate (it must name exactly the unusable lines
// right before it) is checked by fold.
func voidedLines(data []byte) map[int]int {
	out := map[int]int{}
	n := 0
	for len(data) > 0 {
		n++
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimSuffix(data[:i], []byte{'\r'})
		data = data[i+1:]
		if !bytes.Contains(line, []byte(`"repair"`)) || len(line) > maxLineBytes {
			continue
		}
		if rec, err := decodeRecord(line); err == nil && rec.Type == typeRepair {
			for _, v := range rec.Lines {
				if v > 0 && v < n {
					out[v] = n
				}
			}
		}
	}
	return out
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

// check enforces the fold's rules: ids are opened once, decided once and
// only after they were opened, and used once and only after an approval. It
// returns what is wrong with a contradicting record, or "".
func (st *state) check(rec record) string {
	r := st.byID[rec.ReviewID]
	switch rec.Type {
	case typeOpened:
		if r != nil {
			return fmt.Sprintf("review %s is opened a second time", rec.ReviewID)
		}
	case typeDecided:
		if r == nil {
			return fmt.Sprintf("review %s is decided but was never opened", rec.ReviewID)
		}
		if r.Status != Pending {
			return fmt.Sprintf("review %s is decided a second time (%s by %s, after %s by %s)", rec.ReviewID, rec.Status, clip(rec.By), r.Status, clip(r.DecidedBy))
		}
	case typeUsed:
		if r == nil || r.Status != Approved {
			return fmt.Sprintf("review %s is marked used but was never approved", rec.ReviewID)
		}
		if r.UsedAt != "" {
			return fmt.Sprintf("review %s is marked used a second time", rec.ReviewID)
		}
	}
	return ""
}

func (st *state) apply(rec record) {
	switch rec.Type {
	case typeOpened:
		reasons := rec.Reasons
		if reasons == nil {
			reasons = []guard.Reason{}
		}
		r := &Review{ID: rec.ReviewID, Status: Pending, CreatedAt: rec.At, Counterparty: rec.Counterparty,
			Amount: *rec.Amount, Asset: rec.Asset, Template: rec.Template, Reasons: reasons, Caller: rec.Caller, ParamsHash: rec.ParamsHash}
		st.reviews = append(st.reviews, r)
		st.byID[r.ID] = r
	case typeDecided:
		r := st.byID[rec.ReviewID]
		r.Status, r.DecidedAt, r.DecidedBy, r.Note = rec.Status, rec.At, rec.By, rec.Note
	case typeUsed:
		st.byID[rec.ReviewID].UsedAt = rec.At
	}
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

// findPending returns the caller's pending review for the same question
// opened at or after since, if any (the newest one).
func (st *state) findPending(caller string, q guard.Question, since time.Time) *Review {
	for i := len(st.reviews) - 1; i >= 0; i-- {
		r := st.reviews[i]
		if r.Status != Pending || !r.asks(caller, q) {
			continue
		}
		t, err := parseTime(r.CreatedAt)
		if err == nil && !t.Before(since) {
			return r
		}
	}
	return nil
}

// asks: the review is this caller's, about this question.
func (r *Review) asks(caller string, q guard.Question) bool {
	return r.Caller == caller && r.Counterparty == q.Counterparty && r.Amount == q.Amount && r.Asset == q.Asset
}
