package main

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const dossierDetails = `export writes one self-contained JSON file for one x402 payment the guard
signed: the decision receipt, the human decision (its receipts: a
reviewer's key or a passkey assertion), the authorization with its EIP-712
digest and the payer's signature, the seller's signed offer, the settlement
with the seller's signed receipt, and the segments of the decision chains
that hold every receipt, each receipt linked to the one before it. The key
is a nonce, a receipt id, or RUN_ID/OPERATION_ID of the Trace operation
that used it.
verify checks every signature and link of such a file offline and prints
each link's verdict. The keys it trusts are --keyring's (without it, the
keyring the file carries: UNVERIFIED); --reviewers holds the human
decisions to a trusted reviewers file, as verify does.
exit codes (as verify): 0 VALID, 1 UNVERIFIED, 2 TAMPERED, 3 MALFORMED,
4 usage or unreadable file, 5 UNTRUSTED
`

// dossierFormat names the file's format.
const dossierFormat = "haia.dossier/0.1"

// dossierFile is the file dossier export writes.
type dossierFile struct {
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
	Segments []dossierSegment `json:"segments"`
	// Keyring is the store's keyring at export; verify trusts it only
	// when no --keyring is given, and says so (UNVERIFIED).
	Keyring noa.Keyring `json:"keyring"`
	// NOA is the settlement in the shape of noa.settlement-evidence/0.1
	// where this product has its fields (see docs/payments.md): unsigned.
	NOA map[string]any `json:"noa_settlement_evidence,omitempty"`
}

type dossierSegment struct {
	Chain    string            `json:"chain"`
	Receipts []json.RawMessage `json:"receipts"`
}

func defineDossierExport(fs *flag.FlagSet) runFunc {
	var f stackFlags
	f.register(fs, true)
	out := fs.String("out", "", "write the dossier to `FILE` (default: stdout)")
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		return runDossierExport(ctx, env.stdout, env.stderr, pos[0], &f, *out)
	}
}

func runDossierExport(ctx context.Context, stdout, stderr io.Writer, want string, f *stackFlags, out string) error {
	fail := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "haia-trace-mcp dossier export: %s\n", termsafe.String(fmt.Sprintf(format, a...)))
		return exitCode(exitFail)
	}
	st, err := f.open(ctx, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	log := st.Log()
	all, err := log.Authorizations(ctx)
	if err != nil {
		return fail("%v", err)
	}
	var found *reviewlog.AuthorizedLine
	for i := range all {
		a := &all[i]
		if strings.EqualFold(a.Nonce, want) || a.Receipt == want || a.DecisionReceipt == want {
			found = a
		}
	}
	if found == nil && strings.Count(want, "/") == 1 {
		for i := range all {
			uses, err := traceUses(st.Root().Dir(), all[i])
			if err != nil {
				return fail("the Trace could not be searched: %v", err)
			}
			for _, u := range uses {
				if u.RunID+"/"+u.OperationID == want {
					found = &all[i]
				}
			}
		}
	}
	if found == nil {
		fmt.Fprintf(stderr, "haia-trace-mcp dossier export: no authorization with nonce, receipt or Trace operation %q in %s\n", termsafe.String(want), termsafe.String(log.Path()))
		return exitCode(authExitUnknown)
	}
	d := dossierFile{Format: dossierFormat, ExportedAt: time.Now().UTC().Format(time.RFC3339), Nonce: strings.ToLower(found.Nonce), Authorization: found.Authorized, Segments: []dossierSegment{}}
	ids := []string{found.DecisionReceipt, found.Receipt}
	if found.ReviewID != "" {
		rv, rids, err := log.Verified(ctx, found.ReviewID)
		if err != nil {
			return fail("the review %s: %v", found.ReviewID, err)
		}
		d.Review, d.HumanReceipts = &rv, rids
		ids = append(ids, rids...)
	}
	sts, err := log.Settlements(ctx)
	if err != nil {
		return fail("%v", err)
	}
	for i := range sts {
		if strings.EqualFold(sts[i].Nonce, found.Nonce) {
			s := sts[i].Settled
			d.Settlement = &s
			ids = append(ids, s.Receipt)
		}
	}
	err = st.Store().View(ctx, func(r reviewlog.Reader) error {
		if d.Keyring, err = r.Keyring(ctx); err != nil {
			return err
		}
		chains, err := reviewlog.ListChains(ctx, r)
		if err != nil {
			return err
		}
		for _, c := range chains {
			var run []json.RawMessage
			last := -1
			left := map[string]bool{}
			for _, id := range ids {
				left[id] = true
			}
			err := reviewlog.EachReceipt(ctx, r, c.ID, func(_ reviewlog.Segment, _ int64, rc *noa.Receipt) error {
				if len(left) == 0 {
					return nil
				}
				b, err := rc.Bytes()
				if err != nil {
					return err
				}
				if left[rc.ID] {
					delete(left, rc.ID)
					run = append(run, b)
					last = len(run)
					return nil
				}
				if len(run) > 0 {
					run = append(run, b)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("chain %s: %w", c.ID, err)
			}
			if last > 0 {
				d.Segments = append(d.Segments, dossierSegment{Chain: c.ID, Receipts: run[:last]})
			}
		}
		return nil
	})
	if err != nil {
		return fail("%v", err)
	}
	d.NOA = noaEvidence(d)
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return fail("%v", err)
	}
	b = append(b, '\n')
	if out == "" {
		_, err = stdout.Write(b)
		return err
	}
	if err := os.WriteFile(out, b, 0o600); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(stdout, "dossier of authorization %s written to %s (%s in %s)\n", d.Nonce, termsafe.String(out),
		countOf(receiptCount(d), "receipt"), countOf(len(d.Segments), "segment"))
	return nil
}

// countOf writes "1 receipt", "2 receipts".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func receiptCount(d dossierFile) int {
	n := 0
	for _, s := range d.Segments {
		n += len(s.Receipts)
	}
	return n
}

