package notify

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// SettlementFinding is what a reviewer is told of a settlement whose
// seller's answer disagrees with the authorization it settles. It carries
// identifiers, terms and the findings' words, never a signature, a key or
// the seller's receipt; every URL in the findings loses its query,
// fragment and user information (a resource URL may carry an API key).
type SettlementFinding struct {
	// ReviewID is "settlement:" and the nonce (set by NewSettlementMessage).
	ReviewID string `json:"review_id"`
	Kind     string `json:"kind"`
	Nonce    string `json:"nonce"`
	// Source is "agent" (record_receipt) or "trace"; TraceRun,
	// TraceOperation and TraceLine name the event read from the Trace.
	Source         string `json:"source"`
	TraceRun       string `json:"trace_run,omitempty"`
	TraceOperation string `json:"trace_operation,omitempty"`
	TraceLine      int    `json:"trace_line,omitempty"`
	Transaction    string `json:"transaction"`
	Network        string `json:"network"`
	Payee          string `json:"payee"`
	// Amount is the authorization's value as people read it ("0.25 USDC",
	// or atomic units of a token the policy does not name).
	Amount               string `json:"amount"`
	Caller               string `json:"caller"`
	Tenant               string `json:"tenant,omitempty"`
	AuthorizationReceipt string `json:"authorization_receipt"`
	SettlementReceipt    string `json:"settlement_receipt"`
	// HoldKept: the settlement did not end the authorization's hold.
	HoldKept bool `json:"hold_kept"`
	// Fields are the fields the findings name, in order.
	Fields   []string `json:"fields"`
	Findings []string `json:"findings"`
}

// maxFindings bounds the findings a message carries.
const maxFindings = 32

var (
	urlRE      = regexp.MustCompile(`(?i)\b(https?://)([^\s"'/?#@]*@)?([^\s"'?#]*)[?#][^\s"']*`)
	userinfoRE = regexp.MustCompile(`(?i)\b(https?://)[^\s"'/?#@]*@`)
)

// redactURLs drops the query, fragment and user information of every
// http(s) URL in s.
func redactURLs(s string) string {
	s = urlRE.ReplaceAllString(s, "$1$3?…")
	return userinfoRE.ReplaceAllString(s, "$1")
}

// NewSettlementMessage makes the settlement.finding message of f.
func NewSettlementMessage(f SettlementFinding) (Message, error) {
	f.ReviewID, f.Kind = "settlement:"+strings.ToLower(f.Nonce), "settlement_finding"
	if len(f.Findings) > maxFindings {
		f.Findings = f.Findings[:maxFindings]
	}
	f.Fields = nil
	for i, x := range f.Findings {
		f.Findings[i] = redactURLs(x)
		field, _, ok := strings.Cut(x, ": ")
		if !ok || strings.ContainsAny(field, " '\"") || len(field) > 32 {
			field = "finding"
		}
		f.Fields = append(f.Fields, field)
	}
	raw, err := json.Marshal(f)
	if err != nil {
		return Message{}, fmt.Errorf("notify: encode the finding: %w", err)
	}
	m := Message{Event: EventSettlementFinding, ReviewID: f.ReviewID, Review: raw}
	if err := m.check(); err != nil {
		return Message{}, err
	}
	source := "handed in by the agent"
	if f.Source == "trace" {
		source = "read from the Trace"
	}
	hold := ""
	if f.HoldKept {
		hold = "; its hold still counts as an open payment"
	}
	fields := make([]string, len(f.Fields))
	for i, x := range f.Fields {
		fields[i] = field(x)
	}
	n := "1 finding"
	if len(f.Findings) != 1 {
		n = fmt.Sprintf("%d findings", len(f.Findings))
	}
	m.Text = fmt.Sprintf("The seller's settlement of payment authorization %s disagrees with it (%s: %s): %s to %s, settlement %s%s. Check with: haia-trace-mcp authorization show %s",
		field(f.Nonce), n, strings.Join(fields, ", "), field(f.Amount), field(f.Payee), source, hold, field(f.Nonce))
	return m, nil
}

// SettlementAmbiguity is what a reviewer is told of a settlement of the
// Trace the server could bind to no one authorization: one transaction
// with the terms of several authorizations, or one authorization with the
// terms of several transactions. Nothing was bound; a person hands the
// right settlement in (record_receipt).
type SettlementAmbiguity struct {
	// ReviewID is "ambiguity:" and the key (set by NewAmbiguityMessage).
	ReviewID string `json:"review_id"`
	Kind     string `json:"kind"`
	// Ambiguity is settlement_fits_several or authorization_fits_several.
	Ambiguity    string   `json:"ambiguity"`
	Key          string   `json:"key"`
	Nonces       []string `json:"nonces"`
	Transactions []string `json:"transactions"`
	TraceRun     string   `json:"trace_run"`
	TraceLine    int      `json:"trace_line"`
	Tenant       string   `json:"tenant,omitempty"`
	Findings     []string `json:"findings"`
}

// NewAmbiguityMessage makes the settlement.finding message of a.
func NewAmbiguityMessage(a SettlementAmbiguity) (Message, error) {
	a.ReviewID, a.Kind = "ambiguity:"+strings.ToLower(a.Key), "settlement_ambiguous"
	for i, x := range a.Findings {
		a.Findings[i] = redactURLs(x)
	}
	raw, err := json.Marshal(a)
	if err != nil {
		return Message{}, fmt.Errorf("notify: encode the ambiguity: %w", err)
	}
	m := Message{Event: EventSettlementFinding, ReviewID: a.ReviewID, Review: raw}
	if err := m.check(); err != nil {
		return Message{}, err
	}
	first := ""
	if len(a.Nonces) > 0 {
		first = field(a.Nonces[0])
	}
	if a.Ambiguity == "authorization_fits_several" {
		m.Text = fmt.Sprintf("Payment authorization %s has the terms of %s read from the Trace (run %s, line %d): none was taken as its payment, and its hold still counts. Hand the right one in with record_receipt; check with: haia-trace-mcp authorization show %s",
			first, plural(len(a.Transactions), "settlement"), field(a.TraceRun), a.TraceLine, first)
	} else {
		m.Text = fmt.Sprintf("A settlement read from the Trace (run %s, line %d) has the terms of %s: none was taken as paid, and their holds still count. Hand it in with record_receipt for the right one; check with: haia-trace-mcp authorization show %s",
			field(a.TraceRun), a.TraceLine, plural(len(a.Nonces), "payment authorization"), first)
	}
	return m, nil
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
