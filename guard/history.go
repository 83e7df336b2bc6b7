package guard

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Why an operation cannot be attributed to a counterparty.
const (
	whyEscrow    = "escrow receipts carry no x402 money fields (pay_to, amount, asset)"
	whyNoReqs    = "no event carries x402 requirements"
	whyNoCounter = "requirements.pay_to is not a usable address and no resource URL host was found"
	whyNoPayTo   = "no event carries a usable requirements.pay_to address"
	whyNoHost    = "no event carries a usable resource URL host"
)

// settlementChecked names the templates whose outcome stage is an x402
// settlement answer: for them the guard counts the outcome as confirmed only
// where a witness's payload says settle.success is true. The receipt itself
// keeps the reference's verdict; this is the guard's reading of it.
func settlementChecked(template string) bool {
	switch template {
	case "x402-buyer", "x402-seller", "x402-facilitator":
		return true
	}
	return false
}

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
	if len(r.Events) > 0 {
		o.FirstEventAt = r.Events[0].OccurredAt
	}
	// An operation has a few events: their facts are read on the stack
	// unless there are many (a cold listing summarises every operation).
	var few [8]EventFacts
	fs := few[:0]
	if len(r.Events) > len(few) {
		fs = make([]EventFacts, 0, len(r.Events))
	}
	for i := range r.Events {
		fs = append(fs, facts(&r.Events[i]))
	}
	if paid, outcome, ok := receipt.StageRoles(o.Template); ok && hasStage(r, paid) && hasStage(r, outcome) {
		// An operator's own template may reuse a bundled name with other
		// stages; roles then do not apply and it is judged coarsely.
		o.RolesKnown = true
		o.PaidConfirmed = r.StageConfirmed(paid)
		o.OutcomeConfirmed = r.StageConfirmed(outcome)
		if o.OutcomeConfirmed && settlementChecked(o.Template) && !settledByPayload(r, outcome, fs) {
			o.OutcomeConfirmed, o.SettlementUnconfirmed = false, true
		}
	}
	o.classify()
	if o.Template == "escrow-arc" {
		o.Unattributable = whyEscrow
		return o
	}
	o.Money, o.Unattributable = moneyOf(fs)
	return o
}

// classify sets Open and Spent from the stage facts.
func (o *Op) classify() {
	switch {
	case o.RolesKnown:
		// Money moved; from the buyer's side a reported fault and a silent
		// settlement look the same, so a fault keeps the operation open.
		o.Open = o.PaidConfirmed && (!o.OutcomeConfirmed || o.Faulted)
		o.Spent = o.PaidConfirmed
	default:
		o.Open = o.Completeness == receipt.Partial
		o.Spent = true
	}
}

// settledByPayload: some event that closed the outcome stage carries an
// x402 settle answer whose success is true.
func settledByPayload(r *receipt.Receipt, stage string, fs []EventFacts) bool {
	for _, s := range r.Stages {
		if s.ID != stage {
			continue
		}
		for _, id := range s.Events {
			for i := range r.Events {
				if r.Events[i].ID == id && fs[i].SettleOK {
					return true
				}
			}
		}
	}
	return false
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
	// Resource is the resource URL in canonical form (CanonicalResource),
	// "" when there is none or it cannot be read.
	Resource string
	// HasRequirements says the payload carries x402 requirements; PayTo,
	// Atomic (decimal digits) and Asset are then read from them, or
	// Problem says why the amount cannot be used.
	HasRequirements bool
	PayTo           string
	Atomic          string
	Asset           string
	Problem         string
	// SettleOK says the payload carries an x402 settle answer whose
	// success is the JSON value true.
	SettleOK bool
}

// FactsOf extracts an event's facts from its payload.
func FactsOf(e receipt.Event) EventFacts {
	f := EventFacts{EventID: e.ID}
	p := e.Payload()
	if p.Kind() != jsjson.Object {
		return f
	}
	if u, ok := resourceURL(p); ok {
		// One reading of the URL serves both the host and the resource.
		if h, _, err := hostOfURL(u); err == nil {
			f.Host = h
			if r, err := resourceFrom(strings.TrimSpace(u), h); err == nil {
				f.Resource = r
			}
		}
	}
	if st, ok := p.Get("settle"); ok && st.Kind() == jsjson.Object {
		if v, ok := st.Get("success"); ok {
			b, isBool := v.Bool()
			f.SettleOK = isBool && b
		}
	}
	req, ok := p.Get("requirements")
	if !ok {
		return f
	}
	f.HasRequirements = true
	var problem string
	f.PayTo, f.Atomic, f.Asset, problem = readRequirements(req)
	if problem != "" {
		f.Problem = fmt.Sprintf("event %s: %s", clip(e.ID), problem)
	}
	return f
}

