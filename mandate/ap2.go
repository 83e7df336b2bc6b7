package mandate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// AP2 open payment mandates (vct mandate.payment.open.1, the payload of
// the credential): what of one the guard can honour becomes a mandate's
// terms; anything it cannot is refused by name.

// AP2VCT is the credential type read.
const AP2VCT = "mandate.payment.open.1"

// AP2Source is a record's Source for terms read from an AP2 mandate.
const AP2Source = "ap2:" + AP2VCT

// ErrAP2Refused: the AP2 mandate asks for something the guard cannot
// honour, or is not one; nothing was written.
var ErrAP2Refused = errors.New("AP2 mandate refused")

// maxAP2 bounds an AP2 mandate read.
const maxAP2 = 1 << 20

// minorDigits are the ISO 4217 minor units of the currencies read.
var minorDigits = map[string]int{"USD": 2, "EUR": 2, "GBP": 2, "CHF": 2, "CAD": 2, "AUD": 2, "JPY": 0}

type ap2Mandate struct {
	VCT         string            `json:"vct"`
	Constraints []json.RawMessage `json:"constraints"`
	Cnf         json.RawMessage   `json:"cnf"`
	Payee       *ap2Merchant      `json:"payee"`
	Exp         *int64            `json:"exp"`
	Iat         *int64            `json:"iat"`
	// Members the guard cannot honour, refused by name when present.
	PaymentAmount     json.RawMessage `json:"payment_amount"`
	PaymentInstrument json.RawMessage `json:"payment_instrument"`
	PISP              json.RawMessage `json:"pisp"`
	ExecutionDate     *string         `json:"execution_date"`
	RiskData          json.RawMessage `json:"risk_data"`
}

type ap2Merchant struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Website string `json:"website"`
}

type ap2Constraint struct {
	Type string `json:"type"`
	// payment.allowed_payees
	Allowed []ap2Merchant `json:"allowed"`
	// payment.amount_range (minor units) and payment.budget (a number
	// of major units)
	Currency string      `json:"currency"`
	Max      json.Number `json:"max"`
	Min      json.Number `json:"min"`
	// payment.agent_recurrence
	Frequency      string `json:"frequency"`
	MaxOccurrences *int   `json:"max_occurrences"`
	// payment.execution_date
	NotBefore string `json:"not_before"`
	NotAfter  string `json:"not_after"`
	// payment.reference
	ConditionalTransactionID string `json:"conditional_transaction_id"`
}

func refuse(format string, a ...any) error {
	return fmt.Errorf("%w: %s; nothing was written", ErrAP2Refused, fmt.Sprintf(format, a...))
}

