package server

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// The tool schemas state the guard's own argument set: every argument of a
// question is declared by check_before_pay with the guard's bound, the
// required ones are required, and authorize_payment's resource is the
// same argument.
func TestQuestionSchemasAreTheGuardsArgs(t *testing.T) {
	type prop struct {
		MinLength *int `json:"minLength"`
		MaxLength *int `json:"maxLength"`
		Pattern   string
	}
	read := func(name string) (map[string]prop, []string) {
		data, err := schemaFiles.ReadFile("schema/" + name + ".input.json")
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Properties map[string]prop `json:"properties"`
			Required   []string        `json:"required"`
		}
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatal(err)
		}
		return s.Properties, s.Required
	}
	props, required := read("check_before_pay")
	for _, arg := range guard.QuestionArgs() {
		p, ok := props[arg.Name]
		if !ok {
			t.Errorf("check_before_pay does not declare %s", arg.Name)
			continue
		}
		// The template's pattern bounds it ({1,64}).
		if arg.Name == "template" {
			if !strings.Contains(p.Pattern, "{1,64}") || arg.MaxBytes != 64 {
				t.Errorf("template: pattern %q, guard bound %d", p.Pattern, arg.MaxBytes)
			}
		} else if p.MaxLength == nil || *p.MaxLength != arg.MaxBytes || p.MinLength == nil || *p.MinLength != 1 {
			t.Errorf("%s: schema minLength %v maxLength %v, guard bound %d", arg.Name, p.MinLength, p.MaxLength, arg.MaxBytes)
		}
		if slices.Contains(required, arg.Name) != arg.Required {
			t.Errorf("%s: required in the schema %v, in the guard %v", arg.Name, slices.Contains(required, arg.Name), arg.Required)
		}
	}
	props, _ = read("authorize_payment")
	res, _ := guard.QuestionArg("resource")
	if p := props["resource"]; p.MaxLength == nil || *p.MaxLength != res.MaxBytes {
		t.Errorf("authorize_payment's resource: maxLength %v, guard bound %d", p.MaxLength, res.MaxBytes)
	}
}

// What an agent is told of each argument of a question, read by the
// guard's checks through the MCP adapter's JSON types.
func TestQuestionArgMessages(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	for _, c := range []struct {
		name string
		args map[string]any
		want string // "" = accepted
	}{
		{"all there", map[string]any{"counterparty": "api.example.com", "amount": "0.25"}, ""},
		{"amount as a JSON number", map[string]any{"counterparty": "api.example.com", "amount": json.Number("0.30")}, ""},
		{"missing", map[string]any{"amount": "1"}, "invalid arguments: counterparty is required"},
		{"null is missing", map[string]any{"counterparty": nil, "amount": "1"}, "invalid arguments: counterparty is required"},
		{"empty", map[string]any{"counterparty": "", "amount": "1"}, "invalid arguments: counterparty must not be empty"},
		{"empty optional", map[string]any{"counterparty": "x", "amount": "1", "asset": ""}, "invalid arguments: asset must not be empty (leave it out for the default)"},
		{"not a string", map[string]any{"counterparty": json.Number("7"), "amount": "1"}, "invalid arguments: counterparty must be a string"},
		{"amount a float", map[string]any{"counterparty": "x", "amount": 0.3}, `invalid arguments: amount must be a decimal string such as "0.25" (its exact text is not known)`},
		{"amount a bool", map[string]any{"counterparty": "x", "amount": true}, `invalid arguments: amount must be a decimal string such as "0.25" or a JSON number`},
		{"amount number too long", map[string]any{"counterparty": "x", "amount": json.Number(long(65))}, "invalid arguments: amount is longer than 64 characters"},
		{"amount text too long", map[string]any{"counterparty": "x", "amount": long(65)}, "invalid arguments: amount is longer than 64 bytes"},
		{"asset too long", map[string]any{"counterparty": "x", "amount": "1", "asset": long(201)}, "invalid arguments: asset is longer than 200 bytes"},
		{"pay_to not UTF-8", map[string]any{"counterparty": "x", "amount": "1", "pay_to": "\xff"}, "invalid arguments: pay_to is not valid UTF-8"},
		{"two problems, in order", map[string]any{"resource": long(2049)}, "invalid arguments: counterparty is required; amount is required; resource is longer than 2048 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newArgs(c.args, guard.QuestionArgNames()...)
			for _, arg := range guard.QuestionArgs() {
				a.question(arg)
			}
			if got := a.err(); got != c.want {
				t.Fatalf("got %q\nwant %q", got, c.want)
			}
		})
	}
}
