package x402

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"unicode/utf8"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
)

// The x402 Offer and Receipt extension (coinbase/x402,
// specs/extensions/extension-offer-and-receipt.md): a seller signs the
// terms of each entry of accepts (an offer) and, after delivery, a receipt,
// as EIP-712 typed data or as a JWS over the JCS form of the payload.

// OfferReceiptExtension is the extension's key under extensions.
const OfferReceiptExtension = "offer-receipt"

// Artifact formats.
const (
	FormatEIP712 = "eip712"
	FormatJWS    = "jws"
)

// maxArtifactBytes bounds one signed offer or receipt.
const maxArtifactBytes = 8 << 10

var (
	offerDomainTypeHash = Keccak256([]byte("EIP712Domain(string name,string version,uint256 chainId)"))
	offerTypeHash       = Keccak256([]byte("Offer(uint256 version,string resourceUrl,string scheme,string network,string asset,string payTo,string amount,uint256 validUntil)"))
	receiptTypeHash     = Keccak256([]byte("Receipt(uint256 version,string network,string resourceUrl,string payer,uint256 issuedAt,string transaction)"))
)

// Artifact is a signed offer or receipt as sent: format, the payload
// (EIP-712 only), the signature (hex for EIP-712, the JWS compact string),
// and for an offer the unsigned hint acceptIndex.
type Artifact struct {
	Format      string          `json:"format"`
	AcceptIndex *int            `json:"acceptIndex,omitempty"`
	Payload     json.RawMessage `json:"payload,omitempty"`
	Signature   string          `json:"signature"`
	// raw is the artifact as the seller sent it (compact), when it was
	// read by ParseArtifact.
	raw []byte
}

// Raw is the artifact as the seller sent it, in compact form: its own
// bytes when ParseArtifact read it, else its JSON encoding.
func (a Artifact) Raw() ([]byte, error) {
	if a.raw != nil {
		return a.raw, nil
	}
	return json.Marshal(a)
}

// OfferTerms are a signed offer's payload (version 1).
type OfferTerms struct {
	Version     int64  `json:"version"`
	ResourceURL string `json:"resourceUrl"`
	Scheme      string `json:"scheme"`
	Network     string `json:"network"`
	Asset       string `json:"asset"`
	PayTo       string `json:"payTo"`
	Amount      string `json:"amount"`
	// ValidUntil is Unix seconds; 0 means none.
	ValidUntil int64 `json:"validUntil"`
}

// ReceiptTerms are a signed receipt's payload (version 1).
type ReceiptTerms struct {
	Version     int64  `json:"version"`
	Network     string `json:"network"`
	ResourceURL string `json:"resourceUrl"`
	Payer       string `json:"payer"`
	IssuedAt    int64  `json:"issuedAt"`
	// Transaction is "" when the seller left it out (privacy-minimal).
	Transaction string `json:"transaction"`
}

// ArtifactSigner names who signed an artifact: the recovered address for
// EIP-712, the key identifier and the key's thumbprint for JWS.
type ArtifactSigner struct {
	Format     string `json:"format"`
	Address    string `json:"address,omitempty"`
	KID        string `json:"kid,omitempty"`
	Thumbprint string `json:"jwk_thumbprint,omitempty"`
	Alg        string `json:"alg,omitempty"`
}

// String is the signer as a person reads it.
func (s ArtifactSigner) String() string {
	if s.Format == FormatEIP712 {
		return s.Address + " (EIP-712)"
	}
	return fmt.Sprintf("%s (JWS %s, key %s)", s.KID, s.Alg, s.Thumbprint)
}

// KeyLookup finds the public key a JWS key identifier names; ok is false
// when none is known.
type KeyLookup func(kid string) (sellerkey.Key, bool)

// Offers is what a 402 carries under extensions["offer-receipt"]: the
// signed offers as sent, or why they cannot be read.
type Offers struct {
	// Present: the 402 names the offer-receipt extension with offers.
	Present bool
	List    []Artifact
	// Problem says why the extension's offers cannot be read ("" when
	// they can); such offers are never taken as signed.
	Problem string
}

