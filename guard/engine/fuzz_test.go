package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// How a generated operation names its seller. The question is always about
// sellerA (by address) or api.example.com (by host).
var fuzzPayTos = []struct {
	payTo, submitted string
	couldBe          bool // could this operation be sellerA's?
	is               bool // is it, for certain, sellerA's?
}{
	{sellerA, "", true, true},
	{strings.ToLower(sellerA), "", true, true},
	{"0X" + strings.ToUpper(sellerA[2:]), "", true, true},
	{" " + sellerA + " ", "", true, true},
	{sellerB, "", false, false},
	{"seller-a", "", true, false}, // no usable address: it may be anyone's
	{sellerB, sellerA, true, true},
	{sellerA, "0x12", true, true},
}

var fuzzURLs = []struct {
	url     string
	couldBe bool // could this operation be api.example.com's?
	is      bool // is it, for certain, api.example.com's, and the resource https://api.example.com/x?
}{
	{"https://api.example.com/x", true, true},
	{"https://API.Example.COM./x", true, true},
	{"https://u:p@api.example.com:8443/x", true, true},
	{"https://%61pi.example.com/x", true, true},
	{"https://other.example/x", false, false},
	{"not a url", true, false},
	{"ftp://api.example.com/x", true, false},
	{"https://xn--bcher-kva.example/x", false, false},
}

// limitsPolicy adds the limits of issue 17 to lenientPolicy, set so that a
// few generated payments of 1000 atomic units reach them: the total
// (0.0035 USDC) with the third payment, the velocity per counterparty with
// the second to the counterparty, the total velocity with the fourth, and a
// duplicate with the first payment for https://api.example.com/x.
const limitsPolicy = `{"reviewAbove": "1000", "perCounterpartyLimit": {"amount": "10000", "windowHours": 48},
  "totalLimit": {"amount": "0.0035", "windowHours": 48},
  "velocity": {"perCounterparty": {"count": 2, "windowMinutes": 120}, "total": {"count": 4, "windowMinutes": 120}},
  "duplicatePayment": {"windowMinutes": 120}}`

// How the operation ended: settledOK is whether the seller's answer really
// says the payment settled.
var fuzzOutcomes = []struct {
	outcome   string
	settle    any
	paid      bool
	settledOK bool
}{
	{"settled", nil, true, true},
	{"settled", map[string]any{"success": false}, true, false},
	{"settled", map[string]any{"success": "true"}, true, false},
	{"settled", map[string]any{}, true, false},
	{"settled", []any{true}, true, false},
	{"unsettled", nil, true, false},
	{"declined", nil, true, false},
	{"walked-away", nil, false, false},
}

