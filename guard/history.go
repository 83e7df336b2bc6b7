package guard

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Why an operation has no money fields.
const (
	whyEscrow       = "escrow receipts carry no x402 money fields (pay_to, amount, asset)"
	whyNoReqs       = "no event carries x402 requirements"
	whyNoCounter    = "requirements.pay_to is not a usable address and no resource URL host was found"
	whyConflictPay  = "events name different requirements.pay_to"
	whyConflictHost = "events name different resource hosts"
)

// OpFromReceipt reads what the guard needs from one receipt: whether money
// moved and the outcome was seen (by the template's stage roles), and who
// was paid how much in what (from the x402 payloads, validated here).
func OpFromReceipt(runID string, r *receipt.Receipt) Op {
	return OpFromFacts(runID, r, func(e *receipt.Event) EventFacts { return FactsOf(*e) })
}

// OpFromFacts is OpFromReceipt for a caller that extracted each event's
// facts earlier (an index that does not keep payloads): facts returns them
// for one of the receipt's events.
func OpFromFacts(runID string, r *receipt.Receipt, facts func(e *receipt.Event) EventFacts) Op {
	o := Op{
		RunID:        runID,
		OperationID:  r.Operation.OperationID,
		Template:     r.Operation.Template,
		Completeness: r.Completeness,
		Faulted:      len(r.Exceptions) > 0,
		LastEventAt:  r.LastEventAt(),
	}
	if paid, outcome, ok := receipt.StageRoles(o.Template); ok && hasStage(r, paid) && hasStage(r, outcome) {
		// An operator's own template may reuse a bundled name with other
		// stages; roles then do not apply and it is judged coarsely.
		o.RolesKnown = true
		o.PaidConfirmed = r.StageConfirmed(paid)
		o.OutcomeConfirmed = r.StageConfirmed(outcome)
	}
	if o.Template == "escrow-arc" {
		o.Unattributable = whyEscrow
		return o
	}
	fs := make([]EventFacts, len(r.Events))
	for i := range r.Events {
		fs[i] = facts(&r.Events[i])
	}
	o.Money, o.Unattributable = moneyOf(fs)
	return o
}

func hasStage(r *receipt.Receipt, id string) bool {
	for _, s := range r.Stages {
		if s.ID == id {
			return true
		}
	}
	return false
}

// EventFacts is what the guard reads from one event's payload: the resource
// host and the x402 requirements, already validated. It is small, so an
// index can keep it instead of the payload.
type EventFacts struct {
	EventID string
	// Host is the resource URL's normalised host ("" when none).
	Host string
	// HasRequirements says the payload carries x402 requirements; PayTo,
	// Atomic (decimal digits) and Asset are then read from them, or
	// Problem says why the amount cannot be used.
	HasRequirements bool
	PayTo           string
	Atomic          string
	Asset           string
	Problem         string
}

// FactsOf extracts an event's facts from its payload.
func FactsOf(e receipt.Event) EventFacts {
	f := EventFacts{EventID: e.ID}
	p := e.Payload()
	if p.Kind() != jsjson.Object {
		return f
	}
	if host, ok := resourceHost(p); ok {
		f.Host = host
	}
	req, ok := p.Get("requirements")
	if !ok {
		return f
	}
	f.HasRequirements = true
	pay, amt, asset, problem := readRequirements(req)
	f.PayTo, f.Asset = pay, asset
	if amt != nil {
		f.Atomic = amt.String()
	}
	if problem != "" {
		f.Problem = fmt.Sprintf("event %s: %s", clip(e.ID), problem)
	}
	return f
}

