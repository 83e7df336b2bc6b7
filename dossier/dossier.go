// Package dossier builds and verifies one x402 payment's evidence in one
// self-contained file (haia.dossier/0.2): the decision receipt, the human
// decision, the authorization with its EIP-712 digest, the seller's signed
// offer and receipt, the settlement, and the segments of the decision
// chains that hold every receipt, each proved part of its chain by signed
// checkpoints. The CLI (dossier export, dossier verify) and the reviewer
// console serve the same file, built here.
package dossier

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Format names the file's format. Version 0.1 carried no checkpoints.
const (
	Format   = "haia.dossier/0.2"
	FormatV1 = "haia.dossier/0.1"
)

// DefaultMaxLink is how many receipts of a chain after a segment's last
// one a dossier carries at most to link the segment to its chain's head.
// Past it the link stops at the newest kept checkpoint within reach (if
// any) and the receipts beyond are counted, not carried (LinkOmitted).
const DefaultMaxLink = 20000

// Checkpoint kinds.
const (
	// KindExport is the checkpoint of the chain's head signed when the
	// dossier was built.
	KindExport = "export"
	// KindKept is a checkpoint the operator kept (signed by chain
	// checkpoint before the dossier was built).
	KindKept = "kept"
)

// File is the dossier.
type File struct {
	Format     string `json:"format"`
	ExportedAt string `json:"exported_at"`
	Nonce      string `json:"nonce"`
	// Authorization is the signed authorization as recorded (terms,
	// payer's signature, EIP-712 digest, the seller's offer and its
	// signer, the receipts it names).
	Authorization reviewlog.Authorized `json:"authorization"`
	// Review is the human decision it used (nil when none), as the
	// signatures proved it at export, and HumanReceipts the receipts that
	// record the review.
	Review        *reviewlog.Review `json:"review,omitempty"`
	HumanReceipts []string          `json:"human_receipts,omitempty"`
	// Settlement is what record_receipt recorded or the server read from
	// the Trace (its Source says which; nil when none).
	Settlement *reviewlog.Settled `json:"settlement,omitempty"`
	// Segments are runs of consecutive receipts of each decision chain
	// that hold every receipt named above.
	Segments []Segment `json:"segments"`
	// Keyring is the store's keyring at export; verify trusts it only
	// when no --keyring is given, and says so (UNVERIFIED).
	Keyring noa.Keyring `json:"keyring"`
	// SellerKeys are the public keys of the JWS offer and receipt whose key
	// identifier carries no key (did:web …): the keys the operator's
	// policy pins for them (sellerKeys), looked up at export and carried
	// only when one verifies the artifact as the signer recorded when it
	// was verified (alg, kid and RFC 7638 thumbprint). Nothing is fetched,
	// at export or at verify.
	SellerKeys []SellerKey `json:"seller_keys,omitempty"`
	// NOA is the settlement in the shape of noa.settlement-evidence/0.1
	// where this product has its fields (see docs/payments.md): unsigned.
	NOA map[string]any `json:"noa_settlement_evidence,omitempty"`
}

// SellerKey is one carried seller key, bound to its key identifier.
type SellerKey struct {
	KID string          `json:"kid"`
	JWK json.RawMessage `json:"jwk"`
	// Source says where the key came from: always KeyPinnedByPolicy.
	Source string `json:"source"`
}

// KeyPinnedByPolicy is the one source of a carried seller key.
const KeyPinnedByPolicy = "pinned by the operator's policy (sellerKeys)"

// artifact is a JWS offer or receipt whose key a dossier may carry.
type artifact struct {
	what   string
	raw    json.RawMessage
	signer string
	offer  bool
}

// verifyArtifact verifies an offer or receipt with lookup and names its
// signer.
func verifyArtifact(a x402.Artifact, offer bool, lookup x402.KeyLookup) (x402.ArtifactSigner, error) {
	if offer {
		_, who, err := x402.VerifyOffer(a, lookup)
		return who, err
	}
	_, who, err := x402.VerifyReceipt(a, lookup)
	return who, err
}

