package noa

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Head is the few members of a receipt that say what it is — its id and
// time, who answered, the action and the verdict — read without the rest,
// unverified. It is for a reader that picks, among many lines, the few it
// must look at (the commitment receipts a spend ledger must hold); anything
// it trusts it reads again with ParseReceipt and verifies.
type Head struct {
	ID    string `json:"id"`
	TS    string `json:"ts"`
	Agent struct {
		ID        string `json:"id"`
		Principal string `json:"principal"`
	} `json:"agent"`
	Action struct {
		Canonical string `json:"canonical"`
	} `json:"action"`
	Governance struct {
		Verdict string `json:"verdict"`
	} `json:"governance"`
}

// maxHeadDepth bounds the nesting a head reader follows in the members it
// skips (encoding/json's own bound).
const maxHeadDepth = 10000

// ParseHead reads the head of one receipt line. The line's other members
// are skipped, checked only to be well-formed JSON. Members are matched by
// their exact names, the last of a repeated member counts, and null leaves
// a field empty; every line ParseReceipt accepts gives the head
// ParseReceipt reads (FuzzParseHead holds the two together). A decision's catch-up reads the
// head of every receipt other replicas signed, so this scans the line once
// instead of decoding it by reflection.
func ParseHead(line []byte) (Head, error) {
	var h Head
	s := headScanner{b: line}
	s.ws()
	err := s.object(0, func(key []byte) error {
		switch string(key) {
		case "id":
			return s.str(&h.ID)
		case "ts":
			return s.str(&h.TS)
		case "agent":
			return s.members(func(k []byte) error {
				switch string(k) {
				case "id":
					return s.str(&h.Agent.ID)
				case "principal":
					return s.str(&h.Agent.Principal)
				}
				return s.skip(2)
			})
		case "action":
			return s.members(func(k []byte) error {
				if string(k) == "canonical" {
					return s.str(&h.Action.Canonical)
				}
				return s.skip(2)
			})
		case "governance":
			return s.members(func(k []byte) error {
				if string(k) == "verdict" {
					return s.str(&h.Governance.Verdict)
				}
				return s.skip(2)
			})
		}
		return s.skip(1)
	})
	if err == nil {
		s.ws()
		if s.i != len(s.b) {
			err = s.fail("data after the receipt")
		}
	}
	if err != nil {
		return Head{}, fmt.Errorf("noa: receipt head: %w", err)
	}
	if h.ID == "" || h.TS == "" {
		return Head{}, fmt.Errorf("noa: receipt head: no id or ts")
	}
	return h, nil
}

// headScanner walks one JSON text.
type headScanner struct {
	b []byte
	i int
}

func (s *headScanner) fail(what string) error {
	return fmt.Errorf("%s at byte %d", what, s.i)
}

func (s *headScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// members reads an object (or null, which leaves the fields as they are,
// as encoding/json does) one member at a time, the scanner at the value.
func (s *headScanner) members(fn func(key []byte) error) error {
	if s.literal("null") {
		return nil
	}
	return s.object(1, fn)
}

// object reads {"key": value, …}, calling fn with the scanner at each
// value; fn must read the value.
func (s *headScanner) object(depth int, fn func(key []byte) error) error {
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return s.fail("not an object")
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		s.ws()
		key, err := s.rawString()
		if err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return s.fail("no ':' after a member name")
		}
		s.i++
		s.ws()
		if err := fn(key); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return s.fail("unfinished object")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.fail("no ',' or '}' after a member")
		}
	}
}

// str reads a string value into dst (null leaves dst as it is).
func (s *headScanner) str(dst *string) error {
	if s.literal("null") {
		return nil
	}
	v, err := s.rawString()
	if err != nil {
		return err
	}
	*dst = string(v)
	return nil
}

// literal consumes word when it is next.
func (s *headScanner) literal(word string) bool {
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return true
	}
	return false
}

// rawString reads a string and returns its decoded bytes: unescaped, with
// invalid UTF-8 replaced by U+FFFD as encoding/json does. Without escapes
// or invalid bytes it is a slice of the line.
func (s *headScanner) rawString() ([]byte, error) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, s.fail("not a string")
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			return v, nil
		case c == '\\':
			return s.escaped(start)
		case c < 0x20:
			return nil, s.fail("a control character in a string")
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, n := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && n == 1 {
				return s.escaped(start)
			}
			s.i += n
		}
	}
	return nil, s.fail("unfinished string")
}

// escaped finishes a string from start that needs decoding.
func (s *headScanner) escaped(start int) ([]byte, error) {
	out := append([]byte(nil), s.b[start:s.i]...)
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return out, nil
		case c < 0x20:
			return nil, s.fail("a control character in a string")
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return nil, s.fail("unfinished escape")
			}
			e := s.b[s.i+1]
			s.i += 2
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, err := s.hex4()
				if err != nil {
					return nil, err
				}
				if utf16.IsSurrogate(r) {
					r2 := rune(-1)
					if s.i+1 < len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
						save := s.i
						s.i += 2
						if v, err := s.hex4(); err == nil {
							r2 = v
						} else {
							return nil, err
						}
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							continue
						}
						s.i = save
					}
					out = utf8.AppendRune(out, utf8.RuneError)
					continue
				}
				out = utf8.AppendRune(out, r)
			default:
				return nil, s.fail("an unknown escape")
			}
		case c < utf8.RuneSelf:
			out = append(out, c)
			s.i++
		default:
			r, n := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && n == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, s.b[s.i:s.i+n]...)
			}
			s.i += n
		}
	}
	return nil, s.fail("unfinished string")
}

func (s *headScanner) hex4() (rune, error) {
	if len(s.b)-s.i < 4 {
		return 0, s.fail("a short \\u escape")
	}
	v, err := strconv.ParseUint(string(s.b[s.i:s.i+4]), 16, 32)
	if err != nil {
		return 0, s.fail("a bad \\u escape")
	}
	s.i += 4
	return rune(v), nil
}

var errTooDeep = errors.New("nested too deeply")

// skip reads one value of any kind, checking only that it is well formed.
func (s *headScanner) skip(depth int) error {
	if depth > maxHeadDepth {
		return errTooDeep
	}
	if s.i >= len(s.b) {
		return s.fail("a value is missing")
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, err := s.rawString()
		return err
	case c == '{':
		return s.object(depth, func([]byte) error { return s.skip(depth + 1) })
	case c == '[':
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			s.ws()
			if s.i >= len(s.b) {
				return s.fail("unfinished array")
			}
			switch s.b[s.i] {
			case ',':
				s.i++
			case ']':
				s.i++
				return nil
			default:
				return s.fail("no ',' or ']' after an element")
			}
		}
	case c == 't':
		if s.literal("true") {
			return nil
		}
	case c == 'f':
		if s.literal("false") {
			return nil
		}
	case c == 'n':
		if s.literal("null") {
			return nil
		}
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	}
	return s.fail("not a JSON value")
}

// number reads a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *headScanner) number() error {
	if s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if digits() == 0 {
		return s.fail("a bad number")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return s.fail("a bad number")
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return s.fail("a bad number")
		}
	}
	return nil
}
