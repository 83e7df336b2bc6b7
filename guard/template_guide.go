package guard

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// TemplateGuide is what a recorder must write for a template's runs to be
// read as the guard reads them: the stages in order with the events that
// close each and the payload fields the guard reads there, and an example
// run. It is built from the template and from what FactsOf and
// OpFromReceipt read, so that it says what this build does.
type TemplateGuide struct {
	Template   string       `json:"template"`
	Version    float64      `json:"version"`
	Source     string       `json:"source"`
	Stages     []StageGuide `json:"stages"`
	Exceptions []string     `json:"exceptions"`
	// Envelope is what every line needs, whatever its stage.
	Envelope []FieldGuide `json:"envelope"`
	// Reading says how the guard judges an operation of this template.
	Reading string `json:"reading"`
	// Example is a run of one operation that closes every stage, one
	// event line per stage; Completeness is what assembling it against
	// the template gives (full, or partial with Why).
	Example      []json.RawMessage `json:"example"`
	Completeness string            `json:"example_completeness"`
	Why          string            `json:"example_why,omitempty"`
}

// StageGuide is one stage of a TemplateGuide.
type StageGuide struct {
	ID       string `json:"id"`
	Required bool   `json:"required"`
	// Role is what the stage stands for in the guard's reading: "paid"
	// (money moved), "outcome" (the payment's outcome), or "".
	Role               string         `json:"role,omitempty"`
	Phrase             string         `json:"phrase"`
	Match              []WitnessGuide `json:"match"`
	MissingExplanation string         `json:"missing_explanation,omitempty"`
	// Fields are the payload fields the guard reads from this stage's
	// events.
	Fields []FieldGuide `json:"fields"`
}

// WitnessGuide is one event that closes a stage.
type WitnessGuide struct {
	Event string `json:"event"`
	Role  string `json:"role,omitempty"`
}

// FieldGuide is one field a line needs and why.
type FieldGuide struct {
	Path string `json:"path"`
	Why  string `json:"why"`
}

// envelopeGuide is the Event Contract's envelope, as receipt.DecodeLine
// checks it.
func envelopeGuide() []FieldGuide {
	return []FieldGuide{
		{"event_id", "a non-empty string, unique in the run"},
		{"event_type", "the event's type: the stage it closes is chosen by it"},
		{"occurred_at", "UTC with milliseconds, exactly like 2026-07-24T09:00:00.120Z; events are ordered by it"},
		{"seq", "a non-negative integer: the recorder's order among events of one instant"},
		{"adapter", "a non-empty string naming the recorder"},
		{"context_id", "the operation: every event of one operation carries the same one (a line without it belongs to none)"},
		{"role", "who observed the event (client, server, facilitator): required where the stage names a role"},
		{"payload", "an object; what the guard reads in it is listed under each stage"},
	}
}

// moneyFields are the payload fields FactsOf reads from any event of an
// operation: who was paid, how much, in what.
func moneyFields() []FieldGuide {
	return []FieldGuide{
		{"payload.resource.url", "the paid URL; its host is the seller the guard judges (x402 v1: payload.resource as a string)"},
		{"payload.requirements.pay_to", "the payee address (0x and 40 hex digits)"},
		{"payload.requirements.amount", "the amount in atomic units, as a string of digits (\"250000\" is 0.25 USDC)"},
		{"payload.requirements.asset", "the token's contract address"},
		{"payload.requirements.network", "an x402 network name (base, base-sepolia) or a CAIP-2 id (eip155:8453)"},
	}
}

// settleField is what OpFromFacts requires of an x402 outcome.
func settleField() FieldGuide {
	return FieldGuide{"payload.settle.success", "the JSON value true on the event that closes this stage: without it the guard counts the payment as not settled, whatever the receipt says"}
}

// GuideFor describes what a recorder must write for t.
func GuideFor(t *receipt.Template) TemplateGuide {
	g := TemplateGuide{Template: t.Name, Version: t.Version, Source: t.Source, Exceptions: append([]string{}, t.Exceptions...), Envelope: envelopeGuide()}
	if g.Exceptions == nil {
		g.Exceptions = []string{}
	}
	paid, outcome, known := receipt.StageRoles(t.Name)
	hasStage := func(id string) bool {
		for _, s := range t.Stages {
			if s.ID == id {
				return true
			}
		}
		return false
	}
	rolesApply := known && hasStage(paid) && hasStage(outcome)
	escrow := t.Name == "escrow-arc"
	for _, s := range t.Stages {
		sg := StageGuide{ID: s.ID, Required: s.Required, Phrase: receipt.StagePhrase(t.Name, s.ID), MissingExplanation: s.MissingExplanation, Fields: []FieldGuide{}}
		for _, w := range s.Match {
			sg.Match = append(sg.Match, WitnessGuide{Event: w.Event, Role: w.Role})
		}
		switch {
		case rolesApply && s.ID == paid:
			sg.Role = "paid"
			if !escrow {
				sg.Fields = moneyFields()
			}
		case rolesApply && s.ID == outcome:
			sg.Role = "outcome"
			if settlementChecked(t.Name) {
				sg.Fields = []FieldGuide{settleField()}
			}
		}
		g.Stages = append(g.Stages, sg)
	}
	switch {
	case escrow:
		g.Reading = fmt.Sprintf("money moved when %s is closed; the operation stays open until %s is. %s, so they count against no seller and no limit.", paid, outcome, strings.ToUpper(whyEscrow[:1])+whyEscrow[1:])
	case rolesApply:
		g.Reading = fmt.Sprintf("money moved when %s is closed; the payment stays open (it counts against the seller's open payments) until %s is closed", paid, outcome)
		if settlementChecked(t.Name) {
			g.Reading += " by an event whose payload.settle.success is true"
		}
		g.Reading += ", and no exception was recorded. The money fields are read from every event of the operation; events that disagree on amount or asset make it unusable."
	default:
		g.Reading = "the guard knows no stage roles for this template: an operation counts as a payment, open while its receipt is partial. The money fields (" +
			strings.Join(fieldPaths(moneyFields()), ", ") + ") are read from every event of the operation that carries payload.requirements."
	}
	g.Example, g.Completeness, g.Why = exampleRun(t, rolesApply, escrow)
	return g
}

