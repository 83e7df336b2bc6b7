package x402

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// DefaultMaxAuthorizationSeconds caps how long a signed authorization stays
// valid when the policy sets no maxAuthorizationSeconds.
const DefaultMaxAuthorizationSeconds = 300

// MinAuthorizationSeconds is the shortest validity an authorization is
// signed with: the official facilitator refuses one whose validBefore is
// less than 6 seconds ahead when it verifies (its allowance for block
// time), and the header must first reach the seller and the seller the
// facilitator (10 seconds allowed). A shorter one could only be refused
// while its amount stays reserved, so it is never signed.
const MinAuthorizationSeconds = 6 + 10

// TransferEIP3009 is the one assetTransferMethod signed here (x402's
// default when extra names none); "permit2" is not signed.
const TransferEIP3009 = "eip3009"

// validAfterSkew backdates validAfter a little, so that a chain whose
// latest block is a few seconds behind this clock accepts the
// authorization at once.
const validAfterSkew = 60 * time.Second

// Choice is the entry of accepts the product can pay, read exactly.
type Choice struct {
	Index   int
	Req     Requirements
	Asset   guard.Asset
	Atomic  *big.Int
	PayTo   Address
	Token   Address
	ChainID *big.Int
	// Network is the CAIP-2 network (a v1 name such as "base" mapped).
	Network string
}

// Skipped says why one entry of accepts was not chosen.
type Skipped struct {
	Index  int    `json:"index"`
	Reason string `json:"reason"`
}

// Select picks the first entry of accepts that the product can pay
// exactly: scheme exact, an EVM network, an asset the policy's registry
// lists on that network, a readable amount, a payTo address, and the
// token's EIP-712 name and version in extra. Nothing is guessed: an entry
// with anything it cannot read is skipped, and the reasons are returned
// when none can be paid.
func Select(pr *PaymentRequired, assets guard.Registry) (Choice, []Skipped) {
	var skipped []Skipped
	for i, r := range pr.Accepts {
		c, why := choose(r, assets)
		if why == "" {
			c.Index = i
			return c, nil
		}
		skipped = append(skipped, Skipped{Index: i, Reason: why})
	}
	return Choice{}, skipped
}

func choose(r Requirements, assets guard.Registry) (Choice, string) {
	if r.Problem != "" {
		return Choice{}, r.Problem
	}
	if r.Scheme != "exact" {
		return Choice{}, fmt.Sprintf("scheme %q is not paid (only exact is)", clip(r.Scheme))
	}
	network, err := guard.NetworkCAIP2(r.Network)
	if err != nil {
		return Choice{}, err.Error()
	}
	chain, err := ChainID(network)
	if err != nil {
		return Choice{}, err.Error()
	}
	token, err := ParseAddress(r.Asset)
	if err != nil {
		return Choice{}, "asset: " + err.Error()
	}
	asset, ok := assets.Lookup(network + "/" + token.Lower())
	if !ok {
		return Choice{}, fmt.Sprintf("asset %s on %s is not in the policy's assets, so its decimals and identity are unknown", token.Hex(), network)
	}
	payTo, err := ParseAddress(r.PayTo)
	if err != nil {
		return Choice{}, "payTo: " + err.Error()
	}
	if payTo == (Address{}) {
		return Choice{}, "payTo is the zero address"
	}
	atomic, err := ParseAtomic(r.Amount)
	if err != nil {
		return Choice{}, "amount: " + err.Error()
	}
	if atomic.Sign() == 0 {
		return Choice{}, "the amount is zero; there is nothing to authorize"
	}
	switch r.TransferMethod {
	case "", TransferEIP3009:
	case "permit2":
		return Choice{}, "extra.assetTransferMethod is permit2, which this signer does not sign (only EIP-3009 transferWithAuthorization), and an EIP-3009 signature would not settle it"
	default:
		return Choice{}, fmt.Sprintf("extra.assetTransferMethod %q is not one x402 names (eip3009, permit2)", clip(r.TransferMethod))
	}
	if r.Name == "" || r.Version == "" {
		return Choice{}, "extra has no EIP-712 name and version for the token, so the domain to sign under is unknown"
	}
	if r.MaxTimeoutSeconds < MinAuthorizationSeconds {
		return Choice{}, fmt.Sprintf("maxTimeoutSeconds is %s; an authorization valid that briefly cannot settle (the official facilitator refuses a validBefore less than 6 s ahead when it verifies), so at least %d are needed",
			seconds(r.MaxTimeoutSeconds), MinAuthorizationSeconds)
	}
	return Choice{Req: r, Asset: asset, Atomic: atomic, PayTo: payTo, Token: token, ChainID: chain, Network: network}, ""
}

