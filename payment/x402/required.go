// Package x402 reads a seller's x402 PaymentRequired answer as untrusted
// input, picks the entry of accepts the policy can pay, and signs the
// EIP-3009 TransferWithAuthorization that pays it (EIP-712 typed data,
// secp256k1). It decides nothing: the guard's engine decides, this package
// only reads and signs what it was told to.
package x402

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"
	"unicode/utf8"
)

// Bounds on a PaymentRequired. Real answers are a few hundred bytes with
// one to a handful of entries.
const (
	// MaxPaymentRequiredBytes bounds the decoded JSON.
	MaxPaymentRequiredBytes = 64 << 10
	// MaxAccepts bounds the entries of accepts.
	MaxAccepts = 32
	maxDepth   = 16
	maxField   = 2048
	// maxAmountDigits: a uint256 has at most 78 decimal digits.
	maxAmountDigits = 78
	// MaxTimeoutSeconds bounds maxTimeoutSeconds (a day); the policy caps
	// what is signed far lower.
	MaxTimeoutSeconds = 86400
)

// ErrPaymentRequired marks every refusal of a PaymentRequired.
var ErrPaymentRequired = errors.New("payment_required")

func badf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrPaymentRequired, fmt.Sprintf(format, a...))
}

// Resource is the x402 v2 ResourceInfo.
type Resource struct {
	URL         string `json:"url"`
	Description string `json:"description,omitempty"`
	MimeType    string `json:"mimeType,omitempty"`
}

// Requirements is one entry of accepts, with the fields this package reads.
// Raw is the entry exactly as received (compacted), which a v2 payload
// echoes as accepted: the seller matches it field for field.
type Requirements struct {
	Scheme            string
	Network           string
	Asset             string
	Amount            string
	PayTo             string
	MaxTimeoutSeconds int64
	// Name and Version are extra.name and extra.version: the token's
	// EIP-712 domain. Empty when extra does not carry them as strings.
	Name, Version string
	// TransferMethod is extra.assetTransferMethod ("" when absent: x402
	// then means EIP-3009).
	TransferMethod string
	// Resource is a v1 entry's resource URL ("" in v2).
	Resource string
	Raw      json.RawMessage
	// Problem says why this entry cannot be read exactly ("" when it can);
	// such an entry is never paid.
	Problem string
}

// PaymentRequired is a parsed x402 PaymentRequired (v2, or v1).
type PaymentRequired struct {
	Version  int
	Resource Resource
	Accepts  []Requirements
	// Offers are the seller's signed offers (the offer-receipt extension).
	Offers Offers
}

// ParseArgument reads a payment_required tool argument: a JSON object, or
// a string holding the base64 value of a PAYMENT-REQUIRED header (or the
// JSON text itself).
func ParseArgument(v any) (*PaymentRequired, error) {
	switch x := v.(type) {
	case string:
		return ParseHeaderOrJSON(x)
	case json.RawMessage:
		// The object's own bytes, as the agent sent them.
		return Parse(x)
	case map[string]any:
		// mcp-go hands arguments over already decoded (duplicate keys were
		// merged by then); encode again and read strictly.
		b, err := json.Marshal(x)
		if err != nil {
			return nil, badf("cannot be encoded again as JSON")
		}
		return Parse(b)
	case nil:
		return nil, badf("is missing")
	}
	return nil, badf("must be the seller's PaymentRequired object or the base64 value of its PAYMENT-REQUIRED header, not a %T", v)
}

// ParseHeaderOrJSON reads a PAYMENT-REQUIRED header value (base64 of the
// JSON, standard or URL alphabet, padded or not) or the JSON text.
func ParseHeaderOrJSON(s string) (*PaymentRequired, error) {
	s = strings.TrimSpace(s)
	if len(s) > MaxPaymentRequiredBytes*4/3+4 {
		return nil, badf("is %d bytes long; at most %d bytes of JSON are read", len(s), MaxPaymentRequiredBytes)
	}
	if strings.HasPrefix(s, "{") {
		return Parse([]byte(s))
	}
	var b []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err = enc.Strict().DecodeString(s); err == nil {
			break
		}
	}
	if err != nil {
		return nil, badf("a string must be the base64 value of the PAYMENT-REQUIRED header (or the JSON object itself); this one is neither")
	}
	if !bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		return nil, badf("the base64 value does not decode to a JSON object")
	}
	return Parse(b)
}

