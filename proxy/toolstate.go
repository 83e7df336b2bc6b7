package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/strictjson"
)

// ToolsStateFile is where, under the Trace root's guard/ directory, the
// proxy writes what it does with each upstream tool, for `status`.
const ToolsStateFile = "proxy-tools.json"

// MaxToolsStateBytes bounds the file ReadToolsState reads.
const MaxToolsStateBytes = 4 << 20

// What the proxy does with an upstream tool (ToolState.Status).
const (
	// ToolPaying: named by the guard map; every call is a question to
	// the engine.
	ToolPaying = "paying"
	// ToolForwarded: not named by the map, listed when the map was read,
	// forwarded unchecked ("unmapped": "forward").
	ToolForwarded = "forwarded"
	// ToolRefusedUnmapped: not named by the map, refused ("unmapped":
	// "refuse").
	ToolRefusedUnmapped = "refused_unmapped"
	// ToolRefusedNew: not named by the map, listed (or its input schema
	// changed) after the map was read; refused until the map names it or
	// is re-read ("newTools": "refuse").
	ToolRefusedNew = "refused_new"
	// ToolForwardedNew: the same, forwarded ("newTools": "forward").
	ToolForwardedNew = "forwarded_new"
)

// ToolsState is what the proxy wrote of its upstream's tools: the file
// `status` reads.
type ToolsState struct {
	WrittenAt string `json:"written_at"`
	PID       int    `json:"pid"`
	Upstream  string `json:"upstream"`
	MapFile   string `json:"map_file"`
	// MapReadAt is when the guard map in force was read (start or SIGHUP).
	MapReadAt string `json:"map_read_at"`
	Unmapped  string `json:"unmapped"`
	NewTools  string `json:"new_tools"`
	// Broken, when set, is why every upstream call is refused.
	Broken string      `json:"broken,omitempty"`
	Tools  []ToolState `json:"tools"`
}

// ToolState is one upstream tool.
type ToolState struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	// PaymentLike, for a tool the map does not name, says why its name or
	// input schema looks like a payment ("" when it does not).
	PaymentLike string `json:"payment_like,omitempty"`
	// NewSince is when the proxy first saw a new tool (or its changed
	// schema).
	NewSince string `json:"new_since,omitempty"`
}

// UnmappedTools lists the tools the map does not name.
func (s *ToolsState) UnmappedTools() []ToolState {
	var out []ToolState
	for _, t := range s.Tools {
		if t.Status != ToolPaying {
			out = append(out, t)
		}
	}
	return out
}

// ReadToolsState reads the file the proxy wrote. It is read exactly: a
// member named twice, or in another case than the one defined, an unknown
// member, a status that is not one of the proxy's, or a time that is not
// RFC 3339 is refused, with where.
func ReadToolsState(data []byte) (*ToolsState, error) {
	if len(data) > MaxToolsStateBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxToolsStateBytes)
	}
	var s ToolsState
	if err := strictjson.Check(data, &s); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, err
	}
	for _, at := range []struct{ name, v string }{{"written_at", s.WrittenAt}, {"map_read_at", s.MapReadAt}} {
		if _, err := time.Parse(time.RFC3339Nano, at.v); err != nil {
			return nil, fmt.Errorf("%s: %q is not an RFC 3339 time", at.name, at.v)
		}
	}
	for i, t := range s.Tools {
		if t.Name == "" {
			return nil, fmt.Errorf("tools[%d]: a tool without a name", i)
		}
		switch t.Status {
		case ToolPaying, ToolForwarded, ToolRefusedUnmapped, ToolRefusedNew, ToolForwardedNew:
		default:
			return nil, fmt.Errorf("tools[%d] (%s): status %q is not one the proxy writes", i, t.Name, t.Status)
		}
		if t.NewSince != "" {
			if _, err := time.Parse(time.RFC3339Nano, t.NewSince); err != nil {
				return nil, fmt.Errorf("tools[%d] (%s): new_since %q is not an RFC 3339 time", i, t.Name, t.NewSince)
			}
		}
	}
	return &s, nil
}

