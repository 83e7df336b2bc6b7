package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
)

// Unmapped says what happens to a tool the guard map does not name.
const (
	UnmappedForward = "forward"
	UnmappedRefuse  = "refuse"
)

// NewTools says what happens to a tool the upstream lists after the guard
// map was read (a notifications/tools/list_changed, a restarted upstream),
// or whose input schema changed since, that the map does not name.
const (
	// NewToolsRefuse: refused until the map names it or is re-read
	// (SIGHUP), whatever Unmapped says (the default).
	NewToolsRefuse = "refuse"
	// NewToolsForward: treated as every unmapped tool (Unmapped).
	NewToolsForward = "forward"
)

// Amount units of a mapped amount.
const (
	UnitDisplay = "display"
	UnitAtomic  = "atomic"
)

// What a paying tool's error answer (isError) says of the payment.
const (
	// ErrorsUnknown: an error answer does not say whether the tool paid
	// before it failed, so the allow's reservation keeps counting until
	// the Trace shows the payment or the reservation lapses (the default).
	ErrorsUnknown = "unknown"
	// ErrorsUnpaid: the operator vouches that the tool's error answers
	// mean "not paid", so an error answer releases the reservation.
	ErrorsUnpaid = "unpaid"
)

// maxMapBytes bounds the guard map file.
const maxMapBytes = 1 << 20

// Map is the guard map: which upstream tools pay, and where in their
// arguments the payment's counterparty, amount and asset are.
type Map struct {
	Tools    map[string]ToolMap
	Unmapped string
	// NewTools: NewToolsRefuse (the default) or NewToolsForward.
	NewTools string
}

// ToolMap is one paying tool's mapping.
type ToolMap struct {
	Counterparty Field
	Amount       Field
	AmountUnit   string
	// Asset is absent (IsZero) when the policy's default asset is meant.
	Asset Field
	// PayTo (optional) is the payee address beside a host or URL
	// counterparty; Resource (optional) the URL paid for. With a resource
	// beside an address counterparty, the question is the resource's host
	// with the address as its pay_to: both are judged together.
	PayTo    Field
	Resource Field
	// Errors says what the tool's error answer (isError) means of the
	// payment: ErrorsUnknown (the default) or ErrorsUnpaid.
	Errors string
	// PaymentRequired (optional) is the path of the argument that carries
	// the seller's 402 (the PaymentRequired object, or the base64
	// PAYMENT-REQUIRED header value). When set, the payment is read from
	// the 402 as authorize_payment reads it, its signed offer checked, and
	// Counterparty, Amount, AmountUnit, Asset and PayTo are unset.
	PaymentRequired Field
}

// Field is a dotted path into the arguments, or a fixed value. A plain
// string is a path for counterparty and amount; for asset it is a fixed
// asset when the policy knows an asset by that name and a path otherwise
// (resolve decides, against the tool's input schema).
type Field struct {
	Path     []string
	Value    string
	HasValue bool
	// Plain is the plain string the map gave, before resolve decided.
	Plain string
}

// IsZero reports an absent field.
func (f Field) IsZero() bool { return f.Path == nil && !f.HasValue && f.Plain == "" }

func (f Field) String() string {
	switch {
	case f.HasValue:
		return fmt.Sprintf("the fixed value %q", f.Value)
	case f.Path != nil:
		return fmt.Sprintf("the path %q", strings.Join(f.Path, "."))
	}
	return fmt.Sprintf("%q", f.Plain)
}

// LoadMap reads and parses a guard map file.
func LoadMap(path string) (*Map, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("guard map: %w", err)
	}
	defer f.Close()
	buf, err := io.ReadAll(io.LimitReader(f, maxMapBytes+1))
	if err != nil {
		return nil, fmt.Errorf("guard map %s: %w", path, err)
	}
	if len(buf) > maxMapBytes {
		return nil, fmt.Errorf("guard map %s is larger than %d bytes", path, maxMapBytes)
	}
	m, err := ParseMap(buf)
	if err != nil {
		return nil, fmt.Errorf("guard map %s: %w", path, err)
	}
	return m, nil
}

