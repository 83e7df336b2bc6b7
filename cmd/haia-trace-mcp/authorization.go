package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"os"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/dossier"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

const authorizationDetails = `show prints one x402 authorization the guard signed: the signed decision
that allowed it, the human approval it used (if any), the authorization
(payer, payee, value, validity, nonce, signature), the receipt that records
it, and the Trace operation that used it when the recorder wrote it. Each
part is checked against the signed receipts: the review log's copy of the
terms is unsigned, the receipts are not. RECEIPT_ID is the decision's
receipt or the authorization's own.
exit codes: 0 shown and consistent, 1 failure, 2 usage, 3 no such
authorization, 4 the terms and the signed receipts disagree (TAMPERED) or a
receipt they name is in no chain (MISSING: a host crash while the receipts
were synced leaves that too; audit tells it, INCOMPLETE, from tampering)
`

const (
	authExitUnknown  = 3
	authExitTampered = 4
)

// authorizationView is what authorization show prints.
type authorizationView struct {
	reviewlog.AuthorizedLine
	// Amount is the value in the asset's units with its symbol ("0.25
	// USDC"), "" when the policy does not know the asset; Asset names the
	// asset for people (symbol, network, registry key).
	Amount          string               `json:"amount,omitempty"`
	Asset           string               `json:"asset,omitempty"`
	DecisionVerdict string               `json:"decision_verdict,omitempty"`
	Approval        *authorizationReview `json:"approval,omitempty"`
	Trace           []traceUse           `json:"trace"`
	Findings        []string             `json:"findings"`
	Consistent      bool                 `json:"consistent"`
	KeyringSource   string               `json:"keyring_source"`
	// Settlement is the seller's settlement handed in with record_receipt
	// (nil when none), with what checking it found (its Findings are the
	// seller's disagreements, for a person to weigh; a settlement whose
	// record and receipt disagree is a TAMPERED finding above).
	Settlement *reviewlog.SettledLine `json:"settlement,omitempty"`
	// Offer is the seller's signed offer recorded with the authorization.
	OfferSigner string `json:"offer_signer,omitempty"`
	// OfferSealed: the authorization's verified receipt seals the offer
	// seal recorded (its offer_seal).
	OfferSealed bool `json:"offer_sealed"`
	// Export is the dossier export command for this authorization, as
	// the operator can run it.
	Export string `json:"dossier_export"`
}

type authorizationReview struct {
	ReviewID  string `json:"review_id"`
	Status    string `json:"status"`
	DecidedBy string `json:"decided_by,omitempty"`
	DecidedAt string `json:"decided_at,omitempty"`
	Note      string `json:"note,omitempty"`
}

// defineAuthorizationShow is `authorization show NONCE|RECEIPT_ID`.
func defineAuthorizationShow(fs *flag.FlagSet) runFunc {
	var f stackFlags
	f.register(fs, true)
	asJSON := jsonFlag(fs)
	keyringFile := keyringFlag(fs)
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		return runAuthorizationShow(ctx, env.stdout, env.stderr, pos, &f, keyringFile, asJSON)
	}
}

