package receipt

import (
	"io"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// out writes hand-built JSON in the layout of JSON.stringify(v, null, indent).
type out struct {
	dst    []byte
	indent string
	line   []byte // "\n" + current indentation
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

// key starts the n-th member of an object.
func (o *out) key(n int, k string) {
	o.item(n)
	o.dst = jsjson.AppendString(o.dst, k)
	o.dst = append(o.dst, ':')
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
	o.dst = jsjson.AppendIndent(o.dst, v, string(o.line[1:]), o.indent)
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
// a large run never needs its whole output in memory.
func (res *Result) WriteJSON(w io.Writer) error {
	o := newOut(make([]byte, 0, 64<<10), "", "  ")
	var werr error
	// flush hands what is buffered to w once enough has gathered (or at the
	// end); the first write error stops further writes and is returned.
	flush := func(force bool) {
		if werr != nil || (!force && len(o.dst) < 32<<10) {
			return
		}
		_, werr = w.Write(o.dst)
		o.dst = o.dst[:0]
	}
	o.open('{')
	o.key(0, "receipts")
	array(o, res.Receipts, func(r *Receipt) {
		o.receipt(r)
		flush(false)
	})
	o.key(1, "unassigned")
	array(o, res.Unassigned, func(e *Event) {
		o.raw(e.Raw)
		flush(false)
	})
	o.close('}')
	o.dst = append(o.dst, '\n')
	flush(true)
	return werr
}