// Parse reads the JSON of a PaymentRequired strictly: valid UTF-8, no
// duplicate keys at any depth, bounded size and nesting, x402Version 1 or
// 2, accepts a non-empty array of objects. Entries whose own fields cannot
// be read exactly are kept with their Problem (so that a caller can say why
// nothing was paid); the document's structure must be sound.
func Parse(data []byte) (*PaymentRequired, error) {
	if len(data) > MaxPaymentRequiredBytes {
		return nil, badf("is %d bytes long; at most %d are read", len(data), MaxPaymentRequiredBytes)
	}
	if !utf8.Valid(data) {
		return nil, badf("is not valid UTF-8")
	}
	if err := checkStrict(data); err != nil {
		return nil, badf("%s", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil || top == nil {
		return nil, badf("must be a JSON object")
	}
	if err := exactNames(top, "x402Version", "resource", "accepts"); err != nil {
		return nil, badf("%s", err)
	}
	var version json.Number
	if err := unmarshalNumber(top["x402Version"], &version); err != nil {
		return nil, badf("x402Version must be the number 1 or 2")
	}
	pr := &PaymentRequired{}
	switch version.String() {
	case "1":
		pr.Version = 1
	case "2":
		pr.Version = 2
	default:
		return nil, badf("x402Version %s is not supported (1 and 2 are)", clip(version.String()))
	}
	if pr.Version == 2 {
		raw, ok := top["resource"]
		if !ok {
			return nil, badf("resource is missing (x402 v2 names the resource being paid for)")
		}
		// Read by exact names: encoding/json would take "URL" for "url".
		var res map[string]json.RawMessage
		if err := json.Unmarshal(raw, &res); err != nil || res == nil {
			return nil, badf("resource must be an object with a url string")
		}
		if err := exactNames(res, "url", "description", "mimeType"); err != nil {
			return nil, badf("resource: %s", err)
		}
		for _, f := range []struct {
			key string
			dst *string
		}{{"url", &pr.Resource.URL}, {"description", &pr.Resource.Description}, {"mimeType", &pr.Resource.MimeType}} {
			if v, ok := res[f.key]; ok && string(v) != "null" {
				if err := json.Unmarshal(v, f.dst); err != nil {
					return nil, badf("resource.%s must be a string", f.key)
				}
			}
		}
		if pr.Resource.URL == "" || len(pr.Resource.URL) > maxField {
			return nil, badf("resource.url must be a non-empty string of at most %d bytes", maxField)
		}
	}
	var accepts []json.RawMessage
	if err := json.Unmarshal(top["accepts"], &accepts); err != nil || accepts == nil {
		return nil, badf("accepts must be an array of payment requirements")
	}
	if len(accepts) == 0 {
		return nil, badf("accepts is empty: the seller offers no way to pay")
	}
	if len(accepts) > MaxAccepts {
		return nil, badf("accepts has %d entries; at most %d are read", len(accepts), MaxAccepts)
	}
	for i, raw := range accepts {
		r, err := readRequirements(raw, pr.Version)
		if err != nil {
			return nil, badf("accepts[%d]: %s", i, err)
		}
		pr.Accepts = append(pr.Accepts, r)
	}
	pr.Offers = readOffers(top["extensions"])
	return pr, nil
}

// readRequirements reads one entry. A structural fault (not an object) is
// an error; a field that cannot be read exactly becomes the entry's Problem.
func readRequirements(raw json.RawMessage, version int) (Requirements, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return Requirements{}, errors.New("must be an object")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return Requirements{}, errors.New("must be an object")
	}
	r := Requirements{Raw: buf.Bytes()}
	var problems []string
	if err := exactNames(m, "scheme", "network", "amount", "maxAmountRequired", "asset", "payTo", "maxTimeoutSeconds", "extra", "resource"); err != nil {
		problems = append(problems, err.Error())
	}
	str := func(key string, required bool) string {
		v, ok := m[key]
		if !ok {
			if required {
				problems = append(problems, key+" is missing")
			}
			return ""
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			problems = append(problems, key+" must be a string")
			return ""
		}
		if len(s) > maxField {
			problems = append(problems, fmt.Sprintf("%s is longer than %d bytes", key, maxField))
			return ""
		}
		return s
	}
	r.Scheme = str("scheme", true)
	r.Network = str("network", true)
	r.Asset = str("asset", true)
	r.PayTo = str("payTo", true)
	amountKey := "amount"
	if version == 1 {
		amountKey = "maxAmountRequired"
		r.Resource = str("resource", false)
	}
	r.Amount = str(amountKey, true)
	if r.Amount != "" {
		if _, err := ParseAtomic(r.Amount); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", amountKey, err))
		}
	}
	if v, ok := m["maxTimeoutSeconds"]; !ok {
		problems = append(problems, "maxTimeoutSeconds is missing")
	} else {
		var n json.Number
		if err := unmarshalNumber(v, &n); err != nil {
			problems = append(problems, "maxTimeoutSeconds must be a number")
		} else if t, err := n.Int64(); err != nil || t < 1 || t > MaxTimeoutSeconds {
			problems = append(problems, fmt.Sprintf("maxTimeoutSeconds must be a whole number of seconds from 1 to %d", MaxTimeoutSeconds))
		} else {
			r.MaxTimeoutSeconds = t
		}
	}
	if v, ok := m["extra"]; ok && string(v) != "null" {
		var extra map[string]json.RawMessage
		if err := json.Unmarshal(v, &extra); err != nil || extra == nil {
			problems = append(problems, "extra must be an object")
		} else {
			if err := exactNames(extra, "name", "version", "assetTransferMethod"); err != nil {
				problems = append(problems, "extra: "+err.Error())
			}
			for _, f := range []struct {
				key string
				dst *string
			}{{"name", &r.Name}, {"version", &r.Version}, {"assetTransferMethod", &r.TransferMethod}} {
				if raw, ok := extra[f.key]; ok {
					if err := json.Unmarshal(raw, f.dst); err != nil || len(*f.dst) > 256 {
						problems = append(problems, "extra."+f.key+" must be a string of at most 256 bytes")
						*f.dst = ""
					}
				}
			}
		}
	}
	r.Problem = strings.Join(problems, "; ")
	return r, nil
}

