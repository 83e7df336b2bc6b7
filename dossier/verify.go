package dossier

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Verdicts of Verify, worst last.
const (
	Valid      = "VALID"
	Unverified = "UNVERIFIED"
	Untrusted  = "UNTRUSTED"
	Malformed  = "MALFORMED"
	Tampered   = "TAMPERED"
)

var rank = map[string]int{Valid: 0, Unverified: 1, Untrusted: 2, Malformed: 3, Tampered: 4}

// ExitCode is verify's exit code of a verdict: 0 VALID, 1 UNVERIFIED, 2
// TAMPERED, 3 MALFORMED, 5 UNTRUSTED.
func ExitCode(verdict string) int {
	return map[string]int{Valid: 0, Unverified: 1, Tampered: 2, Malformed: 3, Untrusted: 5}[verdict]
}

// Link is one checked link of a dossier.
type Link struct {
	Link    string `json:"link"`
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
}

// Worst is the worst verdict of links (VALID when none).
func Worst(links []Link) string {
	w := Valid
	for _, l := range links {
		if rank[l.Verdict] > rank[w] {
			w = l.Verdict
		}
	}
	return w
}

// countOf writes "1 receipt", "2 receipts".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// Verify checks every link of a dossier offline. keyring nil means the
// file's own keyring (UNVERIFIED at best); trust, when set, holds the
// human decisions to a trusted reviewers file.
func Verify(data []byte, keyring noa.Keyring, trust *reviewlog.ReviewerTrust) []Link {
	var links []Link
	add := func(link, verdict, format string, a ...any) {
		links = append(links, Link{Link: link, Verdict: verdict, Reason: fmt.Sprintf(format, a...)})
	}
	var d File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil || (d.Format != Format && d.Format != FormatV1) {
		add("file", Malformed, "not a %s file: %v", Format, err)
		return links
	}
	// The seller keys the file carries, each bound to its kid: a JWS offer
	// or receipt is verified against them, and nothing else.
	carried := map[string]sellerkey.Key{}
	for i, k := range d.SellerKeys {
		key, err := sellerkey.ParseJWK(k.JWK)
		_, own, _ := sellerkey.FromKID(k.KID)
		switch {
		case k.Source != KeyPinnedByPolicy:
			add("seller key", Malformed, "seller_keys[%d] (%s): its source must be %q", i, k.KID, KeyPinnedByPolicy)
		case k.KID == "" || carried[k.KID].Thumbprint != "":
			add("seller key", Malformed, "seller_keys[%d]: the key identifier %q is empty or carried twice", i, k.KID)
		case own:
			add("seller key", Malformed, "seller_keys[%d]: %s carries its own key; a dossier carries only keys the policy pinned", i, k.KID)
		case err != nil:
			add("seller key", Tampered, "seller_keys[%d] (%s) cannot be read as the public key export wrote: %v", i, k.KID, err)
		default:
			carried[k.KID] = key
		}
	}
	lookupCarried := func(kid string) (sellerkey.Key, bool) { k, ok := carried[kid]; return k, ok }
	// pinnedNote says, beside a JWS signer, that its key was carried and
	// where it came from.
	pinnedNote := func(who x402.ArtifactSigner) string {
		if _, ok := carried[who.KID]; who.Format != x402.FormatJWS || !ok {
			return ""
		}
		return "; its key is carried in the dossier, pinned by the operator's policy (sellerKeys), not resolved from " + who.KID
	}
	keys, keysFrom := keyring, "--keyring"
	if keys == nil {
		keys, keysFrom = d.Keyring, "the file's own keyring"
	}
	// A passkey's decision is sealed with the server's key: the keyring
	// in use is what checks the seal (the file's own only when no
	// --keyring is given, and then nothing is VALID).
	if trust != nil && trust.ServerKeys == nil {
		t := *trust
		t.ServerKeys = keys
		trust = &t
	}
	// Every receipt: its content hash, its signature, its link to the one
	// before it in its segment.
	receipts := map[string]noa.Receipt{}
	for _, s := range d.Segments {
		var prev *noa.Receipt
		bad := ""
		verdict := Valid
		read := 0
		for i, raw := range s.Receipts {
			rc, err := noa.ParseReceipt(raw)
			if err != nil {
				verdict, bad = Malformed, fmt.Sprintf("receipt %d: %v", i, err)
				break
			}
			if reviewlog.ChainIDOf(rc.Scope.Chain) != s.Chain {
				verdict, bad = Tampered, fmt.Sprintf("receipt %s is of chain %s, not %s", rc.ID, rc.Scope.Chain, s.Chain)
				break
			}
			if prev != nil {
				if why := linked(prev, &rc); why != "" {
					verdict, bad = Tampered, why
					break
				}
			}
			if rc.Agent.Principal == noa.PrincipalHuman && trust != nil {
				if why := trust.DecisionProblem(rc); why != "" {
					verdict, bad = Untrusted, fmt.Sprintf("the human decision %s does not count: %s", rc.ID, why)
					break
				}
			} else if spki, ok := keys[rc.Sig.KID]; !ok {
				if rc.Agent.Principal == noa.PrincipalHuman {
					if !hashHolds(rc) {
						verdict, bad = Tampered, fmt.Sprintf("receipt %s: hash mismatch (content altered)", rc.ID)
						break
					}
					if rank[Unverified] > rank[verdict] {
						verdict, bad = Unverified, fmt.Sprintf("the human decision %s is signed by reviewer key %s: hold it to --reviewers", rc.ID, rc.Sig.KID)
					}
				} else {
					verdict, bad = Tampered, fmt.Sprintf("receipt %s is signed with key %s, which %s does not hold", rc.ID, rc.Sig.KID, keysFrom)
					break
				}
			} else {
				pub, err := noa.DecodeSPKI(spki)
				if err == nil {
					err = noa.VerifySignature(rc, ed25519.PublicKey(pub))
				}
				if err != nil {
					verdict, bad = Tampered, fmt.Sprintf("receipt %s does not verify: %v", rc.ID, err)
					break
				}
			}
			receipts[rc.ID] = rc
			r := rc
			prev = &r
			read++
		}
		if verdict == Valid {
			if keyring == nil {
				verdict, bad = Unverified, "signatures verify under the file's own keyring; pass --keyring to trust your own copy"
			} else {
				bad = "every receipt's hash, signature and link verify"
			}
		}
		add("segment "+s.Chain, verdict, "%s: %s", countOf(len(s.Receipts), "receipt"), bad)
		// The checkpoints prove a segment read to its end.
		if read == len(s.Receipts) {
			checkpoints(s, prev, d.Format, keys, keysFrom, keyring == nil, add)
		}
	}
	a := d.Authorization
	need := func(link, id string) (noa.Receipt, bool) {
		rc, ok := receipts[id]
		if !ok {
			add(link, Tampered, "the receipt %s is in no verified segment of the file", id)
		}
		return rc, ok
	}
	// The decision.
	if rc, ok := need("decision", a.DecisionReceipt); ok {
		if rc.Governance.Verdict != noa.VerdictAllowed {
			add("decision", Tampered, "receipt %s says %s, not ALLOWED", rc.ID, rc.Governance.Verdict)
		} else {
			add("decision", Valid, "receipt %s: ALLOWED at %s", rc.ID, rc.TS)
		}
	}
	// The human decision.
	if a.ReviewID != "" {
		switch {
		case d.Review == nil || d.Review.ID != a.ReviewID:
			add("human decision", Tampered, "the authorization used review %s, and the file carries no record of it", a.ReviewID)
		default:
			humans := 0
			for _, id := range d.HumanReceipts {
				if rc, ok := receipts[id]; ok && rc.Agent.Principal == noa.PrincipalHuman && rc.Action.ID == "review:"+a.ReviewID && rc.Governance.Verdict == noa.VerdictAllowed {
					humans++
				}
			}
			if humans == 0 {
				add("human decision", Tampered, "no signed human decision of review %s is in the file", a.ReviewID)
			} else {
				add("human decision", Valid, "review %s %s by %s (%s), signed", a.ReviewID, d.Review.Status, d.Review.DecidedBy, d.Review.DecidedWith)
			}
		}
	}
	// The authorization: digest, payer's signature, nonce, its receipt
	// (and whether it seals the seller's offer: sealHolds once its
	// signature covers the file's offer_seal).
	var authReceipt *noa.Receipt
	sealHolds := false
	digest, err := AuthorizationDigest(a)
	switch {
	case err != nil:
		add("authorization", Malformed, "its terms cannot be read: %v", err)
	case "0x"+hex.EncodeToString(digest[:]) != a.Digest:
		add("authorization", Tampered, "its terms hash to 0x%x, not the EIP-712 digest recorded (%s)", digest, a.Digest)
	default:
		why := ""
		var sig [65]byte
		if b, err := hex.DecodeString(strings.TrimPrefix(a.Signature, "0x")); err == nil && len(b) == 65 {
			copy(sig[:], b)
			if who, err := x402.Recover(digest, sig); err != nil || !strings.EqualFold(who.Hex(), a.From) {
				why = "the payer's signature does not recover to " + a.From
			}
		} else {
			why = "the signature is not 65 bytes of hex"
		}
		if n := x402.NonceFor(a.DecisionReceipt); "0x"+hex.EncodeToString(n[:]) != strings.ToLower(a.Nonce) || strings.ToLower(a.Nonce) != d.Nonce {
			why = "the nonce is not the one derived from decision receipt " + a.DecisionReceipt
		}
		if why != "" {
			add("authorization", Tampered, "%s", why)
		} else {
			add("authorization", Valid, "%s from %s to %s on %s, EIP-712 digest %s, signed by the payer", amountText(a.Network, a.Token, a.Value), a.From, a.To, a.Network, a.Digest)
		}
		if rc, ok := need("authorization receipt", a.Receipt); ok {
			authReceipt = &rc
			switch {
			case rc.Action.ID != "x402-authorization:"+strings.ToLower(a.Nonce):
				add("authorization receipt", Tampered, "receipt %s signs another authorization", rc.ID)
			case engine.SealsOffer(rc) != (a.OfferSeal != nil):
				// Named by the offer seal's link below.
			case rc.Action.ParamsHash != engine.AuthorizationReceiptParamsHash(digest, a):
				if a.OfferSeal != nil {
					add("authorization receipt", Tampered, "receipt %s signs this authorization with another offer seal: offer_seal was edited", rc.ID)
				} else {
					add("authorization receipt", Tampered, "receipt %s signs another authorization", rc.ID)
				}
			case a.OfferSeal != nil:
				sealHolds = true
				add("authorization receipt", Valid, "receipt %s signs this digest and the offer seal", rc.ID)
			default:
				add("authorization receipt", Valid, "receipt %s signs this digest", rc.ID)
			}
		}
	}
	// The seller's offer.
	if len(a.Offer) > 0 {
		art, err := x402.ParseArtifact(a.Offer, true)
		var terms x402.OfferTerms
		var who x402.ArtifactSigner
		if err == nil {
			terms, who, err = x402.VerifyOffer(art, lookupCarried)
		}
		switch {
		case err != nil && art.Format == x402.FormatJWS && strings.Contains(err.Error(), "not known here"):
			add("seller offer", Unverified, "%v", err)
		case err != nil:
			add("seller offer", Tampered, "%v", err)
		case who.String() != a.OfferSigner:
			add("seller offer", Tampered, "signed by %s, not the signer recorded (%s)", who.String(), a.OfferSigner)
		default:
			if f := offerAgainst(terms, a); f != "" {
				add("seller offer", Tampered, "%s", f)
			} else {
				add("seller offer", Valid, "signed by %s; its terms are the authorization's%s", who.String(), pinnedNote(who))
			}
		}
	}
	offerSealLinks(a, authReceipt, sealHolds, lookupCarried, add)
	// The settlement and the seller's receipt.
	if s := d.Settlement; s != nil {
		sd := payment.SettlementDigest(*s)
		switch {
		case "0x"+hex.EncodeToString(sd[:]) != s.Digest:
			add("settlement", Tampered, "its record hashes to 0x%x, not the digest recorded (%s)", sd, s.Digest)
		case !strings.EqualFold(s.Nonce, a.Nonce) || s.DecisionReceipt != a.DecisionReceipt || s.AuthorizationReceipt != a.Receipt:
			add("settlement", Tampered, "it names another authorization")
		default:
			if rc, ok := need("settlement", s.Receipt); ok {
				if rc.Action.ParamsHash != engine.AuthorizationParamsHash(sd) || rc.Action.ID != "x402-settlement:"+strings.ToLower(a.Nonce) {
					add("settlement", Tampered, "receipt %s signs another settlement", rc.ID)
				} else {
					add("settlement", Valid, "transaction %s on %s, payer %s; receipt %s; from %s", s.Transaction, s.Network, s.Payer, rc.ID, SettlementSource(*s))
				}
			}
		}
		if len(s.SellerReceipt) > 0 {
			art, err := x402.ParseArtifact(s.SellerReceipt, false)
			var who x402.ArtifactSigner
			if err == nil {
				_, who, err = x402.VerifyReceipt(art, lookupCarried)
			}
			switch {
			case err != nil && art.Format == x402.FormatJWS && strings.Contains(err.Error(), "not known here"):
				add("seller receipt", Unverified, "%v", err)
			case err != nil:
				add("seller receipt", Tampered, "%v", err)
			case who.String() != s.SellerReceiptSigner:
				add("seller receipt", Tampered, "signed by %s, not the signer recorded (%s)", who.String(), s.SellerReceiptSigner)
			default:
				add("seller receipt", Valid, "signed by %s%s", who.String(), pinnedNote(who))
			}
		}
		for _, f := range s.Findings {
			add("seller finding", Valid, "recorded at settlement, for a person to weigh: %s", f)
		}
	}
	return links
}

