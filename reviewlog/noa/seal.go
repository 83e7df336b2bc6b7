package noa

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Draft is what a caller states about one decision; Seal adds the chain
// link, the hash and the signature.
type Draft struct {
	// ID is the receipt id; empty means a random "rcpt_…" id.
	ID string
	// TS is when the decision was made; it is written in UTC with
	// milliseconds.
	TS time.Time
	// Tenant is scope.tenant; empty means the member is left out.
	Tenant string
	// Chain is scope.chain, the partition the receipt belongs to.
	Chain string

	Agent      Agent
	Action     Action
	Governance Governance
}

// Seal turns d into the next receipt of a chain: genesis when prev is nil,
// else seq prev+1 linked to prev's hash. It signs through s and checks the
// signature before returning, so a signer that answers garbage fails here,
// not later in a verifier (all but a KeySigner, whose signature verifies by
// construction). It returns the receipt and its JSON line (the
// canonical bytes and a newline). Nothing is written anywhere.
func Seal(ctx context.Context, d Draft, prev *Receipt, s Signer) (Receipt, []byte, error) {
	kid := s.KeyID()
	if kid == "" {
		return Receipt{}, nil, errors.New("noa: seal: signer has no key id")
	}
	var seq int64
	var prevHash any
	if prev != nil {
		if prev.tree == nil {
			return Receipt{}, nil, errors.New("noa: seal: previous receipt is empty")
		}
		if prev.Scope.Chain != d.Chain {
			return Receipt{}, nil, fmt.Errorf("noa: seal: chain %q cannot continue chain %q", d.Chain, prev.Scope.Chain)
		}
		if prev.Agent.ID == d.Agent.ID && prev.Sig.KID != kid {
			// NOA pins one key per agent.id within a chain; a rotated key
			// must start a new chain.
			return Receipt{}, nil, fmt.Errorf("noa: seal: agent %q signed this chain with key %q; key %q must start a new chain", d.Agent.ID, prev.Sig.KID, kid)
		}
		seq = prev.Chain.Seq + 1
		prevHash = prev.Chain.Hash
	}
	id := d.ID
	if id == "" {
		var b [13]byte
		if _, err := rand.Read(b[:]); err != nil {
			return Receipt{}, nil, fmt.Errorf("noa: seal: receipt id: %w", err)
		}
		id = "rcpt_" + hex.EncodeToString(b[:])
	}
	tree := draftTree(d, id, seq, prevHash, kid)
	// Validate before signing, with placeholders where hash and signature
	// go, so that Seal never signs what ParseReceipt would refuse.
	if _, err := receiptFromTree(tree); err != nil {
		return Receipt{}, nil, fmt.Errorf("noa: seal: %w", err)
	}
	input, err := hashInput(tree, "chain", "hash", "sig", "value")
	if err != nil {
		return Receipt{}, nil, fmt.Errorf("noa: seal: %w", err)
	}
	sum := sha256.Sum256(input)
	msg := append([]byte(receiptDomain), sum[:]...)
	sig, err := s.Sign(ctx, msg)
	if err != nil {
		return Receipt{}, nil, fmt.Errorf("noa: seal: signing failed (no receipt written): %w", err)
	}
	sigB64 := base64.StdEncoding.EncodeToString(sig)
	// A KeySigner signs with the private key its public key is derived
	// from, in this process: its signature verifies by construction. Any
	// other signer (a signer process) is checked.
	if _, inProcess := s.(*KeySigner); !inProcess && !verifySig(s.PublicKey(), msg, sigB64) {
		return Receipt{}, nil, fmt.Errorf("noa: seal: signer returned a signature that does not verify under key %q", kid)
	}
	tree["chain"].(map[string]any)["hash"] = "sha256:" + hex.EncodeToString(sum[:])
	tree["sig"].(map[string]any)["value"] = sigB64
	r, err := receiptFromTree(tree)
	if err != nil {
		return Receipt{}, nil, fmt.Errorf("noa: seal: %w", err)
	}
	line, err := r.Bytes()
	if err != nil {
		return Receipt{}, nil, fmt.Errorf("noa: seal: %w", err)
	}
	return r, append(line, '\n'), nil
}

// draftTree lays out the receipt as JSON values. Nullable members are
// written as null when unset, as the reference producer does; compliance
// is left out when unset, because older verifiers do not know it.
func draftTree(d Draft, id string, seq int64, prevHash any, kid string) map[string]any {
	scope := map[string]any{"chain": d.Chain}
	if d.Tenant != "" {
		scope["tenant"] = d.Tenant
	}
	gov := map[string]any{
		"mode":      d.Governance.Mode,
		"verdict":   d.Governance.Verdict,
		"ruleId":    strOrNull(d.Governance.RuleID),
		"approval":  nil,
		"sandboxed": d.Governance.Sandboxed,
	}
	if a := d.Governance.Approval; a != nil {
		gov["approval"] = map[string]any{"by": a.By, "at": a.At}
	}
	if c := d.Governance.Compliance; c != nil {
		comp := map[string]any{"policyHash": c.PolicyHash, "readSetHash": c.ReadSetHash, "inputsHash": c.InputsHash}
		if c.Verdict != "" {
			comp["verdict"] = c.Verdict
		}
		gov["compliance"] = comp
	}
	return map[string]any{
		"spec":  ReceiptSpec,
		"id":    id,
		"ts":    FormatTS(d.TS),
		"scope": scope,
		"agent": map[string]any{
			"id":        d.Agent.ID,
			"model":     strOrNull(d.Agent.Model),
			"principal": d.Agent.Principal,
		},
		"action": map[string]any{
			"id":          d.Action.ID,
			"canonical":   d.Action.Canonical,
			"riskClass":   d.Action.RiskClass,
			"paramsHash":  d.Action.ParamsHash,
			"reversible":  d.Action.Reversible,
			"rollbackRef": strOrNull(d.Action.RollbackRef),
		},
		"governance": gov,
		"chain": map[string]any{
			"seq":      seq,
			"prevHash": prevHash,
			"hash":     "sha256:" + zeroHex,
		},
		"sig": map[string]any{"alg": AlgEd25519, "kid": kid, "value": "-"},
	}
}

const zeroHex = "0000000000000000000000000000000000000000000000000000000000000000"

func strOrNull(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}
