package guard

import (
	"fmt"
	"unicode/utf8"
)

// The arguments of a question (RawRequest), as every entry point reads
// them — the MCP tool check_before_pay, authorize_payment's resource, the
// proxy's paying tools, and ParseRequest for the payment signer and any
// program embedding the engine: one set of names, bounds and messages.
const (
	MaxCounterpartyBytes = 2048
	MaxAmountBytes       = 64
	MaxAssetBytes        = 200
	MaxTemplateBytes     = 64
	MaxResourceBytes     = 2048
	MaxPayToBytes        = 200
)

// Arg is one argument of a question.
type Arg struct {
	// Name is the argument's name in the tool schemas and in messages.
	Name string
	// Required: a question without it cannot be asked.
	Required bool
	// MaxBytes bounds its text.
	MaxBytes int
	// Decimal: the argument is a decimal (the amount), which a JSON
	// number may carry, read exactly as written.
	Decimal bool
}

// QuestionArgs are the arguments of a question, in the order they are read
// and their problems reported.
func QuestionArgs() []Arg {
	return []Arg{
		{Name: "counterparty", Required: true, MaxBytes: MaxCounterpartyBytes},
		{Name: "amount", Required: true, MaxBytes: MaxAmountBytes, Decimal: true},
		{Name: "asset", MaxBytes: MaxAssetBytes},
		{Name: "template", MaxBytes: MaxTemplateBytes},
		{Name: "resource", MaxBytes: MaxResourceBytes},
		{Name: "pay_to", MaxBytes: MaxPayToBytes},
	}
}

// QuestionArg is the argument of a question called name.
func QuestionArg(name string) (Arg, bool) {
	for _, a := range QuestionArgs() {
		if a.Name == name {
			return a, true
		}
	}
	return Arg{}, false
}

// QuestionArgNames are the names of QuestionArgs, in their order.
func QuestionArgNames() []string {
	var out []string
	for _, a := range QuestionArgs() {
		out = append(out, a.Name)
	}
	return out
}

// Check says what is wrong with text given for the argument (present:
// the caller gave the argument at all), in the words an agent is shown;
// "" when nothing is. An empty text is no value: an optional argument is
// left out to get its default.
func (a Arg) Check(text string, present bool) string {
	switch {
	case !present:
		if a.Required {
			return a.Name + " is required"
		}
		return ""
	case text == "":
		if a.Required {
			return a.Name + " must not be empty"
		}
		return a.Name + " must not be empty (leave it out for the default)"
	case !utf8.ValidString(text):
		return a.Name + " is not valid UTF-8"
	case len(text) > a.MaxBytes:
		return fmt.Sprintf("%s is longer than %d bytes", a.Name, a.MaxBytes)
	}
	return ""
}

// CheckNumber is Check for a decimal argument given as a JSON number,
// whose text is exactly what the client wrote.
func (a Arg) CheckNumber(text string) string {
	if len(text) > a.MaxBytes {
		return fmt.Sprintf("%s is longer than %d characters", a.Name, a.MaxBytes)
	}
	return ""
}

// Field is the text of r's argument called name (nil when there is none).
func (r *RawRequest) Field(name string) *string {
	switch name {
	case "counterparty":
		return &r.Counterparty
	case "amount":
		return &r.Amount
	case "asset":
		return &r.Asset
	case "template":
		return &r.Template
	case "resource":
		return &r.Resource
	case "pay_to":
		return &r.PayTo
	}
	return nil
}

// checkText applies the arguments' checks to a question as a program
// hands it over, where an empty text is an argument left out: valid
// UTF-8, within bounds. Whether a question can be judged without a
// counterparty or an amount, ParseRequest says (an amount that cannot be
// read is a question for a human).
func (r RawRequest) checkText() error {
	for _, a := range QuestionArgs() {
		if text := *r.Field(a.Name); text != "" {
			if msg := a.Check(text, true); msg != "" {
				return fmt.Errorf("%w: %s", ErrRequest, msg)
			}
		}
	}
	return nil
}
