package console_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// schemaErrors checks v against the subset of JSON Schema 2020-12 the NOA
// receipt schema uses (type, required, additionalProperties: false,
// properties, enum, const, pattern, min/maxLength, minimum, maximum, allOf
// with if/then), written here apart from the noa package, so the schema
// file is the judge, not this project's parser.
func schemaErrors(s map[string]any, v any, at string) []string {
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, at+": "+fmt.Sprintf(format, a...)) }
	if t, ok := s["type"]; ok {
		var types []string
		switch tt := t.(type) {
		case string:
			types = []string{tt}
		case []any:
			for _, x := range tt {
				types = append(types, x.(string))
			}
		}
		if !slices.Contains(types, jsonType(v)) && !(jsonType(v) == "integer" && slices.Contains(types, "number")) {
			bad("is %s, not %v", jsonType(v), types)
			return errs
		}
	}
	if c, ok := s["const"]; ok && fmt.Sprint(c) != fmt.Sprint(v) {
		bad("is %v, not the constant %v", v, c)
	}
	if e, ok := s["enum"].([]any); ok && !slices.ContainsFunc(e, func(x any) bool { return fmt.Sprint(x) == fmt.Sprint(v) }) {
		bad("%v is not one of %v", v, e)
	}
	if str, ok := v.(string); ok {
		n := len([]rune(str))
		if m, ok := s["minLength"].(float64); ok && n < int(m) {
			bad("is shorter than %v", m)
		}
		if m, ok := s["maxLength"].(float64); ok && n > int(m) {
			bad("is longer than %v", m)
		}
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			bad("%q does not match %s", str, p)
		}
	}
	if num, ok := v.(float64); ok {
		if m, ok := s["minimum"].(float64); ok && num < m {
			bad("%v is below %v", num, m)
		}
		if m, ok := s["maximum"].(float64); ok && num > m {
			bad("%v is above %v", num, m)
		}
	}
	if obj, ok := v.(map[string]any); ok {
		props, _ := s["properties"].(map[string]any)
		for _, r := range asList(s["required"]) {
			if _, ok := obj[r.(string)]; !ok {
				bad("lacks the required %q", r)
			}
		}
		for k, x := range obj {
			ps, ok := props[k].(map[string]any)
			if !ok {
				if ap, ok := s["additionalProperties"].(bool); ok && !ap {
					bad("has %q, which the schema does not admit", k)
				}
				continue
			}
			errs = append(errs, schemaErrors(ps, x, at+"."+k)...)
		}
	}
	for _, sub := range asList(s["allOf"]) {
		sm := sub.(map[string]any)
		if cond, ok := sm["if"].(map[string]any); ok {
			if len(schemaErrors(cond, v, at)) == 0 {
				if then, ok := sm["then"].(map[string]any); ok {
					errs = append(errs, schemaErrors(then, v, at)...)
				}
			}
			continue
		}
		errs = append(errs, schemaErrors(sm, v, at)...)
	}
	return errs
}

func asList(x any) []any { l, _ := x.([]any); return l }

func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if x == math.Trunc(x) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

func sharedNOA(t *testing.T) string {
	t.Helper()
	root := os.Getenv("HAIA_SHARED")
	if root == "" {
		t.Skip("HAIA_SHARED not set: skipping the check of passkey receipts against the NOA schema and conformance verifier")
	}
	return filepath.Join(root, "noa")
}

