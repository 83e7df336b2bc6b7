package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
)

const policyUsage = `usage:
  haia-trace-mcp policy check FILE
      validate a noa.policy/0.2 file; print {"policyHash", "readSetHash"}
      exit 0 valid, 1 invalid or unreadable (the reason on stderr), 2 usage
  haia-trace-mcp policy eval FILE --input INPUT.json
      evaluate the policy over an input snapshot (a JSON object of scalars);
      print {"verdict", "ruleFired"}; every failure is a DENY with the
      specification's ruleFired (policy-invalid, eval-error, ...) and the
      reason on stderr; exit 0 when a verdict is printed, 1 when a file cannot
      be read, 2 usage
`

// runPolicy is `haia-trace-mcp policy check|eval`.
func runPolicy(_ context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return newCommand("policy", policyUsage, stdout, stderr).failf("name a subcommand: check or eval")
	}
	switch args[0] {
	case "check":
		return runPolicyCheck(args[1:], stdout, stderr)
	case "eval":
		return runPolicyEval(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, policyUsage)
		return exitOK
	default:
		return newCommand("policy", policyUsage, stdout, stderr).failf("unknown subcommand %q", args[0])
	}
}

func runPolicyCheck(args []string, stdout, stderr io.Writer) int {
	c := newCommand("policy check", policyUsage, stdout, stderr)
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 1, 1, "exactly one FILE"); !ok {
		return code
	}
	data, err := policyReadFile(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "policy check: %v\n", err)
		return exitFail
	}
	p, err := policy.Parse(data)
	if err != nil {
		fmt.Fprintf(stderr, "policy check: %s: %v\n", pos[0], err)
		return exitFail
	}
	out := struct {
		PolicyHash  string `json:"policyHash"`
		ReadSetHash string `json:"readSetHash"`
	}{p.Hash(), p.ReadSetHash()}
	return policyPrint(stdout, stderr, out)
}

func runPolicyEval(args []string, stdout, stderr io.Writer) int {
	c := newCommand("policy eval", policyUsage, stdout, stderr)
	input := c.fs.String("input", "", "the input snapshot, a JSON object of scalars (required)")
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 1, 1, "exactly one FILE"); !ok {
		return code
	}
	if *input == "" {
		return c.failf("--input INPUT.json is required")
	}
	policyDoc, err := policyReadFile(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "policy eval: %v\n", err)
		return exitFail
	}
	inputDoc, err := policyReadFile(*input)
	if err != nil {
		fmt.Fprintf(stderr, "policy eval: %v\n", err)
		return exitFail
	}
	r := policy.EvaluateJSON(policyDoc, inputDoc)
	if r.Failed() {
		fmt.Fprintf(stderr, "policy eval: %s (step %d): %s\n", r.RuleFired, r.Step, r.Reason)
	}
	out := struct {
		Verdict   string  `json:"verdict"`
		RuleFired *string `json:"ruleFired"`
	}{Verdict: r.Verdict}
	if r.RuleFired != "" {
		out.RuleFired = &r.RuleFired
	}
	return policyPrint(stdout, stderr, out)
}

// policyReadFile reads a document, refusing one larger than the evaluator
// accepts before reading it whole.
func policyReadFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, policy.MaxDocumentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(data) > policy.MaxDocumentBytes {
		return nil, fmt.Errorf("%s: larger than the %d-byte limit of a policy or input document", name, policy.MaxDocumentBytes)
	}
	return data, nil
}

func policyPrint(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "policy: write output: %v\n", err)
		return exitFail
	}
	return exitOK
}
