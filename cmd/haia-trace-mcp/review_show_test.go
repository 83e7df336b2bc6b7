package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/app/catalog"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
)

// operatorBuyer replaces the bundled x402-buyer: its settlement stage is
// optional.
const operatorBuyer = `template: x402-buyer
version: 2
stages:
  - id: challenge
    required: true
    match:
      - event: x402.payment.required
        role: client
  - id: payment
    required: true
    match:
      - event: x402.payment.submitted
        role: client
  - id: settlement
    required: false
    match:
      - event: x402.payment.responded
        role: client
`

// review show explains evidence the way the server reads runs: under the
// operator's template where one replaces the bundled template, as the
// guard judged — not under the bundled one.
func TestExplainRefUsesTheOperatorsTemplates(t *testing.T) {
	dir := t.TempDir()
	run, err := os.ReadFile(filepath.Join("..", "..", "testdata", "guard", "buyer-run.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"events", "templates"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "events", "buyer.ndjson"), run, 0o644); err != nil {
		t.Fatal(err)
	}
	// The catalog as a command opens it: the root's templates, read anew.
	openCatalog := func() (*catalog.Catalog, func()) {
		st, err := app.Open(t.Context(), app.Config{Dir: dir, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		return st.Catalog(), st.Close
	}
	explain := func() string {
		cat, closeCat := openCatalog()
		defer closeCat()
		// op-9 paid and never saw a settlement answer.
		return explainRef(t.Context(), cat, "", guard.Ref{RunID: "buyer", OperationID: "op-9"})
	}
	const optional = "Optional and not seen: a successful settlement answer"
	bundled := explain()
	if !strings.Contains(bundled, "required stage \"settlement\"") || strings.Contains(bundled, optional) {
		t.Fatalf("under the bundled template: %q, want settlement required", bundled)
	}
	if err := os.WriteFile(filepath.Join(dir, "templates", "x402-buyer.yaml"), []byte(operatorBuyer), 0o644); err != nil {
		t.Fatal(err)
	}
	operator := explain()
	if !strings.Contains(operator, optional) {
		t.Fatalf("under the operator's template the explanation is %q, the bundled one's %q", operator, bundled)
	}
	for _, tc := range []struct {
		ref  guard.Ref
		want string
	}{
		{guard.Ref{RunID: "gone", OperationID: "op-1"}, "(no explanation: run gone is no longer under events/)"},
		{guard.Ref{RunID: "buyer", OperationID: "op-77"}, "(no explanation: run buyer has no operation op-77)"},
		{guard.Ref{RunID: guard.CommitRun, OperationID: "rcpt_1"}, "an amount held by an earlier allow (receipt rcpt_1), not a payment the Trace shows: it counts until the Trace shows the payment or it stops counting (see status)"},
	} {
		cat, closeCat := openCatalog()
		if got := explainRef(t.Context(), cat, "", tc.ref); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.ref, got, tc.want)
		}
		closeCat()
	}
}