func runAuthorizationShow(ctx context.Context, stdout, stderr io.Writer, pos []string, f *stackFlags, keyringFile *string, asJSON *bool) error {
	want := pos[0]
	st, err := f.open(ctx, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	log := st.Log()
	all, err := log.Authorizations(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp authorization show: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	var found *reviewlog.AuthorizedLine
	for i := range all {
		a := &all[i]
		if strings.EqualFold(a.Nonce, want) || a.Receipt == want || a.DecisionReceipt == want {
			found = a
		}
	}
	if found == nil {
		// The log's copy may be gone while the chain still holds the signed
		// record: that is no unknown authorization, it is a missing one.
		if rc, ok, err := signedAuthorization(ctx, st.Store(), want); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp authorization show: %s\n", termsafe.String(err.Error()))
			return exitCode(exitFail)
		} else if ok {
			fmt.Fprintf(stdout, "authorization %s\n  MISSING: the decision chain holds its signed receipt %s (%s), but the review log has no record of its terms\n",
				termsafe.String(strings.TrimPrefix(rc.Action.ID, "x402-authorization:")), termsafe.String(rc.ID), termsafe.String(rc.Action.ParamsHash))
			return exitCode(authExitTampered)
		}
		fmt.Fprintf(stderr, "haia-trace-mcp authorization show: no authorization with nonce or receipt %q in %s\n", termsafe.String(want), termsafe.String(log.Path()))
		return exitCode(authExitUnknown)
	}
	v := authorizationView{AuthorizedLine: *found, Trace: []traceUse{}, Findings: []string{}}
	v.Amount, v.Asset = authorizationAmount(found.Authorized, st.Policy().Assets)
	var keyring noa.Keyring
	if *keyringFile != "" {
		data, err := os.ReadFile(*keyringFile)
		if err == nil {
			keyring, err = noa.ParseKeyring(data)
		}
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp authorization show: --keyring: %s\n", termsafe.String(err.Error()))
			return exitCode(exitUsage)
		}
		v.KeyringSource = *keyringFile
	} else {
		err := st.Store().View(ctx, func(r reviewlog.Reader) (err error) {
			keyring, err = r.Keyring(ctx)
			return err
		})
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp authorization show: keyring: %s\n", termsafe.String(err.Error()))
			return exitCode(exitFail)
		}
		v.KeyringSource = "the store's keyring (pass --keyring to trust only your own copy)"
	}
	receipts, err := findReceipts(ctx, st.Store(), found.DecisionReceipt, found.Receipt)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp authorization show: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	v.Findings = checkAuthorization(found.Authorized, receipts, keyring, &v)
	if found.ReviewID != "" {
		rv, _, err := log.Verified(ctx, found.ReviewID)
		if err != nil {
			v.Findings = append(v.Findings, fmt.Sprintf("the review %s whose approval it used cannot be read: %v", found.ReviewID, err))
		} else {
			v.Approval = &authorizationReview{ReviewID: rv.ID, Status: rv.Status, DecidedBy: rv.DecidedBy, DecidedAt: rv.DecidedAt, Note: rv.Note}
			if rv.Status != reviewlog.Approved {
				v.Findings = append(v.Findings, fmt.Sprintf("the review %s it names is %s, not approved, as the signatures prove it", rv.ID, rv.Status))
			}
		}
	}
	v.OfferSigner = found.OfferSigner
	v.Export = exportCommand(f, found.Nonce)
	if sts, err := log.Settlements(ctx); err != nil {
		v.Findings = append(v.Findings, "the settlements cannot be read: "+err.Error())
	} else {
		for i := range sts {
			if strings.EqualFold(sts[i].Nonce, found.Nonce) {
				v.Settlement = &sts[i]
			}
		}
	}
	if sv := v.Settlement; sv != nil {
		rs, err := findReceipts(ctx, st.Store(), sv.Receipt)
		if err != nil {
			v.Findings = append(v.Findings, "the settlement's receipt cannot be read: "+err.Error())
		} else {
			v.Findings = append(v.Findings, checkSettlement(sv.Settled, *found, rs, keyring)...)
		}
	}
	if v.Trace, err = traceUses(st.Root().Dir(), *found); err != nil {
		v.Findings = append(v.Findings, "the Trace could not be searched: "+err.Error())
		v.Trace = []traceUse{}
	}
	v.Consistent = len(v.Findings) == 0
	if *asJSON {
		if code := reviewWriteJSON(stdout, stderr, v); code != exitOK {
			return exitCode(code)
		}
	} else {
		printAuthorization(stdout, v)
	}
	if !v.Consistent {
		return exitCode(authExitTampered)
	}
	return nil
}