// seconds writes "1 second" / "5 seconds".
func seconds(n int64) string {
	if n == 1 {
		return "1 second"
	}
	return fmt.Sprintf("%d seconds", n)
}

// Amount is the choice's amount in the asset's display units, as the guard
// reads amounts ("0.25").
func (c Choice) Amount() string { return guard.FormatAmount(c.Atomic, c.Asset.Decimals) }

// Domain is the token's EIP-712 domain.
func (c Choice) Domain() Domain {
	return Domain{Name: c.Req.Name, Version: c.Req.Version, ChainID: c.ChainID, VerifyingContract: c.Token}
}

// Terms are what is signed for one allowed payment.
type Terms struct {
	Domain        Domain
	Authorization Authorization
	// Digest is the EIP-712 hash of the authorization.
	Digest [32]byte
}

// TermsFor builds the authorization of an allowed choice: from the payer
// to payTo, the amount exactly, valid from a minute before now until now
// plus maxTimeoutSeconds capped by maxSeconds, with the nonce derived from
// the decision receipt.
func TermsFor(c Choice, payer Address, receiptID string, now time.Time, maxSeconds int64) (Terms, error) {
	return TermsUntil(c, payer, receiptID, now, ValidBeforeFor(c, now, maxSeconds))
}

// ValidBeforeFor is the validBefore TermsFor gives a choice at now: now
// plus maxTimeoutSeconds capped by maxSeconds, in Unix seconds.
func ValidBeforeFor(c Choice, now time.Time, maxSeconds int64) int64 {
	if maxSeconds <= 0 {
		maxSeconds = DefaultMaxAuthorizationSeconds
	}
	return now.Unix() + min(c.Req.MaxTimeoutSeconds, maxSeconds)
}

// TermsUntil is TermsFor with a validBefore chosen before (the one the
// guard's ledger sealed with the decision): valid from a minute before now
// until before, with the nonce derived from the decision receipt.
func TermsUntil(c Choice, payer Address, receiptID string, now time.Time, before int64) (Terms, error) {
	after := now.Add(-validAfterSkew).Unix()
	t := Terms{Domain: c.Domain(), Authorization: Authorization{
		From: payer, To: c.PayTo, Value: new(big.Int).Set(c.Atomic),
		ValidAfter: big.NewInt(max(after, 0)), ValidBefore: big.NewInt(before),
		Nonce: NonceFor(receiptID),
	}}
	d, err := Digest(t.Domain, t.Authorization)
	if err != nil {
		return Terms{}, err
	}
	t.Digest = d
	return t, nil
}

// AuthorizationJSON is the authorization as x402's exact EVM scheme sends it.
type AuthorizationJSON struct {
	From        string `json:"from"`
	To          string `json:"to"`
	Value       string `json:"value"`
	ValidAfter  string `json:"validAfter"`
	ValidBefore string `json:"validBefore"`
	Nonce       string `json:"nonce"`
}

// JSON is the authorization's wire form.
func (a Authorization) JSON() AuthorizationJSON {
	return AuthorizationJSON{From: a.From.Hex(), To: a.To.Hex(), Value: a.Value.String(),
		ValidAfter: a.ValidAfter.String(), ValidBefore: a.ValidBefore.String(), Nonce: "0x" + hex.EncodeToString(a.Nonce[:])}
}

// ExactPayload is the exact EVM scheme's payload.
type ExactPayload struct {
	Signature     string            `json:"signature"`
	Authorization AuthorizationJSON `json:"authorization"`
}

