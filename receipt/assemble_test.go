package receipt

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// ev builds one event line.
func evLine(id, typ, at string, seq int, role, ctx string) string {
	s := fmt.Sprintf(`{"event_id":%q,"event_type":%q,"occurred_at":%q,"seq":%d,"adapter":"a"`, id, typ, at, seq)
	if role != "-" {
		s += fmt.Sprintf(`,"role":%q`, role)
	}
	if ctx != "-" {
		s += fmt.Sprintf(`,"context_id":%q`, ctx)
	}
	return s + `,"payload":{}}`
}

func decodeAll(t testing.TB, lines ...string) []Event {
	t.Helper()
	var out []Event
	for i, l := range lines {
		e, err := DecodeLine([]byte(l))
		if err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		out = append(out, e)
	}
	return out
}

func mustTemplate(t testing.TB, y string) *Template {
	t.Helper()
	tm, err := ParseTemplate("test", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func TestAssembleFold(t *testing.T) {
	tm := mustTemplate(t, `
template: t
version: 3
stages:
  - id: offer
    required: true
    match:
      - {event: pay.required, role: client}
      - {event: pay.required}
  - id: paid
    required: true
    match: [{event: pay.sent, role: client}]
    missing_explanation: "no payment"
  - id: extra
    required: false
    match: [{event: pay.required}, {event: pay.done}]
exceptions: [pay.failed, pay.failed]
`)
	const t0, t1 = "2026-07-24T09:00:00.000Z", "2026-07-24T09:00:01.000Z"
	events := decodeAll(t,
		evLine("b", "pay.required", t1, 0, "client", "op1"),
		evLine("a", "pay.required", t0, 5, "server", "op2"),
		evLine("c", "pay.sent", t1, 1, "server", "op1"), // wrong role: closes nothing
		evLine("d", "pay.failed", t1, 2, "-", "op1"),
		evLine("u", "trace.attached", t0, 0, "-", "-"),
		evLine("v", "trace.attached", t0, 1, "-", ""),
		evLine("e", "pay.sent", t1, 9, "client", "op2"),
	)
	res := Assemble(events, tm)
	if len(res.Receipts) != 2 || len(res.Unassigned) != 2 {
		t.Fatalf("%d receipts, %d unassigned", len(res.Receipts), len(res.Unassigned))
	}
	op2, op1 := res.Receipts[0], res.Receipts[1] // op2's first event comes first
	if op2.Operation.OperationID != "op2" || op1.Operation.OperationID != "op1" {
		t.Fatalf("operation order %s, %s", op2.Operation.OperationID, op1.Operation.OperationID)
	}
	// One event closes two stages, and a stage with two matching witnesses
	// records it once.
	if got := fmt.Sprint(op2.Stages); got != "[{offer true confirmed [a]} {paid true confirmed [e]} {extra false confirmed [a]}]" {
		t.Errorf("op2 stages %s", got)
	}
	if op2.Completeness != Full || len(op2.Missing) != 0 {
		t.Errorf("op2 %s missing %v", op2.Completeness, op2.Missing)
	}
	if op1.Completeness != Partial || !op1.StageConfirmed("offer") || op1.StageConfirmed("paid") || op1.StageConfirmed("nope") {
		t.Errorf("op1 %s %v", op1.Completeness, op1.Stages)
	}
	if got := fmt.Sprint(op1.Missing); got != "[{paid [pay.sent] no payment}]" {
		t.Errorf("op1 missing %s", got)
	}
	if got := fmt.Sprint(op1.Exceptions); got != "[{pay.failed d}]" {
		t.Errorf("op1 faults %s", got)
	}
	if op1.LastEventAt() != t1 || len(op1.Events) != 3 {
		t.Errorf("op1 events %d, last %s", len(op1.Events), op1.LastEventAt())
	}
	if res.Unassigned[0].ID != "u" || res.Unassigned[1].ID != "v" {
		t.Errorf("unassigned %v", res.Unassigned)
	}
	// The input is not reordered.
	if events[0].ID != "b" {
		t.Error("Assemble sorted its input in place")
	}
}

func TestCompleteness(t *testing.T) {
	optOnly := mustTemplate(t, "template: o\nversion: 1\nstages: [{id: s, required: false, match: [{event: x}]}]\nexceptions: [bad]\n")
	at := "2026-07-24T09:00:00.000Z"
	cases := []struct {
		name  string
		lines []string
		want  string
	}{
		{"nothing confirmed is partial even with no required stage", []string{evLine("1", "other", at, 0, "-", "op")}, Partial},
		{"an optional stage confirmed is full", []string{evLine("1", "x", at, 0, "-", "op")}, Full},
		{"a fault makes it partial", []string{evLine("1", "x", at, 0, "-", "op"), evLine("2", "bad", at, 1, "-", "op")}, Partial},
	}
	for _, c := range cases {
		res := Assemble(decodeAll(t, c.lines...), optOnly)
		if got := res.Receipts[0].Completeness; got != c.want {
			t.Errorf("%s: %s", c.name, got)
		}
	}
}

func TestOrdering(t *testing.T) {
	tm := mustTemplate(t, "template: o\nversion: 1\nstages: [{id: s, required: false, match: [{event: x}]}]\n")
	lines := []string{
		evLine("z", "x", "2026-07-24T09:00:00.001Z", 0, "-", "op"),
		evLine("b", "x", "2026-07-24T09:00:00.000Z", 10, "-", "op"),
		evLine("c", "x", "2026-07-24T09:00:00.000Z", 9, "-", "op"),
		evLine("\U0001F600", "x", "2026-07-24T09:00:00.000Z", 2, "-", "op"),
		evLine("\uff61", "x", "2026-07-24T09:00:00.000Z", 2, "-", "op"),
		evLine("a", "x", "2026-07-24T09:00:00.000Z", 2, "-", "op"),
	}
	res := Assemble(decodeAll(t, lines...), tm)
	var ids []string
	for _, e := range res.Receipts[0].Events {
		ids = append(ids, e.ID)
	}
	// seq compares numerically (9 < 10); ids by UTF-16 units (U+1F600's lead
	// surrogate sorts before U+FF61).
	if got := strings.Join(ids, " "); got != "a \U0001F600 \uff61 c b z" {
		t.Errorf("order %q", got)
	}
}

func TestAssembleOperation(t *testing.T) {
	tm, _ := Bundled("x402-buyer")
	at := "2026-07-24T09:00:00.000Z"
	r := AssembleOperation("op9", decodeAll(t, evLine("1", "x402.payment.submitted", at, 1, "client", "op9")), tm)
	if r.Operation.OperationID != "op9" || !r.StageConfirmed("payment") || r.Completeness != Partial {
		t.Errorf("%+v", r)
	}
}

func TestEmptyResultJSON(t *testing.T) {
	tm, _ := Bundled("x402-buyer")
	res := Assemble(nil, tm)
	if got := string(res.AppendJSON(nil)); got != "{\n  \"receipts\": [],\n  \"unassigned\": []\n}\n" {
		t.Errorf("%q", got)
	}
}

// shuffledRuns yields run texts for the order-independence property: the
// parity runs when HAIA_SHARED is set, and generated runs always.
func generatedRun(r *rand.Rand) string {
	types := []string{"x402.payment.required", "x402.payment.creating", "x402.payment.submitted", "x402.payment.requested",
		"x402.payment.responded", "x402.payment.failed", "x402.verify.ok", "x402.settle.ok", "trace.attached"}
	roles := []string{"client", "server", "facilitator", "-"}
	var b strings.Builder
	n := 1 + r.Intn(60)
	for i := 0; i < n; i++ {
		ctx := "-"
		switch k := r.Intn(8); {
		case k == 0:
			ctx = ""
		case k > 1:
			ctx = fmt.Sprintf("op-%d", r.Intn(6))
		}
		// Few distinct timestamps and seqs, so the tie-breakers matter.
		at := fmt.Sprintf("2026-07-24T09:00:0%d.%03dZ", r.Intn(3), r.Intn(3))
		id := fmt.Sprintf("e%d-%c", i, 'a'+rune(r.Intn(26)))
		if r.Intn(10) == 0 {
			id = fmt.Sprintf("\U0001F600%d", i)
		}
		b.WriteString(evLine(id, types[r.Intn(len(types))], at, r.Intn(4), roles[r.Intn(len(roles))], ctx))
		b.WriteString("\n")
	}
	return b.String()
}

func shuffleLines(r *rand.Rand, text string) string {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	r.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
	return strings.Join(lines, "\n") + "\n"
}

func buildText(t testing.TB, text string, tm *Template) []byte {
	t.Helper()
	var evs []Event
	if _, _, err := ReadEvents(strings.NewReader(text), 1, DefaultLimits(), func(e Event) error {
		evs = append(evs, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	res := Assemble(evs, tm)
	return res.AppendJSON(nil)
}

func TestShuffleNeverChangesOutput(t *testing.T) {
	r := rand.New(rand.NewSource(20260724))
	tmpls := map[string]*Template{}
	for _, n := range BundledNames() {
		tmpls[n], _ = Bundled(n)
	}
	for i := 0; i < 200; i++ {
		text := generatedRun(r)
		for _, name := range []string{"x402-buyer", "x402-seller"} {
			want := buildText(t, text, tmpls[name])
			for k := 0; k < 3; k++ {
				if got := buildText(t, shuffleLines(r, text), tmpls[name]); !bytes.Equal(got, want) {
					t.Fatalf("run %d with %s: shuffled output differs\nrun:\n%s", i, name, text)
				}
			}
		}
	}
	if os.Getenv("HAIA_SHARED") == "" {
		t.Log("HAIA_SHARED not set: shuffling only generated runs, not the parity runs")
		return
	}
	parity := filepath.Join(os.Getenv("HAIA_SHARED"), "parity")
	cases, _ := filepath.Glob(filepath.Join(parity, "cases", "*"))
	for _, c := range cases {
		ref, _ := os.ReadFile(filepath.Join(c, "template"))
		tm, err := LoadTemplateFile(filepath.Join(parity, strings.TrimSpace(string(ref))))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(filepath.Join(c, "run.ndjson"))
		text := string(raw)
		text = text[:strings.LastIndexByte(text, '\n')+1] // drop the torn tail
		var kept []string
		for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
			if !isBlank([]byte(l)) {
				kept = append(kept, l)
			}
		}
		text = strings.Join(kept, "\n") + "\n"
		want := buildText(t, text, tm)
		for k := 0; k < 5; k++ {
			if got := buildText(t, shuffleLines(r, text), tm); !bytes.Equal(got, want) {
				t.Fatalf("%s: shuffled output differs", filepath.Base(c))
			}
		}
	}
}

// TestFixtureVerdicts: the reference sample runs give the same stage
// verdicts with the bundled templates as with the reference templates.
func TestFixtureVerdicts(t *testing.T) {
	shared := sharedDir(t, "the reference fixture runs")
	for _, name := range BundledNames() {
		ref, err := LoadTemplateFile(filepath.Join(shared, "haia-trace", "templates", name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		own, _ := Bundled(name)
		_, evs, err := ReadRunFile(filepath.Join(shared, "haia-trace", "fixtures", name+".ndjson"), DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		a, b := Assemble(evs, ref), Assemble(evs, own)
		if len(a.Receipts) == 0 || len(a.Receipts) != len(b.Receipts) {
			t.Fatalf("%s: %d vs %d receipts", name, len(a.Receipts), len(b.Receipts))
		}
		for i := range a.Receipts {
			ra, rb := a.Receipts[i], b.Receipts[i]
			if ra.Completeness != rb.Completeness || fmt.Sprint(ra.Stages) != fmt.Sprint(rb.Stages) || fmt.Sprint(ra.Exceptions) != fmt.Sprint(rb.Exceptions) {
				t.Errorf("%s %s: verdicts differ:\n ref %s %v\n own %s %v", name, ra.Operation.OperationID, ra.Completeness, ra.Stages, rb.Completeness, rb.Stages)
			}
			if len(ra.Missing) != len(rb.Missing) {
				t.Errorf("%s %s: missing differs", name, ra.Operation.OperationID)
			}
		}
	}
}

// The build command's path (text-only events decoded in parallel, sorted in
// halves, assembled in place and printed in parallel batches) gives exactly
// the bytes of ReadEvents + Assemble + AppendJSON, on runs large enough to
// take every parallel branch.
func TestWriteBuildEqualsAssemble(t *testing.T) {
	r := rand.New(rand.NewSource(16))
	tm, err := Bundled("x402-buyer")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for b.Len() < 3<<20 {
		b.WriteString(generatedRun(r))
		// Some lines that are not plain: escapes, repeated keys, index keys,
		// numbers not in their shortest form, and blank lines.
		b.WriteString(`{"event_id":"e\u0031","event_type":"x402.payment.required","occurred_at":"2026-07-24T09:00:01.000Z","seq":1.0,"adapter":"a","context_id":"op-1","payload":{"2":1,"a":1,"a":2}}` + "\n\n")
	}
	b.WriteString(`{"torn":`)
	path := filepath.Join(t.TempDir(), "run.ndjson")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	want := buildText(t, b.String(), tm)
	for _, r := range runReaders {
		_, evs, err := r.read(path, DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := WriteBuild(&got, evs, tm); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			i := diffAt(got.Bytes(), want)
			t.Fatalf("%s: WriteBuild differs at byte %d of %d:\n got: %s\nwant: %s", r.name, i, len(want), around(got.Bytes(), i), around(want, i))
		}
	}
	_, evs, _ := ReadRunFile(path, DefaultLimits())
	res := AssembleInPlace(evs, tm)
	if !bytes.Equal(res.AppendJSON(nil), want) {
		t.Fatal("AssembleInPlace differs from Assemble")
	}
	_, evs, _ = ReadRunFile(path, DefaultLimits())
	var each Result
	each.Unassigned = AssembleInPlaceEach(evs, tm, func(r *Receipt) {
		each.Receipts = append(each.Receipts, cloneReceipt(r))
	})
	if got := each.AppendJSON(nil); !bytes.Equal(got, want) {
		i := diffAt(got, want)
		t.Fatalf("AssembleInPlaceEach differs at byte %d of %d:\n got: %s\nwant: %s", i, len(want), around(got, i), around(want, i))
	}
}

// cloneReceipt copies what AssembleInPlaceEach hands fn only for its call.
func cloneReceipt(r *Receipt) Receipt {
	c := *r
	c.Stages = slices.Clone(r.Stages)
	for i := range c.Stages {
		c.Stages[i].Events = slices.Clone(c.Stages[i].Events)
	}
	c.Missing = slices.Clone(r.Missing)
	c.Exceptions = slices.Clone(r.Exceptions)
	return c
}

// A run whose lines break rules in several parallel parts reports the first
// bad line of the file, with its line number.
func TestParallelDecodeReportsFirstBadLine(t *testing.T) {
	line := evLine("e", "x402.payment.required", "2026-07-24T09:00:00.000Z", 1, "client", "op") + "\n"
	n := (3 << 20) / len(line)
	lines := make([]string, n)
	for i := range lines {
		lines[i] = line
	}
	lines[n/2] = "{bad\n"
	lines[n-10] = "also bad\n"
	path := filepath.Join(t.TempDir(), "run.ndjson")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, r := range runReaders {
		_, _, err := r.read(path, DefaultLimits())
		var le *LineError
		if !errors.As(err, &le) || le.Line != n/2+1 || le.Rule != RuleJSON {
			t.Fatalf("%s: err = %v, want a json error on line %d", r.name, err, n/2+1)
		}
	}
}

// TestTimeKeyReadsEveryDigit holds timeKey to the layout it reads: each
// digit position changes the key by its place value, and any byte put where
// the layout wants another is refused.
func TestTimeKeyReadsEveryDigit(t *testing.T) {
	const at = "2026-07-24T09:05:03.120Z"
	base, ok := timeKey(at)
	if !ok || base != 20260724090503120 {
		t.Fatalf("timeKey(%q) = %d, %v; want 20260724090503120, true", at, base, ok)
	}
	const layout = "0000-00-00T00:00:00.000Z"
	place := int64(1)
	for i := len(at) - 1; i >= 0; i-- {
		for _, c := range []byte("09-T:.Z/:a\x00\xff") {
			s := at[:i] + string(c) + at[i+1:]
			got, ok := timeKey(s)
			want := layout[i] == '0' && c >= '0' && c <= '9'
			if layout[i] != '0' {
				want = c == layout[i]
			}
			if ok != want {
				t.Errorf("timeKey(%q) ok = %v, want %v", s, ok, want)
				continue
			}
			if ok && layout[i] == '0' && got-base != int64(int(c)-int(at[i]))*place {
				t.Errorf("timeKey(%q) = %d: digit %d not read at its place", s, got, i)
			}
		}
		if layout[i] == '0' {
			place *= 10
		}
	}
	for _, s := range []string{"", at[:23], at + "0", "2026-07-24T09:05:03,120Z"} {
		if _, ok := timeKey(s); ok {
			t.Errorf("timeKey(%q) accepted", s)
		}
	}
}

// TestSortedOrderIsTheStableSort holds every path of sortedOrder (small and
// large runs, the keys read on one core or two, and the general comparison
// when an occurred_at is not canonical) to a stable sort by compareEvents.
func TestSortedOrderIsTheStableSort(t *testing.T) {
	for _, c := range []struct {
		name      string
		n         int
		canonical bool
	}{
		{"small", 500, true}, {"small, one odd time", 500, false},
		{"large", 40_000, true}, {"large, one odd time", 40_000, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			evs := make([]Event, c.n)
			for i := range evs {
				// Few distinct times, seqs and ids: ties on every key, so
				// the file order decides some pairs.
				evs[i] = Event{
					ID:         fmt.Sprintf("e%d", (i*7919)%13),
					OccurredAt: fmt.Sprintf("2026-07-24T09:00:%02d.%03dZ", (i*31)%7, (i*17)%3),
					Seq:        float64((i * 13) % 5),
				}
			}
			if !c.canonical {
				evs[c.n*3/4].OccurredAt = "2026-07-24T09:00:03Z" // no milliseconds
			}
			want := make([]int32, c.n)
			for i := range want {
				want[i] = int32(i)
			}
			slices.SortStableFunc(want, func(a, b int32) int { return compareEvents(&evs[a], &evs[b]) })
			if got := sortedOrder(evs); !slices.Equal(got, want) {
				t.Fatalf("sortedOrder differs from the stable sort (first 8: %v, want %v)", got[:8], want[:8])
			}
		})
	}
}

// TestPlacementInHalvesIsTheWholeOrders: a large run's operations,
// numbered in two halves and joined, are those numbered in one pass over
// the whole order (operations spanning both halves, events of none).
func TestPlacementInHalvesIsTheWholeOrders(t *testing.T) {
	r := rand.New(rand.NewSource(37))
	for _, ops := range []int{1, 50, 5_000, 60_000} {
		events := make([]Event, 40_000)
		for i := range events {
			if r.Intn(9) > 0 {
				events[i].ContextID = fmt.Sprintf("op-%d", r.Intn(ops))
			}
		}
		order := make([]int32, len(events))
		for i, j := range r.Perm(len(events)) {
			order[i] = int32(j)
		}
		dest, counts, unassigned := placement(events, order)
		// One pass: operations in order of first appearance.
		var g groups
		groupOf := make([]int32, len(events))
		g.assign(events, order, groupOf, 0)
		if !slices.Equal(counts, g.counts) || unassigned != g.unassigned {
			t.Fatalf("%d operations: counts or unassigned differ from one pass", ops)
		}
		// Destinations: each operation's events together, in order.
		seen := make([]bool, len(events))
		for _, j := range order {
			seen[dest[j]] = true
		}
		for i, s := range seen {
			if !s {
				t.Fatalf("%d operations: slot %d never filled", ops, i)
			}
		}
		at := make([]int32, len(g.counts)+1)
		for k, c := range g.counts {
			at[k+1] = at[k] + c
		}
		next := slices.Clone(at[:len(g.counts)])
		free := at[len(g.counts)]
		for _, j := range order {
			want := free
			if k := groupOf[j]; k >= 0 {
				want = next[k]
				next[k]++
			} else {
				free++
			}
			if dest[j] != want {
				t.Fatalf("%d operations: event %d goes to %d, want %d", ops, j, dest[j], want)
			}
		}
	}
}