// linked says what is wrong with rc following prev in one chain ("" when
// nothing): the next receipt of prev's partition, or the continuation that
// opens the next partition and names prev as its previous head.
func linked(prev, rc *noa.Receipt) string {
	if rc.Scope.Chain == prev.Scope.Chain {
		if rc.Chain.Seq != prev.Chain.Seq+1 || rc.Chain.PrevHash == nil || *rc.Chain.PrevHash != prev.Chain.Hash {
			return fmt.Sprintf("receipt %s (seq %d) is not linked to %s (seq %d)", rc.ID, rc.Chain.Seq, prev.ID, prev.Chain.Seq)
		}
		return ""
	}
	base, k, _ := reviewlog.ParseSegmentFile(prev.Scope.Chain + ".ndjson")
	switch {
	case rc.Scope.Chain != noa.SegmentChain(base, k+1) || rc.Chain.Seq != 0:
		return fmt.Sprintf("receipt %s (seq %d of %s) does not follow %s (seq %d of %s)", rc.ID, rc.Chain.Seq, rc.Scope.Chain, prev.ID, prev.Chain.Seq, prev.Scope.Chain)
	case rc.Action.Canonical != noa.ContinueCanonical || rc.Action.ID != prev.Scope.Chain || rc.Action.ParamsHash != prev.Chain.Hash:
		return fmt.Sprintf("receipt %s opens %s without a %s naming %s's head %s", rc.ID, rc.Scope.Chain, noa.ContinueCanonical, prev.Scope.Chain, prev.Chain.Hash)
	}
	return ""
}

