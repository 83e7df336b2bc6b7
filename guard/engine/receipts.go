package engine

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// ParamsHash is the keyed hash of a question as receipts carry it; the
// guard's answer and the human's decision on it carry the same value, and
// amounts cannot be brute-forced from the log without the key.
func ParamsHash(key []byte, q guard.Question) (string, error) { return QuestionHash(key, q, "") }

// QuestionHash is ParamsHash of a question that may name the resource it
// pays for (a canonical URL; "" for none, which hashes as ParamsHash).
func QuestionHash(key []byte, q guard.Question, resource string) (string, error) {
	params := map[string]any{"counterparty": q.Counterparty, "amount": q.Amount, "asset": q.Asset, "template": q.Template}
	if resource != "" {
		params["resource"] = resource
	}
	if q.PayTo != "" {
		// Only when named: the hash of a question without it is as it was.
		params["pay_to"] = q.PayTo
	}
	h, err := noa.ParamsHash(key, params)
	if err != nil {
		return "", fmt.Errorf("params hash: %w", err)
	}
	return h, nil
}

// ParamsKeyFrom derives the paramsHash key from signing-key material, so
// that one secret serves both (a key of its own can be passed instead).
func ParamsKeyFrom(secret []byte) []byte {
	m := hmac.New(sha256.New, []byte("haia-trace-mcp/paramsHash/v1"))
	m.Write(secret)
	return m.Sum(nil)
}

// HumanDecisionDraft maps a reviewer's decision to a receipt: approval →
// ALLOWED, rejection → BLOCKED, with approval {by, at}; the reviewer is the
// agent, with principal HUMAN. The paramsHash is the DecisionHash the
// reviewer's side computes itself from the review's terms (as the server
// signed them), the decision and the note, so the reviewer needs no server
// key and signs exactly what it was shown.
func HumanDecisionDraft(rv reviewlog.Review) (noa.Draft, error) {
	ph, err := reviewlog.DecisionParamsHash(rv, rv.Status)
	if err != nil {
		return noa.Draft{}, err
	}
	at, err := time.Parse(time.RFC3339Nano, rv.DecidedAt)
	if err != nil {
		return noa.Draft{}, fmt.Errorf("review %s: decided_at %q: %w", rv.ID, rv.DecidedAt, err)
	}
	verdict := noa.VerdictBlocked
	if rv.Status == reviewlog.Approved {
		verdict = noa.VerdictAllowed
	}
	rule := reviewlog.RuleHumanReview
	return noa.Draft{
		TS:    at,
		Agent: noa.Agent{ID: rv.DecidedBy, Principal: noa.PrincipalHuman},
		Action: noa.Action{
			ID: "review:" + rv.ID, Canonical: actionCanonical, RiskClass: "IRREVERSIBLE", ParamsHash: ph, Reversible: false,
		},
		Governance: noa.Governance{
			Mode: governanceMode, Verdict: verdict, RuleID: &rule,
			Approval: &noa.Approval{By: rv.DecidedBy, At: noa.FormatTS(at)},
		},
	}, nil
}

func randomID(prefix string) (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return prefix + ":" + hex.EncodeToString(b[:]), nil
}
