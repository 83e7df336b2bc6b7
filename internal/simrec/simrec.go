// Package simrec writes Event Contract lines the way the trace-x402
// recorder does for a buyer agent, so the demo and the end-to-end tests can
// build a Trace root from simulated payments. Only the money is simulated:
// the lines are the same shape a real recorder writes.
package simrec

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// USDCBase is USDC's contract address on Base, as recorders write it.
const USDCBase = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"

// Payment is one paid request the simulated agent makes.
type Payment struct {
	OperationID string
	URL         string // the paid resource
	PayTo       string // the seller's address
	Amount      string // atomic units (USDC has 6 decimals)
	Network     string // x402 network name or CAIP-2 id; default "base"
	Asset       string // token address; default USDC on Base
	// Outcome: "settled" (a successful payment response), "unsettled" (the
	// payment left and nothing came back), "declined" (verification failed),
	// or "walked-away" (a 402 was seen and no payment was made).
	Outcome string

	// What a hostile seller or a confused recorder may write. Settle, when
	// set, replaces the settle answer of a "settled" payment (say
	// {"success": false}). SubmittedPayTo, when set, is the pay_to of the
	// submitted event's requirements, so the operation's events disagree.
	// OfferExtra is raw JSON the seller put in its 402 answer, recorded as
	// the payload member "seller_extra".
	Settle         any
	SubmittedPayTo string
	OfferExtra     json.RawMessage
	// Nonce, when set, is the EIP-3009 nonce of the payment sent, written
	// in the submitted event's payment payload (as a recorder that records
	// the payload does).
	Nonce string
}

// Recorder appends events for one run file.
type Recorder struct {
	path string
	now  time.Time
	seq  int
}

// New starts a run file events/<runID>.ndjson under root (created 0755/0644).
func New(root, runID string, start time.Time) (*Recorder, error) {
	dir := filepath.Join(root, "events")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("simrec: %w", err)
	}
	return &Recorder{path: filepath.Join(dir, runID+".ndjson"), now: start.UTC()}, nil
}

// Path is the run file's path.
func (r *Recorder) Path() string { return r.path }

// Pay records the events of one payment.
func (r *Recorder) Pay(p Payment) error {
	lines, err := r.lines(p)
	if err != nil {
		return err
	}
	return r.write(lines)
}

// PayAll records several payments with one write.
func (r *Recorder) PayAll(ps []Payment) error {
	var all []map[string]any
	for _, p := range ps {
		lines, err := r.lines(p)
		if err != nil {
			return err
		}
		all = append(all, lines...)
	}
	return r.write(all)
}

func (r *Recorder) lines(p Payment) ([]map[string]any, error) {
	if p.Network == "" {
		p.Network = "base"
	}
	if p.Asset == "" {
		p.Asset = USDCBase
	}
	resource := map[string]any{"url": p.URL, "description": "Paid resource", "mime_type": "application/json"}
	req := map[string]any{
		"scheme": "exact", "network": p.Network, "asset": p.Asset, "amount": p.Amount,
		"pay_to": p.PayTo, "max_timeout_seconds": 300,
	}
	var lines []map[string]any
	add := func(typ string, after time.Duration, payload map[string]any) {
		r.now = r.now.Add(after)
		lines = append(lines, map[string]any{
			"event_id":    fmt.Sprintf("%s-%d", p.OperationID, r.seq),
			"event_type":  typ,
			"occurred_at": r.now.Format("2006-01-02T15:04:05.000Z"),
			"seq":         r.seq,
			"adapter":     "trace-x402",
			"role":        "client",
			"context_id":  p.OperationID,
			"payload":     payload,
		})
		r.seq++
	}
	offer := map[string]any{"x402_version": 2, "error": "Payment required", "resource": resource, "accepts": []any{req}}
	if p.OfferExtra != nil {
		offer["seller_extra"] = p.OfferExtra
	}
	add("x402.payment.required", time.Second, offer)
	if p.Outcome == "walked-away" {
		return lines, nil
	}
	add("x402.payment.creating", 120*time.Millisecond, map[string]any{"x402_version": 2, "resource": resource, "requirements": req})
	submitted := req
	if p.SubmittedPayTo != "" {
		submitted = map[string]any{}
		for k, v := range req {
			submitted[k] = v
		}
		submitted["pay_to"] = p.SubmittedPayTo
	}
	sub := map[string]any{"x402_version": 2, "resource": resource, "requirements": submitted}
	if p.Nonce != "" {
		sub["payment_payload"] = map[string]any{"x402Version": 2, "payload": map[string]any{"authorization": map[string]any{"nonce": p.Nonce}}}
	}
	add("x402.payment.submitted", 360*time.Millisecond, sub)
	switch p.Outcome {
	case "settled":
		var settle any = map[string]any{"success": true, "transaction": fmt.Sprintf("0x%064x", r.seq), "network": p.Network}
		if p.Settle != nil {
			settle = p.Settle
		}
		add("x402.payment.responded", 1830*time.Millisecond, map[string]any{"x402_version": 2, "resource": resource, "requirements": req,
			"settle": settle})
	case "declined":
		add("x402.verify.failed", 900*time.Millisecond, map[string]any{"x402_version": 2, "resource": resource, "requirements": req, "error": "invalid_signature"})
	case "unsettled":
	default:
		return nil, fmt.Errorf("simrec: unknown outcome %q", p.Outcome)
	}
	return lines, nil
}

func (r *Recorder) write(lines []map[string]any) error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("simrec: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, l := range lines {
		b, err := json.Marshal(l)
		if err != nil {
			f.Close()
			return fmt.Errorf("simrec: %w", err)
		}
		w.Write(b)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("simrec: %w", err)
	}
	return f.Close()
}
