package guard

import (
	"errors"
	"strings"
	"testing"
)

func TestArgCheck(t *testing.T) {
	amount, _ := QuestionArg("amount")
	asset, _ := QuestionArg("asset")
	for _, c := range []struct {
		arg     Arg
		text    string
		present bool
		want    string
	}{
		{amount, "", false, "amount is required"},
		{asset, "", false, ""},
		{amount, "", true, "amount must not be empty"},
		{asset, "", true, "asset must not be empty (leave it out for the default)"},
		{asset, "\xc3", true, "asset is not valid UTF-8"},
		{asset, strings.Repeat("é", 100), true, ""},
		{asset, strings.Repeat("é", 101), true, "asset is longer than 200 bytes"},
		{amount, strings.Repeat("1", 64), true, ""},
		{amount, strings.Repeat("1", 65), true, "amount is longer than 64 bytes"},
	} {
		if got := c.arg.Check(c.text, c.present); got != c.want {
			t.Errorf("%s.Check(%.20q, %v) = %q, want %q", c.arg.Name, c.text, c.present, got, c.want)
		}
	}
	if got := amount.CheckNumber(strings.Repeat("1", 65)); got != "amount is longer than 64 characters" {
		t.Errorf("CheckNumber: %q", got)
	}
	if _, ok := QuestionArg("dry_run"); ok {
		t.Error("dry_run is the tool's, not the question's")
	}
	var r RawRequest
	for _, name := range QuestionArgNames() {
		if r.Field(name) == nil {
			t.Errorf("RawRequest has no field %s", name)
		}
	}
}

// ParseRequest holds a question any entry point hands over to the same
// bounds; an empty text is an argument left out, and an amount that cannot
// be read stays a question for a human.
func TestParseRequestArgBounds(t *testing.T) {
	cfg := DefaultConfig()
	ok := RawRequest{Counterparty: "api.example.com", Amount: "0.25"}
	for _, c := range []struct {
		name string
		edit func(*RawRequest)
		want string
	}{
		{"plain", func(*RawRequest) {}, ""},
		{"empty amount", func(r *RawRequest) { r.Amount = "" }, ""},
		{"asset at the bound", func(r *RawRequest) { r.Asset = strings.Repeat("a", MaxAssetBytes) }, ""},
		{"asset past the bound", func(r *RawRequest) { r.Asset = strings.Repeat("a", MaxAssetBytes+1) }, "asset is longer than 200 bytes"},
		{"template past the bound", func(r *RawRequest) { r.Template = strings.Repeat("a", MaxTemplateBytes+1) }, "template is longer than 64 bytes"},
		{"amount past the bound", func(r *RawRequest) { r.Amount = strings.Repeat("1", MaxAmountBytes+1) }, "amount is longer than 64 bytes"},
		{"pay_to not UTF-8", func(r *RawRequest) { r.PayTo = "\xff" }, "pay_to is not valid UTF-8"},
		{"counterparty past the bound", func(r *RawRequest) { r.Counterparty = strings.Repeat("a", MaxCounterpartyBytes+1) }, "at most 2048 are accepted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := ok
			c.edit(&raw)
			_, err := ParseRequest(raw, cfg)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrRequest) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrRequest with %q", err, c.want)
			}
		})
	}
}
