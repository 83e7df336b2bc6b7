package receipt

import (
	"cmp"
	"runtime"
	"slices"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// Stage states and completeness values as they appear in receipts.
const (
	Confirmed    = "confirmed"
	NotConfirmed = "not_confirmed"
	Full         = "full"
	Partial      = "partial"
)

// Operation identifies what a receipt is about.
type Operation struct {
	Template    string
	Version     float64
	OperationID string
}

// StageResult is one stage of a receipt.
type StageResult struct {
	ID       string
	Required bool
	State    string   // Confirmed or NotConfirmed
	Events   []string // ids of the events that closed it, in order
}

// Missing is a required stage left unclosed.
type Missing struct {
	Stage          string
	ExpectedEvents []string
	Why            string // omitted from JSON when ""
}

// Fault is an event whose type is one of the template's exceptions.
type Fault struct{ EventType, EventID string }

// Receipt is the verdict on one operation of a run.
type Receipt struct {
	Operation    Operation
	Completeness string // Full or Partial
	Stages       []StageResult
	Missing      []Missing
	Exceptions   []Fault
	Events       []Event // all of the operation's events, in order
}

// Result is a whole run assembled against one template.
type Result struct {
	Receipts   []Receipt
	Unassigned []Event
}

// StageConfirmed reports whether the stage with the given id was closed.
func (r *Receipt) StageConfirmed(id string) bool {
	for _, s := range r.Stages {
		if s.ID == id {
			return s.State == Confirmed
		}
	}
	return false
}

// LastEventAt returns the occurred_at of the operation's last event.
func (r *Receipt) LastEventAt() string {
	if len(r.Events) == 0 {
		return ""
	}
	return r.Events[len(r.Events)-1].OccurredAt
}

// compareEvents is the reference's total order: occurred_at (by UTF-16 code
// units, as JavaScript's < compares; a valid occurred_at is ASCII, where
// byte order is the same), then seq numerically, then event_id.
func compareEvents(a, b *Event) int {
	if c := compareJS(a.OccurredAt, b.OccurredAt); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Seq, b.Seq); c != 0 {
		return c
	}
	return compareJS(a.ID, b.ID)
}

