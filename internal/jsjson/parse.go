package jsjson

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// MaxDepth bounds how deeply arrays and objects may nest. Deeper input is
// refused with an error instead of risking the stack; no real event nests
// anywhere near this.
const MaxDepth = 1000

// maxDocBytes keeps tape offsets within 32 bits.
const maxDocBytes = math.MaxUint32 - 1

// SyntaxError reports where and why input is not JSON.
type SyntaxError struct {
	Offset int // byte offset into the input
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

// Parse parses one JSON text the way JavaScript's JSON.parse does: member
// order is kept, a repeated key keeps its first position and its last value,
// numbers become doubles (a literal too large becomes ±Inf) and "\ud800"-style
// lone surrogates are kept as WTF-8 bytes. Unlike a JavaScript engine, which
// would have replaced them while decoding the text, invalid UTF-8 bytes are an
// error.
func Parse(data []byte) (Value, error) {
	return ParseString(string(data))
}

// ParseString is Parse over a string; the Value refers to s without copying
// it.
func ParseString(s string) (Value, error) {
	d := Decoder{tapeBlock: 1, docBlock: 1}
	return d.ParseString(s)
}

// Decoder parses many documents, carving their storage out of shared blocks
// so that reading a large run costs a few big allocations instead of several
// per line. Values from one Decoder keep its blocks alive. The zero Decoder
// is ready to use; it is not safe for concurrent use.
type Decoder struct {
	tapes     []entry // free part of the current block of tape entries
	docs      []doc   // free part of the current block of documents
	tapeBlock int     // entries in the next block; 0 means start small
	docBlock  int     // documents per block; 0 means defaultDocBlock

	scratch    []entry // the tape Scratch reuses
	scratchDoc doc
}

const (
	defaultTapeBlock = 64 << 10 // entries (1.25 MiB)
	defaultDocBlock  = 1 << 10
)

// ParseString parses s like the package-level ParseString.
func (dec *Decoder) ParseString(s string) (Value, error) {
	guess := len(s)/20 + 4
	if cap(dec.tapes) < guess {
		dec.newTapeBlock(guess)
	}
	p, err := parse(s, dec.tapes[:0])
	if err != nil {
		return Value{}, err
	}
	n := len(p.tape)
	if !p.grown {
		// Parsed in place: take the entries out of the block.
		dec.tapes = dec.tapes[n:cap(dec.tapes)][:0]
	} // else append outgrew the block and p.tape is an array of its own.
	d := dec.newDoc()
	*d = doc{src: s, side: string(p.side), tape: p.tape[:n:n], redirect: p.redirect, plain: !p.notPlain && len(p.side) == 0, newline: p.newline}
	return Value{d: d, i: 0}, nil
}

// newTapeBlock starts a block of at least guess entries. Blocks start small
// and double, so a decoder used for a few lines stays cheap and one used for
// a whole run allocates rarely.
func (dec *Decoder) newTapeBlock(guess int) {
	block := dec.tapeBlock
	if block == 0 {
		block = 256
	}
	dec.tapeBlock = min(2*block, defaultTapeBlock)
	dec.tapes = make([]entry, 0, max(block, guess))
}

func (dec *Decoder) newDoc() *doc {
	if len(dec.docs) == 0 {
		block := dec.docBlock
		if block == 0 {
			block = 16
		}
		if block < defaultDocBlock && dec.docBlock != 1 {
			dec.docBlock = min(2*block, defaultDocBlock)
		}
		dec.docs = make([]doc, block)
	}
	d := &dec.docs[0]
	dec.docs = dec.docs[1:]
	return d
}

// parse parses one whole document of s onto tape.
func parse(s string, tape []entry) (parser, error) {
	if len(s) > maxDocBytes {
		return parser{}, &SyntaxError{0, "document larger than 4 GiB"}
	}
	p := parser{src: s, tape: tape}
	p.skipWS()
	if err := p.value(span{}, false, 0); err != nil {
		return parser{}, err
	}
	p.skipWS()
	if p.pos < len(p.src) {
		return parser{}, p.errf("unexpected %s after the JSON value", p.describe())
	}
	return p, nil
}

// Scratch parses s into storage the decoder reuses. The Value it returns,
// and every Value reached from it, is valid only until the decoder's next
// Scratch call; Keep makes a lasting copy. Strings read from it stay valid.
// Reading a large file this way allocates almost nothing per line.
func (dec *Decoder) Scratch(s string) (Value, error) {
	p, err := parse(s, dec.scratch[:0])
	if err != nil {
		return Value{}, err
	}
	dec.scratch = p.tape[:0]
	side := ""
	if len(p.side) > 0 {
		side = string(p.side)
	}
	dec.scratchDoc = doc{src: s, side: side, tape: p.tape, redirect: p.redirect, plain: !p.notPlain && len(p.side) == 0, newline: p.newline}
	return Value{d: &dec.scratchDoc, i: 0}, nil
}

// Keep returns a lasting copy of a document returned by Scratch (or v itself
// for any other value), its storage carved from the decoder's blocks.
func (dec *Decoder) Keep(v Value) Value {
	if v.d != &dec.scratchDoc {
		return v
	}
	sd := &dec.scratchDoc
	n := len(sd.tape)
	if cap(dec.tapes) < n {
		dec.newTapeBlock(n)
	}
	tape := append(dec.tapes[:0], sd.tape...)
	dec.tapes = dec.tapes[n:cap(dec.tapes)][:0]
	d := dec.newDoc()
	*d = *sd
	d.tape = tape[:n:n]
	if sd.redirect != nil {
		d.redirect = make(map[uint32]uint32, len(sd.redirect))
		for k, x := range sd.redirect {
			d.redirect[k] = x
		}
	}
	return Value{d: d, i: v.i}
}

// Plain reports whether v is a whole document that JSON.stringify prints
// token for token as it is written: no escapes in any string or key, no
// repeated keys, no array-index keys, and every number in its shortest
// JavaScript form. Only whitespace and indentation can then differ.
func (v Value) Plain() bool {
	return v.d != nil && (v.i == 0 || v.d.text) && v.d.plain
}

// Lines holds a text made of lines, for documents kept as text only (see
// Line): they share the one text and cost no storage of their own.
type Lines struct{ d *doc }

// NewLines returns the text-only store over text (at most 4 GiB).
func NewLines(text string) Lines { return Lines{d: &doc{src: text, plain: true, text: true}} }

// Line returns a document that holds only its text: v must be a plain
// document (see Plain) parsed from the line of the store's text starting at
// off, ending at a '\n' or the end of the text. It prints straight from the
// text and is parsed again whenever it is read otherwise. It returns v
// unchanged when these do not hold.
func (l Lines) Line(v Value, off int) Value {
	if !v.Plain() || v.d.text || l.d == nil || off < 0 || off > maxDocBytes {
		return v
	}
	src, n := l.d.src, len(v.d.src)
	if off+n > len(src) || (off+n < len(src) && src[off+n] != '\n') || src[off:off+n] != v.d.src || v.d.newline {
		return v
	}
	return Value{d: l.d, i: uint32(off)}
}

type parser struct {
	src      string
	pos      int
	tape     []entry
	side     []byte
	redirect map[uint32]uint32
	grown    bool // the tape outgrew the block it started in
	// newline is set when a '\n' was skipped as whitespace: the only place
	// a parsed document can hold one, since a string may not.
	newline bool
	// notPlain is set by anything JSON.stringify would not print back as
	// written: a duplicate key, an array-index key or a number whose
	// literal is not its shortest JavaScript form (escapes show in side).
	notPlain bool
}

func (p *parser) errf(format string, args ...any) error {
	return &SyntaxError{Offset: p.pos, Msg: fmt.Sprintf(format, args...)}
}

// describe names the byte at the current position for an error message.
func (p *parser) describe() string {
	if p.pos >= len(p.src) {
		return "end of input"
	}
	c := p.src[p.pos]
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// skipWS skips whitespace; most tokens of a recorder's compact line have
// none before them, which the first test answers.
func (p *parser) skipWS() {
	if p.pos < len(p.src) && p.src[p.pos] > ' ' {
		return
	}
	p.skipSpace()
}

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case '\n':
			p.newline = true
			p.pos++
		case ' ', '\t', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) push(kind uint8, key span, keySide bool, a, b uint32) uint32 {
	if keySide {
		kind |= flagSideKey
	}
	if len(p.tape) == cap(p.tape) {
		p.grown = true
	}
	p.tape = append(p.tape, entry{kind: kind, key: key, a: a, b: b})
	return uint32(len(p.tape) - 1)
}

func (p *parser) value(key span, keySide bool, depth int) error {
	if p.pos >= len(p.src) {
		return p.errf("unexpected end of input, expected a value")
	}
	switch c := p.src[p.pos]; {
	case c == '{':
		return p.object(key, keySide, depth+1)
	case c == '[':
		return p.array(key, keySide, depth+1)
	case c == '"':
		sp, side, err := p.str()
		if err != nil {
			return err
		}
		k := uint8(String)
		if side {
			k |= flagSideStr
		}
		p.push(k, key, keySide, sp.off, sp.n)
		return nil
	case c == '-' || (c >= '0' && c <= '9'):
		f, err := p.number()
		if err != nil {
			return err
		}
		bits := math.Float64bits(f)
		p.push(uint8(Number), key, keySide, uint32(bits), uint32(bits>>32))
		return nil
	case c == 't':
		return p.literal("true", uint8(Bool), 1, key, keySide)
	case c == 'f':
		return p.literal("false", uint8(Bool), 0, key, keySide)
	case c == 'n':
		return p.literal("null", uint8(Null), 0, key, keySide)
	default:
		return p.errf("unexpected %s, expected a value", p.describe())
	}
}

func (p *parser) literal(word string, kind uint8, a uint32, key span, keySide bool) error {
	if len(p.src)-p.pos < len(word) || p.src[p.pos:p.pos+len(word)] != word {
		return p.errf("invalid literal, expected %q", word)
	}
	p.pos += len(word)
	p.push(kind, key, keySide, a, 0)
	return nil
}

func (p *parser) array(key span, keySide bool, depth int) error {
	if depth > MaxDepth {
		return p.errf("nesting deeper than %d levels", MaxDepth)
	}
	self := p.push(uint8(Array), key, keySide, 0, 0)
	p.pos++ // '['
	p.skipWS()
	var n uint32
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
	} else {
		for {
			p.skipWS()
			if err := p.value(span{}, false, depth); err != nil {
				return err
			}
			n++
			p.skipWS()
			if p.pos >= len(p.src) {
				return p.errf("unexpected end of input in an array")
			}
			c := p.src[p.pos]
			p.pos++
			if c == ']' {
				break
			}
			if c != ',' {
				p.pos--
				return p.errf("unexpected %s in an array, expected ',' or ']'", p.describe())
			}
		}
	}
	p.tape[self].a = uint32(len(p.tape))
	p.tape[self].b = n
	return nil
}