// hashHolds reports whether a receipt's chain.hash is the hash of its
// content.
func hashHolds(rc noa.Receipt) bool {
	input, err := rc.HashInput()
	if err != nil {
		return false
	}
	s := sha256.Sum256(input)
	return "sha256:"+hex.EncodeToString(s[:]) == rc.Chain.Hash
}

// checkpoints checks a segment's link and checkpoints, given its last
// receipt (verified): the link's receipts follow it, each hash holding (a
// signature checked where keys hold its key: the hashes are what link the
// segment to the head, and the checkpoint's signature is what vouches for
// the head); each checkpoint is signed by a key of keys and names a
// receipt from the segment's last on; the export checkpoint names the
// link's last receipt.
func checkpoints(s Segment, last *noa.Receipt, format string, keys noa.Keyring, keysFrom string, ownKeys bool, add func(link, verdict, format string, a ...any)) {
	name := "checkpoint " + s.Chain
	if format == FormatV1 {
		add(name, Unverified, "a %s file carries no checkpoint: nothing shows the segment is part of its chain as it stands; export the dossier again", FormatV1)
		return
	}
	if last == nil {
		add(name, Tampered, "the segment is empty: no checkpoint can prove it")
		return
	}
	// The link.
	reach := []noa.Receipt{*last}
	prev := last
	for i, raw := range s.Link {
		rc, err := noa.ParseReceipt(raw)
		if err != nil {
			add(name, Malformed, "link receipt %d: %v", i, err)
			return
		}
		if why := linked(prev, &rc); why != "" {
			add(name, Tampered, "the link from the segment to the checkpoint is broken: %s", why)
			return
		}
		if !hashHolds(rc) {
			add(name, Tampered, "link receipt %s: hash mismatch (content altered)", rc.ID)
			return
		}
		if spki, ok := keys[rc.Sig.KID]; ok {
			pub, err := noa.DecodeSPKI(spki)
			if err == nil {
				err = noa.VerifySignature(rc, ed25519.PublicKey(pub))
			}
			if err != nil {
				add(name, Tampered, "link receipt %s does not verify: %v", rc.ID, err)
				return
			}
		}
		reach = append(reach, rc)
		prev = &reach[len(reach)-1]
	}
	if s.LinkOmitted < 0 {
		add(name, Tampered, "link_omitted is %d", s.LinkOmitted)
		return
	}
	exports := 0
	for _, c := range s.Checkpoints {
		cp, err := noa.ParseCheckpoint(c.Checkpoint)
		switch {
		case err != nil && errors.Is(err, noa.ErrCheckpointInvalid):
			add(name, Tampered, "a %s checkpoint is not a valid statement: %v", c.Kind, err)
			continue
		case err != nil:
			add(name, Malformed, "a %s checkpoint: %v", c.Kind, err)
			continue
		case c.Kind != KindExport && c.Kind != KindKept:
			add(name, Malformed, "a checkpoint of kind %q (want %s or %s)", c.Kind, KindExport, KindKept)
			continue
		case reviewlog.ChainIDOf(cp.Chain) != s.Chain:
			add(name, Tampered, "the %s checkpoint is of chain %s, not %s", c.Kind, cp.Chain, s.Chain)
			continue
		}
		switch noa.CheckpointSignature(cp, keys) {
		case "ok":
		case "unverified":
			add(name, Tampered, "the %s checkpoint is signed with key %s, which %s does not hold", c.Kind, cp.Sig.KID, keysFrom)
			continue
		default:
			add(name, Tampered, "the %s checkpoint's signature does not verify under key %s", c.Kind, cp.Sig.KID)
			continue
		}
		at := -1
		for i := range reach {
			if reach[i].Scope.Chain == cp.Chain && reach[i].Chain.Seq == cp.HighestSeq {
				at = i
				if reach[i].Chain.Hash != cp.HeadHash {
					at = -2
				}
				break
			}
		}
		verdict, why := Valid, ""
		if c.Kind == KindExport {
			exports++
		}
		switch {
		case at == -2:
			verdict, why = Tampered, fmt.Sprintf("its head (seq %d of %s) is %s, and the receipt there in the file is another", cp.HighestSeq, cp.Chain, cp.HeadHash)
		case c.Kind == KindExport && s.LinkOmitted > 0 && at >= 0:
			verdict, why = Tampered, fmt.Sprintf("it names seq %d of %s, which the file carries, while the file says %s of the link are not carried", cp.HighestSeq, cp.Chain, countOf(s.LinkOmitted, "receipt"))
		case c.Kind == KindExport && s.LinkOmitted > 0:
			if ln := reach[len(reach)-1]; ln.Scope.Chain == cp.Chain && cp.HighestSeq-ln.Chain.Seq != int64(s.LinkOmitted) {
				verdict, why = Tampered, fmt.Sprintf("its head is seq %d of %s, %d receipts past the link's end, not the %d the file says it left out", cp.HighestSeq, cp.Chain, cp.HighestSeq-ln.Chain.Seq, s.LinkOmitted)
			} else {
				verdict, why = Unverified, fmt.Sprintf("the chain's head (seq %d of %s) was %s past what the file carries (more than %d): the link to it cannot be checked offline; check the chain itself with verify --follow --checkpoint", cp.HighestSeq, cp.Chain, countOf(s.LinkOmitted, "receipt"), DefaultMaxLink)
			}
		case at < 0:
			verdict, why = Tampered, fmt.Sprintf("its head (seq %d of %s) is not among the segment's last receipt and the %s of the link: the segment is not linked to it", cp.HighestSeq, cp.Chain, countOf(len(s.Link), "receipt"))
		case c.Kind == KindExport && at != len(reach)-1:
			verdict, why = Tampered, fmt.Sprintf("it names seq %d of %s, and the link goes on past it: the head it names is not the link's end", cp.HighestSeq, cp.Chain)
		}
		if verdict == Valid && ownKeys {
			verdict = Unverified
		}
		if why == "" {
			what := "the chain's head when the dossier was exported"
			if c.Kind == KindKept {
				what = "a checkpoint the operator kept"
			}
			how := "the segment links to it through " + countOf(at, "receipt")
			if at == 0 {
				how = "it is the segment's last receipt"
			}
			why = fmt.Sprintf("%s: seq %d of %s, signed by %s at %s; %s", what, cp.HighestSeq, cp.Chain, cp.Sig.KID, cp.TS, how)
			if ownKeys {
				why += " (under the file's own keyring)"
			}
		}
		add(name, verdict, "%s", why)
	}
	if exports != 1 {
		add(name, Tampered, "the segment carries %d checkpoints of its chain's head at export, not 1", exports)
	}
}