// ParseMap reads a guard map document. Unknown keys, duplicate keys and
// values of the wrong kind are refused, each named with where it is.
func ParseMap(data []byte) (*Map, error) {
	v, err := jcs.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("not a strict JSON document: %w", err)
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("the guard map must be a JSON object with \"tools\" and optionally \"unmapped\" and \"newTools\"")
	}
	if err := onlyKeys(top, "the guard map", "tools", "unmapped", "newTools"); err != nil {
		return nil, err
	}
	m := &Map{Tools: map[string]ToolMap{}, Unmapped: UnmappedForward, NewTools: NewToolsRefuse}
	if u, ok := top["unmapped"]; ok {
		s, _ := u.(string)
		if s != UnmappedForward && s != UnmappedRefuse {
			return nil, fmt.Errorf("unmapped must be %q or %q", UnmappedForward, UnmappedRefuse)
		}
		m.Unmapped = s
	}
	if u, ok := top["newTools"]; ok {
		s, _ := u.(string)
		if s != NewToolsForward && s != NewToolsRefuse {
			return nil, fmt.Errorf("newTools must be %q or %q", NewToolsRefuse, NewToolsForward)
		}
		if s == NewToolsForward && m.Unmapped == UnmappedRefuse {
			return nil, errors.New(`newTools "forward" forwards new tools as unmapped ones, and "unmapped": "refuse" refuses those: say one`)
		}
		m.NewTools = s
	}
	tools, ok := top["tools"].(map[string]any)
	if !ok {
		return nil, errors.New("tools must be an object naming each paying tool")
	}
	for name, raw := range tools {
		where := fmt.Sprintf("tools.%s", name)
		if name == "" {
			return nil, errors.New("tools: a tool name is empty")
		}
		obj, ok := raw.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s must be an object with counterparty, amount, amountUnit and optionally asset and errors", where)
		}
		if err := onlyKeys(obj, where, "counterparty", "amount", "amountUnit", "asset", "errors", "payTo", "resource", "paymentRequired"); err != nil {
			return nil, err
		}
		var tm ToolMap
		if _, ok := obj["paymentRequired"]; ok {
			// A tool that passes the seller's 402 is judged on the 402, as
			// authorize_payment judges it: the payment's terms are read
			// from it, never from a second copy in the arguments.
			for _, k := range []string{"counterparty", "amount", "amountUnit", "asset", "payTo"} {
				if _, dup := obj[k]; dup {
					return nil, fmt.Errorf("%s: %s cannot stand beside paymentRequired: a tool that passes the seller's 402 is judged on the 402's entry (payee, amount, asset, network), so only resource and errors go beside it", where, k)
				}
			}
			if tm.PaymentRequired, err = parseField(obj, "paymentRequired", where, true); err != nil {
				return nil, err
			}
			if tm.PaymentRequired.HasValue {
				return nil, fmt.Errorf("%s.paymentRequired must be a path into the arguments, not a fixed value", where)
			}
			if tm.Resource, err = parseField(obj, "resource", where, false); err != nil {
				return nil, err
			}
			if tm.Errors, err = parseErrors(obj, where); err != nil {
				return nil, err
			}
			for _, f := range []*Field{&tm.PaymentRequired, &tm.Resource} {
				if f.Plain != "" {
					if f.Path, err = parsePath(f.Plain); err != nil {
						return nil, fmt.Errorf("%s: %w", where, err)
					}
				}
			}
			m.Tools[name] = tm
			continue
		}
		if tm.Counterparty, err = parseField(obj, "counterparty", where, true); err != nil {
			return nil, err
		}
		if tm.Amount, err = parseField(obj, "amount", where, true); err != nil {
			return nil, err
		}
		if tm.Asset, err = parseField(obj, "asset", where, false); err != nil {
			return nil, err
		}
		if tm.PayTo, err = parseField(obj, "payTo", where, false); err != nil {
			return nil, err
		}
		if tm.Resource, err = parseField(obj, "resource", where, false); err != nil {
			return nil, err
		}
		unit, _ := obj["amountUnit"].(string)
		if unit != UnitDisplay && unit != UnitAtomic {
			return nil, fmt.Errorf("%s.amountUnit must be %q (a decimal such as \"1.50\") or %q (an integer of the asset's smallest unit)", where, UnitDisplay, UnitAtomic)
		}
		tm.AmountUnit = unit
		if tm.Errors, err = parseErrors(obj, where); err != nil {
			return nil, err
		}
		// A plain string is a path for counterparty, amount, payTo and
		// resource.
		for _, f := range []*Field{&tm.Counterparty, &tm.Amount, &tm.PayTo, &tm.Resource} {
			if f.Plain != "" {
				if f.Path, err = parsePath(f.Plain); err != nil {
					return nil, fmt.Errorf("%s: %w", where, err)
				}
			}
		}
		m.Tools[name] = tm
	}
	return m, nil
}