// smallObject is how many members are compared pairwise for duplicates
// before a map takes over, so huge objects stay linear.
const smallObject = 16

func (p *parser) object(key span, keySide bool, depth int) error {
	if depth > MaxDepth {
		return p.errf("nesting deeper than %d levels", MaxDepth)
	}
	self := p.push(uint8(Object), key, keySide, 0, 0)
	p.pos++ // '{'
	p.skipWS()
	var (
		n       uint32
		members []uint32          // raw member indices while the object is small
		index   map[string]uint32 // key -> first member index, once it is large
		seen    uint64            // keyBit of every key in members
		flags   uint8
	)
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
	} else {
		for {
			p.skipWS()
			if p.pos >= len(p.src) || p.src[p.pos] != '"' {
				return p.errf("unexpected %s in an object, expected a string key", p.describe())
			}
			ksp, kside, err := p.str()
			if err != nil {
				return err
			}
			p.skipWS()
			if p.pos >= len(p.src) || p.src[p.pos] != ':' {
				return p.errf("unexpected %s after an object key, expected ':'", p.describe())
			}
			p.pos++
			p.skipWS()
			at := uint32(len(p.tape))
			if err := p.value(ksp, kside, depth); err != nil {
				return err
			}
			n++
			k := p.keyBytes(ksp, kside)
			if _, ok := arrayIndex(k); ok {
				flags |= flagIndexKey
				p.notPlain = true
			}
			first, dup := uint32(0), false
			bit := keyBit(k)
			if index != nil {
				first, dup = index[k]
			} else if seen&bit != 0 {
				// A key with the same bit came before: compare (keys of
				// other lengths differ at once).
				for _, m := range members {
					if mk := p.tape[m].key; mk.n == ksp.n && p.keyBytes(mk, p.tape[m].kind&flagSideKey != 0) == k {
						first, dup = m, true
						break
					}
				}
			}
			if dup {
				p.notPlain = true
				p.tape[at].kind |= flagSkip
				p.tape[first].kind |= flagRedirect
				if p.redirect == nil {
					p.redirect = make(map[uint32]uint32)
				}
				p.redirect[first] = at
			} else if index != nil {
				index[k] = at
			} else {
				members = append(members, at)
				seen |= bit
				if len(members) > smallObject {
					index = make(map[string]uint32, 2*len(members))
					for _, m := range members {
						index[p.keyBytes(p.tape[m].key, p.tape[m].kind&flagSideKey != 0)] = m
					}
					members = nil
				}
			}
			p.skipWS()
			if p.pos >= len(p.src) {
				return p.errf("unexpected end of input in an object")
			}
			c := p.src[p.pos]
			p.pos++
			if c == '}' {
				break
			}
			if c != ',' {
				p.pos--
				return p.errf("unexpected %s in an object, expected ',' or '}'", p.describe())
			}
		}
	}
	p.tape[self].kind |= flags
	p.tape[self].a = uint32(len(p.tape))
	p.tape[self].b = n
	return nil
}