// ParseAtomic reads an amount in atomic units: decimal digits only, no
// sign, no leading zero (except "0" itself), at most 78 digits, and below
// 2^256.
func ParseAtomic(s string) (*big.Int, error) {
	if s == "" {
		return nil, errors.New("the amount is empty")
	}
	if len(s) > maxAmountDigits {
		return nil, fmt.Errorf("the amount has %d digits; a uint256 has at most %d", len(s), maxAmountDigits)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return nil, fmt.Errorf("the amount %q is not a whole number of atomic units (digits only)", clip(s))
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return nil, fmt.Errorf("the amount %q has a leading zero", clip(s))
	}
	n, _ := new(big.Int).SetString(s, 10)
	if n.BitLen() > 256 {
		return nil, fmt.Errorf("the amount %q does not fit in a uint256", clip(s))
	}
	return n, nil
}

func unmarshalNumber(raw json.RawMessage, n *json.Number) error {
	if len(raw) == 0 {
		return errors.New("missing")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	num, ok := v.(json.Number)
	if !ok {
		return errors.New("not a number")
	}
	*n = num
	return nil
}

// checkStrict walks the tokens of data: one JSON value, no duplicate key in
// any object, nesting at most maxDepth.
func checkStrict(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		obj    bool
		keys   map[string]bool
		expect bool // in an object: the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if len(stack) != 0 {
				return errors.New("the JSON ends early")
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("is not valid JSON (at byte %d)", dec.InputOffset())
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.expect {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) == 0 {
					return onlyValue(dec)
				}
				continue
			}
			k := tok.(string)
			if top.keys[k] {
				return fmt.Errorf("the key %q appears twice in one object; a duplicated key is read differently by different parsers, so it is refused", clip(k))
			}
			top.keys[k] = true
			top.expect = false
			continue
		}
		if top != nil && top.obj {
			top.expect = true
		}
		switch d := tok.(type) {
		case json.Delim:
			switch d {
			case '{', '[':
				if len(stack) >= maxDepth {
					return fmt.Errorf("nests deeper than %d levels", maxDepth)
				}
				stack = append(stack, &frame{obj: d == '{', keys: map[string]bool{}, expect: d == '{'})
			case ']', '}':
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].obj {
					stack[len(stack)-1].expect = true
				}
			}
		}
		if len(stack) == 0 {
			return onlyValue(dec)
		}
	}
}

// exactNames refuses a member whose name is one of names in another letter
// case ("PayTo", "URL"): readers that match names without regard to case
// (encoding/json into a struct) would take it for the x402 field, readers
// that match exactly would not, so the seller's answer would say two
// things.
func exactNames(m map[string]json.RawMessage, names ...string) error {
	for k := range m {
		for _, n := range names {
			if k != n && strings.EqualFold(k, n) {
				return fmt.Errorf("the field %q is not spelled %q; x402 names are exact, and a reader that ignores case would take one for the other", clip(k), n)
			}
		}
	}
	return nil
}

// onlyValue checks that nothing but white space follows the first value.
func onlyValue(dec *json.Decoder) error {
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("holds more than one JSON value")
	}
	return nil
}

func clip(s string) string {
	const n = 80
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
