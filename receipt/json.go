package receipt

import (
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// out writes hand-built JSON in the layout of JSON.stringify(v, null, indent).
type out struct {
	dst    []byte
	indent string
	line   []byte // "\n" + current indentation
	pr     jsjson.Printer
	fold   *foldBuf // reused by WriteBuild's printers
}

func newOut(dst []byte, prefix, indent string) *out {
	o := &out{dst: dst, indent: indent}
	o.line = append(append(o.line, '\n'), prefix...)
	return o
}

func (o *out) open(c byte) {
	o.dst = append(o.dst, c)
	o.line = append(o.line, o.indent...)
}

func (o *out) close(c byte) {
	o.line = o.line[:len(o.line)-len(o.indent)]
	if o.indent != "" {
		o.dst = append(o.dst, o.line...)
	}
	o.dst = append(o.dst, c)
}

// item starts the n-th element of a container.
func (o *out) item(n int) {
	if n > 0 {
		o.dst = append(o.dst, ',')
	}
	if o.indent != "" {
		o.dst = append(o.dst, o.line...)
	}
}

// key starts the n-th member of an object. Keys are this package's own
// member names, which need no escaping.
func (o *out) key(n int, k string) {
	o.item(n)
	o.dst = append(o.dst, '"')
	o.dst = append(o.dst, k...)
	o.dst = append(o.dst, '"', ':')
	if o.indent != "" {
		o.dst = append(o.dst, ' ')
	}
}

func (o *out) str(s string) { o.dst = jsjson.AppendString(o.dst, s) }

func (o *out) boolean(b bool) {
	if b {
		o.dst = append(o.dst, "true"...)
	} else {
		o.dst = append(o.dst, "false"...)
	}
}

// array writes items as a JSON array ("[]" when empty), each through write.
func array[E any](o *out, items []E, write func(*E)) {
	if len(items) == 0 {
		o.dst = append(o.dst, '[', ']')
		return
	}
	o.open('[')
	for i := range items {
		o.item(i)
		write(&items[i])
	}
	o.close(']')
}

func (o *out) strings(list []string) { array(o, list, func(s *string) { o.str(*s) }) }

// raw writes a parsed value at the current indentation.
func (o *out) raw(v jsjson.Value) {
	o.dst = o.pr.AppendIndent(o.dst, v, string(o.line[1:]), o.indent)
}

func (o *out) events(list []Event) { array(o, list, func(e *Event) { o.raw(e.Raw) }) }

func (o *out) receipt(r *Receipt) {
	o.open('{')
	o.key(0, "operation")
	o.open('{')
	o.key(0, "template")
	o.str(r.Operation.Template)
	o.key(1, "version")
	o.dst = jsjson.AppendNumber(o.dst, r.Operation.Version)
	o.key(2, "operation_id")
	o.str(r.Operation.OperationID)
	o.close('}')
	o.key(1, "completeness")
	o.str(r.Completeness)

	o.key(2, "stages")
	array(o, r.Stages, func(s *StageResult) {
		o.open('{')
		o.key(0, "id")
		o.str(s.ID)
		o.key(1, "required")
		o.boolean(s.Required)
		o.key(2, "state")
		o.str(s.State)
		o.key(3, "events")
		o.strings(s.Events)
		o.close('}')
	})

	o.key(3, "missing")
	array(o, r.Missing, func(m *Missing) {
		o.open('{')
		o.key(0, "stage")
		o.str(m.Stage)
		o.key(1, "expected_events")
		o.strings(m.ExpectedEvents)
		if m.Why != "" {
			o.key(2, "why")
			o.str(m.Why)
		}
		o.close('}')
	})

	o.key(4, "exceptions")
	array(o, r.Exceptions, func(f *Fault) {
		o.open('{')
		o.key(0, "event_type")
		o.str(f.EventType)
		o.key(1, "event_id")
		o.str(f.EventID)
		o.close('}')
	})

	o.key(5, "events")
	o.events(r.Events)
	o.close('}')
}

// AppendJSON appends the receipt exactly as the reference's JSON.stringify
// writes it, with indent per level and prefix starting every line after
// the first.
func (r *Receipt) AppendJSON(dst []byte, prefix, indent string) []byte {
	o := newOut(dst, prefix, indent)
	o.receipt(r)
	return o.dst
}

// AppendJSON appends {"receipts": [...], "unassigned": [...]} indented by two
// spaces with a final newline: the bytes of the reference's `build --json`.
func (res *Result) AppendJSON(dst []byte) []byte {
	w := &appendWriter{buf: dst}
	_ = res.WriteJSON(w) // an appendWriter never fails
	return w.buf
}

// appendWriter collects writes into a byte slice.
type appendWriter struct{ buf []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// WriteJSON writes the same bytes as AppendJSON to w, a piece at a time, so
// a large run never needs its whole output in memory. A large result is
// printed by one goroutine per processor, batch by batch, while the batches
// already printed are written to w in order; a few batches (about a MiB
// each) are in flight at a time.
func (res *Result) WriteJSON(w io.Writer) error {
	return writeDoc(w, len(res.Receipts) > 0, func(prefix string, write func([]byte) bool) {
		printBatches(res.Receipts, prefix, func(r *Receipt) int { return len(r.Events) },
			func(o *out, r *Receipt) { o.receipt(r) }, write)
	}, res.Unassigned)
}

// WriteBuild writes what Assemble(events, t) would give to w as WriteJSON
// does, for a caller that gives up events: they are put into receipt order
// where they are, and each operation is folded only as its batch is
// printed, so no receipt outlives its bytes and neither the events nor the
// receipts of a large run exist twice. This is the build command.
func WriteBuild(w io.Writer, events []Event, t *Template) error {
	order := sortedOrder(events)
	dest, counts, unassigned := placement(events, order)
	permute(events, dest)
	type span struct{ lo, hi int32 }
	ops := make([]span, len(counts))
	var at int32
	for g, c := range counts {
		ops[g] = span{at, at + c}
		at += c
	}
	m := newMatcher(t)
	return writeDoc(w, len(ops) > 0, func(prefix string, write func([]byte) bool) {
		printBatches(ops, prefix, func(s *span) int { return int(s.hi - s.lo) },
			func(o *out, s *span) {
				if o.fold == nil {
					o.fold = new(foldBuf)
				}
				r := m.foldInto(events[s.lo:s.hi:s.hi], o.fold)
				o.receipt(&r)
			}, write)
	}, events[at:int(at)+unassigned])
}

// writeDoc writes {"receipts": [...], "unassigned": [...]} as AppendJSON
// does; receipts prints the receipts' array items under prefix.
func writeDoc(w io.Writer, hasReceipts bool, receipts func(prefix string, write func([]byte) bool), unassigned []Event) error {
	o := newOut(make([]byte, 0, 64<<10), "", "  ")
	var werr error
	write := func(b []byte) bool {
		if werr == nil && len(b) > 0 {
			_, werr = w.Write(b)
		}
		return werr == nil
	}
	o.open('{')
	o.key(0, "receipts")
	if !hasReceipts {
		o.dst = append(o.dst, '[', ']')
	} else {
		o.open('[')
		write(o.dst)
		o.dst = o.dst[:0]
		receipts(string(o.line[1:]), write)
		o.close(']')
	}
	o.key(1, "unassigned")
	if len(unassigned) == 0 {
		o.dst = append(o.dst, '[', ']')
	} else {
		o.open('[')
		write(o.dst)
		o.dst = o.dst[:0]
		printBatches(unassigned, string(o.line[1:]), func(*Event) int { return 1 },
			func(o *out, e *Event) { o.raw(e.Raw) }, write)
		o.close(']')
	}
	o.close('}')
	o.dst = append(o.dst, '\n')
	write(o.dst)
	return werr
}

// batchEvents is about how many events one batch of output holds (a MiB or
// so of JSON for recorder-sized lines).
const batchEvents = 1024

// batchBytes is the capacity a new batch buffer starts with, enough for
// batchEvents recorder-sized events, so that it rarely grows.
const batchBytes = 2 << 20

// printBatches prints the items of an array (indented under prefix) in
// batches of about batchEvents events, weighed by events, in parallel when
// there is more than one batch, handing each batch's bytes to write in order.
// Once write reports a failure, no further batch is printed.
func printBatches[E any](items []E, prefix string, events func(*E) int, print func(*out, *E), write func([]byte) bool) {
	type batch struct {
		lo, hi int
		buf    []byte
		done   chan struct{}
	}
	render := func(b *batch) {
		o := newOut(b.buf[:0], prefix, "  ")
		for i := b.lo; i < b.hi; i++ {
			o.item(i)
			print(o, &items[i])
		}
		b.buf = o.dst
	}
	// Cut the batches lazily, so only those in flight exist.
	next := 0
	cut := func() *batch {
		if next >= len(items) {
			return nil
		}
		b := &batch{lo: next}
		for n := 0; next < len(items) && n < batchEvents; next++ {
			n += events(&items[next])
		}
		b.hi = next
		return b
	}
	workers := runtime.GOMAXPROCS(0)
	first := cut()
	if workers == 1 || next >= len(items) {
		var buf []byte
		for b := first; b != nil; b = cut() {
			b.buf = buf
			render(b)
			if !write(b.buf) {
				return
			}
			buf = b.buf
		}
		return
	}
	var failed atomic.Bool
	// At most workers+2 batches exist at once: one being written, one per
	// worker being printed, one waiting; their buffers are reused.
	jobs := make(chan *batch, workers+1)
	inOrder := make(chan *batch, workers+1)
	free := make(chan []byte, workers+2)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for b := range jobs {
				render(b)
				close(b.done)
			}
		})
	}
	go func() {
		defer close(jobs)
		defer close(inOrder)
		for b := first; b != nil && !failed.Load(); b = cut() {
			select {
			case b.buf = <-free:
			default:
				b.buf = make([]byte, 0, batchBytes)
			}
			b.done = make(chan struct{})
			inOrder <- b // bounds how many batches are in flight
			jobs <- b
		}
	}()
	for b := range inOrder {
		<-b.done
		if !failed.Load() && !write(b.buf) {
			failed.Store(true)
		}
		select {
		case free <- b.buf:
		default:
		}
	}
	wg.Wait()
}
