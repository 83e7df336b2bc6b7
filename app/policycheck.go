package app

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/policy"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsonpos"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// The two kinds of policy file an operator writes.
const (
	// KindGuard is the guard policy the server runs with (--guard-config,
	// haia-guard.config.json as init writes it).
	KindGuard = "guard policy"
	// KindRules is a noa.policy/0.2 rule file (a guard policy's "policy").
	KindRules = "noa.policy/0.2 rule file"
)

// maxPolicyFileBytes bounds a file CheckPolicyFile reads: the larger of
// the two kinds' own bounds.
const maxPolicyFileBytes = max(1<<20, policy.MaxDocumentBytes)

// PolicyProblem is one mistake in a policy file: the file, where in it (a
// JSON path from the root, and the line and column of its member), and
// what is wrong.
type PolicyProblem struct {
	File string `json:"file"`
	Path string `json:"path"`
	Line int    `json:"line"`
	Col  int    `json:"column"`
	Msg  string `json:"message"`
}

func (p PolicyProblem) String() string {
	return fmt.Sprintf("%s:%d:%d: %s: %s", p.File, p.Line, p.Col, p.Path, p.Msg)
}

// PolicyCheck is what CheckPolicyFile found: the file's kind and either
// what it sets or every problem.
type PolicyCheck struct {
	File string
	Kind string
	// Guard is a valid guard policy; Rules a valid rule file, or the
	// custom rules a valid guard policy names.
	Guard *guard.Config
	Rules *policy.Policy
	// RulesFile is the custom rules file a guard policy names.
	RulesFile string
	Problems  []PolicyProblem
}

// CheckPolicyFile tells which kind of policy file path is — a guard
// policy, or a noa.policy/0.2 rule file (it names "spec" or "rules") — and
// validates it with the loader the server reads it with: a guard policy
// as the server starts with it (guard.LoadConfig, the custom rules file it
// names as LoadRules reads it, every history template among templates);
// a rule file as policy.Parse does. Every problem is given with its path
// and line.
func CheckPolicyFile(path string, templates receipt.TemplateSource) PolicyCheck {
	out := PolicyCheck{File: path}
	data, err := readPolicyFile(path)
	if err != nil {
		out.Problems = []PolicyProblem{{File: path, Path: "$", Line: 1, Col: 1, Msg: err.Error()}}
		return out
	}
	out.Kind = policyKind(data)
	if out.Kind == KindRules {
		out.Rules, out.Problems = checkRules(path, data)
		return out
	}
	// The server's loader: guard.LoadConfig reads the file and parses it
	// so; CheckConfig keeps what it could read past a mistake, so that
	// what the server checks next is checked too.
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	pol, ces := guard.CheckConfig(data, filepath.Dir(abs))
	for _, p := range ces {
		out.Problems = append(out.Problems, problemAt(path, data, p.Path.JSONPath(), segments(p.Path), configMessage(p.Err)))
	}
	if pol == nil {
		return out
	}
	for i, name := range pol.HistoryTemplates {
		if _, err := templates.Resolve(name); err != nil {
			p := guard.Path{"historyTemplates", i}
			out.Problems = append(out.Problems, problemAt(path, data, p.JSONPath(), segments(p),
				fmt.Sprintf("history template %q cannot be used: %v (the server would refuse to start)", name, err)))
		}
	}
	if pol.PolicyFile != "" {
		out.RulesFile = pol.PolicyFile
		at := guard.Path{"policy"}
		rdata, err := readPolicyFile(pol.PolicyFile)
		if err != nil {
			out.Problems = append(out.Problems, problemAt(path, data, at.JSONPath(), segments(at), "custom rules: "+err.Error()))
		} else if rules, probs := checkRules(pol.PolicyFile, rdata); len(probs) > 0 {
			out.Problems = append(out.Problems, problemAt(path, data, at.JSONPath(), segments(at),
				fmt.Sprintf("the custom rules %s are invalid (%s, below); the server would refuse to start", pol.PolicyFile, plural(len(probs), "problem", "problems"))))
			out.Problems = append(out.Problems, probs...)
		} else {
			out.Rules = rules
		}
	}
	// In the order of the files, the policy's own first.
	slices.SortStableFunc(out.Problems, func(a, b PolicyProblem) int {
		if a.File != b.File {
			if a.File == path {
				return -1
			}
			if b.File == path {
				return 1
			}
			return 0
		}
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
	})
	if len(out.Problems) == 0 {
		pol.Source = path
		sum := sha256.Sum256(data)
		pol.Text, pol.Hash = data, hex.EncodeToString(sum[:])
		out.Guard = pol
	}
	return out
}

// plural is n and its noun, singular for one.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// readPolicyFile reads a policy file, refusing one larger than either
// kind accepts before reading it whole.
func readPolicyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPolicyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxPolicyFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxPolicyFileBytes)
	}
	return data, nil
}

// policyKind is KindRules for a JSON object that names "spec" or "rules"
// at its top, else KindGuard (also for what is no JSON object: the guard's
// loader then says why).
func policyKind(data []byte) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return KindGuard
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return KindGuard
		}
		if k, _ := tok.(string); k == "spec" || k == "rules" {
			return KindRules
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return KindGuard
		}
	}
	return KindGuard
}

// unknownKey reads the key a closed-grammar problem names, to place it.
var unknownKey = regexp.MustCompile(`^unknown key "((?:[^"\\]|\\.)*)"`)

// checkRules validates a rule file as policy.Parse does.
func checkRules(path string, data []byte) (*policy.Policy, []PolicyProblem) {
	p, err := policy.Parse(data)
	if err == nil {
		return p, nil
	}
	var pe *policy.Error
	if !errors.As(err, &pe) || pe.Syntax != nil {
		msg := err.Error()
		pos := jsonpos.Pos{Line: 1, Col: 1}
		var se *json.SyntaxError
		if jerr := json.Unmarshal(data, new(any)); errors.As(jerr, &se) {
			pos = jsonpos.At(data, int(se.Offset))
		}
		return nil, []PolicyProblem{{File: path, Path: "$", Line: pos.Line, Col: pos.Col, Msg: msg}}
	}
	var out []PolicyProblem
	for _, pr := range pe.Problems {
		segs, _ := jsonpos.ParsePath(pr.Path)
		if m := unknownKey.FindStringSubmatch(pr.Msg); m != nil {
			segs = append(segs, strings.ReplaceAll(m[1], `\"`, `"`))
		}
		out = append(out, problemAt(path, data, pr.Path, segs, fmt.Sprintf("%s (%s)", pr.Msg, pr.Rule)))
	}
	return nil, out
}

// problemAt is a problem at path (shown) placed at segs in data.
func problemAt(file string, data []byte, path string, segs []any, msg string) PolicyProblem {
	pos, _ := jsonpos.Locate(data, segs)
	return PolicyProblem{File: file, Path: path, Line: pos.Line, Col: pos.Col, Msg: msg}
}

// segments is a guard path in jsonpos's form.
func segments(p guard.Path) []any {
	out := make([]any, len(p))
	for i, s := range p {
		if n, ok := s.(guard.Name); ok {
			s = string(n)
		}
		out[i] = s
	}
	return out
}

// configMessage is a loader's message without the marker every one of
// them starts with.
func configMessage(err error) string {
	return strings.TrimPrefix(err.Error(), guard.ErrConfig.Error()+": ")
}