// ParseAP2 reads an AP2 open payment mandate as a mandate's terms in
// asset (the policy's default asset, whose symbol names the currency it
// is paid in: USDC for USD). now judges the dates.
func ParseAP2(data []byte, asset guard.Asset, now time.Time) (Record, error) {
	var r Record
	if len(data) > maxAP2 {
		return r, refuse("the file is %d bytes, more than %d", len(data), maxAP2)
	}
	var m ap2Mandate
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return r, refuse("not an AP2 open payment mandate this guard can read (the credential's JSON payload): %v", err)
	}
	if dec.More() {
		return r, refuse("data after the mandate")
	}
	if m.VCT != AP2VCT {
		return r, refuse("vct %q is not %s", clip(m.VCT), AP2VCT)
	}
	for name, v := range map[string]json.RawMessage{"payment_amount": m.PaymentAmount, "payment_instrument": m.PaymentInstrument, "pisp": m.PISP} {
		if v != nil {
			return r, refuse("%s is a constraint the guard cannot honour (a mandate here bounds amounts, it does not fix one amount, instrument or provider)", name)
		}
	}
	if m.ExecutionDate != nil {
		return r, refuse("execution_date (one date of execution) is a constraint the guard cannot honour; use payment.execution_date's window")
	}
	r.Source, r.Asset = AP2Source, asset.Key
	var payees []ap2Merchant
	if m.Payee != nil {
		payees = append(payees, *m.Payee)
	}
	var maxMinor, budget *big.Int
	var notAfter time.Time
	seen := map[string]bool{}
	for i, raw := range m.Constraints {
		var c ap2Constraint
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		d.UseNumber()
		if err := d.Decode(&c); err != nil {
			return r, refuse("constraints[%d]: %v", i, err)
		}
		if seen[c.Type] {
			return r, refuse("constraints[%d]: %s appears twice", i, clip(c.Type))
		}
		seen[c.Type] = true
		switch c.Type {
		case "payment.allowed_payees":
			payees = append(payees, c.Allowed...)
		case "payment.amount_range":
			a, err := minorAmount(c.Max, c.Currency, asset, "payment.amount_range.max")
			if err != nil {
				return r, err
			}
			if c.Min != "" {
				if mn, err := minorAmount(c.Min, c.Currency, asset, "payment.amount_range.min"); err != nil || mn.Sign() > 0 {
					return r, refuse("payment.amount_range.min is a constraint the guard cannot honour (payments below reviewAbove are allowed without a mandate)")
				}
			}
			maxMinor = a
		case "payment.budget":
			a, err := majorAmount(c.Max, c.Currency, asset)
			if err != nil {
				return r, err
			}
			budget = a
		case "payment.agent_recurrence":
			if c.Frequency != "ON_DEMAND" {
				return r, refuse("payment.agent_recurrence.frequency %s is a constraint the guard cannot honour (only ON_DEMAND: a mandate here counts payments, not periods)", clip(c.Frequency))
			}
			if c.MaxOccurrences != nil {
				if *c.MaxOccurrences <= 0 {
					return r, refuse("payment.agent_recurrence.max_occurrences %d is not a count of payments", *c.MaxOccurrences)
				}
				r.Count = *c.MaxOccurrences
			}
		case "payment.execution_date":
			if c.NotBefore != "" {
				t, err := ap2Time(c.NotBefore, "payment.execution_date.not_before")
				if err != nil {
					return r, err
				}
				r.NotBefore = FormatTime(t)
			}
			if c.NotAfter != "" {
				t, err := ap2Time(c.NotAfter, "payment.execution_date.not_after")
				if err != nil {
					return r, err
				}
				notAfter = t
			}
		case "payment.reference":
			r.Reference = c.ConditionalTransactionID
		default:
			return r, refuse("constraints[%d]: %s is a constraint the guard cannot honour", i, clip(c.Type))
		}
	}
	switch len(payees) {
	case 0:
		return r, refuse("payment.allowed_payees names no payee")
	case 1:
	default:
		if len(payees) != 2 || payees[0] != payees[1] {
			return r, refuse("payment.allowed_payees names %d payees; a mandate here pays one (import one mandate per payee)", len(payees))
		}
	}
	p := payees[0]
	addr, err := guard.CanonicalAddress(p.ID)
	if err != nil {
		return r, refuse("payment.allowed_payees: merchant id %q is not a payee address (0x and 40 hex digits)", clip(p.ID))
	}
	r.PayTo = addr
	if p.Website != "" {
		h := p.Website
		if strings.Contains(h, "://") {
			u, err := url.Parse(h)
			if err != nil {
				return r, refuse("payment.allowed_payees: website %q: %v", clip(p.Website), err)
			}
			h = u.Hostname()
		}
		if r.Host, err = guard.CanonicalHost(h); err != nil {
			return r, refuse("payment.allowed_payees: website %q is no host: %v", clip(p.Website), err)
		}
	}
	switch {
	case budget == nil && maxMinor != nil && r.Count > 0:
		budget = new(big.Int).Mul(maxMinor, big.NewInt(int64(r.Count)))
	case budget == nil:
		return r, refuse("no payment.budget (and no payment.amount_range with max_occurrences to make one)")
	}
	if maxMinor == nil {
		maxMinor = budget
	}
	if maxMinor.Sign() <= 0 || budget.Sign() <= 0 {
		return r, refuse("the amount range and the budget must be more than zero")
	}
	r.MaxAtomic, r.BudgetAtomic = maxMinor.String(), budget.String()
	var exp time.Time
	if m.Exp != nil {
		exp = time.Unix(*m.Exp, 0)
	}
	if !notAfter.IsZero() && (exp.IsZero() || notAfter.Before(exp)) {
		exp = notAfter
	}
	switch {
	case exp.IsZero():
		return r, refuse("no exp and no payment.execution_date.not_after: a mandate here expires")
	case !exp.After(now):
		return r, refuse("it expired at %s", FormatTime(exp))
	}
	r.Expires = FormatTime(exp)
	if r.NotBefore != "" && r.NotBefore >= r.Expires {
		return r, refuse("payment.execution_date.not_before is not before its expiry")
	}
	if len(r.Reference) > maxField {
		return r, refuse("payment.reference is longer than %d bytes", maxField)
	}
	return r, nil
}

// currencyAsset checks that asset is the one the policy names for
// currency: its symbol is the currency's, or the currency's with a C (USD:
// USDC).
func currencyAsset(currency string, asset guard.Asset, what string) (int, error) {
	digits, ok := minorDigits[currency]
	if !ok {
		return 0, refuse("%s: currency %q is not one the guard reads (USD, EUR, GBP, CHF, CAD, AUD, JPY)", what, clip(currency))
	}
	if asset.Symbol != currency && asset.Symbol != currency+"C" {
		return 0, refuse("%s: currency %s: the policy names no asset for it (its amounts are in %s)", what, currency, asset.Symbol)
	}
	if asset.Decimals < digits {
		return 0, refuse("%s: %s has fewer decimals than %s", what, asset.Symbol, currency)
	}
	return digits, nil
}

// minorAmount reads an integer of the currency's minor units in atomic
// units of asset.
func minorAmount(n json.Number, currency string, asset guard.Asset, what string) (*big.Int, error) {
	digits, err := currencyAsset(currency, asset, what)
	if err != nil {
		return nil, err
	}
	a, ok := new(big.Int).SetString(string(n), 10)
	if !ok || a.Sign() < 0 {
		return nil, refuse("%s %q is not a whole number of minor units", what, clip(string(n)))
	}
	return a.Mul(a, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(asset.Decimals-digits)), nil)), nil
}

// majorAmount reads a number of the currency's major units (payment.budget)
// in atomic units of asset.
func majorAmount(n json.Number, currency string, asset guard.Asset) (*big.Int, error) {
	if _, err := currencyAsset(currency, asset, "payment.budget"); err != nil {
		return nil, err
	}
	s := string(n)
	if err := guard.CheckAmountSyntax(s); err != nil {
		return nil, refuse("payment.budget.max %q is not a plain decimal number", clip(s))
	}
	a, err := guard.ParseAmount(s, asset.Decimals)
	if err != nil {
		return nil, refuse("payment.budget.max %q: %v", clip(s), err)
	}
	return a, nil
}

// ap2Time reads an ISO 8601 date or date-time (a date is its day's start
// in UTC).
func ap2Time(s, what string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC().Truncate(time.Millisecond), nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	return time.Time{}, refuse("%s %q is not an ISO 8601 date or date-time", what, clip(s))
}
