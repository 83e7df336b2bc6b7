package noa

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// VerifySignature checks one receipt on its own, outside its chain: its
// chain.hash is the hash of its content, it names the key pub as its kid,
// and its signature verifies under pub. It says nothing about the chain
// the receipt sits in; VerifyChain does that.
func VerifySignature(r Receipt, pub ed25519.PublicKey) error {
	if r.tree == nil {
		return errors.New("receipt not decoded")
	}
	input, err := r.HashInput()
	if err != nil {
		return err
	}
	sum := sha256.Sum256(input)
	if "sha256:"+hex.EncodeToString(sum[:]) != r.Chain.Hash {
		return errors.New("hash mismatch (content altered)")
	}
	if r.Sig.KID != KeyID(pub) {
		return fmt.Errorf("signed with key %q, not the trusted key %q", r.Sig.KID, KeyID(pub))
	}
	if !verifySig(pub, append([]byte(receiptDomain), sum[:]...), r.Sig.Value) {
		return errors.New("invalid signature")
	}
	return nil
}