func fieldPaths(fs []FieldGuide) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Path
	}
	return out
}

// The example run's values: the README's seller and USDC on Base.
const (
	exampleURL   = "https://api.example.com/reports/weekly"
	examplePayTo = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	exampleToken = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
	exampleOp    = "op-1"
)

type exampleReq struct {
	Scheme  string `json:"scheme"`
	Network string `json:"network"`
	Asset   string `json:"asset"`
	Amount  string `json:"amount"`
	PayTo   string `json:"pay_to"`
}

type exampleSettle struct {
	Success     bool   `json:"success"`
	Transaction string `json:"transaction"`
	Network     string `json:"network"`
}

type examplePayload struct {
	X402Version  int            `json:"x402_version"`
	Resource     map[string]any `json:"resource"`
	Accepts      []exampleReq   `json:"accepts,omitempty"`
	Requirements *exampleReq    `json:"requirements,omitempty"`
	Settle       *exampleSettle `json:"settle,omitempty"`
}

type exampleLine struct {
	EventID    string `json:"event_id"`
	EventType  string `json:"event_type"`
	OccurredAt string `json:"occurred_at"`
	Seq        int    `json:"seq"`
	Adapter    string `json:"adapter"`
	Role       string `json:"role,omitempty"`
	ContextID  string `json:"context_id"`
	Payload    any    `json:"payload"`
}

// exampleRun writes one operation that closes every stage of t with the
// first of its events that is no exception, each payload carrying what the
// guard reads there, and assembles it against t: the completeness is the
// assembler's, not a claim.
func exampleRun(t *receipt.Template, rolesApply, escrow bool) ([]json.RawMessage, string, string) {
	exception := map[string]bool{}
	for _, x := range t.Exceptions {
		exception[x] = true
	}
	_, outcome, _ := receipt.StageRoles(t.Name)
	start := time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)
	req := exampleReq{Scheme: "exact", Network: "base", Asset: exampleToken, Amount: "250000", PayTo: examplePayTo}
	var (
		lines  []json.RawMessage
		events []receipt.Event
		why    []string
	)
	for i, s := range t.Stages {
		var w *receipt.Witness
		for j := range s.Match {
			if !exception[s.Match[j].Event] {
				w = &s.Match[j]
				break
			}
		}
		if w == nil {
			why = append(why, fmt.Sprintf("every event that closes stage %s is also an exception", s.ID))
			continue
		}
		seq := i + 1
		l := exampleLine{EventID: fmt.Sprintf("%s-%d", exampleOp, seq), EventType: w.Event, Seq: seq, Role: w.Role, ContextID: exampleOp,
			OccurredAt: start.Add(time.Duration(seq) * 240 * time.Millisecond).Format("2006-01-02T15:04:05.000Z"), Adapter: "example-recorder"}
		var payload any = map[string]any{}
		if strings.HasPrefix(w.Event, "x402.") && !escrow {
			l.Adapter = "trace-x402"
			p := examplePayload{X402Version: 2, Resource: map[string]any{"url": exampleURL}}
			if w.Event == "x402.payment.required" {
				p.Accepts = []exampleReq{req}
			} else {
				r := req
				p.Requirements = &r
			}
			if rolesApply && s.ID == outcome && settlementChecked(t.Name) {
				p.Settle = &exampleSettle{Success: true, Transaction: "0x" + strings.Repeat("ab", 32), Network: "base"}
			}
			payload = p
		}
		l.Payload = payload
		b, err := json.Marshal(l)
		if err != nil {
			why = append(why, err.Error())
			continue
		}
		ev, err := receipt.DecodeLine(b)
		if err != nil {
			why = append(why, fmt.Sprintf("stage %s: %v", s.ID, err))
			continue
		}
		lines = append(lines, b)
		events = append(events, ev)
	}
	if lines == nil {
		lines = []json.RawMessage{}
	}
	if len(events) == 0 {
		return lines, receipt.Partial, strings.Join(why, "; ")
	}
	res := receipt.Assemble(events, t)
	if len(res.Receipts) != 1 {
		return lines, receipt.Partial, fmt.Sprintf("the example assembled into %d operations", len(res.Receipts))
	}
	r := res.Receipts[0]
	if r.Completeness != receipt.Full {
		for _, m := range r.Missing {
			why = append(why, "stage "+m.Stage+" is not closed")
		}
		for _, f := range r.Exceptions {
			why = append(why, "event "+f.EventType+" is an exception")
		}
	}
	return lines, r.Completeness, strings.Join(why, "; ")
}