// offerAgainst names the first term of an offer that is not the
// authorization's ("" when all are).
func offerAgainst(t x402.OfferTerms, a reviewlog.Authorized) string {
	switch {
	case !strings.EqualFold(t.PayTo, a.To):
		return fmt.Sprintf("payTo: the offer signs %s, the authorization pays %s", t.PayTo, a.To)
	case t.Amount != a.Value:
		return fmt.Sprintf("amount: the offer signs %s, the authorization moves %s", t.Amount, a.Value)
	case !strings.EqualFold(t.Asset, a.Token):
		return fmt.Sprintf("asset: the offer signs %s, the authorization moves %s", t.Asset, a.Token)
	case t.Network != a.Network:
		return fmt.Sprintf("network: the offer signs %s, the authorization is on %s", t.Network, a.Network)
	case a.Resource != "" && !x402.SameResource(a.Resource, t.ResourceURL):
		return fmt.Sprintf("resourceUrl: the offer signs %s, the authorization paid for %s", t.ResourceURL, a.Resource)
	}
	return ""
}

// offerSealLinks checks the seller's offer the authorization's receipt
// sealed (reviewlog.OfferSeal) against what the file carries: the offer,
// its format, its signer and the key that verifies it. rc is the
// authorization's verified receipt (nil when none), sealHolds whether its
// paramsHash covers the file's offer_seal. Each field that differs is its
// own TAMPERED link, named.
func offerSealLinks(a reviewlog.Authorized, rc *noa.Receipt, sealHolds bool, lookup x402.KeyLookup, add func(link, verdict, format string, a ...any)) {
	const link = "offer seal"
	if rc == nil {
		return
	}
	seal := a.OfferSeal
	switch sealed := engine.SealsOffer(*rc); {
	case !sealed && seal == nil:
		if len(a.Offer) > 0 {
			add(link, Valid, "no offer sealed: receipt %s was signed before authorizations sealed their offer, so which offer was accepted is the record's word; the offer's own signature and terms are checked above", rc.ID)
		}
		return
	case !sealed:
		add(link, Tampered, "offer_seal: the file's authorization carries one, and its receipt %s seals no offer", rc.ID)
		return
	case seal == nil:
		add(link, Tampered, "offer_seal: receipt %s seals the seller's offer the server accepted, and the file's authorization carries no offer_seal (the offer, its signer and its key cannot be checked against it)", rc.ID)
		return
	case !sealHolds:
		// The authorization receipt's link says the seal was edited.
		return
	}
	bad := 0
	tampered := func(format string, args ...any) { bad++; add(link, Tampered, format, args...) }
	if len(a.Offer) == 0 {
		tampered("offer: receipt %s sealed the seller's offer %s (%s), and the file carries no offer", rc.ID, seal.Offer, seal.Format)
		return
	}
	if d, err := reviewlog.OfferDigest(a.Offer); err != nil || d != seal.Offer {
		tampered("offer: the file's offer hashes to %s, and receipt %s sealed %s: it is not the offer the server accepted", d, rc.ID, seal.Offer)
	}
	art, err := x402.ParseArtifact(a.Offer, true)
	if err == nil && art.Format != seal.Format {
		tampered("format: the file's offer is %s, and receipt %s sealed a %s offer", art.Format, rc.ID, seal.Format)
	}
	if a.OfferSigner != seal.Signer {
		tampered("offer_signer: the file records %q, and receipt %s sealed %q", a.OfferSigner, rc.ID, seal.Signer)
	}
	key, known := "", false
	if err == nil && seal.Key != "" {
		key, known = offerKey(art, lookup)
		switch {
		case !known && art.Format == x402.FormatJWS:
			add(link, Unverified, "pinned key: receipt %s sealed key %s, and the file carries no key for the offer's key identifier", rc.ID, seal.Key)
			bad++
		case !known:
			tampered("key: the file's offer recovers to no address, and receipt %s sealed %s", rc.ID, seal.Key)
		case key != seal.Key && art.Format == x402.FormatJWS:
			tampered("pinned key: the file carries key %s for the offer's key identifier, and receipt %s sealed key %s", key, rc.ID, seal.Key)
		case key != seal.Key:
			tampered("key: the file's offer is signed by %s, and receipt %s sealed %s", key, rc.ID, seal.Key)
		}
	}
	if bad == 0 {
		signer := seal.Signer
		if signer == "" {
			signer = "a signer whose signature did not verify when it was accepted"
		}
		add(link, Valid, "receipt %s sealed this offer (%s, %s), signed by %s: the file's offer, signer and key are the ones the server accepted", rc.ID, seal.Format, seal.Offer, signer)
	}
}