// findReceipts reads, from every decision chain, the receipts with these ids.
func findReceipts(ctx context.Context, st reviewlog.Store, ids ...string) (map[string]noa.Receipt, error) {
	out := map[string]noa.Receipt{}
	err := st.View(ctx, func(r reviewlog.Reader) error {
		chains, err := reviewlog.ListChains(ctx, r)
		if err != nil {
			return err
		}
		for _, c := range chains {
			err := reviewlog.EachReceipt(ctx, r, c.ID, func(_ reviewlog.Segment, _ int64, rc *noa.Receipt) error {
				for _, id := range ids {
					if rc.ID == id {
						out[id] = *rc
					}
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("chain %s: %w", c.ID, err)
			}
		}
		return nil
	})
	return out, err
}

// signedAuthorization finds the receipt that records an authorization by
// its nonce, its own id, or the id of the decision it derives from.
func signedAuthorization(ctx context.Context, st reviewlog.Store, want string) (noa.Receipt, bool, error) {
	action := "x402-authorization:" + strings.ToLower(want)
	if !strings.HasPrefix(want, "0x") {
		n := x402.NonceFor(want)
		action = "x402-authorization:0x" + hex.EncodeToString(n[:])
	}
	var found noa.Receipt
	ok := false
	err := st.View(ctx, func(r reviewlog.Reader) error {
		chains, err := reviewlog.ListChains(ctx, r)
		if err != nil {
			return err
		}
		for _, c := range chains {
			err := reviewlog.EachReceipt(ctx, r, c.ID, func(_ reviewlog.Segment, _ int64, rc *noa.Receipt) error {
				if rc.Action.Canonical == reviewlog.CanonicalAuthorizationSigned && (rc.Action.ID == action || rc.ID == want) {
					found, ok = *rc, true
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("chain %s: %w", c.ID, err)
			}
		}
		return nil
	})
	return found, ok, err
}

// checkAuthorization compares the log's (unsigned) copy of an
// authorization with what is signed: the payer's signature over its terms,
// and the two receipts (the decision, and the authorization's own).
func checkAuthorization(a reviewlog.Authorized, receipts map[string]noa.Receipt, keyring noa.Keyring, v *authorizationView) []string {
	findings := []string{}
	bad := func(format string, args ...any) { findings = append(findings, fmt.Sprintf(format, args...)) }
	digest, err := dossier.AuthorizationDigest(a)
	if err != nil {
		bad("TAMPERED: the recorded terms cannot be read: %v", err)
		return findings
	}
	if "0x"+hex.EncodeToString(digest[:]) != a.Digest {
		bad("TAMPERED: the recorded terms hash to %x, not the digest recorded with them (%s)", digest, a.Digest)
	}
	if n := x402.NonceFor(a.DecisionReceipt); "0x"+hex.EncodeToString(n[:]) != strings.ToLower(a.Nonce) {
		bad("TAMPERED: the nonce is not the one derived from decision receipt %s", a.DecisionReceipt)
	}
	var sig [65]byte
	if b, err := hex.DecodeString(strings.TrimPrefix(a.Signature, "0x")); err == nil && len(b) == 65 {
		copy(sig[:], b)
		if who, err := x402.Recover(digest, sig); err != nil || !strings.EqualFold(who.Hex(), a.From) {
			bad("TAMPERED: the payer signature does not recover to the payer %s over these terms", a.From)
		}
	} else {
		bad("TAMPERED: the signature is not 65 bytes of hex")
	}
	verified := func(id, what string) (noa.Receipt, bool) {
		rc, ok := receipts[id]
		if !ok {
			bad("MISSING: the %s receipt %s is in no decision chain of this store", what, id)
			return rc, false
		}
		spki, ok := keyring[rc.Sig.KID]
		if !ok {
			bad("UNVERIFIED: the %s receipt %s is signed with key %s, which the keyring does not hold", what, id, rc.Sig.KID)
			return rc, false
		}
		pub, err := noa.DecodeSPKI(spki)
		if err == nil {
			err = noa.VerifySignature(rc, ed25519.PublicKey(pub))
		}
		if err != nil {
			bad("TAMPERED: the %s receipt %s does not verify: %v", what, id, err)
			return rc, false
		}
		return rc, true
	}
	if rc, ok := verified(a.DecisionReceipt, "decision"); ok {
		v.DecisionVerdict = rc.Governance.Verdict
		if rc.Governance.Verdict != noa.VerdictAllowed {
			bad("TAMPERED: the decision receipt %s says %s, not ALLOWED", rc.ID, rc.Governance.Verdict)
		}
	}
	if rc, ok := verified(a.Receipt, "authorization"); ok {
		switch sealed := engine.SealsOffer(rc); {
		case sealed && a.OfferSeal == nil:
			bad("TAMPERED: the authorization receipt %s seals the seller's offer accepted, and the record carries no offer_seal", rc.ID)
		case !sealed && a.OfferSeal != nil:
			bad("TAMPERED: the record carries an offer_seal, and the authorization receipt %s seals no offer", rc.ID)
		case rc.Action.ParamsHash != engine.AuthorizationReceiptParamsHash(digest, a):
			bad("TAMPERED: the authorization receipt %s signs other terms or another offer seal (its paramsHash is not the hash of these terms' EIP-712 digest and the offer seal recorded)", rc.ID)
		case sealed:
			v.OfferSealed = true
		}
		if rc.Action.ID != "x402-authorization:"+strings.ToLower(a.Nonce) || rc.Action.Canonical != reviewlog.CanonicalAuthorizationSigned {
			bad("TAMPERED: the authorization receipt %s records another action (%s)", rc.ID, rc.Action.ID)
		}
	}
	return findings
}

// checkSettlement checks a settlement's record against its signed
// receipt: the receipt verifies, names the nonce, and its paramsHash is the
// hash of the record's digest, which is the digest of the record.
func checkSettlement(sv reviewlog.Settled, a reviewlog.AuthorizedLine, receipts map[string]noa.Receipt, keyring noa.Keyring) []string {
	var out []string
	d := payment.SettlementDigest(sv)
	if "0x"+hex.EncodeToString(d[:]) != sv.Digest {
		out = append(out, fmt.Sprintf("TAMPERED: the settlement's record hashes to 0x%x, not the digest recorded with it (%s)", d, sv.Digest))
	}
	if sv.DecisionReceipt != a.DecisionReceipt || sv.AuthorizationReceipt != a.Receipt {
		out = append(out, "TAMPERED: the settlement names other receipts than the authorization's")
	}
	rc, ok := receipts[sv.Receipt]
	if !ok {
		return append(out, fmt.Sprintf("MISSING: the settlement's receipt %s is in no decision chain of this store", sv.Receipt))
	}
	spki, ok := keyring[rc.Sig.KID]
	if !ok {
		return append(out, fmt.Sprintf("UNVERIFIED: the settlement's receipt %s is signed with key %s, which the keyring does not hold", rc.ID, rc.Sig.KID))
	}
	pub, err := noa.DecodeSPKI(spki)
	if err == nil {
		err = noa.VerifySignature(rc, ed25519.PublicKey(pub))
	}
	if err != nil {
		return append(out, fmt.Sprintf("TAMPERED: the settlement's receipt %s does not verify: %v", rc.ID, err))
	}
	if rc.Action.ParamsHash != engine.AuthorizationParamsHash(d) || rc.Action.ID != "x402-settlement:"+strings.ToLower(a.Nonce) {
		out = append(out, fmt.Sprintf("TAMPERED: the settlement's receipt %s signs another settlement", rc.ID))
	}
	return out
}

func printAuthorization(w io.Writer, v authorizationView) {
	s := termsafe.String
	unix := func(n string) string {
		i, ok := new(big.Int).SetString(n, 10)
		if !ok || !i.IsInt64() {
			return n
		}
		return n + " (" + time.Unix(i.Int64(), 0).UTC().Format(time.RFC3339) + ")"
	}
	fmt.Fprintf(w, "authorization %s\n", s(v.Nonce))
	fmt.Fprintf(w, "  signed at      %s for caller %s (review log line %d)\n", s(v.At), s(v.Caller), v.Line)
	fmt.Fprintf(w, "  decision       receipt %s", s(v.DecisionReceipt))
	if v.DecisionVerdict != "" {
		fmt.Fprintf(w, " (%s)", v.DecisionVerdict)
	}
	fmt.Fprintln(w)
	if v.Approval != nil {
		fmt.Fprintf(w, "  approval       review %s %s by %s at %s", s(v.Approval.ReviewID), v.Approval.Status, s(v.Approval.DecidedBy), s(v.Approval.DecidedAt))
		if v.Approval.Note != "" {
			fmt.Fprintf(w, " (note: %s)", s(v.Approval.Note))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  payer          %s\n  payee          %s\n", s(v.From), s(v.To))
	if v.Amount != "" {
		fmt.Fprintf(w, "  value          %s (%s atomic units)\n  asset          %s\n", s(v.Amount), s(v.Value), s(v.Asset))
	} else {
		fmt.Fprintf(w, "  value          %s atomic units of token %s on %s (an asset the policy does not name)\n", s(v.Value), s(v.Token), s(v.Network))
	}
	fmt.Fprintf(w, "  eip712 domain  name %q, version %q, chain %s, verifying contract %s\n", s(v.Name), s(v.Version), s(v.Network), s(v.Token))
	fmt.Fprintf(w, "  valid          after %s, before %s\n", unix(v.ValidAfter), unix(v.ValidBefore))
	fmt.Fprintf(w, "  signature      %s\n  eip712 digest  %s\n  recorded as    receipt %s\n", s(v.Signature), s(v.Digest), s(v.Receipt))
	if v.Resource != "" {
		fmt.Fprintf(w, "  resource       %s\n", s(v.Resource))
	}
	if len(v.Trace) == 0 {
		fmt.Fprintln(w, "  trace          no operation in the Trace carries this nonce yet (the recorder has not written its use)")
	}
	for _, u := range v.Trace {
		how := "carries its nonce"
		if u.By == "terms" {
			how = "a settled payment of the same terms after the signature"
		}
		fmt.Fprintf(w, "  trace          run %s, operation %s (event line %d: %s)\n", s(u.RunID), s(u.OperationID), u.Line, how)
	}
	if v.OfferSigner != "" {
		fmt.Fprintf(w, "  seller offer   signed by %s, checked before the engine was asked\n", s(v.OfferSigner))
	}
	switch sl := v.OfferSeal; {
	case sl != nil && v.OfferSealed:
		fmt.Fprintf(w, "  offer sealed   %s (%s), signer %s, key %s: sealed by receipt %s\n", s(sl.Offer), s(sl.Format), s(orNone(sl.Signer)), s(orNone(sl.Key)), s(v.Receipt))
	case sl != nil:
		fmt.Fprintf(w, "  offer seal     %s (%s), signer %s, key %s: not proved by its receipt (see below)\n", s(sl.Offer), s(sl.Format), s(orNone(sl.Signer)), s(orNone(sl.Key)))
	case len(v.Offer) > 0:
		fmt.Fprintln(w, "  offer sealed   no offer sealed (recorded before authorizations sealed their offer): which offer was accepted is the record's word")
	}
	if st := v.Settlement; st != nil {
		fmt.Fprintf(w, "  settlement     transaction %s on %s, payer %s, recorded at %s as receipt %s\n", s(st.Transaction), s(st.Network), s(st.Payer), s(st.At), s(st.Receipt))
		fmt.Fprintf(w, "  settled by     %s\n", s(dossier.SettlementSource(st.Settled)))
		if st.HoldKept {
			fmt.Fprintln(w, "  hold kept      the Trace's settlement disagrees with the authorization: its hold still counts as an open payment")
		}
		if st.SellerReceiptSigner != "" {
			fmt.Fprintf(w, "  seller receipt signed by %s\n", s(st.SellerReceiptSigner))
		}
		for _, f := range st.Findings {
			fmt.Fprintf(w, "  SELLER: %s\n", s(f))
		}
	} else {
		fmt.Fprintln(w, "  settlement     none recorded (record_receipt, or the Trace's settlement at the server's next authorize_payment)")
	}
	fmt.Fprintf(w, "  keys trusted   %s\n", v.KeyringSource)
	fmt.Fprintf(w, "  dossier        %s\n                 (one file, verified offline by dossier verify)\n", s(v.Export))
	if v.Consistent {
		fmt.Fprintln(w, "  CONSISTENT: the terms, the payer's signature and the signed receipts agree")
		return
	}
	for _, f := range v.Findings {
		fmt.Fprintf(w, "  %s\n", s(f))
	}
}

// authorizationAmount writes an authorization's value as the rest of the
// command line does, "0.25 USDC", with the asset named for people; both are
// "" when the policy does not know the asset (the caller then prints the
// atomic units and the token).
func authorizationAmount(a reviewlog.Authorized, assets guard.Registry) (amount, asset string) {
	key, _, err := guard.AssetKey(a.Network, a.Token)
	if err != nil {
		return "", ""
	}
	as, ok := assets.Lookup(key)
	n, isInt := new(big.Int).SetString(a.Value, 10)
	if !ok || !isInt || as.Symbol == "" {
		return "", ""
	}
	return amountText(n, key, assets), as.Describe()
}

// traceUse is an event of the Trace that carries the authorization's nonce.
type traceUse struct {
	RunID       string `json:"run_id"`
	OperationID string `json:"operation_id"`
	Line        int    `json:"line"`
	// By is "nonce" (the event carries the authorization's nonce) or
	// "terms" (a settled payment to the same payee, of the same amount, on
	// the same network, after the signature: a recorder that does not
	// write the nonce is matched so).
	By string `json:"by"`
}

// maxTraceLine bounds one event line read while searching for a nonce.
const maxTraceLine = 1 << 20

// traceUses finds the events that carry nonce (the recorder writes the
// payment it saw sent, the authorization's nonce in it): run, operation
// (the event's context_id) and line.
func traceUses(root *confined.Dir, a reviewlog.AuthorizedLine) ([]traceUse, error) {
	nonce := a.Nonce
	out := []traceUse{}
	events, err := root.OpenDirLazy("events")
	if err != nil {
		return out, err
	}
	defer events.Close()
	if !events.Exists() {
		return out, nil
	}
	entries, err := events.ReadDir()
	if err != nil {
		return out, err
	}
	needle := []byte(strings.ToLower(strings.TrimPrefix(strings.ToLower(nonce), "0x")))
	toLower := []byte(strings.ToLower(strings.TrimPrefix(a.To, "0x")))
	for _, e := range entries {
		run, ok := strings.CutSuffix(e.Name, ".ndjson")
		if !ok || !e.Regular() {
			continue
		}
		f, err := events.Open(e.Name)
		if err != nil {
			return out, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), maxTraceLine)
		for n := 1; sc.Scan(); n++ {
			var ev struct {
				ContextID  string `json:"context_id"`
				EventType  string `json:"event_type"`
				OccurredAt string `json:"occurred_at"`
				Payload    struct {
					Requirements struct {
						PayTo   string `json:"pay_to"`
						Amount  string `json:"amount"`
						Network string `json:"network"`
					} `json:"requirements"`
					Settle struct {
						Success any `json:"success"`
					} `json:"settle"`
				} `json:"payload"`
			}
			if bytes.Contains(bytes.ToLower(sc.Bytes()), needle) {
				_ = json.Unmarshal(sc.Bytes(), &ev)
				out = append(out, traceUse{RunID: run, OperationID: ev.ContextID, Line: n, By: "nonce"})
				continue
			}
			if !bytes.Contains(bytes.ToLower(sc.Bytes()), toLower) || json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			rq := ev.Payload.Requirements
			net, err := guard.NetworkCAIP2(rq.Network)
			if ev.EventType == "x402.payment.responded" && ev.Payload.Settle.Success == true && err == nil && net == a.Network &&
				strings.EqualFold(rq.PayTo, a.To) && rq.Amount == a.Value && notBefore(ev.OccurredAt, a.At) {
				out = append(out, traceUse{RunID: run, OperationID: ev.ContextID, Line: n, By: "terms"})
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil && !errors.Is(err, bufio.ErrTooLong) {
			return out, fmt.Errorf("events/%s: %w", e.Name, err)
		}
	}
	return out, nil
}

// notBefore says whether the instant t is at or after since (both RFC 3339);
// an instant that cannot be read is not.
func notBefore(t, since string) bool {
	a, err1 := time.Parse(time.RFC3339Nano, t)
	b, err2 := time.Parse(time.RFC3339Nano, since)
	return err1 == nil && err2 == nil && !a.Before(b)
}

func orNone(x string) string {
	if x == "" {
		return "none (its signature did not verify)"
	}
	return x
}

// exportCommand is the dossier export command of an authorization as the
// operator can run it: the store show read (a --store DSN's password left
// out, and said so) and the server's signing key, which export needs to
// sign its checkpoints — the default key file when it exists, else a
// placeholder the line explains.
func exportCommand(f *stackFlags, nonce string) string {
	args := []string{"haia-trace-mcp", "dossier", "export", nonce}
	if f.dir != "" {
		args = append(args, "--dir", shellQuote(f.dir))
	}
	note := ""
	if f.store != "" {
		red := pgstore.Redact(f.store)
		args = append(args, "--store", shellQuote(red))
		if red != f.store {
			note = " (give --store as you gave it here; its password and parameters are left out of this line)"
		}
	}
	if f.reviewers != "" {
		args = append(args, "--reviewers", shellQuote(f.reviewers))
	}
	if f.tenantsDir != "" {
		args = append(args, "--tenants-dir", shellQuote(f.tenantsDir), "--tenant", shellQuote(f.tenant))
	}
	key := "KEY_FILE"
	if p, err := defaultConfigPath("signing-key.pem"); err == nil {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			key = shellQuote(p)
		}
	}
	args = append(args, "--key-file", key, "--out", "dossier.json")
	if key == "KEY_FILE" {
		note += " (KEY_FILE: the server's signing key, its --key-file; or --signer unix:PATH of its signer process)"
	}
	return strings.Join(args, " ") + note
}

// shellQuote quotes a word for a POSIX shell when it needs it.
func shellQuote(w string) string {
	if w != "" && strings.Trim(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@%+,") == "" {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}