// moneyOf combines the facts of an operation's events. Every usable pay_to
// and every resource host any event names is kept, so an operation whose
// events disagree counts against each counterparty they name. The first
// event with requirements sets the amount; a later event that disagrees
// makes it unusable rather than being silently ignored.
func moneyOf(facts []EventFacts) (*Money, string) {
	var (
		m          Money
		seenReqs   bool
		amountKey  amountID // the first event's, to detect disagreement
		amountFrom string
	)
	for _, f := range facts {
		if f.Host != "" {
			m.Hosts = addUnique(m.Hosts, f.Host)
		}
		if f.Resource != "" {
			m.Resources = addUnique(m.Resources, f.Resource)
		}
		if !f.HasRequirements {
			continue
		}
		if f.PayTo != "" {
			m.PayTos = addUnique(m.PayTos, f.PayTo)
		}
		if !seenReqs {
			seenReqs = true
			var amt *big.Int
			if f.Problem == "" {
				amt, _ = new(big.Int).SetString(f.Atomic, 10)
			}
			m.Atomic, m.Asset, m.Problem = amt, f.Asset, f.Problem
			amountKey, amountFrom = amountOf(f), f.EventID
			continue
		}
		if k := amountOf(f); k != amountKey && m.Problem == "" {
			m.Atomic, m.Asset = nil, ""
			m.Problem = fmt.Sprintf("events %s and %s disagree on requirements.amount or asset", clip(amountFrom), clip(f.EventID))
		}
	}
	if !seenReqs {
		return nil, whyNoReqs
	}
	if len(m.PayTos) == 0 && len(m.Hosts) == 0 {
		// Paid to no one the guard can name: kept, so that its amount
		// still counts towards the total limit.
		return &m, whyNoCounter
	}
	return &m, ""
}

func addUnique(list []string, v string) []string {
	for _, x := range list {
		if x == v {
			return list
		}
	}
	return append(list, v)
}

// amountID is what two events' requirements must share to agree: the
// same problem, or the same amount (as its big.Int prints) and asset.
type amountID struct{ problem, amount, asset string }

// amountOf is an event's amountID. The amount of an event FactsOf read is
// already the digits its big.Int prints; other text is parsed and printed.
func amountOf(f EventFacts) amountID {
	if f.Problem != "" {
		return amountID{problem: f.Problem}
	}
	if checkAtomic(f.Atomic) == nil {
		return amountID{amount: f.Atomic, asset: f.Asset}
	}
	amt, _ := new(big.Int).SetString(f.Atomic, 10)
	return amountID{amount: amt.String(), asset: f.Asset}
}

// readRequirements validates the x402 requirements object: pay_to an
// address, amount a string of atomic units (returned as its digits), asset a token address on
// network (an x402 name or CAIP-2 id).
func readRequirements(req jsjson.Value) (payTo, atomic, asset, problem string) {
	if req.Kind() != jsjson.Object {
		return "", "", "", "requirements is a " + req.Kind().String() + ", not an object"
	}
	var problems []string
	if v, ok := req.Get("pay_to"); ok {
		if s, isStr := v.Str(); isStr {
			if a, err := PayToAddress(s); err == nil {
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
		a, err := AtomicDigits(s)
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
		return payTo, "", "", strings.Join(problems, "; ")
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

// resourceURL reads payload.resource.url (x402 v2) or payload.resource as
// a URL string (v1).
func resourceURL(p jsjson.Value) (string, bool) {
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
	return s, isStr
}

// OpsFromResult reads every receipt of one assembled run.
func OpsFromResult(runID string, res *receipt.Result) []Op {
	ops := make([]Op, 0, len(res.Receipts))
	for i := range res.Receipts {
		ops = append(ops, OpFromReceipt(runID, &res.Receipts[i]))
	}
	return ops
}