// noaEvidence is the settlement in noa.settlement-evidence/0.1's shape,
// where this product has its fields; what it lacks is said in
// docs/payments.md (no execution grant, no observer signature, and a nonce
// derived from the decision receipt, not NOA's correlation derivation).
func noaEvidence(d dossierFile) map[string]any {
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

// Verdicts of dossier verify, worst last.
const (
	dvValid      = "VALID"
	dvUnverified = "UNVERIFIED"
	dvUntrusted  = "UNTRUSTED"
	dvMalformed  = "MALFORMED"
	dvTampered   = "TAMPERED"
)

var dvRank = map[string]int{dvValid: 0, dvUnverified: 1, dvUntrusted: 2, dvMalformed: 3, dvTampered: 4}
var dvExit = map[string]int{dvValid: 0, dvUnverified: 1, dvTampered: 2, dvMalformed: 3, dvUntrusted: 5}

type dossierLink struct {
	Link    string `json:"link"`
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
}

func defineDossierVerify(fs *flag.FlagSet) runFunc {
	keyringFile := keyringFlag(fs)
	reviewers := fs.String("reviewers", "", "hold the human decision to this trusted reviewers `FILE` (default: none, the keys alone)")
	asJSON := jsonFlag(fs)
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		return runDossierVerify(env.stdout, env.stderr, pos[0], *keyringFile, *reviewers, *asJSON)
	}
}

func runDossierVerify(stdout, stderr io.Writer, path, keyringFile, reviewersFile string, asJSON bool) error {
	usage := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "haia-trace-mcp dossier verify: %s\n", termsafe.String(fmt.Sprintf(format, a...)))
		return exitCode(exitVerifyUsage)
	}
	data, err := readBounded(path, 64<<20)
	if err != nil {
		return usage("%v", err)
	}
	var keyring noa.Keyring
	if keyringFile != "" {
		kb, err := readBounded(keyringFile, maxTrustFileBytes)
		if err == nil {
			keyring, err = noa.ParseKeyring(kb)
		}
		if err != nil {
			return usage("--keyring: %v", err)
		}
	}
	var trust *reviewlog.ReviewerTrust
	if reviewersFile != "" {
		t, err := reviewlog.LoadReviewerTrust(reviewersFile, "")
		if err != nil {
			return usage("--reviewers: %v", err)
		}
		trust = &t
	}
	links := verifyDossier(data, keyring, trust)
	worst := dvValid
	for _, l := range links {
		if dvRank[l.Verdict] > dvRank[worst] {
			worst = l.Verdict
		}
	}
	if asJSON {
		if code := reviewWriteJSON(stdout, stderr, map[string]any{"verdict": worst, "links": links}); code != exitOK {
			return exitCode(code)
		}
	} else {
		for _, l := range links {
			fmt.Fprintf(stdout, "%-10s %-26s %s\n", l.Verdict, l.Link, termsafe.String(l.Reason))
		}
		fmt.Fprintf(stdout, "%s: %d links checked\n", worst, len(links))
		if keyringFile == "" {
			fmt.Fprintln(stderr, "note: no --keyring: the receipts were checked under the keyring the file itself carries")
		}
	}
	if code := dvExit[worst]; code != 0 {
		return exitCode(code)
	}
	return nil
}

