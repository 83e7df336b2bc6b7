package guard

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
)

// RuleSignedOffer is the rule that judges a seller's signed offer (the
// x402 Offer and Receipt extension): a signature that does not verify,
// terms that differ from the entry paid, a signer that does not speak for
// the seller, or no signed offer where the policy requires one, is review.
const RuleSignedOffer = "signed_offer"

// maxSellerKeys bounds the keys the policy names per counterparty.
const maxSellerKeys = 16

// SellerKey is one key the policy trusts to sign offers and receipts for a
// counterparty: an EVM address (EIP-712), or a JWS key identifier with its
// key (a did:jwk identifier carries its key; any other names it beside).
type SellerKey struct {
	Counterparty Counterparty
	// Address is the lower-case 0x address of an EIP-712 signer, or "".
	Address string
	// KID and Key are a JWS signer's key identifier and public key.
	KID string
	Key sellerkey.Key
}

// OfferEvidence is what the payment reader found about the seller's
// signed offer for the entry it would pay; the engine's question carries
// it and Decide judges it. nil: the question came with no 402 (so nothing
// can be said about offers).
type OfferEvidence struct {
	// Carried: the 402 carries signed offers.
	Carried bool `json:"carried"`
	// Problem names the field or fault that keeps the offer from being
	// trusted ("" when its signature verified and its terms equal the
	// entry's).
	Problem string `json:"problem,omitempty"`
	// Signer is the verified signer as a person reads it; SignerAddress
	// (EIP-712, lower case) or SignerKID and SignerThumbprint (JWS) name
	// it for the trust check.
	Signer           string `json:"signer,omitempty"`
	SignerAddress    string `json:"signer_address,omitempty"`
	SignerKID        string `json:"signer_kid,omitempty"`
	SignerThumbprint string `json:"signer_thumbprint,omitempty"`
	// Index is the entry of accepts the offer is for.
	Index int `json:"index"`
}

// requiresSignedOffer says whether the policy requires a signed offer from
// the counterparty (or the payee beside it).
func (c *Config) requiresSignedOffer(cp Counterparty, payTo string) bool {
	if c.RequireSignedOffers {
		return true
	}
	for _, r := range c.RequireSignedOffersFrom {
		if r == cp || (payTo != "" && r.Kind == KindAddress && r.Value == payTo) {
			return true
		}
	}
	return false
}

// TrustsSigner says whether the policy names the signer for the
// counterparty or the payee beside it. An EIP-712 signer that is the payee
// itself is trusted (the extension's simplest binding: the payTo key signs).
func (c *Config) TrustsSigner(cp Counterparty, payTo string, ev OfferEvidence) bool {
	if ev.SignerAddress != "" && payTo != "" && ev.SignerAddress == payTo {
		return true
	}
	for _, k := range c.SellerKeys {
		if k.Counterparty != cp && (payTo == "" || k.Counterparty != (Counterparty{Kind: KindAddress, Value: payTo})) {
			continue
		}
		if ev.SignerAddress != "" && k.Address == ev.SignerAddress {
			return true
		}
		if ev.SignerKID != "" && k.KID == ev.SignerKID && k.Key.Thumbprint == ev.SignerThumbprint {
			return true
		}
	}
	return false
}

// SellerKeyFor finds the JWS key the policy names by kid, for any
// counterparty (whether it speaks for this one is TrustsSigner's question).
func (c *Config) SellerKeyFor(kid string) (sellerkey.Key, bool) {
	for _, k := range c.SellerKeys {
		if k.KID == kid {
			return k.Key, true
		}
	}
	return sellerkey.Key{}, false
}

// SellerKeysPinned lists the JWS keys the policy pins under kid, in this
// layer and every agent's (a dossier carries the one that verified an
// offer or receipt; which layer trusted it was the decision's question).
func (c *Config) SellerKeysPinned(kid string) []sellerkey.Key {
	var out []sellerkey.Key
	add := func(cfg *Config) {
		for _, k := range cfg.SellerKeys {
			if k.KID == kid && !slices.ContainsFunc(out, func(o sellerkey.Key) bool { return o.Thumbprint == k.Key.Thumbprint }) {
				out = append(out, k.Key)
			}
		}
	}
	add(c)
	names := make([]string, 0, len(c.Agents))
	for n := range c.Agents {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		add(c.Agents[n])
	}
	return out
}

// signedOffer is the rule: nil evidence says nothing.
func signedOffer(req Request, cfg *Config) (Reason, string, bool) {
	ev := req.Offer
	if ev == nil {
		return Reason{}, "", false
	}
	who := req.Counterparty.Value
	switch {
	case ev.Problem != "":
		return Reason{Rule: RuleSignedOffer, Detail: fmt.Sprintf("the seller's signed offer for accepts[%d] cannot be trusted: %s", ev.Index, ev.Problem)}, Review, true
	case !ev.Carried:
		if cfg.requiresSignedOffer(req.Counterparty, req.PayTo) {
			return Reason{Rule: RuleSignedOffer, Detail: fmt.Sprintf("the policy requires a signed offer from %s, and its 402 carries none", who)}, Review, true
		}
		return Reason{}, "", false
	case !cfg.TrustsSigner(req.Counterparty, req.PayTo, *ev):
		return Reason{Rule: RuleSignedOffer, Detail: fmt.Sprintf("the offer for accepts[%d] is signed by %s, which is neither the payTo nor a key the policy's sellerKeys name for %s", ev.Index, ev.Signer, who)}, Review, true
	}
	return Reason{Rule: RuleSignedOffer, Detail: fmt.Sprintf("the offer for accepts[%d] is signed by %s, a signer trusted for %s; its terms are the entry's", ev.Index, ev.Signer, who)}, "", true
}

