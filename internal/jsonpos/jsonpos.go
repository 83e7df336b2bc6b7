// Package jsonpos finds where a value is in a JSON document, by its path,
// so that a message about a file can give the line a person opens it at.
package jsonpos

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
)

// Pos is a place in a document: line and column, both from 1 (the column
// counts bytes).
type Pos struct{ Line, Col int }

// Locate finds the value at path (member names as strings, list indexes as
// ints) in data: the position of its member's name in its object, or of
// the element in its list. Where the path goes further than the document
// (a member that is required but absent), it is the deepest part that
// exists; the document's start for an empty path. exact says whether the
// whole path was found. A document that is not JSON gives the place its
// syntax breaks, when the decoder says.
func Locate(data []byte, path []any) (pos Pos, exact bool) {
	w := walker{data: data, want: path, dec: json.NewDecoder(bytes.NewReader(data))}
	w.dec.UseNumber()
	w.bestOff = w.skip(0)
	err := w.value(0)
	var se *json.SyntaxError
	if errors.As(err, &se) && w.bestLen < len(path) {
		w.bestOff = int(se.Offset)
	}
	return At(data, w.bestOff), w.bestLen == len(path)
}

// At is the position of byte offset off in data.
func At(data []byte, off int) Pos {
	off = min(max(off, 0), len(data))
	before := data[:off]
	line := bytes.Count(before, []byte{'\n'}) + 1
	col := off - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return Pos{Line: line, Col: col}
}

// ParsePath reads a JSON path as the noa.policy validator writes it —
// $, .name, [index] — into Locate's form.
func ParsePath(p string) ([]any, bool) {
	rest, ok := strings.CutPrefix(p, "$")
	if !ok {
		return nil, false
	}
	var out []any
	for rest != "" {
		switch rest[0] {
		case '.':
			rest = rest[1:]
			n := strings.IndexAny(rest, ".[")
			if n < 0 {
				n = len(rest)
			}
			if n == 0 {
				return nil, false
			}
			out, rest = append(out, rest[:n]), rest[n:]
		case '[':
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return nil, false
			}
			inner := rest[1:end]
			if i, err := strconv.Atoi(inner); err == nil {
				out = append(out, i)
			} else if s, err := strconv.Unquote(inner); err == nil {
				out = append(out, s)
			} else {
				return nil, false
			}
			rest = rest[end+1:]
		default:
			return nil, false
		}
	}
	return out, true
}

type walker struct {
	data    []byte
	dec     *json.Decoder
	want    []any
	bestLen int
	bestOff int
}

// skip is the first offset from off that is not white space, a comma or
// a colon: where the next token starts.
func (w *walker) skip(off int) int {
	for off < len(w.data) {
		switch w.data[off] {
		case ' ', '\t', '\r', '\n', ',', ':':
			off++
		default:
			return off
		}
	}
	return off
}

// matches says whether the path to depth, ending in seg, is a prefix of
// the one wanted so far (the walk is on it).
func (w *walker) on(depth int, seg any) bool {
	return depth < len(w.want) && w.bestLen == depth && w.want[depth] == seg
}

// value reads one value at depth; its parent is on the wanted path when
// w.bestLen == depth.
func (w *walker) value(depth int) error {
	tok, err := w.dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil
		}
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch d {
	case '{':
		for w.dec.More() {
			start := w.skip(int(w.dec.InputOffset()))
			kt, err := w.dec.Token()
			if err != nil {
				return err
			}
			key, _ := kt.(string)
			if w.on(depth, key) {
				w.bestLen, w.bestOff = depth+1, start
			}
			if err := w.value(depth + 1); err != nil {
				return err
			}
		}
	case '[':
		for i := 0; w.dec.More(); i++ {
			start := w.skip(int(w.dec.InputOffset()))
			if w.on(depth, i) {
				w.bestLen, w.bestOff = depth+1, start
			}
			if err := w.value(depth + 1); err != nil {
				return err
			}
		}
	}
	_, err = w.dec.Token() // the closing delimiter
	return err
}
