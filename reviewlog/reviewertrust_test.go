package reviewlog

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// ReviewerTrust.DecisionProblem holds a reviewer's key-signed decision to
// the file read whole: listed key, and with a tenant, the grant.
func TestReviewerTrustDecisionProblem(t *testing.T) {
	alicePub, aliceKey, _ := ed25519.GenerateKey(rand.Reader)
	_, mallory, _ := ed25519.GenerateKey(rand.Reader)
	path := filepath.Join(t.TempDir(), "reviewers.json")
	if err := os.WriteFile(path, []byte(`{"alice":{"key":"`+noa.EncodeSPKI(alicePub)+`","tenants":["acme"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	decision := func(by string, key ed25519.PrivateKey) noa.Receipt {
		at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
		rule := RuleHumanReview
		rc, _, err := noa.Seal(t.Context(), noa.Draft{TS: at, Tenant: "acme", Chain: "decisions-x",
			Agent:  noa.Agent{ID: by, Principal: noa.PrincipalHuman},
			Action: noa.Action{ID: ActionID("1b4e28ba-2fa1-4d2c-883f-0016d3cca427"), Canonical: ActionCanonical, RiskClass: "IRREVERSIBLE", ParamsHash: "sha256:" + strings.Repeat("0", 64)},
			Governance: noa.Governance{Mode: GovernanceMode, Verdict: noa.VerdictAllowed, RuleID: &rule,
				Approval: &noa.Approval{By: by, At: noa.FormatTS(at)}}}, nil, noa.NewKeySigner(key))
		if err != nil {
			t.Fatal(err)
		}
		return rc
	}
	for _, tc := range []struct {
		name, tenant string
		rc           noa.Receipt
		want         string // "" counts
	}{
		{"alice on a single root", "", decision("alice", aliceKey), ""},
		{"alice for acme", "acme", decision("alice", aliceKey), ""},
		{"alice for globex", "globex", decision("alice", aliceKey), `does not grant them tenant "globex"`},
		{"alice's name, another key", "", decision("alice", mallory), `not signed by reviewer "alice"'s trusted key`},
		{"a reviewer the file does not list", "acme", decision("mallory", mallory), `"mallory" is not in the trusted reviewers file`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			trust, err := LoadReviewerTrust(path, tc.tenant)
			if err != nil {
				t.Fatal(err)
			}
			got := trust.DecisionProblem(tc.rc)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("problem %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := LoadReviewerTrust(filepath.Join(t.TempDir(), "absent.json"), ""); err == nil {
		t.Fatal("an absent reviewers file was read")
	}
}
