package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Call is a tool call of another MCP server that an integration (the guard
// proxy) forwards only when the engine allows it. Arguments are the JCS
// (RFC 8785) bytes of the arguments exactly as they will be forwarded.
type Call struct {
	Tool      string
	Arguments []byte
}

// CallParamsHash is the receipts' paramsHash of a forwarded call: the keyed
// hash of the JCS form of {"tool", "arguments"}, so the chain proves which
// call a decision let through, and whoever holds the key and the call can
// check it.
func CallParamsHash(key []byte, c Call) (string, error) {
	if c.Tool == "" {
		return "", errors.New("call params hash: no tool name")
	}
	args, err := jcs.Parse(c.Arguments)
	if err != nil {
		return "", fmt.Errorf("call params hash: arguments: %w", err)
	}
	canon, err := jcs.Marshal(args)
	if err != nil {
		return "", fmt.Errorf("call params hash: arguments: %w", err)
	}
	if !bytes.Equal(canon, c.Arguments) {
		return "", errors.New("call params hash: the arguments are not in JCS canonical form, so what is hashed would not be what is forwarded")
	}
	h, err := noa.ParamsHash(key, map[string]any{"tool": c.Tool, "arguments": args})
	if err != nil {
		return "", fmt.Errorf("call params hash: %w", err)
	}
	return h, nil
}

// CheckCall answers q, the payment a tool call would make, for caller. It is
// Check with two differences: the receipt's paramsHash is CallParamsHash of
// the call, and a human approval is honoured only for a review opened by
// this very call (same tool, same arguments), once.
func (e *Engine) CheckCall(ctx context.Context, caller string, q Question, c Call) (Answer, error) {
	if _, err := CallParamsHash(e.cfg.ParamsKey, c); err != nil {
		return Answer{}, err
	}
	return e.check(ctx, caller, q, &c, CheckOptions{})
}

// Outcome is what became of a call the engine allowed.
type Outcome string

// Outcomes of a forwarded call. Only OutcomeExecuted says the upstream ran
// it; a timeout or a lost upstream leaves the payment's fate unknown.
const (
	// OutcomeExecuted: the upstream answered with a result.
	OutcomeExecuted Outcome = "upstream_executed"
	// OutcomeToolError: the upstream answered that the tool failed, and
	// the operator vouches that its errors mean "not paid" (the guard
	// map's "errors": "unpaid").
	OutcomeToolError Outcome = "upstream_tool_error"
	// OutcomeToolErrorUnknown: the upstream answered that the tool failed,
	// with nothing to say whether it paid first (the guard map's
	// "errors": "unknown", the default).
	OutcomeToolErrorUnknown Outcome = "upstream_tool_error_unknown"
	// OutcomeRefused: the upstream's answer proves the call was not run:
	// it was never sent, or the upstream refused the request before any
	// handler ran (JSON-RPC -32700, -32600, -32601 or -32602: a request it
	// could not read, an unknown method or tool, arguments refused before
	// execution).
	OutcomeRefused Outcome = "upstream_refused"
	// OutcomeErrorUnknown: the upstream answered with a JSON-RPC error that
	// does not prove the call was not run (an internal error, a
	// server-defined or application code, a handler that threw): whether
	// it paid first is unknown, as for OutcomeToolErrorUnknown.
	OutcomeErrorUnknown Outcome = "upstream_error_unknown"
	// OutcomeTimeout: no answer in time; the upstream may still run it.
	OutcomeTimeout Outcome = "upstream_timeout"
	// OutcomeLost: the upstream went away during the call.
	OutcomeLost Outcome = "upstream_lost"
)

// Settled reports whether the upstream's answer says for certain that the
// payment did not happen, so that what the allow reserved can be released.
func (o Outcome) Settled() bool { return o == OutcomeToolError || o == OutcomeRefused }

// OutcomeRecord is what RecordOutcome wrote.
type OutcomeRecord struct {
	// ReceiptID is the outcome's signed receipt.
	ReceiptID string
	// Released: the allow's reservation no longer counts (a sealed release
	// was written in the same locked step as the receipt).
	Released bool
}

// RecordOutcome signs what became of an allowed call into the decision
// chain, after the decision's receipt: the same action.id and paramsHash,
// verdict EXECUTED for OutcomeExecuted and FAILED for every other outcome,
// the outcome as ruleId. When the outcome says for certain that the payment
// did not happen (Settled) and the allow's reservation still holds, the
// same locked step releases it: a released record sealed with the server's
// key, bound to the reservation record it names and to the outcome's
// receipt. A timeout or a lost upstream releases nothing — the payment may
// have been made — so it counts until the reservation lapses.
func (e *Engine) RecordOutcome(ctx context.Context, caller string, ans Answer, o Outcome) (OutcomeRecord, error) {
	if ans.ActionID == "" || ans.ParamsHash == "" || ans.ReceiptID == "" {
		return OutcomeRecord{}, errors.New("engine: the answer carries no recorded action")
	}
	if ans.Decision != guard.Allow {
		return OutcomeRecord{}, fmt.Errorf("engine: an outcome follows an allow, not a %s", ans.Decision)
	}
	verdict := noa.VerdictFailed
	if o == OutcomeExecuted {
		verdict = noa.VerdictExecuted
	}
	rule := string(o)
	d := noa.Draft{
		TS:    e.cfg.Now(),
		Agent: noa.Agent{ID: caller, Principal: noa.PrincipalService},
		Action: noa.Action{
			ID: ans.ActionID, Canonical: actionCanonical, RiskClass: "IRREVERSIBLE", ParamsHash: ans.ParamsHash, Reversible: false,
		},
		Governance: noa.Governance{Mode: governanceMode, Verdict: verdict, RuleID: &rule},
	}
	var out OutcomeRecord
	var kept string
	var rel *ledger.Raw
	err := e.cfg.Log.WithLock(ctx, func(tx reviewlog.Tx) error {
		d.TS = tx.At
		r, err := e.cfg.Chains.Append(ctx, tx.Store, d)
		if err != nil {
			return err
		}
		out.ReceiptID = r.ID
		if !o.Settled() {
			return nil
		}
		// Only a commitment of this server's ledger, of this caller, that
		// is not a signed authorization (a signed payment is never
		// released by a call's outcome). The receipt comes first: a crash
		// between the two leaves the commitment counting.
		rel, kept, err = e.release(ctx, tx.Store, ans.ReceiptID, caller, ledger.OutcomeNotRun, r.ID, tx.At)
		if err != nil {
			return err
		}
		out.Released = rel != nil
		return nil
	})
	if err != nil {
		return OutcomeRecord{}, e.notRecorded("record the outcome "+string(o), err)
	}
	if rel != nil {
		e.committed(*rel)
	}
	if kept != "" {
		e.cfg.Logger.Warn("the reservation of a failed call is kept", "decision_receipt", ans.ReceiptID, "why", kept)
	}
	e.cfg.Logger.Info("call outcome", "outcome", string(o), "decision_receipt", ans.ReceiptID, "receipt_id", out.ReceiptID, "released", out.Released, "caller", caller)
	return out, nil
}
