package guard

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds of the key payees.
const (
	maxPayees        = maxListEntries
	maxPayeeNameRune = 64
)

// addressLike finds what reads as a payee address inside a name: a name
// that shows an address could stand for another payee beside the real one.
var addressLike = regexp.MustCompile(`(?i)0x[0-9a-f]{8,}`)

// readPayees reads payees at at: null, or an object from payee address to
// name. Every key must be a 0x address (any case; two keys may not name
// one address), every name 1 to 64 characters of printable text: no
// control or format characters (a bidirectional override could make an
// address read as another), not blank, no address inside it. names is nil
// for null; ok is false when it has a mistake (reported to ps).
func readPayees(raw json.RawMessage, at Path, ps *problems) (names map[string]string, ok bool) {
	where := at.String()
	if isNull(raw) {
		return nil, true
	}
	entries, err := objectMembers(raw, where)
	if err != nil {
		ps.add(at, fmt.Errorf("%w (payees maps a payee address to its name: {\"0x…\": \"Weather API\"})", err))
		return nil, false
	}
	if len(entries) > maxPayees {
		ps.add(at, fmt.Errorf("%w: %s has %d entries; at most %d are accepted", ErrConfig, where, len(entries), maxPayees))
		return nil, false
	}
	before := ps.count()
	names = make(map[string]string, len(entries))
	first := make(map[string]string, len(entries))
	for _, e := range entries {
		eat := at.with(Name(e.key))
		addr, err := CanonicalAddress(e.key)
		if err != nil || addr == "" || e.key != strings.TrimSpace(e.key) {
			why := "it has surrounding white space"
			if err != nil {
				why = err.Error()
			}
			ps.add(eat, fmt.Errorf("%w: %s: the key %q is not a payee address (%s); payees are named by their 0x address, 40 hex digits", ErrConfig, eat, clip(e.key), why))
			continue
		}
		if k, dup := first[addr]; dup {
			ps.add(eat, fmt.Errorf("%w: %s: the key %q names the address %q names already (keys compare without case)", ErrConfig, eat, clip(e.key), clip(k)))
			continue
		}
		first[addr] = e.key
		name, err := readString(e.value, eat.String())
		if err != nil {
			ps.add(eat, fmt.Errorf("%w (the name of payee %s)", err, addr))
			continue
		}
		if err := checkPayeeName(name); err != nil {
			ps.add(eat, fmt.Errorf("%w: %s: the name of %s %v", ErrConfig, eat, addr, err))
			continue
		}
		names[addr] = name
	}
	if ps.count() > before {
		return nil, false
	}
	return names, true
}

// checkPayeeName says what is wrong with a payee's name, nil when nothing.
func checkPayeeName(name string) error {
	switch {
	case !utf8.ValidString(name):
		return fmt.Errorf("is not valid UTF-8")
	case strings.TrimSpace(name) == "":
		return fmt.Errorf("is empty; give a name or leave the address out")
	case utf8.RuneCountInString(name) > maxPayeeNameRune:
		return fmt.Errorf("has %d characters; at most %d are accepted", utf8.RuneCountInString(name), maxPayeeNameRune)
	case name != strings.TrimSpace(name):
		return fmt.Errorf("%q starts or ends with white space", clip(name))
	}
	for i, r := range name {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError {
			return fmt.Errorf("has the control or format character %U at byte %d; a name is printable text", r, i)
		}
	}
	if addressLike.MatchString(name) {
		return fmt.Errorf("%q shows an address; a name beside an address may not show another", clip(name))
	}
	return nil
}

// PayeeName is the operator's name of a payee ("" when the policy names
// none). value is an address in any case; a host has no name.
func (c *Config) PayeeName(value string) string {
	if c == nil || len(c.Payees) == 0 {
		return ""
	}
	return c.Payees[strings.ToLower(strings.TrimSpace(value))]
}

// Label writes a counterparty for people: the address with its name
// beside it, "0x… (Weather API)", or the value alone when it has none.
func (c *Config) Label(value string) string {
	if n := c.PayeeName(value); n != "" {
		return value + " (" + n + ")"
	}
	return value
}