// readRequireSignedOffers reads requireSignedOffers: true, false, or a
// list of counterparties.
func (c *Config) readRequireSignedOffers(raw json.RawMessage, at Path, ps *problems) {
	switch strings.TrimSpace(string(raw)) {
	case "true":
		c.RequireSignedOffers, c.RequireSignedOffersFrom = true, nil
		return
	case "false", "null":
		c.RequireSignedOffers, c.RequireSignedOffersFrom = false, nil
		return
	}
	list, ok := readCounterparties(raw, at, ps)
	if !ok {
		ps.add(at, fmt.Errorf("%w: %s must be true, false or a list of counterparties", ErrConfig, at))
		return
	}
	c.RequireSignedOffers, c.RequireSignedOffersFrom = false, list
}

// readSellerKeys reads sellerKeys: an object from counterparty to a list
// of keys, each an EVM address, a did:jwk key identifier, or {"kid":
// "...", "jwk": {...}}. A layer's keys add to the wider layer's.
func (c *Config) readSellerKeys(raw json.RawMessage, at Path, ps *problems) {
	entries, err := objectMembers(raw, at.String())
	if err != nil {
		ps.add(at, err)
		return
	}
	before := ps.count()
	var add []SellerKey
	for _, e := range entries {
		eat := at.with(e.key)
		cp, err := ParseCounterparty(e.key)
		if err != nil {
			ps.add(eat, fmt.Errorf("%w: %s: %w", ErrConfig, eat, err))
			continue
		}
		var items []json.RawMessage
		if err := json.Unmarshal(e.value, &items); err != nil || items == nil {
			ps.add(eat, fmt.Errorf("%w: %s must be a list of keys", ErrConfig, eat))
			continue
		}
		if len(items) == 0 || len(items) > maxSellerKeys {
			ps.add(eat, fmt.Errorf("%w: %s must name between 1 and %d keys", ErrConfig, eat, maxSellerKeys))
			continue
		}
		for i, it := range items {
			iat := eat.with(i)
			k, err := readSellerKey(it, iat.String())
			if err != nil {
				ps.add(iat, err)
				continue
			}
			k.Counterparty = cp
			add = append(add, k)
		}
	}
	if ps.count() != before {
		return
	}
	c.SellerKeys = append(slices.Clip(c.SellerKeys), add...)
}

func readSellerKey(raw json.RawMessage, where string) (SellerKey, error) {
	if s, err := readString(raw, where); err == nil {
		if strings.HasPrefix(s, "did:") {
			k, ok, err := sellerkey.FromKID(s)
			if err != nil {
				return SellerKey{}, fmt.Errorf("%w: %s: %w", ErrConfig, where, err)
			}
			if !ok {
				return SellerKey{}, fmt.Errorf("%w: %s: the key identifier %q carries no key; name it as {\"kid\": %q, \"jwk\": {...}} with its public JWK (keys are never fetched)", ErrConfig, where, clip(s), clip(s))
			}
			return SellerKey{KID: s, Key: k}, nil
		}
		addr, err := PayToAddress(s)
		if err != nil {
			return SellerKey{}, fmt.Errorf("%w: %s: %w (a seller key is an address, a did:jwk identifier, or {\"kid\", \"jwk\"})", ErrConfig, where, err)
		}
		return SellerKey{Address: addr}, nil
	}
	m, err := objectMembers(raw, where)
	if err != nil {
		return SellerKey{}, fmt.Errorf("%w: %s must be an address, a did:jwk identifier, or {\"kid\": \"...\", \"jwk\": {...}}", ErrConfig, where)
	}
	var out SellerKey
	for _, im := range m {
		switch im.key {
		case "kid":
			s, err := readString(im.value, where+".kid")
			if err != nil || s == "" || len(s) > 512 {
				return SellerKey{}, fmt.Errorf("%w: %s.kid must be a key identifier of at most 512 bytes", ErrConfig, where)
			}
			out.KID = s
		case "jwk":
			k, err := sellerkey.ParseJWK(im.value)
			if err != nil {
				return SellerKey{}, fmt.Errorf("%w: %s.jwk: %w", ErrConfig, where, err)
			}
			out.Key = k
		default:
			return SellerKey{}, fmt.Errorf("%w: unknown key %q in %s (known: kid, jwk)", ErrConfig, clip(im.key), where)
		}
	}
	if out.KID == "" || out.Key.Thumbprint == "" {
		return SellerKey{}, fmt.Errorf("%w: %s must name both kid and jwk", ErrConfig, where)
	}
	return out, nil
}
