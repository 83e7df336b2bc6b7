// Package noa implements the NOA receipt v0.1 format
// (https://github.com/NordenSoft/noa, docs/receipt-spec.md): the receipt
// object with strict decoding, chain hashing, the domain-separated Ed25519
// signature, chain verification with the verdicts of the NOA reference
// verifier, checkpoints, keyrings, identity manifests, the on-disk signing
// key and a signer that runs in another process.
//
// A Receipt keeps the exact JSON tree it was decoded from (or sealed as), so
// that its hash never depends on how a Go struct would re-encode optional
// and null members.
package noa

import (
	"errors"
	"fmt"
	"regexp"
	"unicode/utf16"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
)

// Spec identifiers and signature domain tags, frozen by NOA v0.1.
const (
	ReceiptSpec      = "noa.receipt/0.1"
	CheckpointSpec   = "noa.checkpoint/0.1"
	AlgEd25519       = "ed25519"
	receiptDomain    = "NOA-Receipt-v0.1-sig:"
	checkpointDomain = "NOA-Checkpoint-v0.1-sig:"
)

// Enumerations of the receipt fields.
const (
	PrincipalHuman      = "HUMAN"
	PrincipalService    = "SERVICE"
	PrincipalPolicy     = "POLICY"
	PrincipalSandboxSim = "SANDBOX_SIM"

	VerdictAllowed    = "ALLOWED"
	VerdictBlocked    = "BLOCKED"
	VerdictDeferred   = "DEFERRED"
	VerdictExecuted   = "EXECUTED"
	VerdictFailed     = "FAILED"
	VerdictRolledBack = "ROLLED_BACK"
	VerdictSimulated  = "SIMULATED"
)

var (
	principals = set("HUMAN", "SERVICE", "POLICY", "SANDBOX_SIM")
	riskClass  = set("LOW", "MEDIUM", "HIGH", "CRITICAL", "IRREVERSIBLE")
	modes      = set("off", "shadow", "approvals_on", "on")
	verdicts   = set("ALLOWED", "BLOCKED", "DEFERRED", "EXECUTED", "FAILED", "ROLLED_BACK", "SIMULATED")
	cpVerdicts = set("ALLOW", "DENY")

	hashRE       = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	paramsHashRE = regexp.MustCompile(`^(sha256|hmac-sha256):[0-9a-f]{64}$`)
)

func set(xs ...string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// Receipt is one decoded, structurally valid NOA receipt. Its fields are a
// read-only view: the hashed bytes come from the tree it was decoded from,
// so changing a field does not change the receipt. Obtain receipts from
// ParseReceipt, ReadChain or Seal.
type Receipt struct {
	Spec       string
	ID         string
	TS         string
	Scope      Scope
	Agent      Agent
	Action     Action
	Governance Governance
	Chain      Link
	Sig        Sig

	tree map[string]any
}

// Scope names the chain partition. Tenant is nil when the member is absent.
type Scope struct {
	Tenant *string
	Chain  string
}

// Agent is the actor. Model is nil when absent or null.
type Agent struct {
	ID        string
	Model     *string
	Principal string
}

// Action is what was attempted. RollbackRef is nil when absent or null.
type Action struct {
	ID          string
	Canonical   string
	RiskClass   string
	ParamsHash  string
	Reversible  bool
	RollbackRef *string
}

// Governance is the verdict and how it was reached. RuleID, Approval and
// Compliance are nil when absent or null.
type Governance struct {
	Mode       string
	Verdict    string
	RuleID     *string
	Approval   *Approval
	Sandboxed  bool
	Compliance *Compliance
}

// Approval records a human decision: who and when (an RFC 3339 instant).
type Approval struct {
	By string
	At string
}

// Compliance binds a decision to the policy and the inputs it read.
// Verdict ("ALLOW" or "DENY") is optional and empty when absent.
type Compliance struct {
	PolicyHash  string
	ReadSetHash string
	InputsHash  string
	Verdict     string
}

// Link is the receipt's place in its chain. PrevHash is nil for genesis.
type Link struct {
	Seq      int64
	PrevHash *string
	Hash     string
}

// Sig is the signature block.
type Sig struct {
	Alg   string
	KID   string
	Value string
}

// MalformedError says why a receipt (or another NOA document) is not
// structurally valid; Path names the member ("receipt.chain.seq").
type MalformedError struct {
	Path string
	Msg  string
}

func (e *MalformedError) Error() string { return e.Path + ": " + e.Msg }

// ParseReceipt decodes one receipt strictly: NOA-hardened JSON (see package
// jcs), unknown members refused at every level, every type, enumeration and
// pattern checked, timestamps that denote real instants, and the four
// coherence rules of the schema.
func ParseReceipt(data []byte) (Receipt, error) {
	v, err := jcs.Parse(data)
	if err != nil {
		return Receipt{}, err
	}
	return receiptFromTree(v)
}

// Bytes returns the receipt's canonical (JCS) JSON.
func (r Receipt) Bytes() ([]byte, error) {
	if r.tree == nil {
		return nil, errors.New("noa: empty receipt (not decoded or sealed)")
	}
	return jcs.Marshal(r.tree)
}

// HashInput returns JCS(receipt without chain.hash and sig.value): the
// bytes whose SHA-256 is chain.hash.
func (r Receipt) HashInput() ([]byte, error) {
	if r.tree == nil {
		return nil, errors.New("noa: empty receipt (not decoded or sealed)")
	}
	return hashInput(r.tree, "chain", "hash", "sig", "value")
}

// hashInput canonicalizes tree with the named members (object, key pairs)
// removed from its sub-objects, without changing tree.
func hashInput(tree map[string]any, drop ...string) ([]byte, error) {
	clone := make(map[string]any, len(tree))
	for k, v := range tree {
		clone[k] = v
	}
	for i := 0; i+1 < len(drop); i += 2 {
		sub, ok := tree[drop[i]].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("noa: member %q is not an object", drop[i])
		}
		c := make(map[string]any, len(sub))
		for k, v := range sub {
			if k != drop[i+1] {
				c[k] = v
			}
		}
		clone[drop[i]] = c
	}
	return jcs.Marshal(clone)
}

