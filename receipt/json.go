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

func (o *out) strings(list []string) {
	if len(list) == 0 {
		o.dst = append(o.dst, '[', ']')
		return
	}
	o.open('[')
	for i, s := range list {
		o.item(i)
		o.str(s)
	}
	o.close(']')
}

// raw writes a parsed value at the current indentation.
func (o *out) raw(v jsjson.Value) {
	o.dst = jsjson.AppendIndent(o.dst, v, string(o.line[1:]), o.indent)
}

func (o *out) events(list []Event) {
	if len(list) == 0 {
		o.dst = append(o.dst, '[', ']')
		return
	}
	o.open('[')
	for i := range list {
		o.item(i)
		o.raw(list[i].Raw)
	}
	o.close(']')
}

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
	if len(r.Stages) == 0 {
		o.dst = append(o.dst, '[', ']')
	} else {
		o.open('[')
		for i, s := range r.Stages {
			o.item(i)
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
		}
		o.close(']')
	}

	o.key(3, "missing")
	if len(r.Missing) == 0 {
		o.dst = append(o.dst, '[', ']')
	} else {
		o.open('[')
		for i, m := range r.Missing {
			o.item(i)
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
		}
		o.close(']')
	}

	o.key(4, "exceptions")
	if len(r.Exceptions) == 0 {
		o.dst = append(o.dst, '[', ']')
	} else {
		o.open('[')
		for i, f := range r.Exceptions {
			o.item(i)
			o.open('{')
			o.key(0, "event_type")
			o.str(f.EventType)
			o.key(1, "event_id")
			o.str(f.EventID)
			o.close('}')
		}
		o.close(']')
	}

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
	o := newOut(dst, "", "  ")
	o.open('{')
	o.key(0, "receipts")
	if len(res.Receipts) == 0 {
		o.dst = append(o.dst, '[', ']')
	} else {
		o.open('[')
		for i := range res.Receipts {
			o.item(i)
			o.receipt(&res.Receipts[i])
		}
		o.close(']')
	}
	o.key(1, "unassigned")
	o.events(res.Unassigned)
	o.close('}')
	return append(o.dst, '\n')
}

// WriteJSON writes the same bytes as AppendJSON to w, a piece at a time, so
// a large run never needs its whole output in memory.
func (res *Result) WriteJSON(w io.Writer) error {
	o := newOut(make([]byte, 0, 64<<10), "", "  ")
	flush := func(force bool) error {
		if !force && len(o.dst) < 32<<10 {
			return nil
		}
		_, err := w.Write(o.dst)
		o.dst = o.dst[:0]
		return err
	}
	o.open('{')
	o.key(0, "receipts")
	if len(res.Receipts) == 0 {
		o.dst = append(o.dst, '[', ']')
	} else {
		o.open('[')
		for i := range res.Receipts {
			o.item(i)
			o.receipt(&res.Receipts[i])
			if err := flush(false); err != nil {
				return err
			}
		}
		o.close(']')
	}
	o.key(1, "unassigned")
	if len(res.Unassigned) == 0 {
		o.dst = append(o.dst, '[', ']')
	} else {
		o.open('[')
		for i := range res.Unassigned {
			o.item(i)
			o.raw(res.Unassigned[i].Raw)
			if err := flush(false); err != nil {
				return err
			}
		}
		o.close(']')
	}
	o.close('}')
	o.dst = append(o.dst, '\n')
	return flush(true)
}