// keyBit is one of 64 bits picked by a key's length and its first and last
// bytes: a small object's keys are compared with a new one only when one
// of them had its bit, which distinct keys rarely share.
func keyBit(k string) uint64 {
	h := uint(len(k))
	if len(k) > 0 {
		h += uint(k[0])*7 + uint(k[len(k)-1])*31
	}
	return 1 << (h & 63)
}

// keyBytes returns a key as a string. Side keys are copied because p.side may
// still grow; source keys are substrings and cost nothing.
func (p *parser) keyBytes(sp span, side bool) string {
	if side {
		return string(p.side[sp.off : sp.off+sp.n])
	}
	return p.src[sp.off : sp.off+sp.n]
}

func (p *parser) number() (float64, error) {
	start := p.pos
	s := p.src
	i := p.pos
	if s[i] == '-' {
		i++
	}
	digits := func() int {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i - j
	}
	if i >= len(s) || s[i] < '0' || s[i] > '9' {
		p.pos = i
		return 0, p.errf("invalid number: expected a digit")
	}
	if s[i] == '0' {
		i++
		if i < len(s) && s[i] >= '0' && s[i] <= '9' {
			p.pos = i
			return 0, p.errf("invalid number: leading zero")
		}
	} else {
		digits()
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			p.pos = i
			return 0, p.errf("invalid number: expected a digit after '.'")
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			p.pos = i
			return 0, p.errf("invalid number: expected a digit in the exponent")
		}
	}
	p.pos = i
	lit := s[start:i]
	if f, ok := smallInteger(lit); ok {
		return f, nil // exact, and printed as written (see shortestForm)
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		// The grammar was checked above, so only a range error is possible:
		// ParseFloat then returns ±Inf or ±0, which is what JavaScript holds.
		if ne, ok := err.(*strconv.NumError); !ok || ne.Err != strconv.ErrRange {
			return 0, &SyntaxError{start, "invalid number"}
		}
	}
	if !p.notPlain && !shortestForm(lit, f) {
		p.notPlain = true
	}
	return f, nil
}