// parseErrors reads a tool's errors setting (ErrorsUnknown by default).
func parseErrors(obj map[string]any, where string) (string, error) {
	e, ok := obj["errors"]
	if !ok {
		return ErrorsUnknown, nil
	}
	s, _ := e.(string)
	if s != ErrorsUnknown && s != ErrorsUnpaid {
		return "", fmt.Errorf("%s.errors must be %q (an error answer may follow a payment: the reservation keeps counting; the default) or %q (the tool's error answers mean it did not pay: the reservation is released)", where, ErrorsUnknown, ErrorsUnpaid)
	}
	return s, nil
}

func onlyKeys(obj map[string]any, where string, allowed ...string) error {
	var unknown []string
	for k := range obj {
		if !slices.Contains(allowed, k) {
			unknown = append(unknown, fmt.Sprintf("%q", k))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("%s: unknown key %s (accepted: %s)", where, strings.Join(unknown, ", "), strings.Join(allowed, ", "))
	}
	return nil
}

func parseField(obj map[string]any, key, where string, required bool) (Field, error) {
	raw, ok := obj[key]
	if !ok {
		if required {
			return Field{}, fmt.Errorf("%s.%s is required: a dotted path into the arguments, or {\"value\": …}", where, key)
		}
		return Field{}, nil
	}
	switch v := raw.(type) {
	case string:
		if v == "" {
			return Field{}, fmt.Errorf("%s.%s is empty", where, key)
		}
		return Field{Plain: v}, nil
	case map[string]any:
		if err := onlyKeys(v, where+"."+key, "path", "value"); err != nil {
			return Field{}, err
		}
		if len(v) != 1 {
			return Field{}, fmt.Errorf("%s.%s must hold exactly one of \"path\" or \"value\"", where, key)
		}
		if p, ok := v["path"]; ok {
			s, _ := p.(string)
			path, err := parsePath(s)
			if err != nil {
				return Field{}, fmt.Errorf("%s.%s: %w", where, key, err)
			}
			return Field{Path: path}, nil
		}
		s, ok := v["value"].(string)
		if !ok || s == "" {
			return Field{}, fmt.Errorf("%s.%s.value must be a non-empty string", where, key)
		}
		return Field{Value: s, HasValue: true}, nil
	}
	return Field{}, fmt.Errorf("%s.%s must be a string (a dotted path) or an object {\"path\": …} or {\"value\": …}", where, key)
}

// parsePath reads a dotted path of printable ASCII names.
func parsePath(s string) ([]string, error) {
	if s == "" {
		return nil, errors.New("a path is empty")
	}
	parts := strings.Split(s, ".")
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("path %q has an empty segment", s)
		}
		if !asciiKey(p) {
			return nil, fmt.Errorf("path %q: segment %q must be printable ASCII without spaces", s, p)
		}
	}
	return parts, nil
}