// object is a validation cursor over one JSON object.
type object struct {
	m    map[string]any
	path string
	err  error
}

func asObject(v any, path string) (*object, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, &MalformedError{Path: path, Msg: "must be an object"}
	}
	return &object{m: m, path: path}, nil
}

func (o *object) fail(key, format string, args ...any) {
	if o.err == nil {
		o.err = &MalformedError{Path: o.path + "." + key, Msg: fmt.Sprintf(format, args...)}
	}
}

// keys refuses unknown members and missing required ones.
func (o *object) keys(required []string, optional ...string) {
	allowed := map[string]bool{}
	for _, k := range required {
		allowed[k] = true
		if _, ok := o.m[k]; !ok {
			o.fail(k, "missing required member")
		}
	}
	for _, k := range optional {
		allowed[k] = true
	}
	// Report unknown members in a stable order.
	var unknown []string
	for k := range o.m {
		if !allowed[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		first := unknown[0]
		for _, k := range unknown[1:] {
			if k < first {
				first = k
			}
		}
		o.fail(first, "unknown member (NOA refuses fields it does not define)")
	}
}

func (o *object) has(key string) bool { _, ok := o.m[key]; return ok }

func (o *object) str(key string, nonEmpty bool) string {
	s, ok := o.m[key].(string)
	if !ok {
		o.fail(key, "must be a string")
		return ""
	}
	if nonEmpty && s == "" {
		o.fail(key, "must be a non-empty string")
	}
	return s
}

// optStr reads a member that may be absent or null.
func (o *object) optStr(key string) *string {
	v, ok := o.m[key]
	if !ok || v == nil {
		return nil
	}
	s, ok := v.(string)
	if !ok {
		o.fail(key, "must be a string or null")
		return nil
	}
	return &s
}

func (o *object) enum(key string, allowed map[string]bool) string {
	s, ok := o.m[key].(string)
	if !ok || !allowed[s] {
		o.fail(key, "must be one of the values NOA defines (got %s)", describe(o.m[key]))
		return ""
	}
	return s
}

func (o *object) pattern(key string, re *regexp.Regexp) string {
	s, ok := o.m[key].(string)
	if !ok || !re.MatchString(s) {
		o.fail(key, "must match %s", re)
		return ""
	}
	return s
}

func (o *object) boolean(key string) bool {
	b, ok := o.m[key].(bool)
	if !ok {
		o.fail(key, "must be a boolean")
	}
	return b
}

func (o *object) instant(key string) string {
	s, ok := o.m[key].(string)
	if !ok {
		o.fail(key, "must be an RFC 3339 timestamp string")
		return ""
	}
	if err := checkInstant(s); err != nil {
		o.fail(key, "%v", err)
	}
	return s
}

func (o *object) sub(key string) *object {
	c, err := asObject(o.m[key], o.path+"."+key)
	if err != nil {
		if o.err == nil {
			o.err = err
		}
		return &object{m: map[string]any{}, path: o.path + "." + key, err: err}
	}
	return c
}

// merge carries a sub-object's first error up.
func (o *object) merge(c *object) {
	if o.err == nil && c.err != nil {
		o.err = c.err
	}
}

func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		if len(x) > 40 {
			x = x[:40] + "…"
		}
		return fmt.Sprintf("%q", x)
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	default:
		return fmt.Sprint(x)
	}
}

func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n += utf16.RuneLen(r)
	}
	return n
}