// moneyOf combines the facts of an operation's events. The first event with
// requirements sets the values; a later event that disagrees makes the field
// unusable rather than being silently ignored.
func moneyOf(facts []EventFacts) (*Money, string) {
	var (
		m                  Money
		seenReqs, seenHost bool
		amountKey          string // "amount|asset" of the first event, to detect disagreement
		amountFrom         string
		payConflict        bool
		hostConflict       bool
	)
	for _, f := range facts {
		if f.Host != "" {
			switch {
			case !seenHost:
				m.Host, seenHost = f.Host, true
			case f.Host != m.Host:
				hostConflict = true
			}
		}
		if !f.HasRequirements {
			continue
		}
		var amt *big.Int
		if f.Problem == "" {
			amt, _ = new(big.Int).SetString(f.Atomic, 10)
		}
		if !seenReqs {
			seenReqs = true
			m.PayTo = f.PayTo
			m.Atomic, m.Asset, m.Problem = amt, f.Asset, f.Problem
			amountKey, amountFrom = moneyKey(amt, f.Asset, f.Problem), f.EventID
			continue
		}
		if f.PayTo != m.PayTo {
			payConflict = true
		}
		if k := moneyKey(amt, f.Asset, f.Problem); k != amountKey && m.Problem == "" {
			m.Atomic, m.Asset = nil, ""
			m.Problem = fmt.Sprintf("events %s and %s disagree on requirements.amount or asset", clip(amountFrom), clip(f.EventID))
		}
	}
	if hostConflict {
		m.Host = ""
	}
	if payConflict {
		return nil, whyConflictPay
	}
	if !seenReqs {
		return nil, whyNoReqs
	}
	if m.PayTo == "" && m.Host == "" {
		if hostConflict {
			return nil, whyConflictHost
		}
		return nil, whyNoCounter
	}
	return &m, ""
}

func moneyKey(amt *big.Int, asset, problem string) string {
	if problem != "" {
		return "!" + problem
	}
	return amt.String() + "|" + asset
}

// readRequirements validates the x402 requirements object: pay_to an
// address, amount a string of atomic units, asset a token address on
// network (an x402 name or CAIP-2 id).
func readRequirements(req jsjson.Value) (payTo string, atomic *big.Int, asset, problem string) {
	if req.Kind() != jsjson.Object {
		return "", nil, "", "requirements is a " + req.Kind().String() + ", not an object"
	}
	var problems []string
	if v, ok := req.Get("pay_to"); ok {
		if s, isStr := v.Str(); isStr {
			if a, err := ParseAddress(s); err == nil {
				payTo = a
			}
		}
	}
	switch v, ok := req.Get("amount"); {
	case !ok:
		problems = append(problems, "requirements.amount is missing")
	case v.Kind() != jsjson.String:
		problems = append(problems, "requirements.amount is a "+v.Kind().String()+", not a string of atomic units")
	default:
		s, _ := v.Str()
		a, err := ParseAtomic(s)
		if err != nil {
			problems = append(problems, "requirements.amount: "+shortErr(err))
		} else {
			atomic = a
		}
	}
	network, nerr := stringField(req, "network")
	token, terr := stringField(req, "asset")
	switch {
	case nerr != "":
		problems = append(problems, nerr)
	case terr != "":
		problems = append(problems, terr)
	default:
		caip, err := NetworkCAIP2(network)
		if err != nil {
			problems = append(problems, "requirements.network: "+err.Error())
			break
		}
		key, _, err := AssetKey(caip, token)
		if err != nil {
			problems = append(problems, "requirements.asset: "+err.Error())
			break
		}
		asset = key
	}
	if len(problems) > 0 {
		return payTo, nil, "", strings.Join(problems, "; ")
	}
	return payTo, atomic, asset, ""
}

func stringField(obj jsjson.Value, key string) (string, string) {
	v, ok := obj.Get(key)
	if !ok {
		return "", "requirements." + key + " is missing"
	}
	s, isStr := v.Str()
	if !isStr {
		return "", "requirements." + key + " is a " + v.Kind().String() + ", not a string"
	}
	return s, ""
}

// resourceHost reads payload.resource.url (x402 v2) or payload.resource as
// a URL string (v1) and returns its normalised host.
func resourceHost(p jsjson.Value) (string, bool) {
	res, ok := p.Get("resource")
	if !ok {
		return "", false
	}
	if res.Kind() == jsjson.Object {
		if res, ok = res.Get("url"); !ok {
			return "", false
		}
	}
	s, isStr := res.Str()
	if !isStr {
		return "", false
	}
	h, err := HostOfURL(s)
	if err != nil {
		return "", false
	}
	return h, true
}

// OpsFromResult reads every receipt of one assembled run.
func OpsFromResult(runID string, res *receipt.Result) []Op {
	ops := make([]Op, 0, len(res.Receipts))
	for i := range res.Receipts {
		ops = append(ops, OpFromReceipt(runID, &res.Receipts[i]))
	}
	return ops
}