// TestPasskeyReceiptsAgreeWithNOA: the HUMAN receipts of decisions made in
// the console with a passkey are NOA receipts v0.1 by the normative schema
// (the assertion rides in agent.model), and the decision chain verifies
// with the NOA verifier this project conforms with (the exit codes of
// expected-verdicts.tsv) exactly when audit accepts it: both VALID; an
// edited assertion is TAMPERED to both; an assertion moved to another
// decision and sealed again by the server's key (a compromised server) is
// VALID to the NOA verifier, which knows nothing of passkeys, and refused
// by audit and get_review_status, which check the assertion against the
// reviewers file.
func TestPasskeyReceiptsAgreeWithNOA(t *testing.T) {
	dir := sharedNOA(t)
	raw, err := os.ReadFile(filepath.Join(dir, "schema", "noa-receipt-0.1.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	g := newRig(t)
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	r1, r2 := g.ask(1).Review, g.ask(2).Review
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	if _, code, res := g.decide(b, r1.ID, "approved", "fine", alice); code != 200 {
		t.Fatalf("approve: %d %v", code, res)
	}
	if _, code, res := g.decide(b, r2.ID, "rejected", "no", alice); code != 200 {
		t.Fatalf("reject: %d %v", code, res)
	}
	ctx := context.Background()
	var rcs []noa.Receipt
	err = g.log.Store().View(ctx, func(r reviewlog.Reader) error {
		chains, err := reviewlog.ListChains(ctx, r)
		if err != nil || len(chains) != 1 {
			return fmt.Errorf("chains %v: %w", chains, err)
		}
		rcs, err = reviewlog.ReadChainFile(ctx, r, chains[0].ID)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	keyring, err := g.keyring().JSON()
	if err != nil {
		t.Fatal(err)
	}
	verify := func(rs []noa.Receipt) noa.Result {
		t.Helper()
		arr, err := noa.ExportArray(rs)
		if err != nil {
			t.Fatal(err)
		}
		return noa.VerifyDocuments(noa.Documents{Chain: bytes.NewReader(arr), Keyring: keyring})
	}
	// Every receipt, as the chain exports it, passes the schema; two are
	// passkey decisions.
	exported, err := noa.ExportArray(rcs)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	if err := json.Unmarshal(exported, &docs); err != nil || len(docs) != len(rcs) {
		t.Fatalf("exported chain: %v", err)
	}
	var human []int
	for i, doc := range docs {
		if errs := schemaErrors(schema, doc, "receipt "+rcs[i].ID); len(errs) > 0 {
			t.Fatalf("not a NOA receipt v0.1 by the schema: %v", errs)
		}
		if _, ok, _ := passkey.DecodeModel(rcs[i].Agent.Model); ok && rcs[i].Agent.Principal == noa.PrincipalHuman {
			human = append(human, i)
		}
	}
	if len(human) != 2 {
		t.Fatalf("%d passkey receipts, want 2", len(human))
	}
	// The schema check can fail: what the schema refuses, it reports.
	for name, mutate := range map[string]func(map[string]any){
		"an unknown member":    func(d map[string]any) { d["assertion"] = "x" },
		"an unknown principal": func(d map[string]any) { d["agent"].(map[string]any)["principal"] = "PASSKEY" },
		"no signature":         func(d map[string]any) { delete(d, "sig") },
	} {
		var d map[string]any
		b, _ := json.Marshal(docs[human[0]])
		_ = json.Unmarshal(b, &d)
		mutate(d)
		if len(schemaErrors(schema, d, "x")) == 0 {
			t.Errorf("the schema check accepts a receipt with %s", name)
		}
	}
	// Both VALID.
	if res := verify(rcs); res.Verdict != noa.Valid {
		t.Fatalf("the NOA verifier: %s", res.Line())
	}
	if rep, err := g.log.Audit(ctx, g.keyring()); err != nil || len(rep.Findings) != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}

	// An edited assertion (its signature's last byte), in the exported
	// bytes: TAMPERED to the NOA verifier, and not this passkey's
	// signature to the check audit makes.
	a, _, _ := passkey.DecodeModel(rcs[human[0]].Agent.Model)
	sig, _ := base64.RawURLEncoding.DecodeString(a.Signature)
	sig[len(sig)-1] ^= 1
	a.Signature = base64.RawURLEncoding.EncodeToString(sig)
	docs[human[0]]["agent"].(map[string]any)["model"] = passkey.EncodeModel(a)
	edited, _ := json.Marshal(docs)
	if res := noa.VerifyDocuments(noa.Documents{Chain: bytes.NewReader(edited), Keyring: keyring}); res.Verdict != noa.Tampered {
		t.Fatalf("an edited assertion: NOA verifier says %s", res.Line())
	}
	cred, _ := g.credential(t, "alice")
	if err := passkey.VerifyDecision(cred, a, rcs[human[0]].Action.ParamsHash); err == nil {
		t.Fatal("an edited assertion verifies")
	}

	// The first decision's assertion moved into the second's receipt and
	// the chain sealed again with the server's own key: the chain is
	// VALID, the decision is not.
	resealed := make([]noa.Receipt, 0, len(rcs))
	var prev *noa.Receipt
	for i, rc := range rcs {
		if i == human[1] {
			rc.Agent.Model = rcs[human[0]].Agent.Model
		}
		d := noa.Draft{ID: rc.ID, TS: mustTS(t, rc.TS), Chain: rc.Scope.Chain, Agent: rc.Agent, Action: rc.Action, Governance: rc.Governance}
		if rc.Scope.Tenant != nil {
			d.Tenant = *rc.Scope.Tenant
		}
		sealed, _, err := noa.Seal(ctx, d, prev, g.chains.Signer)
		if err != nil {
			t.Fatal(err)
		}
		resealed = append(resealed, sealed)
		prev = &resealed[len(resealed)-1]
	}
	if res := verify(resealed); res.Verdict != noa.Valid {
		t.Fatalf("the resealed chain: %s", res.Line())
	}
	// What audit and get_review_status check (reviewlog's passkeyProblem):
	// the assertion under the reviewers file's credential over the
	// receipt's own paramsHash.
	moved, _, _ := passkey.DecodeModel(resealed[human[1]].Agent.Model)
	if err := passkey.VerifyDecision(cred, moved, resealed[human[1]].Action.ParamsHash); err == nil || !strings.Contains(err.Error(), "challenge") {
		t.Fatalf("the moved assertion: %v", err)
	}
	if err := passkey.VerifyDecision(cred, moved, rcs[human[0]].Action.ParamsHash); err != nil {
		t.Fatalf("the assertion no longer verifies where it was made: %v", err)
	}
}

func mustTS(t *testing.T, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// credential is reviewer who's one passkey in the reviewers file.
func (g *rig) credential(t *testing.T, who string) (passkey.Credential, bool) {
	t.Helper()
	pks, err := reviewlog.LoadPasskeys(g.reviewers)
	if err != nil || len(pks[who]) != 1 {
		t.Fatalf("passkeys of %s: %v %v", who, pks, err)
	}
	return pks[who][0], true
}