// smallInteger reads a literal of the grammar's that is an integer of 1 to
// 15 digits without a leading zero (seq, versions, amounts): its value is
// exact in a double, so no general conversion is needed.
func smallInteger(lit string) (float64, bool) {
	digits, neg := lit, false
	if len(digits) > 0 && digits[0] == '-' {
		digits, neg = digits[1:], true
	}
	if len(digits) == 0 || len(digits) > 15 || digits[0] == '0' {
		return 0, false
	}
	var n int64
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return float64(n), true
}

// shortestForm reports whether lit is exactly how JavaScript prints f.
func shortestForm(lit string, f float64) bool {
	digits := lit
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) > 0 && len(digits) <= 15 && digits[0] != '0' {
		whole := true
		for i := 0; i < len(digits); i++ {
			if digits[i] < '0' || digits[i] > '9' {
				whole = false
				break
			}
		}
		if whole {
			return true // a small integer prints as written
		}
	}
	var buf [32]byte
	return string(AppendNumber(buf[:0], f)) == lit
}

// str parses a string literal at p.pos ('"'). Strings without escapes are
// spans of the source; others are decoded into p.side.
func (p *parser) str() (span, bool, error) {
	p.pos++ // opening quote
	start := p.pos
	s := p.src
	i := p.pos
	for i < len(s) {
		if i+8 <= len(s) {
			// A word at a time; the lowest byte marked is the first one
			// that is not plain (see plainMask).
			if m := plainMask(load8(s, i)); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
			} else {
				i += 8
				continue
			}
		} else if plainByte(s[i]) {
			i++
			continue
		}
		c := s[i]
		switch {
		case c == '"':
			p.pos = i + 1
			return span{uint32(start), uint32(i - start)}, false, nil
		case c == '\\':
			p.pos = i
			return p.strSlow(start)
		case c < 0x20:
			p.pos = i
			return span{}, false, p.errf("control character 0x%02x in a string must be escaped", c)
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				p.pos = i
				return span{}, false, p.errf("invalid UTF-8 byte 0x%02x in a string", c)
			}
			i += size
		}
	}
	p.pos = i
	return span{}, false, p.errf("unterminated string")
}

