package jsjson

import (
	"math"
	"strconv"
	"strings"
)

// Kind is the type of a JSON value.
type Kind uint8

// The JSON kinds. Null is the zero Kind, so a zero Value is null.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

func (k Kind) String() string {
	switch k {
	case Null:
		return "null"
	case Bool:
		return "boolean"
	case Number:
		return "number"
	case String:
		return "string"
	case Array:
		return "array"
	case Object:
		return "object"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is an ordered JSON value as JavaScript's JSON.parse holds it. It is a
// small handle into a parsed document: copying it is cheap and it is
// immutable, so it may be shared between goroutines. The zero Value is null.
//
// A document is stored as a flat "tape" of entries rather than a tree of
// heap objects because run files hold millions of values and the receipt
// builder must stay within a small multiple of the file's size.
type Value struct {
	d *doc
	i uint32
}

// Member is one member of an object, in JavaScript's enumeration order.
type Member struct {
	Key   string
	Value Value
}

// entry flags, stored above the Kind bits.
const (
	kindMask     = 0x07
	flagSkip     = 0x08 // a later duplicate key: its value is shown at the first key's position
	flagRedirect = 0x10 // the first of duplicate keys: its value lives at doc.redirect[i]
	flagIndexKey = 0x20 // object has at least one array-index key (JS enumerates those first)
	flagSideStr  = 0x40 // string value lives in doc.side, not doc.src
	flagSideKey  = 0x80 // member key lives in doc.side
)

// span locates a string in doc.src or doc.side.
type span struct{ off, n uint32 }

// entry is one value on the tape. Containers are followed by their children;
// a holds the index just past the container's last descendant and b the
// number of raw children (duplicates included).
type entry struct {
	kind uint8
	key  span   // member key, for values inside objects
	a, b uint32 // string: span; number: float64 bits; bool: a; container: end, count
}

type doc struct {
	src      string
	side     string
	tape     []entry
	redirect map[uint32]uint32 // first duplicate key's index -> latest value's index
	plain    bool              // see Value.Plain
	text     bool              // a Lines store: tape is nil, Value.i is a line's offset in src
	newline  bool              // src holds a '\n' (as whitespace)
}

// textSrc returns a text-only document's text: its line.
func (v Value) textSrc() string {
	s := v.d.src[v.i:]
	if nl := strings.IndexByte(s, '\n'); nl >= 0 {
		s = s[:nl]
	}
	return s
}

// Source returns the text a whole document was parsed from (for a document
// of Lines, its line up to the next '\n'), and "" for a value inside one.
func (v Value) Source() string {
	switch {
	case v.d == nil:
		return ""
	case v.d.text:
		return v.textSrc()
	case v.i == 0:
		return v.d.src
	}
	return ""
}

// full returns v with a tape: a text-only document is parsed again (it was
// valid when it was made, so this cannot fail).
func (v Value) full() Value {
	if v.d == nil || !v.d.text {
		return v
	}
	w, err := ParseString(v.textSrc())
	if err != nil {
		return Value{}
	}
	return w
}

func (d *doc) str(sp span, side bool) string {
	if side {
		return d.side[sp.off : sp.off+sp.n]
	}
	return d.src[sp.off : sp.off+sp.n]
}

func (v Value) e() *entry { return &v.d.tape[v.i] }

// Kind reports the value's kind.
func (v Value) Kind() Kind {
	if v.d == nil {
		return Null
	}
	if v.d.text {
		return textKind(v.textSrc())
	}
	return Kind(v.e().kind & kindMask)
}

// textKind reads a valid document's kind from its first byte.
func textKind(s string) Kind {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return Object
		case '[':
			return Array
		case '"':
			return String
		case 't', 'f':
			return Bool
		case 'n':
			return Null
		}
		return Number
	}
	return Null
}

// Bool returns the value of a boolean.
func (v Value) Bool() (bool, bool) {
	v = v.full()
	if v.Kind() != Bool {
		return false, false
	}
	return v.e().a != 0, true
}

// Num returns the value of a number (±Inf for a literal too large for a
// double, as JavaScript holds it).
func (v Value) Num() (float64, bool) {
	v = v.full()
	if v.Kind() != Number {
		return 0, false
	}
	e := v.e()
	return math.Float64frombits(uint64(e.a) | uint64(e.b)<<32), true
}

// Str returns the value of a string. Lone surrogates are WTF-8 encoded.
func (v Value) Str() (string, bool) {
	v = v.full()
	if v.Kind() != String {
		return "", false
	}
	e := v.e()
	return v.d.str(span{e.a, e.b}, e.kind&flagSideStr != 0), true
}

// Len returns the number of members of an object (after duplicate keys are
// merged) or items of an array, and 0 for anything else.
func (v Value) Len() int {
	v = v.full()
	switch v.Kind() {
	case Array:
		return int(v.e().b)
	case Object:
		n := 0
		v.eachRaw(func(i uint32) bool {
			if v.d.tape[i].kind&flagSkip == 0 {
				n++
			}
			return true
		})
		return n
	}
	return 0
}