// compareJS compares like JavaScript; byte order agrees with UTF-16 order for
// ASCII, which covers every valid occurred_at and most ids.
func compareJS(a, b string) int {
	if isASCII(a) && isASCII(b) {
		return strings.Compare(a, b)
	}
	return jsjson.CompareUTF16(a, b)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// SortEvents puts events into the assembler's order. The sort is stable, as
// JavaScript's Array#sort is, so events equal on all three keys (which only a
// duplicated event can be) keep their file order.
func SortEvents(events []Event) {
	order := sortedOrder(events)
	sorted := make([]Event, len(events))
	for i, j := range order {
		sorted[i] = events[j]
	}
	copy(events, sorted)
}

// sortedOrder returns the indices of events in the assembler's order. Sorting
// indices avoids moving large structs, and the index as last key makes the
// (faster) unstable sort give the stable sort's result.
func sortedOrder(events []Event) []int32 {
	keys := make([]sortKey, len(events))
	// Canonical timestamps order as the numbers their digits spell.
	byKey := func(a, b sortKey) int {
		if a.at != b.at {
			return cmp.Compare(a.at, b.at)
		}
		if c := cmp.Compare(a.seq, b.seq); c != 0 {
			return c
		}
		if c := compareJS(events[a.i].ID, events[b.i].ID); c != 0 {
			return c
		}
		return cmp.Compare(a.i, b.i)
	}
	if len(keys) < 1<<14 || runtime.GOMAXPROCS(0) == 1 {
		if timeKeys(keys, events, 0) {
			slices.SortFunc(keys, byKey)
			order := make([]int32, len(keys))
			for k, key := range keys {
				order[k] = key.i
			}
			return order
		}
	} else {
		// A large run: each half's keys read and sorted on a core of its
		// own, then the halves merged.
		half := len(keys) / 2
		var ok [2]bool
		parallel(2, func(k int) {
			lo, hi := halfOf(k, half, len(keys))
			if ok[k] = timeKeys(keys[lo:hi], events, lo); ok[k] {
				slices.SortFunc(keys[lo:hi], byKey)
			}
		})
		if ok[0] && ok[1] {
			order := make([]int32, len(keys))
			a, b := keys[:half], keys[half:]
			for k := range order {
				if len(b) == 0 || (len(a) > 0 && byKey(a[0], b[0]) <= 0) {
					order[k], a = a[0].i, a[1:]
				} else {
					order[k], b = b[0].i, b[1:]
				}
			}
			return order
		}
	}
	order := make([]int32, len(events))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		if c := compareEvents(&events[a], &events[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return order
}

type sortKey struct {
	at  int64 // YYYYMMDDhhmmssmmm
	seq float64
	i   int32
}

// timeKeys fills keys with the sort keys of events[from:from+len(keys)]
// and reports whether their occurred_at are all in the canonical form (as
// every decoded event's is).
func timeKeys(keys []sortKey, events []Event, from int) bool {
	for k := range keys {
		i := from + k
		at, ok := timeKey(events[i].OccurredAt)
		if !ok {
			return false
		}
		keys[k] = sortKey{at: at, seq: events[i].Seq, i: int32(i)}
	}
	return true
}

// timeKey reads YYYY-MM-DDTHH:MM:SS.mmmZ as the number YYYYMMDDHHMMSSmmm.
func timeKey(s string) (int64, bool) {
	if len(s) != 24 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' ||
		s[19] != '.' || s[23] != 'Z' {
		return 0, false
	}
	var n int64
	for k := 0; k < len(timeDigits); k++ {
		d := s[timeDigits[k]] - '0'
		if d > 9 {
			return 0, false
		}
		n = n*10 + int64(d)
	}
	return n, true
}

// timeDigits holds where the digits of YYYY-MM-DDTHH:MM:SS.mmmZ are.
const timeDigits = "\x00\x01\x02\x03\x05\x06\x08\x09\x0b\x0c\x0e\x0f\x11\x12\x14\x15\x16"

// Assemble splits a run's events into one receipt per operation (grouped by
// context_id, in order of first appearance) plus the events that belong to
// no operation (SPEC §4). It does not modify events.
func Assemble(events []Event, t *Template) Result {
	order := sortedOrder(events)
	dest, counts, unassigned := placement(events, order)
	all := make([]Event, len(events))
	for j, d := range dest {
		all[d] = events[j]
	}
	return result(all, counts, unassigned, t)
}

// AssembleInPlace is Assemble for a caller that gives up events: they are
// put into receipt order where they are, and the receipts (and Unassigned)
// share their array, so a large run is not copied.
func AssembleInPlace(events []Event, t *Template) Result {
	order := sortedOrder(events)
	dest, counts, unassigned := placement(events, order)
	permute(events, dest)
	return result(events, counts, unassigned, t)
}

// AssembleInPlaceEach is AssembleInPlace for a caller that reads each
// receipt once, as it is folded: fn is handed the receipts in
// AssembleInPlace's order, each valid only during fn (its stages, their
// events, its missing stages and exceptions are storage reused for the
// next; its Events are its part of events, put in receipt order where they
// are). It returns the events that belong to no operation.
func AssembleInPlaceEach(events []Event, t *Template, fn func(*Receipt)) (unassigned []Event) {
	order := sortedOrder(events)
	dest, counts, n := placement(events, order)
	permute(events, dest)
	m := newMatcher(t)
	var buf foldBuf
	var at int32
	for _, c := range counts {
		r := m.foldInto(events[at:at+c:at+c], &buf)
		fn(&r)
		at += c
	}
	return events[at : int(at)+n : int(at)+n]
}

// permute moves each events[j] to events[dest[j]], following each cycle of
// the permutation so that every event moves once; dest is used up.
func permute(events []Event, dest []int32) {
	for start := range dest {
		for dest[start] != int32(start) {
			d := dest[start]
			events[start], events[d] = events[d], events[start]
			dest[start], dest[d] = dest[d], d
		}
	}
}

// placement works out where each event goes: operations in order of first
// appearance, each's events in order, then the unassigned events. It
// returns each event's destination, the operations' event counts and the
// number of unassigned events.
func placement(events []Event, order []int32) (dest []int32, counts []int32, unassigned int) {
	groupOf := make([]int32, len(events))
	if len(order) < 1<<14 || runtime.GOMAXPROCS(0) == 1 {
		var g groups
		g.assign(events, order, groupOf, len(events)/4)
		counts, unassigned = g.counts, g.unassigned
	} else {
		// A large run: each half of the order grouped on a core of its own,
		// then the second half's operations numbered after the first's in
		// order of first appearance (one lookup per operation, not per event).
		half := len(order) / 2
		var h [2]groups
		parallel(2, func(k int) {
			lo, hi := halfOf(k, half, len(order))
			h[k].assign(events, order[lo:hi], groupOf, (hi-lo)/4)
		})
		counts, unassigned = h[0].counts, h[0].unassigned+h[1].unassigned
		global := make([]int32, len(h[1].counts))
		for g, id := range h[1].ids {
			first, ok := h[0].index[id]
			if !ok {
				first = int32(len(counts))
				counts = append(counts, 0)
			}
			counts[first] += h[1].counts[g]
			global[g] = first
		}
		for _, j := range order[half:] {
			if g := groupOf[j]; g >= 0 {
				groupOf[j] = global[g]
			}
		}
	}
	next := make([]int32, len(counts)) // next free slot of each group
	var at int32
	for g, c := range counts {
		next[g] = at
		at += c
	}
	dest = groupOf // reused: each entry is read before it is overwritten
	for _, j := range order {
		if g := groupOf[j]; g >= 0 {
			dest[j] = next[g]
			next[g]++
		} else {
			dest[j] = at
			at++
		}
	}
	return dest, counts, unassigned
}

// groups numbers the operations of some events in order of first
// appearance.
type groups struct {
	index      map[string]int32 // context id -> group
	ids        []string         // group -> context id
	counts     []int32          // group -> events
	unassigned int
}

// assign numbers the operations of events[order...] into groupOf (-1 for
// an event of none), sized for about hint operations.
func (g *groups) assign(events []Event, order []int32, groupOf []int32, hint int) {
	g.index = make(map[string]int32, hint)
	for _, j := range order {
		e := &events[j]
		if e.ContextID == "" {
			groupOf[j] = -1
			g.unassigned++
			continue
		}
		n, ok := g.index[e.ContextID]
		if !ok {
			n = int32(len(g.counts))
			g.index[e.ContextID] = n
			g.counts = append(g.counts, 0)
			g.ids = append(g.ids, e.ContextID)
		}
		g.counts[n]++
		groupOf[j] = n
	}
}

// result folds the placed events into receipts.
func result(all []Event, counts []int32, unassigned int, t *Template) Result {
	var res Result
	m := newMatcher(t)
	res.Receipts = make([]Receipt, len(counts))
	var at int32
	for g, c := range counts {
		res.Receipts[g] = m.fold(all[at : at+c : at+c])
		at += c
	}
	if unassigned > 0 {
		res.Unassigned = all[at : int(at)+unassigned : int(at)+unassigned]
	}
	return res
}

// AssembleOperation folds the events of one operation (already selected by
// the caller) into its receipt.
func AssembleOperation(operationID string, events []Event, t *Template) Receipt {
	ordered := make([]Event, len(events))
	copy(ordered, events)
	SortEvents(ordered)
	r := newMatcher(t).fold(ordered)
	r.Operation.OperationID = operationID
	return r
}

type stageWitness struct {
	stage   int
	role    string
	hasRole bool
}

// matcher holds the template's lookups, built once per assembly.
type matcher struct {
	t        *Template
	byType   map[string]typeRule // one lookup per event
	expected [][]string          // each stage's witness event types, shared by its Missing entries
}

// typeRule is what the template says of one event type.
type typeRule struct {
	witnesses []stageWitness // the stages it may close, a stage's adjacent
	exception bool           // it is one of the template's exceptions
}

func newMatcher(t *Template) *matcher {
	m := &matcher{t: t, byType: map[string]typeRule{}}
	for i, s := range t.Stages {
		for _, w := range s.Match {
			r := m.byType[w.Event]
			r.witnesses = append(r.witnesses, stageWitness{i, w.Role, w.HasRole})
			m.byType[w.Event] = r
		}
	}
	for _, x := range t.Exceptions {
		r := m.byType[x]
		r.exception = true
		m.byType[x] = r
	}
	m.expected = make([][]string, len(t.Stages))
	for i, s := range t.Stages {
		m.expected[i] = make([]string, len(s.Match))
		for j, w := range s.Match {
			m.expected[i][j] = w.Event
		}
	}
	return m
}

// fold runs one operation's ordered events through the template.
func (m *matcher) fold(events []Event) Receipt { return m.foldInto(events, nil) }

// foldBuf is storage a printer reuses for one receipt after another.
type foldBuf struct {
	closed  [][]string
	stages  []StageResult
	missing []Missing
	faults  []Fault
}

// foldInto is fold with the receipt's slices taken from buf (when not nil):
// the receipt is then valid only until buf is used again.
func (m *matcher) foldInto(events []Event, buf *foldBuf) Receipt {
	t := m.t
	var closed [][]string
	var faults []Fault
	if buf != nil {
		if len(buf.closed) != len(t.Stages) {
			buf.closed = make([][]string, len(t.Stages))
		}
		closed = buf.closed
		for i := range closed {
			closed[i] = closed[i][:0]
		}
		faults = buf.faults[:0]
	} else {
		closed = make([][]string, len(t.Stages))
	}
	for _, e := range events {
		rule := m.byType[e.Type]
		last := -1 // a stage's witnesses are adjacent, so this records an event once per stage
		for _, w := range rule.witnesses {
			if w.hasRole && (!e.HasRole || e.Role != w.role) {
				continue
			}
			if w.stage == last {
				continue
			}
			closed[w.stage] = append(closed[w.stage], e.ID)
			last = w.stage
		}
		if rule.exception {
			faults = append(faults, Fault{EventType: e.Type, EventID: e.ID})
		}
	}
	r := Receipt{
		Operation:  Operation{Template: t.Name, Version: t.Version},
		Missing:    []Missing{},
		Exceptions: faults,
		Events:     events,
	}
	if buf != nil {
		buf.faults = faults
		if cap(buf.stages) < len(t.Stages) {
			buf.stages = make([]StageResult, len(t.Stages))
		}
		r.Stages = buf.stages[:len(t.Stages)]
		r.Missing = buf.missing[:0]
	} else {
		r.Stages = make([]StageResult, len(t.Stages))
	}
	if r.Exceptions == nil {
		r.Exceptions = []Fault{}
	}
	if len(events) > 0 {
		r.Operation.OperationID = events[0].ContextID
	}
	allRequired, anyConfirmed := true, false
	for i, s := range t.Stages {
		sr := StageResult{ID: s.ID, Required: s.Required, State: NotConfirmed, Events: closed[i]}
		if sr.Events == nil {
			sr.Events = []string{}
		}
		if len(closed[i]) > 0 {
			sr.State = Confirmed
			anyConfirmed = true
		} else if s.Required {
			allRequired = false
			r.Missing = append(r.Missing, Missing{Stage: s.ID, ExpectedEvents: m.expected[i], Why: s.MissingExplanation})
		}
		r.Stages[i] = sr
	}
	if buf != nil {
		buf.missing = r.Missing
	}
	r.Completeness = Partial
	if allRequired && anyConfirmed && len(faults) == 0 {
		r.Completeness = Full
	}
	return r
}

// halfOf is the range [lo, hi) of half k (0 or 1) of n items split at mid.
func halfOf(k, mid, n int) (lo, hi int) {
	if k == 0 {
		return 0, mid
	}
	return mid, n
}