// verifyDossier checks every link of a dossier offline.
func verifyDossier(data []byte, keyring noa.Keyring, trust *reviewlog.ReviewerTrust) []dossierLink {
	var links []dossierLink
	add := func(link, verdict, format string, a ...any) {
		links = append(links, dossierLink{Link: link, Verdict: verdict, Reason: fmt.Sprintf(format, a...)})
	}
	var d dossierFile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil || d.Format != dossierFormat {
		add("file", dvMalformed, "not a %s file: %v", dossierFormat, err)
		return links
	}
	keys, keysFrom := keyring, "--keyring"
	if keys == nil {
		keys, keysFrom = d.Keyring, "the file's own keyring"
	}
	// Every receipt: its content hash, its signature, its link to the one
	// before it in its segment.
	receipts := map[string]noa.Receipt{}
	for _, s := range d.Segments {
		var prev *noa.Receipt
		bad := ""
		verdict := dvValid
		for i, raw := range s.Receipts {
			rc, err := noa.ParseReceipt(raw)
			if err != nil {
				verdict, bad = dvMalformed, fmt.Sprintf("receipt %d: %v", i, err)
				break
			}
			if prev != nil && (rc.Chain.Seq != prev.Chain.Seq+1 || rc.Chain.PrevHash == nil || *rc.Chain.PrevHash != prev.Chain.Hash) {
				verdict, bad = dvTampered, fmt.Sprintf("receipt %s (seq %d) is not linked to %s (seq %d)", rc.ID, rc.Chain.Seq, prev.ID, prev.Chain.Seq)
				break
			}
			if rc.Agent.Principal == noa.PrincipalHuman && trust != nil {
				if why := trust.DecisionProblem(rc); why != "" {
					verdict, bad = dvUntrusted, fmt.Sprintf("the human decision %s does not count: %s", rc.ID, why)
					break
				}
			} else if spki, ok := keys[rc.Sig.KID]; !ok {
				if rc.Agent.Principal == noa.PrincipalHuman {
					if input, err := rc.HashInput(); err != nil || "sha256:"+hexSum(input) != rc.Chain.Hash {
						verdict, bad = dvTampered, fmt.Sprintf("receipt %s: hash mismatch (content altered)", rc.ID)
						break
					}
					if dvRank[dvUnverified] > dvRank[verdict] {
						verdict, bad = dvUnverified, fmt.Sprintf("the human decision %s is signed by reviewer key %s: hold it to --reviewers", rc.ID, rc.Sig.KID)
					}
				} else {
					verdict, bad = dvTampered, fmt.Sprintf("receipt %s is signed with key %s, which %s does not hold", rc.ID, rc.Sig.KID, keysFrom)
					break
				}
			} else {
				pub, err := noa.DecodeSPKI(spki)
				if err == nil {
					err = noa.VerifySignature(rc, ed25519.PublicKey(pub))
				}
				if err != nil {
					verdict, bad = dvTampered, fmt.Sprintf("receipt %s does not verify: %v", rc.ID, err)
					break
				}
			}
			receipts[rc.ID] = rc
			r := rc
			prev = &r
		}
		if verdict == dvValid {
			if keyring == nil {
				verdict, bad = dvUnverified, "signatures verify under the file's own keyring; pass --keyring to trust your own copy"
			} else {
				bad = "every receipt's hash, signature and link verify"
			}
		}
		add("segment "+s.Chain, verdict, "%s: %s", countOf(len(s.Receipts), "receipt"), bad)
	}
	a := d.Authorization
	need := func(link, id string) (noa.Receipt, bool) {
		rc, ok := receipts[id]
		if !ok {
			add(link, dvTampered, "the receipt %s is in no verified segment of the file", id)
		}
		return rc, ok
	}
	// The decision.
	if rc, ok := need("decision", a.DecisionReceipt); ok {
		if rc.Governance.Verdict != noa.VerdictAllowed {
			add("decision", dvTampered, "receipt %s says %s, not ALLOWED", rc.ID, rc.Governance.Verdict)
		} else {
			add("decision", dvValid, "receipt %s: ALLOWED at %s", rc.ID, rc.TS)
		}
	}
	// The human decision.
	if a.ReviewID != "" {
		switch {
		case d.Review == nil || d.Review.ID != a.ReviewID:
			add("human decision", dvTampered, "the authorization used review %s, and the file carries no record of it", a.ReviewID)
		default:
			humans := 0
			for _, id := range d.HumanReceipts {
				if rc, ok := receipts[id]; ok && rc.Agent.Principal == noa.PrincipalHuman && rc.Action.ID == "review:"+a.ReviewID && rc.Governance.Verdict == noa.VerdictAllowed {
					humans++
				}
			}
			if humans == 0 {
				add("human decision", dvTampered, "no signed human decision of review %s is in the file", a.ReviewID)
			} else {
				add("human decision", dvValid, "review %s %s by %s (%s), signed", a.ReviewID, d.Review.Status, d.Review.DecidedBy, d.Review.DecidedWith)
			}
		}
	}
	// The authorization: digest, payer's signature, nonce, its receipt.
	digest, err := authorizationDigest(a)
	switch {
	case err != nil:
		add("authorization", dvMalformed, "its terms cannot be read: %v", err)
	case "0x"+hex.EncodeToString(digest[:]) != a.Digest:
		add("authorization", dvTampered, "its terms hash to 0x%x, not the EIP-712 digest recorded (%s)", digest, a.Digest)
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
			add("authorization", dvTampered, "%s", why)
		} else {
			add("authorization", dvValid, "%s atomic units from %s to %s on %s, EIP-712 digest %s, signed by the payer", a.Value, a.From, a.To, a.Network, a.Digest)
		}
		if rc, ok := need("authorization receipt", a.Receipt); ok {
			if rc.Action.ParamsHash != engine.AuthorizationParamsHash(digest) || rc.Action.ID != "x402-authorization:"+strings.ToLower(a.Nonce) {
				add("authorization receipt", dvTampered, "receipt %s signs another authorization", rc.ID)
			} else {
				add("authorization receipt", dvValid, "receipt %s signs this digest", rc.ID)
			}
		}
	}
	// The seller's offer.
	if len(a.Offer) > 0 {
		art, err := x402.ParseArtifact(a.Offer, true)
		var terms x402.OfferTerms
		var who x402.ArtifactSigner
		if err == nil {
			terms, who, err = x402.VerifyOffer(art, nil)
		}
		switch {
		case err != nil && art.Format == x402.FormatJWS && strings.Contains(err.Error(), "not known here"):
			add("seller offer", dvUnverified, "%v", err)
		case err != nil:
			add("seller offer", dvTampered, "%v", err)
		case who.String() != a.OfferSigner:
			add("seller offer", dvTampered, "signed by %s, not the signer recorded (%s)", who.String(), a.OfferSigner)
		default:
			if f := offerAgainst(terms, a); f != "" {
				add("seller offer", dvTampered, "%s", f)
			} else {
				add("seller offer", dvValid, "signed by %s; its terms are the authorization's", who.String())
			}
		}
	}
	// The settlement and the seller's receipt.
	if s := d.Settlement; s != nil {
		sd := payment.SettlementDigest(*s)
		switch {
		case "0x"+hex.EncodeToString(sd[:]) != s.Digest:
			add("settlement", dvTampered, "its record hashes to 0x%x, not the digest recorded (%s)", sd, s.Digest)
		case !strings.EqualFold(s.Nonce, a.Nonce) || s.DecisionReceipt != a.DecisionReceipt || s.AuthorizationReceipt != a.Receipt:
			add("settlement", dvTampered, "it names another authorization")
		default:
			if rc, ok := need("settlement", s.Receipt); ok {
				if rc.Action.ParamsHash != engine.AuthorizationParamsHash(sd) || rc.Action.ID != "x402-settlement:"+strings.ToLower(a.Nonce) {
					add("settlement", dvTampered, "receipt %s signs another settlement", rc.ID)
				} else {
					add("settlement", dvValid, "transaction %s on %s, payer %s; receipt %s; from %s", s.Transaction, s.Network, s.Payer, rc.ID, settlementSource(*s))
				}
			}
		}
		if len(s.SellerReceipt) > 0 {
			art, err := x402.ParseArtifact(s.SellerReceipt, false)
			var who x402.ArtifactSigner
			if err == nil {
				_, who, err = x402.VerifyReceipt(art, nil)
			}
			switch {
			case err != nil && art.Format == x402.FormatJWS && strings.Contains(err.Error(), "not known here"):
				add("seller receipt", dvUnverified, "%v", err)
			case err != nil:
				add("seller receipt", dvTampered, "%v", err)
			case who.String() != s.SellerReceiptSigner:
				add("seller receipt", dvTampered, "signed by %s, not the signer recorded (%s)", who.String(), s.SellerReceiptSigner)
			default:
				add("seller receipt", dvValid, "signed by %s", who.String())
			}
		}
		for _, f := range s.Findings {
			add("seller finding", dvValid, "recorded at settlement, for a person to weigh: %s", f)
		}
	}
	return links
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

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