// asciiKey reports a printable ASCII name without spaces: a paying tool's
// argument names are read byte for byte, so look-alikes cannot pass.
func asciiKey(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// resolved is a ToolMap checked against the tool's input schema.
type resolved struct {
	tool   string
	m      ToolMap
	schema schemaNode
	// leaves are the last segments of every mapped path, lower-cased: an
	// undeclared key with one of these names is a copy of a mapped value.
	leaves []string
	// paths are the mapped paths themselves: a declared sibling spelled
	// like one of them in another case is a second copy of its value.
	paths [][]string
}

// resolve checks a tool's mapping against its input schema: every path
// must be one the schema holds, with a type that can carry the value.
func (m ToolMap) resolve(tool string, inputSchema json.RawMessage, pol *guard.Config) (*resolved, error) {
	var root any
	if err := json.Unmarshal(inputSchema, &root); err != nil {
		return nil, fmt.Errorf("tool %s: its input schema is not JSON: %w", tool, err)
	}
	schema := schemaNode{v: root}
	r := &resolved{tool: tool, m: m, schema: schema}
	if !m.Asset.IsZero() && !m.Asset.HasValue && m.Asset.Path == nil {
		// A plain string: an asset the policy knows, or a path.
		_, assetErr := pol.Assets.Resolve(m.Asset.Plain, pol.DefaultAsset)
		path, pathErr := parsePath(m.Asset.Plain)
		holds := pathErr == nil && schema.holds(path) == nil
		switch {
		case assetErr == nil && holds:
			return nil, fmt.Errorf("tool %s: asset %q is both an asset the policy knows and a path of the input schema; write {\"value\": %q} or {\"path\": %q}", tool, m.Asset.Plain, m.Asset.Plain, m.Asset.Plain)
		case assetErr == nil:
			r.m.Asset = Field{Value: m.Asset.Plain, HasValue: true}
		case holds:
			r.m.Asset = Field{Path: path}
		default:
			return nil, fmt.Errorf("tool %s: asset %q is neither an asset the policy knows (%v) nor a path its input schema holds", tool, m.Asset.Plain, assetErr)
		}
	}
	if r.m.Asset.HasValue {
		if _, err := pol.Assets.Resolve(r.m.Asset.Value, pol.DefaultAsset); err != nil {
			return nil, fmt.Errorf("tool %s: asset %q: %w", tool, r.m.Asset.Value, err)
		}
	}
	if r.m.Counterparty.HasValue {
		if _, err := guard.ParseCounterparty(r.m.Counterparty.Value); err != nil {
			return nil, fmt.Errorf("tool %s: counterparty %q: %w", tool, r.m.Counterparty.Value, err)
		}
	}
	if r.m.Amount.HasValue {
		return nil, fmt.Errorf("tool %s: amount must be a path into the arguments, not a fixed value", tool)
	}
	if r.m.PayTo.HasValue {
		if _, err := guard.PayToAddress(r.m.PayTo.Value); err != nil {
			return nil, fmt.Errorf("tool %s: payTo %q: %w", tool, r.m.PayTo.Value, err)
		}
	}
	if r.m.Resource.HasValue {
		if _, err := guard.CanonicalResource(r.m.Resource.Value, false); err != nil {
			return nil, fmt.Errorf("tool %s: resource %q: %w", tool, r.m.Resource.Value, err)
		}
	}
	type want struct {
		name  string
		f     Field
		types []string
	}
	amountTypes := []string{"string"}
	if m.AmountUnit == UnitAtomic {
		amountTypes = []string{"string", "integer"}
	}
	for _, w := range []want{
		{"counterparty", r.m.Counterparty, []string{"string"}},
		{"amount", r.m.Amount, amountTypes},
		{"asset", r.m.Asset, []string{"string"}},
		{"payTo", r.m.PayTo, []string{"string"}},
		{"resource", r.m.Resource, []string{"string"}},
		{"paymentRequired", r.m.PaymentRequired, []string{"object", "string"}},
	} {
		if w.f.Path == nil {
			continue
		}
		if err := schema.holds(w.f.Path); err != nil {
			return nil, fmt.Errorf("tool %s: %s path %q: %w", tool, w.name, strings.Join(w.f.Path, "."), err)
		}
		leaf := schema.at(w.f.Path)
		if ts := leaf.types(); ts != nil && !overlaps(ts, w.types) {
			return nil, fmt.Errorf("tool %s: %s path %q: the input schema types it %s, which cannot carry %s exactly (want %s)",
				tool, w.name, strings.Join(w.f.Path, "."), strings.Join(ts, "|"), w.name, strings.Join(w.types, " or "))
		}
		r.leaves = append(r.leaves, strings.ToLower(w.f.Path[len(w.f.Path)-1]))
		r.paths = append(r.paths, w.f.Path)
	}
	return r, nil
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// schemaNode is a JSON Schema node as far as the map follows one: objects
// with "properties", nothing else ($ref, anyOf and friends are not
// followed; a path through them is refused).
type schemaNode struct{ v any }

func (n schemaNode) obj() map[string]any { m, _ := n.v.(map[string]any); return m }

// properties returns the declared properties, or nil when the node
// declares none the map can follow.
func (n schemaNode) properties() map[string]any {
	m := n.obj()
	if m == nil {
		return nil
	}
	p, _ := m["properties"].(map[string]any)
	return p
}

func (n schemaNode) types() []string {
	m := n.obj()
	if m == nil {
		return nil
	}
	switch t := m["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, x := range t {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func (n schemaNode) child(key string) (schemaNode, bool) {
	p := n.properties()
	if p == nil {
		return schemaNode{}, false
	}
	c, ok := p[key]
	return schemaNode{v: c}, ok
}

func (n schemaNode) holds(path []string) error {
	cur := n
	for i, seg := range path {
		if ts := cur.types(); ts != nil && !slices.Contains(ts, "object") {
			return fmt.Errorf("%q is typed %s, not an object", strings.Join(path[:i], "."), strings.Join(ts, "|"))
		}
		next, ok := cur.child(seg)
		if !ok {
			if cur.properties() == nil {
				return fmt.Errorf("the input schema declares no properties at %q that the map could follow (only \"properties\" are followed, not $ref, anyOf, oneOf or allOf)", strings.Join(path[:i], "."))
			}
			return fmt.Errorf("the input schema has no property %q there", seg)
		}
		cur = next
	}
	return nil
}

func (n schemaNode) at(path []string) schemaNode {
	cur := n
	for _, seg := range path {
		cur, _ = cur.child(seg)
	}
	return cur
}