// readOffers reads extensions["offer-receipt"].info.offers from the 402's
// extensions member. A 402 without the extension has no offers; one whose
// extension cannot be read keeps the reason.
func readOffers(raw json.RawMessage) Offers {
	if len(raw) == 0 || string(raw) == "null" {
		return Offers{}
	}
	var ext map[string]json.RawMessage
	if err := json.Unmarshal(raw, &ext); err != nil || ext == nil {
		return Offers{Present: true, Problem: "extensions must be an object"}
	}
	or, ok := ext[OfferReceiptExtension]
	if !ok {
		return Offers{}
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(or, &body); err != nil || body == nil {
		return Offers{Present: true, Problem: "extensions[\"offer-receipt\"] must be an object"}
	}
	var info map[string]json.RawMessage
	if err := json.Unmarshal(body["info"], &info); err != nil || info == nil {
		return Offers{Present: true, Problem: "extensions[\"offer-receipt\"].info must be an object"}
	}
	var list []json.RawMessage
	if err := json.Unmarshal(info["offers"], &list); err != nil || list == nil {
		return Offers{Present: true, Problem: "extensions[\"offer-receipt\"].info.offers must be an array"}
	}
	out := Offers{Present: true}
	if len(list) > MaxAccepts {
		out.Problem = fmt.Sprintf("extensions[\"offer-receipt\"].info.offers has %d entries; at most %d are read", len(list), MaxAccepts)
		return out
	}
	for i, r := range list {
		a, err := ParseArtifact(r, true)
		if err != nil {
			out.Problem = fmt.Sprintf("offers[%d]: %s", i, err)
			return out
		}
		out.List = append(out.List, a)
	}
	return out
}

// ParseArtifact reads a signed offer (offer true) or receipt strictly:
// exact member names, no member twice, format eip712 with a payload or jws
// without one.
func ParseArtifact(raw []byte, offer bool) (Artifact, error) {
	if len(raw) > maxArtifactBytes {
		return Artifact{}, fmt.Errorf("is %d bytes long; at most %d are read", len(raw), maxArtifactBytes)
	}
	if !utf8.Valid(raw) {
		return Artifact{}, errors.New("is not valid UTF-8")
	}
	if err := checkStrict(raw); err != nil {
		return Artifact{}, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return Artifact{}, errors.New("must be an object")
	}
	known := []string{"format", "payload", "signature"}
	if offer {
		known = append(known, "acceptIndex")
	}
	for k := range m {
		if !contains(known, k) {
			return Artifact{}, fmt.Errorf("has the member %q, which the extension does not define (known: %s)", clip(k), strings.Join(known, ", "))
		}
	}
	var a Artifact
	if err := json.Unmarshal(m["format"], &a.Format); err != nil {
		return Artifact{}, errors.New("format must be the string eip712 or jws")
	}
	if err := json.Unmarshal(m["signature"], &a.Signature); err != nil || a.Signature == "" {
		return Artifact{}, errors.New("signature must be a non-empty string")
	}
	if v, ok := m["acceptIndex"]; ok && string(v) != "null" {
		var n json.Number
		if err := unmarshalNumber(v, &n); err != nil {
			return Artifact{}, errors.New("acceptIndex must be a whole number")
		}
		i, err := n.Int64()
		if err != nil || i < 0 || i >= MaxAccepts {
			return Artifact{}, fmt.Errorf("acceptIndex must be a whole number from 0 to %d", MaxAccepts-1)
		}
		ii := int(i)
		a.AcceptIndex = &ii
	}
	p, hasPayload := m["payload"]
	switch a.Format {
	case FormatEIP712:
		if !hasPayload || string(p) == "null" {
			return Artifact{}, errors.New("an eip712 artifact must carry its payload")
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, p); err != nil {
			return Artifact{}, errors.New("payload must be an object")
		}
		a.Payload = buf.Bytes()
	case FormatJWS:
		if hasPayload {
			return Artifact{}, errors.New("a jws artifact must not carry a payload (the JWS holds it)")
		}
	default:
		return Artifact{}, fmt.Errorf("format %q is not eip712 or jws", clip(a.Format))
	}
	var c bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		return Artifact{}, errors.New("must be an object")
	}
	a.raw = c.Bytes()
	return a, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// payloadBytes is the artifact's payload as signed: the EIP-712 payload,
// or the JWS payload (without checking its signature).
func (a Artifact) payloadBytes() ([]byte, *sellerkey.Compact, error) {
	if a.Format == FormatEIP712 {
		return a.Payload, nil, nil
	}
	c, err := sellerkey.ParseCompact(a.Signature)
	if err != nil {
		return nil, nil, err
	}
	return c.Payload, &c, nil
}

// payloadFields reads a payload object strictly: exact names, each once,
// every required one present.
func payloadFields(b []byte, required, optional []string) (map[string]json.RawMessage, error) {
	if !utf8.Valid(b) {
		return nil, errors.New("the payload is not valid UTF-8")
	}
	if err := checkStrict(b); err != nil {
		return nil, fmt.Errorf("the payload %s", err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return nil, errors.New("the payload must be an object")
	}
	for k := range m {
		if !contains(required, k) && !contains(optional, k) {
			return nil, fmt.Errorf("the payload has the member %q, which version 1 does not define", clip(k))
		}
	}
	for _, k := range required {
		if _, ok := m[k]; !ok {
			return nil, fmt.Errorf("the payload has no %s", k)
		}
	}
	return m, nil
}

func payloadString(m map[string]json.RawMessage, k string) (string, error) {
	v, ok := m[k]
	if !ok {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil || len(s) > maxField {
		return "", fmt.Errorf("the payload's %s must be a string of at most %d bytes", k, maxField)
	}
	return s, nil
}

// payloadUint reads a whole number from 0 to 2^53-1 (what a JavaScript
// signer can write exactly).
func payloadUint(m map[string]json.RawMessage, k string) (int64, error) {
	v, ok := m[k]
	if !ok {
		return 0, nil
	}
	var n json.Number
	if err := unmarshalNumber(v, &n); err != nil {
		return 0, fmt.Errorf("the payload's %s must be a number", k)
	}
	i, err := n.Int64()
	if err != nil || i < 0 || i > 1<<53-1 {
		return 0, fmt.Errorf("the payload's %s must be a whole number from 0 to 2^53-1", k)
	}
	return i, nil
}

// OfferTerms reads the offer's payload without checking its signature.
func (a Artifact) OfferTerms() (OfferTerms, error) {
	b, _, err := a.payloadBytes()
	if err != nil {
		return OfferTerms{}, err
	}
	m, err := payloadFields(b, []string{"version", "resourceUrl", "scheme", "network", "asset", "payTo", "amount"}, []string{"validUntil"})
	if err != nil {
		return OfferTerms{}, err
	}
	var t OfferTerms
	if t.Version, err = payloadUint(m, "version"); err != nil {
		return OfferTerms{}, err
	}
	if t.Version != 1 {
		return OfferTerms{}, fmt.Errorf("the payload's version is %d; only version 1 is defined", t.Version)
	}
	for _, f := range []struct {
		k string
		p *string
	}{{"resourceUrl", &t.ResourceURL}, {"scheme", &t.Scheme}, {"network", &t.Network}, {"asset", &t.Asset}, {"payTo", &t.PayTo}, {"amount", &t.Amount}} {
		if *f.p, err = payloadString(m, f.k); err != nil {
			return OfferTerms{}, err
		}
	}
	if t.ValidUntil, err = payloadUint(m, "validUntil"); err != nil {
		return OfferTerms{}, err
	}
	return t, nil
}

// ReceiptTerms reads the receipt's payload without checking its signature.
func (a Artifact) ReceiptTerms() (ReceiptTerms, error) {
	b, _, err := a.payloadBytes()
	if err != nil {
		return ReceiptTerms{}, err
	}
	m, err := payloadFields(b, []string{"version", "network", "resourceUrl", "payer", "issuedAt"}, []string{"transaction"})
	if err != nil {
		return ReceiptTerms{}, err
	}
	var t ReceiptTerms
	if t.Version, err = payloadUint(m, "version"); err != nil {
		return ReceiptTerms{}, err
	}
	if t.Version != 1 {
		return ReceiptTerms{}, fmt.Errorf("the payload's version is %d; only version 1 is defined", t.Version)
	}
	for _, f := range []struct {
		k string
		p *string
	}{{"network", &t.Network}, {"resourceUrl", &t.ResourceURL}, {"payer", &t.Payer}, {"transaction", &t.Transaction}} {
		if *f.p, err = payloadString(m, f.k); err != nil {
			return ReceiptTerms{}, err
		}
	}
	if t.IssuedAt, err = payloadUint(m, "issuedAt"); err != nil {
		return ReceiptTerms{}, err
	}
	return t, nil
}

func stringWord(s string) []byte { h := Keccak256([]byte(s)); return h[:] }

func uintWord(n int64) []byte { return new(big.Int).SetInt64(n).FillBytes(make([]byte, 32)) }

func artifactDomain(name string) [32]byte {
	return Keccak256(offerDomainTypeHash[:], stringWord(name), stringWord("1"), uintWord(1))
}

// OfferDigest is the EIP-712 hash of an offer: domain {name "x402 offer",
// version "1", chainId 1}, the extension's normative Offer type.
func OfferDigest(t OfferTerms) [32]byte {
	sep := artifactDomain("x402 offer")
	st := Keccak256(offerTypeHash[:], uintWord(t.Version), stringWord(t.ResourceURL), stringWord(t.Scheme), stringWord(t.Network),
		stringWord(t.Asset), stringWord(t.PayTo), stringWord(t.Amount), uintWord(t.ValidUntil))
	return Keccak256([]byte{0x19, 0x01}, sep[:], st[:])
}

// ReceiptDigest is the EIP-712 hash of a receipt: domain {name "x402
// receipt", version "1", chainId 1}, the extension's Receipt type.
func ReceiptDigest(t ReceiptTerms) [32]byte {
	sep := artifactDomain("x402 receipt")
	st := Keccak256(receiptTypeHash[:], uintWord(t.Version), stringWord(t.Network), stringWord(t.ResourceURL), stringWord(t.Payer),
		uintWord(t.IssuedAt), stringWord(t.Transaction))
	return Keccak256([]byte{0x19, 0x01}, sep[:], st[:])
}

// verifyArtifact checks the signature over the payload and names the
// signer: EIP-712 recovers an address from digest; a JWS is verified with
// the key its kid names (lookup, else a did:jwk identifier's own key).
func (a Artifact) verifyArtifact(digest func() ([32]byte, error), lookup KeyLookup) (ArtifactSigner, error) {
	switch a.Format {
	case FormatEIP712:
		d, err := digest()
		if err != nil {
			return ArtifactSigner{}, err
		}
		s := strings.TrimPrefix(strings.TrimPrefix(a.Signature, "0x"), "0X")
		raw, err := hex.DecodeString(s)
		if err != nil || len(raw) != 65 {
			return ArtifactSigner{}, errors.New("the signature must be 0x and 65 bytes in hex (r ‖ s ‖ v)")
		}
		var sig [65]byte
		copy(sig[:], raw)
		addr, err := Recover(d, sig)
		if err != nil {
			return ArtifactSigner{}, fmt.Errorf("the signature does not verify: %w", err)
		}
		return ArtifactSigner{Format: FormatEIP712, Address: addr.Hex()}, nil
	case FormatJWS:
		c, err := sellerkey.ParseCompact(a.Signature)
		if err != nil {
			return ArtifactSigner{}, err
		}
		key, ok := sellerkey.Key{}, false
		if lookup != nil {
			key, ok = lookup(c.Header.KID)
		}
		if !ok {
			k, isJWK, err := sellerkey.FromKID(c.Header.KID)
			if err != nil {
				return ArtifactSigner{}, fmt.Errorf("the key identifier %q: %w", clip(c.Header.KID), err)
			}
			if !isJWK {
				return ArtifactSigner{}, fmt.Errorf("the key identifier %q names a key not known here (the policy's sellerKeys name a did:web or did:key key with its JWK; keys are never fetched)", clip(c.Header.KID))
			}
			key = k
		}
		if err := c.Verify(key); err != nil {
			return ArtifactSigner{}, err
		}
		return ArtifactSigner{Format: FormatJWS, KID: c.Header.KID, Thumbprint: key.Thumbprint, Alg: key.Alg}, nil
	}
	return ArtifactSigner{}, fmt.Errorf("format %q is not eip712 or jws", clip(a.Format))
}

// VerifyOffer checks a signed offer's signature and returns its terms and
// signer. It says nothing about whether the signer speaks for the seller.
func VerifyOffer(a Artifact, lookup KeyLookup) (OfferTerms, ArtifactSigner, error) {
	t, err := a.OfferTerms()
	if err != nil {
		return OfferTerms{}, ArtifactSigner{}, err
	}
	s, err := a.verifyArtifact(func() ([32]byte, error) { return OfferDigest(t), nil }, lookup)
	return t, s, err
}

// VerifyReceipt checks a signed receipt's signature and returns its terms
// and signer.
func VerifyReceipt(a Artifact, lookup KeyLookup) (ReceiptTerms, ArtifactSigner, error) {
	t, err := a.ReceiptTerms()
	if err != nil {
		return ReceiptTerms{}, ArtifactSigner{}, err
	}
	s, err := a.verifyArtifact(func() ([32]byte, error) { return ReceiptDigest(t), nil }, lookup)
	return t, s, err
}

// OfferCheck is what a 402's signed offers say about the entry chosen.
type OfferCheck struct {
	// Carried: the 402 carries the offer-receipt extension's offers.
	Carried bool
	// Offer is the offer for the entry (nil when none matched), with its
	// terms and, once its signature verified, its signer.
	Offer  *Artifact
	Terms  OfferTerms
	Signer *ArtifactSigner
	// Problem names the field or fault that keeps the offer from being
	// trusted; "" when its signature verified and its terms are the entry's.
	Problem string
}

// CheckOffer finds the signed offer for the chosen entry and checks it:
// its signature (EIP-712, or a JWS with a key lookup names or a did:jwk
// identifier carries), and that its terms equal the entry's scheme,
// network, asset, payTo and amount and the resource paid for, and that it
// has not expired. Offers are matched by their terms, as the extension
// requires; acceptIndex only says which offer's difference to name when
// none matches. Whether the signer speaks for the seller is the policy's
// question, not this function's.
func CheckOffer(pr *PaymentRequired, c Choice, resource string, nowUnix int64, lookup KeyLookup) OfferCheck {
	out := OfferCheck{Carried: pr.Offers.Present}
	if !out.Carried {
		return out
	}
	if pr.Offers.Problem != "" {
		out.Problem = "the offers cannot be read: " + pr.Offers.Problem
		return out
	}
	var near *Artifact
	var nearTerms OfferTerms
	nearWhy := ""
	for i := range pr.Offers.List {
		a := &pr.Offers.List[i]
		t, err := a.OfferTerms()
		if err != nil {
			if a.AcceptIndex != nil && *a.AcceptIndex == c.Index && near == nil {
				near, nearWhy = a, fmt.Sprintf("offers[%d]: %s", i, err)
			}
			continue
		}
		field, why := offerDiffers(t, c)
		if field == "" {
			out.Offer, out.Terms = a, t
			break
		}
		if near == nil && (a.AcceptIndex != nil && *a.AcceptIndex == c.Index || a.AcceptIndex == nil && i == c.Index) {
			near, nearTerms, nearWhy = a, t, fmt.Sprintf("offers[%d] %s", i, why)
		}
	}
	if out.Offer == nil {
		if near != nil {
			out.Offer, out.Terms = near, nearTerms
			out.Problem = nearWhy
		} else {
			out.Problem = fmt.Sprintf("no signed offer has the terms of accepts[%d] (%d offers carried)", c.Index, len(pr.Offers.List))
		}
		return out
	}
	_, signer, err := VerifyOffer(*out.Offer, lookup)
	if err != nil {
		out.Problem = "signature: " + err.Error()
		return out
	}
	out.Signer = &signer
	if resource != "" && !SameResource(resource, out.Terms.ResourceURL) {
		out.Problem = fmt.Sprintf("resourceUrl: the offer is signed for %q, not the resource paid for, %q", clip(out.Terms.ResourceURL), clip(resource))
		return out
	}
	if out.Terms.ValidUntil != 0 && nowUnix > out.Terms.ValidUntil {
		out.Problem = fmt.Sprintf("validUntil: the offer expired %d seconds ago (validUntil %d)", nowUnix-out.Terms.ValidUntil, out.Terms.ValidUntil)
		return out
	}
	return out
}

// offerDiffers names the first of the entry's terms the offer does not
// sign exactly ("" when it signs them all).
func offerDiffers(t OfferTerms, c Choice) (string, string) {
	if t.Scheme != c.Req.Scheme {
		return "scheme", fmt.Sprintf("scheme: the offer signs %q, the entry asks %q", clip(t.Scheme), clip(c.Req.Scheme))
	}
	if t.Network != c.Network {
		return "network", fmt.Sprintf("network: the offer signs %q, the entry asks %q", clip(t.Network), c.Network)
	}
	if a, err := ParseAddress(t.Asset); err != nil || a != c.Token {
		return "asset", fmt.Sprintf("asset: the offer signs %q, the entry asks %s", clip(t.Asset), c.Token.Hex())
	}
	if a, err := ParseAddress(t.PayTo); err != nil || a != c.PayTo {
		return "payTo", fmt.Sprintf("payTo: the offer signs %q, the entry asks %s", clip(t.PayTo), c.PayTo.Hex())
	}
	if t.Amount != c.Atomic.String() {
		return "amount", fmt.Sprintf("amount: the offer signs %q atomic units, the entry asks %s", clip(t.Amount), c.Atomic.String())
	}
	return "", ""
}
