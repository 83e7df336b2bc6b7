package reviewlog

import (
	"encoding/json"
	"errors"
	"fmt"
)

// PolicyFile is where the file store records the policy in effect, under
// guard/.
const PolicyFile = "policy-in-effect.json"

// MaxPolicyRecord bounds a recorded policy: the policy file's own bound
// (1 MiB) and room for its JSON escaping.
const MaxPolicyRecord = 8 << 20

// PolicyRecord is the guard policy a server runs with, recorded in its
// store when it starts and on every reload, so that the review commands
// decide under the very policy the server applies (its reviewTtlMinutes
// above all) instead of a file they might not find.
type PolicyRecord struct {
	// Source is the file the server read, or "built-in defaults".
	Source string `json:"source"`
	// SHA256 is the hex SHA-256 of Text ("" for the built-in defaults).
	SHA256 string `json:"sha256,omitempty"`
	// Text is the policy file's bytes, as the server parsed them.
	Text string `json:"text,omitempty"`
	// At is when it was recorded (RFC 3339).
	At string `json:"at"`
	// Tenant is the tenant of a --tenants-dir server whose store this is
	// ("" for a single root): the review commands read and write its log
	// as that tenant's, where only the reviewers granted it decide.
	Tenant string `json:"tenant,omitempty"`
	// Refused, when set, is the last reload (SIGHUP) the server refused
	// since it recorded this policy, which stays in force.
	Refused *RefusedPolicy `json:"refused,omitempty"`
}

// RefusedPolicy is a policy file the server was asked to put in force on
// a reload and refused: it kept the policy it ran with.
type RefusedPolicy struct {
	// Source is the file the server read.
	Source string `json:"source"`
	// At is when it refused it (RFC 3339).
	At string `json:"at"`
	// Error says why.
	Error string `json:"error"`
}

// ParsePolicyRecord reads a recorded policy, refusing anything that is not
// one.
func ParsePolicyRecord(data []byte) (PolicyRecord, error) {
	var rec PolicyRecord
	if len(data) > MaxPolicyRecord {
		return rec, fmt.Errorf("the recorded policy is larger than %d bytes", MaxPolicyRecord)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return PolicyRecord{}, fmt.Errorf("the recorded policy is not valid JSON: %w", err)
	}
	if rec.Source == "" || rec.At == "" || (rec.Text != "") != (rec.SHA256 != "") {
		return PolicyRecord{}, errors.New("the recorded policy lacks its source, time, text or hash")
	}
	if rec.Tenant != "" {
		if err := CheckTenant(rec.Tenant); err != nil {
			return PolicyRecord{}, fmt.Errorf("the recorded policy's tenant: %w", err)
		}
	}
	if r := rec.Refused; r != nil && (r.Source == "" || r.At == "" || r.Error == "") {
		return PolicyRecord{}, errors.New("the recorded policy's refused reload lacks its source, time or error")
	}
	return rec, nil
}