// FuzzCheckNeverAllowsOpen drives check_before_pay through the engine with
// generated histories — spellings of the seller, settlement claims, hostile
// lines — and holds the safety property: a history that holds a paid, not
// settled operation that could be the counterparty's, or a run that cannot
// be read, is never answered allow. Under limitsPolicy (limits odd) it also
// holds that a payment over the total limit, the velocity limits or for a
// resource already paid for is never answered allow — counting the allows
// given before it (prior questions, whose reservations count as payments).
//
// ask chooses the question: by address (0), by host alone (1: any open
// payment could be the host's, since a seller declares the host it
// likes), or by host with the 402's pay_to (2: judged by the address).
func FuzzCheckNeverAllowsOpen(f *testing.F) {
	f.Add([]byte{0, 0, 5}, false, byte(0), byte(0))
	f.Add([]byte{2, 1, 1}, false, byte(0), byte(0))
	f.Add([]byte{4, 4, 0, 0, 0, 0}, true, byte(0), byte(0))
	f.Add([]byte{6, 0, 5, 1, 2, 3}, true, byte(1), byte(0))
	f.Add([]byte{5, 5, 6}, false, byte(2), byte(0))
	f.Add([]byte{4, 4, 0, 4, 7, 0, 4, 4, 0}, false, byte(0), byte(1))
	f.Add([]byte{0, 4, 0, 1, 7, 0}, false, byte(0), byte(1))
	f.Add([]byte{4, 0, 0}, true, byte(0), byte(1))
	f.Add([]byte{4, 4, 0, 4, 4, 0, 4, 4, 0, 4, 4, 0}, false, byte(3), byte(1))
	f.Add([]byte{4, 4, 5}, true, byte(0), byte(0))
	f.Add([]byte{4, 4, 5}, true, byte(0), byte(2))
	f.Add([]byte{4, 4, 0}, false, byte(0), byte(1|2<<1|2<<3))
	f.Add([]byte{}, false, byte(0), byte(1|1<<1|3<<3))
	f.Fuzz(func(t *testing.T, data []byte, byHost bool, hostile, limits byte) {
		// limits: bit 0 the limits policy; bits 1-2 the question's kind
		// when byHost; bits 3-4 how many questions were answered before.
		ask := 0
		if byHost {
			ask = 1 + int(limits>>1)%2
		}
		prior := int(limits>>3) % 4
		if len(data) > 3*6 {
			data = data[:3*6]
		}
		withLimits := limits%2 == 1
		pol := lenientPolicy
		if withLimits {
			pol = limitsPolicy
		}
		f := newFixture(t, t.TempDir(), pol)
		var ps []simrec.Payment
		mustNotAllow := false
		paid, paidToIt, paidForIt := 0, 0, 0
		for i := 0; i+2 < len(data); i += 3 {
			pt := fuzzPayTos[int(data[i])%len(fuzzPayTos)]
			u := fuzzURLs[int(data[i+1])%len(fuzzURLs)]
			oc := fuzzOutcomes[int(data[i+2])%len(fuzzOutcomes)]
			ps = append(ps, simrec.Payment{OperationID: "op-" + string(rune('a'+i/3)), URL: u.url, PayTo: pt.payTo, SubmittedPayTo: pt.submitted,
				Amount: "1000", Outcome: oc.outcome, Settle: oc.settle})
			couldBe := pt.couldBe
			switch ask {
			case 1:
				couldBe = true // a host alone: any open payment may be its
			case 2:
				couldBe = pt.couldBe || u.is
			}
			if oc.paid && !oc.settledOK && couldBe {
				mustNotAllow = true
			}
			is := pt.is
			switch ask {
			case 1:
				is = u.is
			case 2:
				is = pt.is || u.is
			}
			if oc.paid {
				paid++
				if is {
					paidToIt++
				}
				if u.is {
					paidForIt++
				}
			}
		}
		if len(ps) > 0 {
			f.pay(t, "run-1", ps...)
		}
		switch hostile % 4 {
		case 1: // a 402 answer nested past the reader's bound
			f.pay(t, "run-2", simrec.Payment{OperationID: "x", URL: "https://api.example.com/x", PayTo: sellerA, Amount: "1", Outcome: "walked-away",
				OfferExtra: json.RawMessage(strings.Repeat("[", 2000) + strings.Repeat("]", 2000))})
			mustNotAllow = true
		case 2: // a line that is not JSON
			if err := os.WriteFile(filepath.Join(f.dir, "events", "run-3.ndjson"), []byte("{\"event_id\":\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			mustNotAllow = true
		case 3: // invalid UTF-8 in a string
			if err := os.WriteFile(filepath.Join(f.dir, "events", "run-4.ndjson"), []byte("{\"event_id\":\"\xff\"}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			mustNotAllow = true
		}
		q := Question{Counterparty: sellerA, Amount: "0.001"}
		switch ask {
		case 1:
			q.Counterparty = "api.example.com"
		case 2:
			q.Counterparty, q.PayTo = "https://api.example.com/", sellerA
		}
		if withLimits {
			q.Resource = "https://api.example.com/x"
		}
		// Earlier answers: each allow reserves a payment to the same
		// counterparty, for the same resource.
		for i := range prior {
			a, err := f.eng.Check(context.Background(), "fuzz-agent-"+string(rune('a'+i)), q)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if a.Decision == guard.Allow {
				paid++
				paidToIt++
				paidForIt++
			}
		}
		if withLimits && (paid >= 3 || paidToIt >= 2 || paidForIt >= 1) {
			mustNotAllow = true
		}
		ans, err := f.eng.Check(context.Background(), "fuzz-agent", q)
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		if mustNotAllow && ans.Decision == guard.Allow {
			t.Fatalf("allowed over a history that holds an open operation that could be the counterparty's: %+v", ans.Reasons)
		}
		if len(ps) == 0 && hostile%4 == 0 && (prior == 0 || !withLimits) && ans.Decision != guard.Allow {
			t.Fatalf("an empty history must be allowed for a small amount: %+v", ans.Reasons)
		}
	})
}
