package receipt

import (
	"cmp"
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

// Assemble splits a run's events into one receipt per operation (grouped by
// context_id, in order of first appearance) plus the events that belong to
// no operation (SPEC §4). It does not modify events.
func Assemble(events []Event, t *Template) Result {
	order := sortedOrder(events)
	// Group in two passes so all operations' events share one array.
	var res Result
	index := map[string]int32{}
	var counts []int
	groupOf := make([]int32, len(order))
	for k, j := range order {
		e := &events[j]
		if e.ContextID == "" {
			res.Unassigned = append(res.Unassigned, *e)
			groupOf[k] = -1
			continue
		}
		g, ok := index[e.ContextID]
		if !ok {
			g = int32(len(counts))
			index[e.ContextID] = g
			counts = append(counts, 0)
		}
		counts[g]++
		groupOf[k] = g
	}
	all := make([]Event, 0, len(events)-len(res.Unassigned))
	groups := make([][]Event, len(counts))
	for g, c := range counts {
		groups[g] = all[len(all) : len(all) : len(all)+c]
		all = all[:len(all)+c]
	}
	for k, j := range order {
		if g := groupOf[k]; g >= 0 {
			groups[g] = append(groups[g], events[j])
		}
	}
	m := newMatcher(t)
	res.Receipts = make([]Receipt, len(groups))
	for i, g := range groups {
		res.Receipts[i] = m.fold(g)
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
	t          *Template
	byType     map[string][]stageWitness
	exceptions map[string]bool
}

func newMatcher(t *Template) *matcher {
	m := &matcher{t: t, byType: map[string][]stageWitness{}, exceptions: map[string]bool{}}
	for i, s := range t.Stages {
		for _, w := range s.Match {
			m.byType[w.Event] = append(m.byType[w.Event], stageWitness{i, w.Role, w.HasRole})
		}
	}
	for _, x := range t.Exceptions {
		m.exceptions[x] = true
	}
	return m
}

// fold runs one operation's ordered events through the template.
func (m *matcher) fold(events []Event) Receipt {
	t := m.t
	closed := make([][]string, len(t.Stages))
	var faults []Fault
	for _, e := range events {
		last := -1 // a stage's witnesses are adjacent in byType, so this records an event once per stage
		for _, w := range m.byType[e.Type] {
			if w.hasRole && (!e.HasRole || e.Role != w.role) {
				continue
			}
			if w.stage == last {
				continue
			}
			closed[w.stage] = append(closed[w.stage], e.ID)
			last = w.stage
		}
		if m.exceptions[e.Type] {
			faults = append(faults, Fault{EventType: e.Type, EventID: e.ID})
		}
	}
	r := Receipt{
		Operation:  Operation{Template: t.Name, Version: t.Version},
		Stages:     make([]StageResult, len(t.Stages)),
		Missing:    []Missing{},
		Exceptions: faults,
		Events:     events,
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
			exp := make([]string, len(s.Match))
			for j, w := range s.Match {
				exp[j] = w.Event
			}
			r.Missing = append(r.Missing, Missing{Stage: s.ID, ExpectedEvents: exp, Why: s.MissingExplanation})
		}
		r.Stages[i] = sr
	}
	r.Completeness = Partial
	if allRequired && anyConfirmed && len(faults) == 0 {
		r.Completeness = Full
	}
	return r
}
