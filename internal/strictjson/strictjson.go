// Package strictjson checks that a JSON document can be read only one way
// before encoding/json reads it into a Go value.
//
// encoding/json matches an object's member names to a struct's fields
// without regard to letter case, and keeps the last of two members with one
// name. Another reader (a JavaScript verifier, PostgreSQL's ->> operator, a
// second Go struct) may take the other member, so a document that repeats a
// name, or spells it in another case beside the exact one, says two things
// at once. Check refuses such a document: every object names each member
// once, and a member of an object read into a struct is one of the struct's
// JSON names, spelled exactly.
package strictjson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// MaxDepth bounds how deeply arrays and objects may nest.
const MaxDepth = 64

// Error is a document that is valid JSON but not exact: a repeated member,
// a member the struct does not define or spells in another case, or
// nesting past MaxDepth. Path names where ("terms", "reasons[0]").
type Error struct {
	Path string
	Msg  string
	// Ambiguous is set where readers could disagree on what the document
	// says: a repeated member, or a name spelled in another case than one
	// the struct defines. A member of no known name, or one nested too
	// deep, is merely not of the shape.
	Ambiguous bool
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Check reads data as one JSON value shaped like v (a value or a pointer to
// one) and reports the first place it is not exact, as an *Error. Data that
// is not JSON at all, or that holds more than one value, is an error of
// another kind. Types of scalar members are left to encoding/json; members
// read into a map, an interface or a json.RawMessage may have any name,
// but never twice in one object.
//
// Valid JSON is walked in place (see scanner); anything else by
// encoding/json's tokens, whose errors say where the JSON breaks.
func Check(data []byte, v any) error {
	if json.Valid(data) {
		sc := scanner{data: data}
		return sc.value(reflect.TypeOf(v), 0)
	}
	return checkTokens(data, v)
}

// checkTokens is Check by encoding/json's tokens: the reference the
// scanner agrees with (FuzzScannerAgreesWithTokens), and the reader of
// what is not JSON.
func checkTokens(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	w := walker{dec: dec}
	if err := w.value(reflect.TypeOf(v), "", 0); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return nil
}

type walker struct {
	dec *json.Decoder
}

var (
	rawType         = reflect.TypeOf(json.RawMessage(nil))
	unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
	textType        = reflect.TypeOf((*encoding.TextUnmarshaler)(nil)).Elem()
)

// shape is what a value of t is read as: a struct (with its exact member
// names), a map or a list (with the type of their elements), or anything
// (nil type: only repeated names are checked).
func shape(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t == rawType || t.Kind() == reflect.Interface {
		return nil
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) || reflect.PointerTo(t).Implements(textType) {
		return nil // the type reads itself
	}
	return t
}

func (w *walker) token() (json.Token, error) {
	tok, err := w.dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, errors.New("the JSON ends early")
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("invalid JSON at byte %d", se.Offset)
		}
		return nil, fmt.Errorf("invalid JSON at byte %d", w.dec.InputOffset())
	}
	return tok, nil
}

func (w *walker) value(t reflect.Type, path string, depth int) error {
	tok, err := w.token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar: its type is encoding/json's to check
	}
	if depth >= MaxDepth {
		return &Error{Path: path, Msg: fmt.Sprintf("nests deeper than %d levels", MaxDepth)}
	}
	t = shape(t)
	switch d {
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; w.dec.More(); i++ {
			if err := w.value(elem, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
		}
	case '{':
		var fields map[string]reflect.Type
		var elem reflect.Type
		switch {
		case t != nil && t.Kind() == reflect.Struct:
			fields = fieldsOf(t)
		case t != nil && t.Kind() == reflect.Map:
			elem = t.Elem()
		}
		seen := map[string]bool{}
		for w.dec.More() {
			tok, err := w.token()
			if err != nil {
				return err
			}
			k, _ := tok.(string) // inside an object the decoder yields only string keys here
			at := join(path, k)
			if seen[k] {
				return &Error{Path: path, Msg: fmt.Sprintf("the field %q appears twice; a repeated name is read differently by different readers", clip(k)), Ambiguous: true}
			}
			seen[k] = true
			ft := elem
			if fields != nil {
				var known bool
				if ft, known = fields[k]; !known {
					msg, folded := unknown(k, fields)
					return &Error{Path: path, Msg: msg, Ambiguous: folded}
				}
			}
			if err := w.value(ft, at, depth+1); err != nil {
				return err
			}
		}
	}
	_, err = w.token() // the closing ']' or '}'
	return err
}

// unknown says why k is no member of fields, and whether it is one of
// them in another case (which encoding/json would take for it).
func unknown(k string, fields map[string]reflect.Type) (string, bool) {
	for name := range fields {
		if strings.EqualFold(name, k) {
			return fmt.Sprintf("the field %q is not spelled %q; names are exact (another reader would not take it for %q)", clip(k), name, name), true
		}
	}
	return fmt.Sprintf("unknown field %q", clip(k)), false
}

// fieldsOf maps the JSON names of t's exported fields (as encoding/json
// names them, fields of untagged embedded structs included) to their types.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range fieldsOf(et) {
					if _, shadowed := out[k]; !shadowed {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, k string) string {
	if path == "" {
		return clip(k)
	}
	return path + "." + clip(k)
}

func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}