// eachRaw calls fn with the tape index of every raw child of a container.
func (v Value) eachRaw(fn func(i uint32) bool) {
	e := v.e()
	end := e.a
	for i := v.i + 1; i < end; {
		if !fn(i) {
			return
		}
		c := &v.d.tape[i]
		if k := Kind(c.kind & kindMask); k == Array || k == Object {
			i = c.a
		} else {
			i++
		}
	}
}

// key returns the key of the member at tape index i.
func (d *doc) keyAt(i uint32) string {
	e := &d.tape[i]
	return d.str(e.key, e.kind&flagSideKey != 0)
}

// valueAt resolves duplicate keys: the member at i shows the last value given
// for its key.
func (d *doc) valueAt(i uint32) Value {
	if d.tape[i].kind&flagRedirect != 0 {
		return Value{d, d.redirect[i]}
	}
	return Value{d, i}
}

// Get returns the member of an object with the given key.
func (v Value) Get(key string) (Value, bool) {
	v = v.full()
	if v.Kind() != Object {
		return Value{}, false
	}
	var out Value
	found := false
	v.eachRaw(func(i uint32) bool {
		e := &v.d.tape[i]
		if e.kind&flagSkip != 0 || v.d.keyAt(i) != key {
			return true
		}
		out, found = v.d.valueAt(i), true
		return false
	})
	return out, found
}

// Range calls fn with each member of an object, a repeated key once with
// its last value, in the order the keys first appear (not JavaScript's
// enumeration order: use Members for that), until fn returns false. It is
// the cheap way to read several members: one pass instead of a Get each.
func (v Value) Range(fn func(key string, val Value) bool) {
	v = v.full()
	if v.Kind() != Object {
		return
	}
	v.eachRaw(func(i uint32) bool {
		if v.d.tape[i].kind&flagSkip != 0 {
			return true
		}
		return fn(v.d.keyAt(i), v.d.valueAt(i))
	})
}

// Members returns an object's members in the order JavaScript enumerates
// them: array-index keys ("0", "17") first in ascending numeric order, then
// the other keys in the order they first appeared. A repeated key keeps its
// first position and its last value. It returns nil for a non-object.
func (v Value) Members() []Member {
	v = v.full()
	if v.Kind() != Object {
		return nil
	}
	out := make([]Member, 0, v.Len())
	v.eachMember(func(k string, val Value) { out = append(out, Member{k, val}) })
	return out
}

func (v Value) eachMember(fn func(key string, val Value)) {
	e := v.e()
	if e.kind&flagIndexKey == 0 {
		v.eachRaw(func(i uint32) bool {
			if v.d.tape[i].kind&flagSkip == 0 {
				fn(v.d.keyAt(i), v.d.valueAt(i))
			}
			return true
		})
		return
	}
	// Rare path: collect the index keys, sort them, then the rest.
	type idx struct {
		n uint32
		i uint32
	}
	var ints []idx
	v.eachRaw(func(i uint32) bool {
		if v.d.tape[i].kind&flagSkip == 0 {
			if n, ok := arrayIndex(v.d.keyAt(i)); ok {
				ints = append(ints, idx{n, i})
			}
		}
		return true
	})
	// Insertion sort keeps this dependency-free; index keys are few.
	for a := 1; a < len(ints); a++ {
		for b := a; b > 0 && ints[b].n < ints[b-1].n; b-- {
			ints[b], ints[b-1] = ints[b-1], ints[b]
		}
	}
	for _, x := range ints {
		fn(v.d.keyAt(x.i), v.d.valueAt(x.i))
	}
	v.eachRaw(func(i uint32) bool {
		if v.d.tape[i].kind&flagSkip == 0 {
			if _, ok := arrayIndex(v.d.keyAt(i)); !ok {
				fn(v.d.keyAt(i), v.d.valueAt(i))
			}
		}
		return true
	})
}

// Items returns an array's items, or nil for a non-array.
func (v Value) Items() []Value {
	v = v.full()
	if v.Kind() != Array {
		return nil
	}
	out := make([]Value, 0, v.e().b)
	v.eachRaw(func(i uint32) bool {
		out = append(out, Value{v.d, i})
		return true
	})
	return out
}

// arrayIndex reports whether key is an ECMAScript array index: the
// canonical decimal form of an integer in [0, 2^32-2]. Ordinary objects
// enumerate such keys before all others.
func arrayIndex(key string) (uint32, bool) {
	if len(key) == 0 || len(key) > 10 || (key[0] == '0' && len(key) > 1) {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if n > math.MaxUint32-1 {
		return 0, false
	}
	return uint32(n), true
}

// Equal reports whether two values are the same JSON value as JavaScript
// would see it (member order included; numbers compared as doubles, so NaN
// never occurs and +0 equals -0).
func Equal(a, b Value) bool {
	if a.Kind() != b.Kind() {
		return false
	}
	switch a.Kind() {
	case Null:
		return true
	case Bool:
		x, _ := a.Bool()
		y, _ := b.Bool()
		return x == y
	case Number:
		x, _ := a.Num()
		y, _ := b.Num()
		return x == y
	case String:
		x, _ := a.Str()
		y, _ := b.Str()
		return x == y
	case Array:
		x, y := a.Items(), b.Items()
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !Equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case Object:
		x, y := a.Members(), b.Members()
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i].Key != y[i].Key || !Equal(x[i].Value, y[i].Value) {
				return false
			}
		}
		return true
	}
	return false
}
