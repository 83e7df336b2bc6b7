package x402

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// maxSettlementBytes bounds a settlement answer.
const maxSettlementBytes = 32 << 10

var txHashRE = regexp.MustCompile(`^0x[0-9a-fA-F]{64}$`)

// Settlement is a seller's PAYMENT-RESPONSE (X-PAYMENT-RESPONSE in v1)
// answer: the facilitator's settlement, and the seller's signed receipt
// when it carries the offer-receipt extension.
type Settlement struct {
	Success     bool
	Transaction string
	Network     string
	Payer       string
	ErrorReason string
	// Receipt is the signed receipt under extensions["offer-receipt"].info.receipt,
	// nil when none.
	Receipt *Artifact
}

// ParseSettlementArgument reads a settlement handed in as the header's
// base64 value, its JSON text, or an object's bytes.
func ParseSettlementArgument(v any) (Settlement, error) {
	switch x := v.(type) {
	case string:
		s := strings.TrimSpace(x)
		if len(s) > maxSettlementBytes*4/3+4 {
			return Settlement{}, fmt.Errorf("is %d bytes long; at most %d bytes of JSON are read", len(s), maxSettlementBytes)
		}
		if strings.HasPrefix(s, "{") {
			return ParseSettlement([]byte(s))
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if b, err := enc.Strict().DecodeString(s); err == nil {
				return ParseSettlement(b)
			}
		}
		return Settlement{}, errors.New("a string must be the base64 value of the PAYMENT-RESPONSE header (or its JSON)")
	case json.RawMessage:
		return ParseSettlement(x)
	case map[string]any:
		b, err := json.Marshal(x)
		if err != nil {
			return Settlement{}, errors.New("cannot be encoded again as JSON")
		}
		return ParseSettlement(b)
	}
	return Settlement{}, fmt.Errorf("must be the seller's PAYMENT-RESPONSE (its base64 header value or the JSON object), not a %T", v)
}

// ParseSettlement reads a settlement answer strictly: {success,
// transaction, network, payer, errorReason?, extensions?}, no member twice,
// names exact; a success names a 32-byte transaction hash and the payer's
// address.
func ParseSettlement(data []byte) (Settlement, error) {
	if len(data) > maxSettlementBytes {
		return Settlement{}, fmt.Errorf("is %d bytes long; at most %d are read", len(data), maxSettlementBytes)
	}
	if !utf8.Valid(data) {
		return Settlement{}, errors.New("is not valid UTF-8")
	}
	if err := checkStrict(data); err != nil {
		return Settlement{}, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil || m == nil {
		return Settlement{}, errors.New("must be a JSON object")
	}
	known := []string{"success", "transaction", "network", "payer", "errorReason", "errorMessage", "extensions"}
	for k := range m {
		if !contains(known, k) {
			return Settlement{}, fmt.Errorf("has the member %q, which a settlement answer does not define (known: %s)", clip(k), strings.Join(known, ", "))
		}
	}
	var s Settlement
	if err := json.Unmarshal(m["success"], &s.Success); err != nil || m["success"] == nil {
		return Settlement{}, errors.New("success must be true or false")
	}
	for _, f := range []struct {
		k string
		p *string
	}{{"transaction", &s.Transaction}, {"network", &s.Network}, {"payer", &s.Payer}, {"errorReason", &s.ErrorReason}} {
		if v, ok := m[f.k]; ok && string(v) != "null" {
			if err := json.Unmarshal(v, f.p); err != nil || len(*f.p) > maxField {
				return Settlement{}, fmt.Errorf("%s must be a string of at most %d bytes", f.k, maxField)
			}
		}
	}
	if s.Success {
		if !txHashRE.MatchString(s.Transaction) {
			return Settlement{}, fmt.Errorf("transaction %q is not a transaction hash (0x and 64 hex digits)", clip(s.Transaction))
		}
		if _, err := ParseAddress(s.Payer); err != nil {
			return Settlement{}, fmt.Errorf("payer: %w", err)
		}
		if s.Network == "" {
			return Settlement{}, errors.New("network is missing")
		}
	}
	if raw, ok := m["extensions"]; ok && string(raw) != "null" {
		var ext map[string]json.RawMessage
		if err := json.Unmarshal(raw, &ext); err != nil || ext == nil {
			return Settlement{}, errors.New("extensions must be an object")
		}
		if or, ok := ext[OfferReceiptExtension]; ok {
			var body struct {
				Info struct {
					Receipt json.RawMessage `json:"receipt"`
				} `json:"info"`
			}
			if err := json.Unmarshal(or, &body); err != nil || len(body.Info.Receipt) == 0 {
				return Settlement{}, errors.New("extensions[\"offer-receipt\"] must carry info.receipt")
			}
			a, err := ParseArtifact(body.Info.Receipt, false)
			if err != nil {
				return Settlement{}, fmt.Errorf("the receipt: %w", err)
			}
			s.Receipt = &a
		}
	}
	return s, nil
}
