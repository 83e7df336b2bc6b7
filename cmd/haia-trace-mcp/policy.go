package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
)

const policyDetails = `check validates a noa.policy/0.2 file and prints {"policyHash", "readSetHash"};
exit 0 valid, 1 invalid or unreadable (the reason on stderr), 2 usage.
eval evaluates the policy over an input snapshot (a JSON object of scalars)
and prints {"verdict", "ruleFired"}; every failure is a DENY with the
specification's ruleFired (policy-invalid, eval-error, ...) and the reason
on stderr; exit 0 when a verdict is printed, 1 when a file cannot be read,
2 usage.
`

// definePolicyCheck is `policy check FILE`.
func definePolicyCheck(*flag.FlagSet) runFunc {
	return func(_ context.Context, env *cmdEnv, pos []string) error {
		data, err := policyReadFile(pos[0])
		if err != nil {
			return err
		}
		p, err := policy.Parse(data)
		if err != nil {
			return fmt.Errorf("%s: %w", pos[0], err)
		}
		out := struct {
			PolicyHash  string `json:"policyHash"`
			ReadSetHash string `json:"readSetHash"`
		}{p.Hash(), p.ReadSetHash()}
		return policyPrint(env.stdout, out)
	}
}

// definePolicyEval is `policy eval FILE --input INPUT.json`.
func definePolicyEval(fs *flag.FlagSet) runFunc {
	input := fs.String("input", "", "the input snapshot `INPUT.json`, a JSON object of scalars (required)")
	return func(_ context.Context, env *cmdEnv, pos []string) error {
		if *input == "" {
			return usageErrorf("--input INPUT.json is required")
		}
		policyDoc, err := policyReadFile(pos[0])
		if err != nil {
			return err
		}
		inputDoc, err := policyReadFile(*input)
		if err != nil {
			return err
		}
		r := policy.EvaluateJSON(policyDoc, inputDoc)
		if r.Failed() {
			fmt.Fprintf(env.stderr, "haia-trace-mcp policy eval: %s (step %d): %s\n", r.RuleFired, r.Step, r.Reason)
		}
		out := struct {
			Verdict   string  `json:"verdict"`
			RuleFired *string `json:"ruleFired"`
		}{Verdict: r.Verdict}
		if r.RuleFired != "" {
			out.RuleFired = &r.RuleFired
		}
		return policyPrint(env.stdout, out)
	}
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

func policyPrint(stdout io.Writer, v any) error {
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}