// offerKey is the key that verifies an offer as the file carries it: the
// RFC 7638 thumbprint of the JWS key its key identifier names (the file's
// pinned key, else a did:jwk identifier's own), or the lower-case address
// an EIP-712 signature recovers to. known is false when there is none.
func offerKey(art x402.Artifact, lookup x402.KeyLookup) (string, bool) {
	if art.Format == x402.FormatEIP712 {
		_, who, err := x402.VerifyOffer(art, nil)
		if err != nil {
			return "", false
		}
		return strings.ToLower(who.Address), true
	}
	c, err := sellerkey.ParseCompact(art.Signature)
	if err != nil {
		return "", false
	}
	if k, ok := lookup(c.Header.KID); ok {
		return k.Thumbprint, true
	}
	if k, own, err := sellerkey.FromKID(c.Header.KID); own && err == nil {
		return k.Thumbprint, true
	}
	return "", false
}

// amountText is an authorization's amount as a person reads it: with its
// symbol for an asset every policy knows ("0.25 USDC (250000 atomic
// units)"), in atomic units alone for any other (the verifier holds no
// policy to name it by).
func amountText(network, token, value string) string {
	if key, _, err := guard.AssetKey(network, token); err == nil {
		if as, ok := guard.BuiltinAsset(key); ok {
			if n, ok := new(big.Int).SetString(value, 10); ok && n.Sign() >= 0 {
				return fmt.Sprintf("%s %s (%s atomic units)", guard.FormatDisplay(n, as.Decimals), as.Symbol, value)
			}
		}
	}
	return value + " atomic units"
}