// receiptFromTree validates a decoded JSON value as a receipt.
func receiptFromTree(v any) (Receipt, error) {
	o, err := asObject(v, "receipt")
	if err != nil {
		return Receipt{}, err
	}
	o.keys([]string{"spec", "id", "ts", "scope", "agent", "action", "governance", "chain", "sig"})
	if o.err != nil {
		return Receipt{}, o.err
	}
	var r Receipt
	if s, ok := o.m["spec"].(string); !ok || s != ReceiptSpec {
		o.fail("spec", "must be %q", ReceiptSpec)
	}
	r.Spec = ReceiptSpec
	r.ID = o.str("id", true)
	if n := utf16Len(r.ID); n > 128 {
		o.fail("id", "longer than 128 characters (%d)", n)
	}
	r.TS = o.instant("ts")

	sc := o.sub("scope")
	sc.keys([]string{"chain"}, "tenant")
	r.Scope.Chain = sc.str("chain", true)
	if sc.has("tenant") {
		t := sc.str("tenant", false)
		r.Scope.Tenant = &t
	}
	o.merge(sc)

	ag := o.sub("agent")
	ag.keys([]string{"id", "principal"}, "model")
	r.Agent.ID = ag.str("id", true)
	r.Agent.Principal = ag.enum("principal", principals)
	r.Agent.Model = ag.optStr("model")
	o.merge(ag)

	ac := o.sub("action")
	ac.keys([]string{"id", "canonical", "riskClass", "paramsHash", "reversible"}, "rollbackRef")
	r.Action.ID = ac.str("id", true)
	r.Action.Canonical = ac.str("canonical", true)
	r.Action.RiskClass = ac.enum("riskClass", riskClass)
	r.Action.ParamsHash = ac.pattern("paramsHash", paramsHashRE)
	r.Action.Reversible = ac.boolean("reversible")
	r.Action.RollbackRef = ac.optStr("rollbackRef")
	o.merge(ac)

	gv := o.sub("governance")
	gv.keys([]string{"mode", "verdict", "sandboxed"}, "ruleId", "approval", "compliance")
	r.Governance.Mode = gv.enum("mode", modes)
	r.Governance.Verdict = gv.enum("verdict", verdicts)
	r.Governance.Sandboxed = gv.boolean("sandboxed")
	r.Governance.RuleID = gv.optStr("ruleId")
	if a, ok := gv.m["approval"]; ok && a != nil {
		ap := gv.sub("approval")
		ap.keys([]string{"by", "at"})
		r.Governance.Approval = &Approval{By: ap.str("by", false), At: ap.instant("at")}
		gv.merge(ap)
	}
	if c, ok := gv.m["compliance"]; ok && c != nil {
		cp := gv.sub("compliance")
		cp.keys([]string{"policyHash", "readSetHash", "inputsHash"}, "verdict")
		comp := &Compliance{
			PolicyHash:  cp.pattern("policyHash", hashRE),
			ReadSetHash: cp.pattern("readSetHash", hashRE),
			InputsHash:  cp.pattern("inputsHash", hashRE),
		}
		if cp.has("verdict") {
			comp.Verdict = cp.enum("verdict", cpVerdicts)
		}
		r.Governance.Compliance = comp
		gv.merge(cp)
	}
	o.merge(gv)

	ch := o.sub("chain")
	ch.keys([]string{"seq", "prevHash", "hash"})
	if seq, ok := ch.m["seq"].(int64); !ok || seq < 0 {
		ch.fail("seq", "must be a non-negative integer")
	} else {
		r.Chain.Seq = seq
	}
	if p := ch.m["prevHash"]; p != nil {
		s := ch.pattern("prevHash", hashRE)
		r.Chain.PrevHash = &s
	}
	r.Chain.Hash = ch.pattern("hash", hashRE)
	o.merge(ch)

	sg := o.sub("sig")
	sg.keys([]string{"alg", "kid", "value"})
	if a, ok := sg.m["alg"].(string); !ok || a != AlgEd25519 {
		sg.fail("alg", "must be %q", AlgEd25519)
	}
	r.Sig.Alg = AlgEd25519
	r.Sig.KID = sg.str("kid", true)
	r.Sig.Value = sg.str("value", true)
	o.merge(sg)

	if o.err != nil {
		return Receipt{}, o.err
	}
	if err := coherent(&r); err != nil {
		return Receipt{}, err
	}
	r.tree = o.m
	return r, nil
}

// coherent applies the schema's cross-field rules R1–R4: statements that
// contradict themselves are refused rather than argued about later.
func coherent(r *Receipt) error {
	switch {
	case r.Agent.Principal == PrincipalSandboxSim && !r.Governance.Sandboxed:
		return &MalformedError{Path: "receipt.governance.sandboxed", Msg: "must be true when agent.principal is SANDBOX_SIM"}
	case r.Governance.Verdict == VerdictSimulated && !r.Governance.Sandboxed:
		return &MalformedError{Path: "receipt.governance.sandboxed", Msg: "must be true when governance.verdict is SIMULATED"}
	case !r.Action.Reversible && r.Action.RollbackRef != nil:
		return &MalformedError{Path: "receipt.action.rollbackRef", Msg: "must be absent or null when action.reversible is false"}
	case r.Governance.Verdict == VerdictRolledBack && !r.Action.Reversible:
		return &MalformedError{Path: "receipt.action.reversible", Msg: "must be true when governance.verdict is ROLLED_BACK"}
	}
	return nil
}