// Payment is what the agent sends: the PaymentPayload and its header.
type Payment struct {
	// Payload is the x402 PaymentPayload (v2: x402Version, resource,
	// accepted, payload; v1: x402Version, scheme, network, payload).
	Payload json.RawMessage `json:"payload"`
	// Header is the base64 of Payload, for PAYMENT-SIGNATURE (v2) or
	// X-PAYMENT (v1).
	Header string `json:"header"`
	// HeaderName names the header it goes in.
	HeaderName string `json:"header_name"`
}

// BuildPayment assembles the PaymentPayload for a signed authorization.
// A v2 payload echoes the chosen entry exactly as the seller sent it (the
// seller matches accepted against its own requirements field by field).
func BuildPayment(pr *PaymentRequired, c Choice, t Terms, sig [65]byte) (Payment, error) {
	ep := ExactPayload{Signature: "0x" + hex.EncodeToString(sig[:]), Authorization: t.Authorization.JSON()}
	var v any
	name := "PAYMENT-SIGNATURE"
	if pr.Version == 1 {
		name = "X-PAYMENT"
		v = struct {
			X402Version int          `json:"x402Version"`
			Scheme      string       `json:"scheme"`
			Network     string       `json:"network"`
			Payload     ExactPayload `json:"payload"`
		}{1, c.Req.Scheme, c.Req.Network, ep}
	} else {
		v = struct {
			X402Version int             `json:"x402Version"`
			Resource    Resource        `json:"resource"`
			Accepted    json.RawMessage `json:"accepted"`
			Payload     ExactPayload    `json:"payload"`
		}{2, pr.Resource, c.Req.Raw, ep}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return Payment{}, fmt.Errorf("encode the payment payload: %w", err)
	}
	return Payment{Payload: b, Header: base64.StdEncoding.EncodeToString(b), HeaderName: name}, nil
}

// Sign signs t with s and checks the signature recovers to the payer
// before anyone sees it; of the in-process KeySigner, which signs with the
// payer's own key, only that it signed the digest t records.
func Sign(ctx context.Context, s Signer, t Terms) ([65]byte, error) {
	sig, err := s.SignAuthorization(ctx, t.Domain, t.Authorization)
	if err != nil {
		return sig, err
	}
	if ks, ok := s.(*KeySigner); ok && ks.addr == t.Authorization.From {
		// The key is in this process and signed Digest(Domain,
		// Authorization) itself, and the address is its key's: what it
		// signed recovers to the payer by construction, so only the digest
		// recorded is held to the one signed (a recovery costs more than
		// the rest of the signing).
		if d, err := Digest(t.Domain, t.Authorization); err == nil && d == t.Digest {
			return sig, nil
		}
	}
	got, err := Recover(t.Digest, sig)
	if err != nil {
		return sig, fmt.Errorf("the payer signer's answer: %w", err)
	}
	if got != t.Authorization.From {
		return sig, fmt.Errorf("the payer signer's signature recovers to %s, not the payer %s", got.Hex(), t.Authorization.From.Hex())
	}
	return sig, nil
}

// ResourceURL is the URL the seller declares for what is paid: v2's
// resource.url, or the v1 entry's resource.
func (pr *PaymentRequired) ResourceURL(c Choice) string {
	if pr.Version == 1 {
		return c.Req.Resource
	}
	return pr.Resource.URL
}

// SameResource compares the URL the agent asked for with the seller's
// declaration, both in canonical form (guard.CanonicalResource): scheme,
// host and path must agree, and the declared query must be none (sellers
// commonly declare the path only) or the asked one exactly, parameters in
// the same order. A seller that could declare a query the agent did not
// ask for could make every repeat of one payment look like a new resource.
func SameResource(asked, declared string) bool {
	a, err1 := guard.CanonicalResource(asked, false)
	d, err2 := guard.CanonicalResource(declared, false)
	if err1 != nil || err2 != nil {
		return false
	}
	ap, aq, _ := strings.Cut(a, "?")
	dp, dq, _ := strings.Cut(d, "?")
	return ap == dp && (dq == "" || dq == aq)
}
