package policy

import "fmt"

// Compliance is the commitment a NOA receipt carries in
// governance.compliance (receipt schema 0.1: exactly these four members):
// which policy ran over which inputs, and what it answered. The inputs
// themselves stay out of the receipt; only their hash is committed.
type Compliance struct {
	PolicyHash  string `json:"policyHash"`
	ReadSetHash string `json:"readSetHash"`
	InputsHash  string `json:"inputsHash"`
	Verdict     string `json:"verdict"`
}

// Commit evaluates the policy over s and returns the result with the
// commitment that binds it. A snapshot that cannot be hashed (a non-scalar,
// a key no document could carry, a nil map) returns an error together with
// the denying result: there is no commitment a verifier could reproduce, so
// the caller must fail closed.
func (p *Policy) Commit(s Snapshot) (Compliance, Result, error) {
	r := p.Evaluate(s)
	if p == nil || p.hash == "" {
		return Compliance{}, r, fmt.Errorf("commit: %s", r.Reason)
	}
	h, err := InputsHash(s)
	if err != nil {
		return Compliance{}, r, fmt.Errorf("commit: inputsHash: %w", err)
	}
	return Compliance{PolicyHash: p.hash, ReadSetHash: p.readSetHash, InputsHash: h, Verdict: r.Verdict}, r, nil
}