// writeState writes the state for `status`; a failure is logged, never
// fatal (the state file is a report, not a control).
func (p *Proxy) writeState(s ToolsState) {
	if p.cfg.StateDir == nil {
		return
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err == nil {
		var guardDir *confined.Dir
		if guardDir, err = p.cfg.StateDir.MkdirAll("guard", 0o700); err == nil {
			err = guardDir.WriteFileAtomic(ToolsStateFile, append(data, '\n'), 0o600)
			guardDir.Close()
		}
	}
	if err != nil {
		p.cfg.Logger.Warn("the proxy's tool state could not be written for `status`", "file", "guard/"+ToolsStateFile, "err", err)
	}
}

// schemaPrint identifies an input schema: its JCS form's SHA-256 (the raw
// bytes' when it is not strict JSON), so that a tool whose input schema
// changes is told from the one the map was read against.
func schemaPrint(in json.RawMessage) string {
	b := []byte(in)
	if v, err := jcs.Parse(in); err == nil {
		if c, err := jcs.Marshal(v); err == nil {
			b = c
		}
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Words that make a tool look like a payment. A name needs one of
// paymentNameWords; an input schema, a property with an amount word and
// one with an address word (at any depth).
var (
	paymentNameWords = []string{"pay", "payment", "payout", "transfer", "withdraw", "purchase", "buy", "checkout", "charge", "tip", "donate", "remit", "invoice", "usdc", "usdt", "x402"}
	amountWords      = []string{"amount", "value", "price", "total", "sum", "cost", "fee", "wei", "lamports", "sats", "satoshis"}
	addressWords     = []string{"to", "address", "recipient", "payee", "destination", "dest", "receiver", "beneficiary", "wallet", "account", "iban", "counterparty", "merchant", "seller", "vendor"}
)

// maxSchemaDepth bounds how deeply paymentLike follows nested properties.
const maxSchemaDepth = 8

// paymentLike says why a tool's name or input schema looks like a payment
// ("" when it does not): a name with a payment word, or a schema with an
// amount-like and an address-like property.
func paymentLike(name string, in json.RawMessage) string {
	var why []string
	for _, w := range words(name) {
		if slices.Contains(paymentNameWords, w) {
			why = append(why, fmt.Sprintf("its name %q reads like a payment", name))
			break
		}
	}
	var schema any
	if json.Unmarshal(in, &schema) == nil {
		var amount, address string
		walkProperties(schema, "", 0, func(path, prop string) {
			for _, w := range words(prop) {
				if amount == "" && slices.Contains(amountWords, w) {
					amount = path
				}
				if address == "" && slices.Contains(addressWords, w) {
					address = path
				}
			}
		})
		if amount != "" && address != "" {
			why = append(why, fmt.Sprintf("its input has an amount-like property %q and an address-like property %q", amount, address))
		}
	}
	return strings.Join(why, "; ")
}

// walkProperties calls f with the dotted path and name of every property a
// JSON Schema declares, in objects and array items, up to maxSchemaDepth.
func walkProperties(schema any, prefix string, depth int, f func(path, prop string)) {
	obj, ok := schema.(map[string]any)
	if !ok || depth > maxSchemaDepth {
		return
	}
	if props, ok := obj["properties"].(map[string]any); ok {
		for _, k := range slices.Sorted(mapKeysOf(props)) {
			path := k
			if prefix != "" {
				path = prefix + "." + k
			}
			f(path, k)
			walkProperties(props[k], path, depth+1, f)
		}
	}
	if items, ok := obj["items"]; ok {
		walkProperties(items, prefix+"[]", depth+1, f)
	}
}

func mapKeysOf(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// words splits a name into its lower-case words: at every character that
// is not a letter or digit, and where camelCase turns upper.
func words(s string) []string {
	var out []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	rs := []rune(s)
	for i, r := range rs {
		switch {
		case !unicode.IsLetter(r) && !unicode.IsDigit(r):
			flush()
		case unicode.IsUpper(r) && len(cur) > 0 && (unicode.IsLower(cur[len(cur)-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]))):
			flush()
			cur = append(cur, r)
		default:
			cur = append(cur, r)
		}
	}
	flush()
	return out
}
