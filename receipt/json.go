package receipt

import (
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// out writes a build's JSON in the layout of JSON.stringify(v, null,
// indent), through the one JSON printer (jsjson.Indenter), with the
// member names and helpers of a receipt.
type out struct {
	jsjson.Indenter
	fold *foldBuf // reused by WriteBuild's printers
}

func newOut(dst []byte, prefix, indent string) *out {
	o := &out{}
	o.Reset(dst, prefix, indent)
	return o
}

func (o *out) str(s string) { o.Buf = jsjson.AppendString(o.Buf, s) }

func (o *out) boolean(b bool) {
	if b {
		o.Buf = append(o.Buf, "true"...)
	} else {
		o.Buf = append(o.Buf, "false"...)
	}
}

// array writes items as a JSON array ("[]" when empty), each through write.
func array[E any](o *out, items []E, write func(*E)) {
	if len(items) == 0 {
		o.Buf = append(o.Buf, '[', ']')
		return
	}
	o.Open('[')
	for i := range items {
		o.Item(i)
		write(&items[i])
	}
	o.Close(']')
}

func (o *out) strings(list []string) { array(o, list, func(s *string) { o.str(*s) }) }

func (o *out) events(list []Event) { array(o, list, func(e *Event) { o.Value(e.Raw) }) }

func (o *out) receipt(r *Receipt) {
	o.Open('{')
	o.QuotedKey(0, `"operation":`)
	o.Open('{')
	o.QuotedKey(0, `"template":`)
	o.str(r.Operation.Template)
	o.QuotedKey(1, `"version":`)
	o.Buf = jsjson.AppendNumber(o.Buf, r.Operation.Version)
	o.QuotedKey(2, `"operation_id":`)
	o.str(r.Operation.OperationID)
	o.Close('}')
	o.QuotedKey(1, `"completeness":`)
	o.str(r.Completeness)

	o.QuotedKey(2, `"stages":`)
	array(o, r.Stages, func(s *StageResult) {
		o.Open('{')
		o.QuotedKey(0, `"id":`)
		o.str(s.ID)
		o.QuotedKey(1, `"required":`)
		o.boolean(s.Required)
		o.QuotedKey(2, `"state":`)
		o.str(s.State)
		o.QuotedKey(3, `"events":`)
		o.strings(s.Events)
		o.Close('}')
	})

	o.QuotedKey(3, `"missing":`)
	array(o, r.Missing, func(m *Missing) {
		o.Open('{')
		o.QuotedKey(0, `"stage":`)
		o.str(m.Stage)
		o.QuotedKey(1, `"expected_events":`)
		o.strings(m.ExpectedEvents)
		if m.Why != "" {
			o.QuotedKey(2, `"why":`)
			o.str(m.Why)
		}
		o.Close('}')
	})

	o.QuotedKey(4, `"exceptions":`)
	array(o, r.Exceptions, func(f *Fault) {
		o.Open('{')
		o.QuotedKey(0, `"event_type":`)
		o.str(f.EventType)
		o.QuotedKey(1, `"event_id":`)
		o.str(f.EventID)
		o.Close('}')
	})

	o.QuotedKey(5, `"events":`)
	o.events(r.Events)
	o.Close('}')
}

// AppendJSON appends the receipt exactly as the reference's JSON.stringify
// writes it, with indent per level and prefix starting every line after
// the first.
func (r *Receipt) AppendJSON(dst []byte, prefix, indent string) []byte {
	o := newOut(dst, prefix, indent)
	o.receipt(r)
	return o.Buf
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
// already printed are written to w in order; a few batches (a few hundred KiB
// each) are in flight at a time.
func (res *Result) WriteJSON(w io.Writer) error {
	return writeDoc(w, len(res.Receipts) > 0, func(prefix string, write func([]byte) bool, check func([]Event)) {
		printBatches(res.Receipts, prefix, func(r *Receipt) int { return len(r.Events) },
			func(o *out, r *Receipt) { o.receipt(r); check(r.Events) }, write)
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
	return writeDoc(w, len(ops) > 0, func(prefix string, write func([]byte) bool, check func([]Event)) {
		printBatches(ops, prefix, func(s *span) int { return int(s.hi - s.lo) },
			func(o *out, s *span) {
				if o.fold == nil {
					o.fold = new(foldBuf)
				}
				r := m.foldInto(events[s.lo:s.hi:s.hi], o.fold)
				o.receipt(&r)
				check(events[s.lo:s.hi])
			}, write)
	}, events[at:int(at)+unassigned])
}

// writeDoc writes {"receipts": [...], "unassigned": [...]} as AppendJSON
// does; receipts prints the receipts' array items under prefix, and
// hands check the events of each item once printed. Events whose mapped
// line changed since it was decoded (see Event.changed) stop the output
// before the batch that printed them, with ErrRunChanged.
func writeDoc(w io.Writer, hasReceipts bool, receipts func(prefix string, write func([]byte) bool, check func([]Event)), unassigned []Event) error {
	o := newOut(make([]byte, 0, 64<<10), "", "  ")
	var (
		werr    error
		changed atomic.Int64 // the line of an event found changed, 0 if none
	)
	check := func(events []Event) {
		for i := range events {
			if events[i].changed() {
				changed.CompareAndSwap(0, int64(max(events[i].Line, 1)))
			}
		}
	}
	// A batch is written after its printer checked it (printBatches hands
	// batches over only once printed), so no unchecked byte is written.
	write := func(b []byte) bool {
		if line := changed.Load(); line != 0 && werr == nil {
			werr = fmt.Errorf("line %d: %w", line, ErrRunChanged)
		}
		if werr == nil && len(b) > 0 {
			_, werr = w.Write(b)
		}
		return werr == nil
	}
	o.Open('{')
	o.Key(0, "receipts")
	if !hasReceipts {
		o.Buf = append(o.Buf, '[', ']')
	} else {
		o.Open('[')
		write(o.Buf)
		o.Buf = o.Buf[:0]
		receipts(o.Prefix(), write, check)
		o.Close(']')
	}
	o.Key(1, "unassigned")
	if len(unassigned) == 0 {
		o.Buf = append(o.Buf, '[', ']')
	} else {
		o.Open('[')
		write(o.Buf)
		o.Buf = o.Buf[:0]
		printBatches(unassigned, o.Prefix(), func(*Event) int { return 1 },
			func(o *out, e *Event) { o.Value(e.Raw); check(unsafe.Slice(e, 1)) }, write)
		o.Close(']')
	}
	o.Close('}')
	o.Buf = append(o.Buf, '\n')
	write(o.Buf)
	return werr
}

// batchEvents is about how many events one batch of output holds (about
// 300 KiB of JSON for recorder-sized lines). Smaller batches mean fewer
// fresh pages for the buffers in flight: 1,024 cost the build about a
// thousand more page faults.
const batchEvents = 256

// batchBytes is the capacity a new batch buffer starts with, enough for
// batchEvents recorder-sized events, so that it rarely grows.
const batchBytes = 512 << 10

// printBatches prints the items of an array (indented under prefix) in
// batches of about batchEvents events, weighed by events, in parallel when
// there is more than one batch, handing each batch's bytes to write in order.
// Once write reports a failure, no further batch is printed.
func printBatches[E any](items []E, prefix string, events func(*E) int, print func(*out, *E), write func([]byte) bool) {
	type batch struct {
		lo, hi int
		buf    []byte
		done   chan struct{}
		fault  any // met reading mapped text (see Guard)
	}
	render := func(b *batch) {
		o := newOut(b.buf[:0], prefix, "  ")
		for i := b.lo; i < b.hi; i++ {
			o.Item(i)
			print(o, &items[i])
		}
		b.buf = o.Buf
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
				b.fault = guarded(func() { render(b) })
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
	var fault any
	for b := range inOrder {
		<-b.done
		if b.fault != nil && fault == nil {
			fault = b.fault
			failed.Store(true)
		}
		if !failed.Load() && !write(b.buf) {
			failed.Store(true)
		}
		select {
		case free <- b.buf:
		default:
		}
	}
	wg.Wait()
	if fault != nil {
		panic(fault) // for Guard, on the goroutine that called
	}
}
