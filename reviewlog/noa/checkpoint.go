package noa

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
)

// Checkpoint is a signed statement of a chain's head (noa.checkpoint/0.1):
// given one, a verifier detects receipts cut from the tail.
type Checkpoint struct {
	Spec       string
	Chain      string
	HighestSeq int64
	HeadHash   string
	TS         string
	Sig        Sig

	tree map[string]any
}

// ErrCheckpointInvalid marks a checkpoint that is a JSON object but not a
// valid checkpoint statement; the reference verifier calls a chain checked
// against it TAMPERED (a JSON syntax error is MALFORMED instead).
var ErrCheckpointInvalid = errors.New("checkpoint invalid")

// cpTSRE is the checkpoint timestamp shape the reference verifier checks.
var cpTSRE = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$`)

// ParseCheckpoint decodes a checkpoint strictly. Errors that wrap
// ErrCheckpointInvalid concern the statement; others mean the bytes are
// not a JSON object at all.
func ParseCheckpoint(data []byte) (Checkpoint, error) {
	v, err := jcs.Parse(data)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	o, err := asObject(v, "checkpoint")
	if err != nil {
		return Checkpoint{}, err
	}
	cp, err := checkpointFromObject(o)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrCheckpointInvalid, err)
	}
	return cp, nil
}

func checkpointFromObject(o *object) (Checkpoint, error) {
	o.keys([]string{"spec", "chain", "highestSeq", "headHash", "ts", "sig"})
	if o.err != nil {
		return Checkpoint{}, o.err
	}
	var cp Checkpoint
	if s, ok := o.m["spec"].(string); !ok || s != CheckpointSpec {
		o.fail("spec", "must be %q", CheckpointSpec)
	}
	cp.Spec = CheckpointSpec
	cp.Chain = o.str("chain", true)
	if n, ok := o.m["highestSeq"].(int64); !ok || n < 0 {
		o.fail("highestSeq", "must be a non-negative integer")
	} else {
		cp.HighestSeq = n
	}
	cp.HeadHash = o.pattern("headHash", hashRE)
	cp.TS = o.pattern("ts", cpTSRE)
	sg := o.sub("sig")
	sg.keys([]string{"alg", "kid", "value"})
	if a, ok := sg.m["alg"].(string); !ok || a != AlgEd25519 {
		sg.fail("alg", "must be %q", AlgEd25519)
	}
	cp.Sig = Sig{Alg: AlgEd25519, KID: sg.str("kid", true), Value: sg.str("value", true)}
	o.merge(sg)
	if o.err != nil {
		return Checkpoint{}, o.err
	}
	cp.tree = o.m
	return cp, nil
}

// Bytes returns the checkpoint's canonical JSON.
func (cp Checkpoint) Bytes() ([]byte, error) {
	if cp.tree == nil {
		return nil, errors.New("noa: empty checkpoint")
	}
	return jcs.Marshal(cp.tree)
}

// NewCheckpoint signs a checkpoint over head, the last receipt of a chain.
func NewCheckpoint(ctx context.Context, head Receipt, ts time.Time, s Signer) (Checkpoint, []byte, error) {
	if head.tree == nil {
		return Checkpoint{}, nil, errors.New("noa: checkpoint: empty head receipt")
	}
	kid := s.KeyID()
	tree := map[string]any{
		"spec":       CheckpointSpec,
		"chain":      head.Scope.Chain,
		"highestSeq": head.Chain.Seq,
		"headHash":   head.Chain.Hash,
		"ts":         FormatTS(ts),
		"sig":        map[string]any{"alg": AlgEd25519, "kid": kid},
	}
	input, err := jcs.Marshal(tree)
	if err != nil {
		return Checkpoint{}, nil, fmt.Errorf("noa: checkpoint: %w", err)
	}
	msg := preimage(checkpointDomain, input)
	sig, err := s.Sign(ctx, msg)
	if err != nil {
		return Checkpoint{}, nil, fmt.Errorf("noa: checkpoint: signing failed: %w", err)
	}
	sigB64 := base64.StdEncoding.EncodeToString(sig)
	if !verifySig(s.PublicKey(), msg, sigB64) {
		return Checkpoint{}, nil, fmt.Errorf("noa: checkpoint: signer returned a signature that does not verify under key %q", kid)
	}
	tree["sig"].(map[string]any)["value"] = sigB64
	o, _ := asObject(tree, "checkpoint")
	cp, err := checkpointFromObject(o)
	if err != nil {
		return Checkpoint{}, nil, fmt.Errorf("noa: checkpoint: %w", err)
	}
	b, err := cp.Bytes()
	if err != nil {
		return Checkpoint{}, nil, err
	}
	return cp, append(b, '\n'), nil
}

// CheckpointSignature checks a checkpoint's signature under the key its
// kid names in kr: "ok", "unverified" (kr does not hold the kid) or "bad
// signature".
func CheckpointSignature(cp Checkpoint, kr Keyring) string { return verifyCheckpointSig(cp, kr) }

// verifyCheckpointSig reports "ok", "unverified" (kid not in the keyring or
// no keyring) or "bad signature".
func verifyCheckpointSig(cp Checkpoint, kr Keyring) string {
	b64, ok := kr[cp.Sig.KID]
	if !ok {
		return "unverified"
	}
	pub, err := DecodeSPKI(b64)
	if err != nil {
		return "bad signature"
	}
	input, err := hashInput(cp.tree, "sig", "value")
	if err != nil {
		return "bad signature"
	}
	if !verifySig(pub, preimage(checkpointDomain, input), cp.Sig.Value) {
		return "bad signature"
	}
	return "ok"
}

// ParamsHash returns "hmac-sha256:<hex>" of the canonical (JCS) form of
// params under key: a keyed hash, so that low-entropy parameters (an
// amount, an address) cannot be recovered from a receipt by trying values.
func ParamsHash(key []byte, params any) (string, error) {
	if len(key) < 16 {
		return "", errors.New("noa: params hash key shorter than 16 bytes")
	}
	b, err := jcs.Marshal(params)
	if err != nil {
		return "", fmt.Errorf("noa: params hash: %w", err)
	}
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil)), nil
}