// pinnedKeys finds the key the policy pins for each JWS artifact whose kid
// carries none, and keeps it only when it verifies the artifact as the
// signer recorded. The record keeps the key's thumbprint, not the key, so
// a key the policy no longer pins cannot be carried: warn says so.
func pinnedKeys(pinned func(kid string) []sellerkey.Key, arts []artifact, warn func(string)) []SellerKey {
	var out []SellerKey
	for _, da := range arts {
		if len(da.raw) == 0 {
			continue
		}
		a, err := x402.ParseArtifact(da.raw, da.offer)
		if err != nil || a.Format != x402.FormatJWS {
			continue
		}
		c, err := sellerkey.ParseCompact(a.Signature)
		if err != nil {
			continue
		}
		kid := c.Header.KID
		if _, carried, _ := sellerkey.FromKID(kid); carried || slices.ContainsFunc(out, func(k SellerKey) bool { return k.KID == kid }) {
			continue
		}
		found := false
		if pinned != nil {
			for _, k := range pinned(kid) {
				who, err := verifyArtifact(a, da.offer, func(string) (sellerkey.Key, bool) { return k, true })
				if err == nil && who.String() == da.signer {
					out = append(out, SellerKey{KID: kid, JWK: json.RawMessage(k.PublicJWK()), Source: KeyPinnedByPolicy})
					found = true
					break
				}
			}
		}
		if !found && warn != nil {
			warn(fmt.Sprintf("the %s is signed under key identifier %s, and the policy no longer pins the key that verified it (%s); the dossier carries no key for it, so dossier verify will say UNVERIFIED", da.what, kid, da.signer))
		}
	}
	return out
}

