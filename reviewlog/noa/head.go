package noa

import (
	"encoding/json"
	"fmt"
)

// Head is the few members of a receipt that say what it is — its id and
// time, who answered, the action and the verdict — read without the rest,
// unverified. It is for a reader that picks, among many lines, the few it
// must look at (the commitment receipts a spend ledger must hold); anything
// it trusts it reads again with ParseReceipt and verifies.
type Head struct {
	ID    string `json:"id"`
	TS    string `json:"ts"`
	Agent struct {
		ID        string `json:"id"`
		Principal string `json:"principal"`
	} `json:"agent"`
	Action struct {
		Canonical string `json:"canonical"`
	} `json:"action"`
	Governance struct {
		Verdict string `json:"verdict"`
	} `json:"governance"`
}

// ParseHead reads the head of one receipt line. The line's other members
// are skipped, not checked.
func ParseHead(line []byte) (Head, error) {
	var h Head
	if err := json.Unmarshal(line, &h); err != nil {
		return Head{}, fmt.Errorf("noa: receipt head: %w", err)
	}
	if h.ID == "" || h.TS == "" {
		return Head{}, fmt.Errorf("noa: receipt head: no id or ts")
	}
	return h, nil
}
