package strictjson

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"unicode/utf8"
)

// scanner walks a document json.Valid accepted, in place: the same checks
// in the same order as the token walk, without a token, a map or a path
// string made per member (the path is built only for an error, and a
// struct's names once per type and call).
type scanner struct {
	data   []byte
	i      int
	fields map[reflect.Type]map[string]reflect.Type
	path   []segment
}

// segment is one step of the path: a member name or an index.
type segment struct {
	key   string
	index int
	isKey bool
}

// pathString is the path as the token walk writes it.
func (s *scanner) pathString() string {
	p := ""
	for _, g := range s.path {
		if g.isKey {
			p = join(p, g.key)
		} else {
			p += "[" + strconv.Itoa(g.index) + "]"
		}
	}
	return p
}

func (s *scanner) fieldsOf(t reflect.Type) map[string]reflect.Type {
	if f, ok := s.fields[t]; ok {
		return f
	}
	if s.fields == nil {
		s.fields = map[reflect.Type]map[string]reflect.Type{}
	}
	f := fieldsOf(t)
	s.fields[t] = f
	return f
}

func (s *scanner) ws() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// str skips the string at s.i (its opening quote) and returns its raw
// bytes and whether they need decoding (an escape or a non-ASCII byte).
func (s *scanner) str() (raw []byte, decode bool) {
	start := s.i
	s.i++
	for {
		switch c := s.data[s.i]; {
		case c == '\\':
			decode = true
			s.i += 2
		case c == '"':
			s.i++
			return s.data[start:s.i], decode
		default:
			if c >= utf8.RuneSelf {
				decode = true
			}
			s.i++
		}
	}
}

// key reads the member name at s.i as encoding/json would.
func (s *scanner) key() string {
	raw, decode := s.str()
	inner := raw[1 : len(raw)-1]
	if !decode || (utf8.Valid(inner) && !hasEscape(inner)) {
		return string(inner)
	}
	var k string
	_ = json.Unmarshal(raw, &k) // valid JSON: a string always decodes
	return k
}

func hasEscape(b []byte) bool {
	for _, c := range b {
		if c == '\\' {
			return true
		}
	}
	return false
}

// scalar skips a number, true, false or null.
func (s *scanner) scalar() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return
		}
		s.i++
	}
}

func (s *scanner) value(t reflect.Type, depth int) error {
	s.ws()
	c := s.data[s.i]
	switch c {
	case '{', '[':
	case '"':
		s.str()
		return nil
	default:
		s.scalar()
		return nil // a scalar: its type is encoding/json's to check
	}
	if depth >= MaxDepth {
		return &Error{Path: s.pathString(), Msg: fmt.Sprintf("nests deeper than %d levels", MaxDepth)}
	}
	t = shape(t)
	s.i++
	s.ws()
	if c == '[' {
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		if s.data[s.i] == ']' {
			s.i++
			return nil
		}
		for n := 0; ; n++ {
			if more, err := s.member(segment{index: n}, elem, depth); !more || err != nil {
				return err
			}
		}
	}
	var fields map[string]reflect.Type
	var elem reflect.Type
	switch {
	case t != nil && t.Kind() == reflect.Struct:
		fields = s.fieldsOf(t)
	case t != nil && t.Kind() == reflect.Map:
		elem = t.Elem()
	}
	if s.data[s.i] == '}' {
		s.i++
		return nil
	}
	// The names seen: a few in a list, more in a map (a hostile object
	// of many members stays linear).
	var few [16]string
	seenList := few[:0]
	var seenMap map[string]bool
	for {
		s.ws()
		k := s.key()
		repeated := seenMap[k]
		if seenMap == nil {
			for _, o := range seenList {
				repeated = repeated || o == k
			}
		}
		if repeated {
			return &Error{Path: s.pathString(), Msg: fmt.Sprintf("the field %q appears twice; a repeated name is read differently by different readers", clip(k)), Ambiguous: true}
		}
		switch {
		case seenMap != nil:
			seenMap[k] = true
		case len(seenList) < len(few):
			seenList = append(seenList, k)
		default:
			seenMap = make(map[string]bool, 2*len(few))
			for _, o := range seenList {
				seenMap[o] = true
			}
			seenMap[k] = true
		}
		ft := elem
		if fields != nil {
			var known bool
			if ft, known = fields[k]; !known {
				msg, folded := unknown(k, fields)
				return &Error{Path: s.pathString(), Msg: msg, Ambiguous: folded}
			}
		}
		s.ws()
		s.i++ // ':'
		if more, err := s.member(segment{key: k, isKey: true}, ft, depth); !more || err != nil {
			return err
		}
	}
}

// member walks the value of an array element or object member at g, then
// its separator: more is whether another follows (a ',', not the ']' or
// '}' that closes its container).
func (s *scanner) member(g segment, t reflect.Type, depth int) (more bool, err error) {
	s.path = append(s.path, g)
	err = s.value(t, depth+1)
	s.path = s.path[:len(s.path)-1]
	if err != nil {
		return false, err
	}
	s.ws()
	more = s.data[s.i] == ','
	s.i++ // the ',', ']' or '}'
	return more, nil
}