// Segment is one run of consecutive receipts of a chain, with what proves
// it part of the chain.
type Segment struct {
	// Chain is the chain's id (its segment 0's scope.chain).
	Chain    string            `json:"chain"`
	Receipts []json.RawMessage `json:"receipts"`
	// Link is the receipts of the chain after the segment's last one, in
	// order, up to the head the export checkpoint names, or up to the
	// newest kept checkpoint within DefaultMaxLink when the head is
	// farther; LinkOmitted counts the receipts between the link's end and
	// the head that the file does not carry.
	Link        []json.RawMessage `json:"link"`
	LinkOmitted int               `json:"link_omitted,omitempty"`
	// Checkpoints are signed noa.checkpoint/0.1 statements of the chain:
	// the export checkpoint (its head when the file was built) and the
	// newest kept one at or after the segment's end, if any.
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// Checkpoint is one signed checkpoint carried for a segment.
type Checkpoint struct {
	Kind       string          `json:"kind"`
	Checkpoint json.RawMessage `json:"checkpoint"`
}

// Kept is a checkpoint the operator kept: Name says where it came from
// (for messages), Raw is its bytes as signed.
type Kept struct {
	Name string
	Raw  []byte
	CP   noa.Checkpoint
}

// Options are what Build needs besides the log.
type Options struct {
	// Signer signs the export checkpoints: the server's key (required).
	Signer noa.Signer
	// Kept are the checkpoints the operator kept; the newest at or after
	// each segment's end is carried.
	Kept []Kept
	// Now is the export time (time.Now when zero).
	Now time.Time
	// MaxLink bounds the link carried per segment (DefaultMaxLink when 0).
	MaxLink int
	// PinnedKeys lists the keys the operator's policy pins for a JWS key
	// identifier (guard.Config.SellerKeysPinned); nil carries none.
	PinnedKeys func(kid string) []sellerkey.Key
	// Warn is told what the file cannot carry (nil: nobody).
	Warn func(string)
}

// ErrNotFound marks a key that names no authorization.
var ErrNotFound = errors.New("no such authorization")

// Find returns the authorization whose nonce, receipt or decision receipt
// is want (ErrNotFound when none).
func Find(ctx context.Context, log *reviewlog.Log, want string) (reviewlog.AuthorizedLine, error) {
	all, err := log.Authorizations(ctx)
	if err != nil {
		return reviewlog.AuthorizedLine{}, err
	}
	var found *reviewlog.AuthorizedLine
	for i := range all {
		a := &all[i]
		if strings.EqualFold(a.Nonce, want) || a.Receipt == want || a.DecisionReceipt == want {
			found = a
		}
	}
	if found == nil {
		return reviewlog.AuthorizedLine{}, ErrNotFound
	}
	return *found, nil
}

// Marshal writes the file as export writes it (indented, one newline at
// the end).
func Marshal(d File) ([]byte, error) {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Receipts counts the receipts of every segment (links apart).
func (d File) Receipts() int {
	n := 0
	for _, s := range d.Segments {
		n += len(s.Receipts)
	}
	return n
}

// Build assembles the dossier of authorization found from log's store.
func Build(ctx context.Context, log *reviewlog.Log, found reviewlog.AuthorizedLine, opt Options) (File, error) {
	if opt.Signer == nil {
		return File{}, errors.New("the dossier's checkpoints need the server's signing key")
	}
	if opt.Now.IsZero() {
		opt.Now = time.Now()
	}
	if opt.MaxLink <= 0 {
		opt.MaxLink = DefaultMaxLink
	}
	d := File{Format: Format, ExportedAt: opt.Now.UTC().Format(time.RFC3339), Nonce: strings.ToLower(found.Nonce), Authorization: found.Authorized, Segments: []Segment{}}
	ids := []string{found.DecisionReceipt, found.Receipt}
	if found.ReviewID != "" {
		rv, rids, err := log.Verified(ctx, found.ReviewID)
		if err != nil {
			return File{}, fmt.Errorf("the review %s: %w", found.ReviewID, err)
		}
		d.Review, d.HumanReceipts = &rv, rids
		ids = append(ids, rids...)
	}
	sts, err := log.Settlements(ctx)
	if err != nil {
		return File{}, err
	}
	for i := range sts {
		if strings.EqualFold(sts[i].Nonce, found.Nonce) {
			s := sts[i].Settled
			d.Settlement = &s
			ids = append(ids, s.Receipt)
		}
	}
	err = log.Store().View(ctx, func(r reviewlog.Reader) error {
		if d.Keyring, err = r.Keyring(ctx); err != nil {
			return err
		}
		// A checkpoint signed by a key the store does not know would make
		// the dossier TAMPERED: refuse before signing anything.
		if _, ok := d.Keyring[opt.Signer.KeyID()]; !ok {
			return fmt.Errorf("the signing key %s is not in this store's keyring: give the server's own key (--key-file or --signer)", opt.Signer.KeyID())
		}
		chains, err := reviewlog.ListChains(ctx, r)
		if err != nil {
			return err
		}
		for _, c := range chains {
			s, ok, err := segmentOf(ctx, r, c.ID, ids, opt)
			if err != nil {
				return fmt.Errorf("chain %s: %w", c.ID, err)
			}
			if ok {
				d.Segments = append(d.Segments, s)
			}
		}
		return nil
	})
	if err != nil {
		return File{}, err
	}
	arts := []artifact{{what: "seller's offer", raw: d.Authorization.Offer, signer: d.Authorization.OfferSigner, offer: true}}
	if d.Settlement != nil {
		arts = append(arts, artifact{what: "seller's receipt", raw: d.Settlement.SellerReceipt, signer: d.Settlement.SellerReceiptSigner})
	}
	d.SellerKeys = pinnedKeys(opt.PinnedKeys, arts, opt.Warn)
	d.NOA = noaEvidence(d)
	return d, nil
}

// errStop ends a walk early.
var errStop = errors.New("stop")

// segmentOf builds chain id's segment: every receipt from the first of ids
// to the last, the link to the head, and its checkpoints. ok is false
// when the chain holds none of ids. The chain is read twice: once to find
// the ids, the head and the kept checkpoints' places (holding nothing),
// once to copy what the file carries, up to the head the first read saw
// (a receipt appended meanwhile is not in this dossier).
func segmentOf(ctx context.Context, r reviewlog.Reader, id string, ids []string, opt Options) (Segment, bool, error) {
	want := map[string]bool{}
	for _, x := range ids {
		want[x] = true
	}
	var kept []int // indexes into opt.Kept of this chain's checkpoints
	for i, k := range opt.Kept {
		if reviewlog.ChainIDOf(k.CP.Chain) == id {
			kept = append(kept, i)
		}
	}
	first, last, n := -1, -1, 0
	keptAt := map[int]int{} // opt.Kept index → ordinal of its head
	err := reviewlog.EachReceipt(ctx, r, id, func(_ reviewlog.Segment, _ int64, rc *noa.Receipt) error {
		if want[rc.ID] {
			if first < 0 {
				first = n
			}
			last = n
		}
		for _, i := range kept {
			cp := opt.Kept[i].CP
			if cp.Chain == rc.Scope.Chain && cp.HighestSeq == rc.Chain.Seq {
				if cp.HeadHash != rc.Chain.Hash {
					return fmt.Errorf("the kept checkpoint %s says seq %d of %s is %s, and the chain holds %s there: the chain or the checkpoint was altered (verify the chain with --checkpoint)",
						opt.Kept[i].Name, cp.HighestSeq, cp.Chain, cp.HeadHash, rc.Chain.Hash)
				}
				keptAt[i] = n
			}
		}
		n++
		return nil
	})
	if err != nil || first < 0 {
		return Segment{}, false, err
	}
	head := n - 1
	linkEnd := head
	if head-last > opt.MaxLink {
		linkEnd = last
	}
	// The newest kept checkpoint at or after the segment's end, within
	// what the link carries (or, when the head is out of reach, within
	// MaxLink of the segment's end: the link then stops there).
	best := -1
	for i, at := range keptAt {
		if at < last || (linkEnd < head && at-last > opt.MaxLink) || (linkEnd == head && at > head) {
			continue
		}
		if best < 0 || at > keptAt[best] || (at == keptAt[best] && opt.Kept[i].CP.TS > opt.Kept[best].CP.TS) {
			best = i
		}
	}
	if best >= 0 && linkEnd < keptAt[best] {
		linkEnd = keptAt[best]
	}
	s := Segment{Chain: id, Receipts: []json.RawMessage{}, Link: []json.RawMessage{}, LinkOmitted: head - linkEnd}
	var headRc noa.Receipt
	i := 0
	err = reviewlog.EachReceipt(ctx, r, id, func(_ reviewlog.Segment, _ int64, rc *noa.Receipt) error {
		defer func() { i++ }()
		if i == head {
			headRc = *rc
		}
		if i < first || (i > linkEnd && i < head) {
			return nil
		}
		if i > head {
			return errStop
		}
		if i <= linkEnd {
			b, err := rc.Bytes()
			if err != nil {
				return err
			}
			if i <= last {
				s.Receipts = append(s.Receipts, b)
			} else {
				s.Link = append(s.Link, b)
			}
		}
		if i == head {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return Segment{}, false, err
	}
	if i <= head {
		return Segment{}, false, fmt.Errorf("the chain ended at %d receipts while being read, after %d a moment before", i, n)
	}
	if best >= 0 {
		s.Checkpoints = append(s.Checkpoints, Checkpoint{Kind: KindKept, Checkpoint: json.RawMessage(strings.TrimSpace(string(opt.Kept[best].Raw)))})
	}
	_, cp, err := noa.NewCheckpoint(ctx, headRc, opt.Now, opt.Signer)
	if err != nil {
		return Segment{}, false, fmt.Errorf("the checkpoint of its head: %w", err)
	}
	s.Checkpoints = append(s.Checkpoints, Checkpoint{Kind: KindExport, Checkpoint: json.RawMessage(strings.TrimSpace(string(cp)))})
	return s, true, nil
}

// noaEvidence is the settlement in noa.settlement-evidence/0.1's shape,
// where this product has its fields; what it lacks is said in
// docs/payments.md (no execution grant, no observer signature, and a nonce
// derived from the decision receipt, not NOA's correlation derivation).
func noaEvidence(d File) map[string]any {
	if d.Settlement == nil {
		return nil
	}
	a := d.Authorization
	m := map[string]any{
		"spec":        "noa.settlement-evidence/0.1",
		"correlation": d.Nonce,
		"railFamily":  "x402",
		"chainWitness": map[string]any{"status": "SETTLED", "network": a.Network, "asset": strings.ToLower(a.Token), "payer": strings.ToLower(a.From),
			"payee": strings.ToLower(a.To), "amount": a.Value, "txHash": d.Settlement.Transaction, "blockNumber": nil, "settledAt": nil},
		"railReceipt": nil,
		"unsigned":    "this product is no NOA settlement observer: the artifact carries no observerKid and no sig, and no executionGrantHash (x402 authorizations here are not NOA execution grants); see docs/payments.md",
	}
	for _, s := range d.Segments {
		for _, raw := range s.Receipts {
			if rc, err := noa.ParseReceipt(raw); err == nil && rc.ID == a.DecisionReceipt {
				m["authorizationReceiptHash"] = rc.Chain.Hash
				m["chain"] = rc.Scope.Chain
				if rc.Scope.Tenant != nil {
					m["tenant"] = *rc.Scope.Tenant
				}
			}
		}
	}
	if len(d.Settlement.SellerReceipt) > 0 {
		m["railReceipt"] = map[string]any{"kind": "FULL", "bytes": base64.StdEncoding.EncodeToString(d.Settlement.SellerReceipt)}
	}
	return m
}

// AuthorizationDigest is the EIP-712 digest of an authorization's terms.
func AuthorizationDigest(a reviewlog.Authorized) ([32]byte, error) {
	chain, err := x402.ChainID(a.Network)
	if err != nil {
		return [32]byte{}, err
	}
	token, err := x402.ParseAddress(a.Token)
	if err != nil {
		return [32]byte{}, err
	}
	au, err := x402.AuthorizationJSON{From: a.From, To: a.To, Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore, Nonce: strings.ToLower(a.Nonce)}.Read()
	if err != nil {
		return [32]byte{}, err
	}
	return x402.Digest(x402.Domain{Name: a.Name, Version: a.Version, ChainID: chain, VerifyingContract: token}, au)
}

// SettlementSource says where a settlement was taken from, for people.
func SettlementSource(st reviewlog.Settled) string {
	if st.Source != reviewlog.SourceTrace || st.Trace == nil {
		return "the agent (record_receipt)"
	}
	t := st.Trace
	how := "an event of its operation carries the authorization's nonce"
	if t.Binding == "terms" {
		how = "its terms: payer, payee, amount, asset, network and resource, within the authorization's validity, and no other authorization's"
	}
	return fmt.Sprintf("the Trace: run %s, operation %s, line %d (%s at %s), bound by %s", t.Run, t.Operation, t.Line, t.Event, t.OccurredAt, how)
}