func (p *parser) strSlow(start int) (span, bool, error) {
	off := len(p.side)
	p.side = append(p.side, p.src[start:p.pos]...)
	s := p.src
	i := p.pos
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"':
			p.pos = i + 1
			return span{uint32(off), uint32(len(p.side) - off)}, true, nil
		case c == '\\':
			if i+1 >= len(s) {
				p.pos = i
				return span{}, false, p.errf("unterminated escape sequence")
			}
			e := s[i+1]
			i += 2
			switch e {
			case '"', '\\', '/':
				p.side = append(p.side, e)
			case 'b':
				p.side = append(p.side, '\b')
			case 'f':
				p.side = append(p.side, '\f')
			case 'n':
				p.side = append(p.side, '\n')
			case 'r':
				p.side = append(p.side, '\r')
			case 't':
				p.side = append(p.side, '\t')
			case 'u':
				u, ok := hex4(s, i)
				if !ok {
					p.pos = i
					return span{}, false, p.errf("invalid \\u escape, expected four hex digits")
				}
				i += 4
				r := rune(u)
				if u >= 0xD800 && u <= 0xDBFF && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					// A high surrogate followed by an escaped low surrogate is one
					// astral character, as it is in a JavaScript string.
					if lo, ok := hex4(s, i+2); ok && lo >= 0xDC00 && lo <= 0xDFFF {
						r = 0x10000 + (rune(u)-0xD800)<<10 + (rune(lo) - 0xDC00)
						i += 6
					}
				}
				p.side = appendWTF8(p.side, r)
			default:
				p.pos = i - 1
				return span{}, false, p.errf("invalid escape %s", strconv.QuoteRune(rune(e)))
			}
		case c < 0x20:
			p.pos = i
			return span{}, false, p.errf("control character 0x%02x in a string must be escaped", c)
		case c < utf8.RuneSelf:
			p.side = append(p.side, c)
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				p.pos = i
				return span{}, false, p.errf("invalid UTF-8 byte 0x%02x in a string", c)
			}
			p.side = append(p.side, s[i:i+size]...)
			i += size
		}
	}
	p.pos = i
	return span{}, false, p.errf("unterminated string")
}

// plain8 reports whether the eight bytes of s at i are all plainByte.
func plain8(s string, i int) bool { return plainWord(load8(s, i)) }

// load8 reads the eight bytes of s at i as a little-endian word.
func load8(s string, i int) uint64 {
	_ = s[i+7]
	return uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
		uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
}

// plainWord reports whether the eight bytes of x are all plainByte, with
// word arithmetic: a byte below 0x20 borrows into its high bit when 0x20 is
// taken from it, '"' and '\\' become zero (and then borrow) when xored with
// themselves, and non-ASCII bytes have the high bit already. A borrow can
// only mark bytes above a byte that was marked itself, so the answer is exact.
// load8 and plainWord are small enough to be inlined into the loops that
// use them, where a call per word cost more than its test.
func plainWord(x uint64) bool { return plainMask(x) == 0 }

// plainMask has the high bit of every byte of x that is not plainByte set,
// and maybe of bytes above such a byte (a borrow): its lowest set bit
// marks the first byte that is not plain, exactly.
func plainMask(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, b := x^(ones*'"'), x^(ones*'\\')
	return (x | (x - ones*0x20) | (q - ones) | (b - ones)) & highs
}

// plainByte reports whether a string literal may hold c as it is:
// printable ASCII other than '"' and '\\'.
func plainByte(c byte) bool { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\' }

func hex4(s string, i int) (uint16, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var u uint16
	for j := i; j < i+4; j++ {
		c := s[j]
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		u = u<<4 | uint16(d)
	}
	return u, true
}

// appendWTF8 appends r as UTF-8, encoding a surrogate code point with the
// same three-byte pattern (WTF-8) that AppendString recognises.
func appendWTF8(dst []byte, r rune) []byte {
	if r >= 0xD800 && r <= 0xDFFF {
		return append(dst, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	}
	return utf8.AppendRune(dst, r)
}
