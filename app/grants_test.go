package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// grantsFixture is two tenants, acme and globex, served from one
// directory with one trusted reviewers file, and alice's reviewer key.
type grantsFixture struct {
	dir       string
	cfg       app.Config
	reviewers string
	alice     ed25519.PrivateKey
}

func newGrantsFixture(t *testing.T, aliceTenants ...string) *grantsFixture {
	t.Helper()
	f := &grantsFixture{dir: t.TempDir()}
	for _, name := range []string{"acme", "globex"} {
		f.cfg = newTraceRoot(t, filepath.Join(f.dir, name))
	}
	f.cfg.Dir = ""
	f.reviewers = filepath.Join(t.TempDir(), "reviewers.json")
	f.cfg.ReviewersPath = f.reviewers
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f.alice = key
	f.grant(t, aliceTenants...)
	return f
}

// grant rewrites the reviewers file: alice's key, granted tenants.
func (f *grantsFixture) grant(t *testing.T, tenants ...string) {
	t.Helper()
	if err := os.Remove(f.reviewers); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if _, err := reviewlog.AddReviewer(f.reviewers, "alice", f.alice.Public().(ed25519.PublicKey), tenants...); err != nil {
		t.Fatal(err)
	}
}

func (f *grantsFixture) open(t *testing.T) *app.Tenants {
	t.Helper()
	ts, err := app.OpenTenants(t.Context(), f.dir, f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.Close)
	return ts
}

// decide signs alice's decision on review id with her own key, as the
// review CLI does, through log.
func (f *grantsFixture) decide(ctx context.Context, log *reviewlog.Log, id, status string) (reviewlog.Review, error) {
	chains := &reviewlog.Chains{Signer: noa.NewKeySigner(f.alice), Tenant: "haia-trace-mcp"}
	return engine.Decider{Log: log, Chains: chains}.Decide(ctx, id, status, "checked", "alice")
}

// singleRootLog is the log of a tenant's root read as a single root (no
// grant read): what the review commands wrote through --dir DIR/<tenant>
// before they read the tenant the server records, and what anyone who can
// write the store may append.
func singleRootLog(st *app.Stack) *reviewlog.Log {
	path := st.ReviewersPath()
	return reviewlog.OpenStore(st.Store(), reviewlog.Options{
		Reviewers: func() (reviewlog.Reviewers, error) { return reviewlog.LoadReviewers(path) },
		Passkeys:  func() (reviewlog.Passkeys, error) { return reviewlog.LoadPasskeys(path) }})
}

func auditFindings(t *testing.T, st *app.Stack) []string {
	t.Helper()
	var kr noa.Keyring
	if err := st.Store().View(t.Context(), func(r reviewlog.Reader) (err error) {
		kr, err = r.Keyring(t.Context())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, pub := range mustReviewers(t, st.ReviewersPath()) {
		kr.Add(noa.KeyID(pub), pub)
	}
	rep, err := st.Log().Audit(t.Context(), kr)
	if err != nil {
		t.Fatal(err)
	}
	return rep.Findings
}

func mustReviewers(t *testing.T, path string) reviewlog.Reviewers {
	t.Helper()
	rs, err := reviewlog.LoadReviewers(path)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

var grantsQuestion = engine.Question{Counterparty: "0x9999999999999999999999999999999999999999", Amount: "0.10"}

// A reviewer's decision counts for a tenant only when the trusted
// reviewers file grants them that tenant: an ungranted reviewer's signed
// approval leaves the question in review (never allow), in the engine,
// get_review_status and audit alike; granted, it is honoured; a grant
// withdrawn before the approval is used sends later questions to review.
func TestTenantGrantsBindDecisions(t *testing.T) {
	ctx := t.Context()
	f := newGrantsFixture(t, "globex") // alice decides for globex only
	ts := f.open(t)
	acme := ts.Stack("acme")

	first := ask(t, acme, grantsQuestion)
	if first.Decision != guard.Review {
		t.Fatalf("first answer %s, want review", first.Decision)
	}
	// The tenant's own log refuses her decision before writing anything.
	if _, err := f.decide(ctx, acme.Log(), first.ReviewID, reviewlog.Approved); !errors.Is(err, reviewlog.ErrUntrusted) || !strings.Contains(err.Error(), `tenant "acme"`) {
		t.Fatalf("ungranted decision through acme's log: %v, want ErrUntrusted naming the tenant", err)
	}
	if rv, err := acme.Log().Get(ctx, first.ReviewID); err != nil || rv.Status != reviewlog.Pending || rv.DecidedBy != "" {
		t.Fatalf("after the refused decision: %+v %v, want pending and nothing written", rv, err)
	}
	// Her approval signed anyway (written around the tenant's log): it is
	// no decision for acme.
	if _, err := f.decide(ctx, singleRootLog(acme), first.ReviewID, reviewlog.Approved); err != nil {
		t.Fatalf("approval through the single-root log: %v", err)
	}
	st, err := acme.Engine().ReviewStatus(ctx, first.ReviewID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status == reviewlog.Approved || !strings.Contains(strings.Join(st.Integrity, "\n"), `does not grant them tenant "acme"`) {
		t.Fatalf("get_review_status of the ungranted approval: %s %q, want not approved, saying the grant is missing", st.Status, st.Integrity)
	}
	if again := ask(t, acme, grantsQuestion); again.Decision != guard.Review {
		t.Fatalf("after the ungranted approval the question is %s, want review", again.Decision)
	}
	if fs := strings.Join(auditFindings(t, acme), "\n"); !strings.Contains(fs, `does not grant them tenant "acme"`) {
		t.Fatalf("audit of acme does not flag the ungranted decision:\n%s", fs)
	}

	// Granted acme: the same signed approval counts.
	f.grant(t, "globex", "acme")
	if st, err := acme.Engine().ReviewStatus(ctx, first.ReviewID); err != nil || st.Status != reviewlog.Approved || st.DecidedBy != "alice" {
		t.Fatalf("granted: %+v %v, want approved by alice", st.Review, err)
	}
	// Withdrawn before the agent used it: later questions are reviewed.
	f.grant(t, "globex")
	if ans := ask(t, acme, grantsQuestion); ans.Decision != guard.Review {
		t.Fatalf("grant withdrawn: %s, want review", ans.Decision)
	}
	// Granted again: the approval is honoured once.
	f.grant(t, "acme")
	if ans := ask(t, acme, grantsQuestion); ans.Decision != guard.Allow {
		t.Fatalf("granted again: %s %+v, want allow on alice's approval", ans.Decision, ans.Reasons)
	}

	// Granted globex alone, her rejection there holds; in acme it is
	// refused.
	f.grant(t, "globex")
	globex := ts.Stack("globex")
	g := ask(t, globex, grantsQuestion)
	if _, err := f.decide(ctx, globex.Log(), g.ReviewID, reviewlog.Rejected); err != nil {
		t.Fatalf("granted rejection: %v", err)
	}
	if ans := ask(t, globex, grantsQuestion); ans.Decision != guard.Block {
		t.Fatalf("after the granted rejection: %s, want block", ans.Decision)
	}
}

// A reviewer with no tenants list decides on a single root (everyone
// trusted is trusted there) and for no tenant of a --tenants-dir server;
// "*" grants every tenant.
func TestTenantGrantsForReviewersWithoutTenants(t *testing.T) {
	ctx := t.Context()
	f := newGrantsFixture(t)
	ts := f.open(t)
	acme := ts.Stack("acme")
	r := ask(t, acme, grantsQuestion)
	if _, err := f.decide(ctx, acme.Log(), r.ReviewID, reviewlog.Approved); !errors.Is(err, reviewlog.ErrUntrusted) {
		t.Fatalf("no tenants list, --tenants-dir: %v, want ErrUntrusted", err)
	}
	// The same root served alone trusts her.
	cfg := f.cfg
	cfg.Dir = filepath.Join(f.dir, "globex")
	single := open(t, cfg)
	s := ask(t, single, grantsQuestion)
	if _, err := f.decide(ctx, single.Log(), s.ReviewID, reviewlog.Approved); err != nil {
		t.Fatalf("single root: %v", err)
	}
	f.grant(t, reviewlog.AllTenants)
	if _, err := f.decide(ctx, acme.Log(), r.ReviewID, reviewlog.Approved); err != nil {
		t.Fatalf(`"*": %v`, err)
	}
	if ans := ask(t, acme, grantsQuestion); ans.Decision != guard.Allow {
		t.Fatalf(`granted "*": %s, want allow`, ans.Decision)
	}
}

// The signed terms name the tenant, so a review and its decision moved
// from one tenant's store to another's count in neither, even for a
// reviewer granted both and under the server key the tenants share.
func TestDecisionMovedBetweenTenantsStores(t *testing.T) {
	ctx := t.Context()
	f := newGrantsFixture(t, reviewlog.AllTenants)
	ts := f.open(t)
	globex := ts.Stack("globex")
	g := ask(t, globex, grantsQuestion)
	if _, err := f.decide(ctx, globex.Log(), g.ReviewID, reviewlog.Approved); err != nil {
		t.Fatal(err)
	}
	if st, err := globex.Engine().ReviewStatus(ctx, g.ReviewID); err != nil || st.Status != reviewlog.Approved || st.Terms == nil || st.Terms.Tenant != "globex" {
		t.Fatalf("in globex: %+v %v, want approved, its terms naming globex", st.Review, err)
	}
	ts.Close()
	// globex's whole guard/ (log, chains, keyring) replaces acme's.
	acmeGuard := filepath.Join(f.dir, "acme", reviewlog.DirName)
	if err := os.RemoveAll(acmeGuard); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(acmeGuard, os.DirFS(filepath.Join(f.dir, "globex", reviewlog.DirName))); err != nil {
		t.Fatal(err)
	}
	ts = f.open(t)
	acme := ts.Stack("acme")
	st, err := acme.Engine().ReviewStatus(ctx, g.ReviewID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status == reviewlog.Approved || !st.Tampered || !strings.Contains(strings.Join(st.Integrity, "\n"), `the terms are for tenant "globex", but this is tenant "acme"'s review log`) {
		t.Fatalf("moved into acme: %s tampered=%v %q, want TAMPERED naming both tenants", st.Status, st.Tampered, st.Integrity)
	}
	if ans := ask(t, acme, grantsQuestion); ans.Decision != guard.Review {
		t.Fatalf("the moved approval answered acme's question: %s, want review", ans.Decision)
	}
	if fs := strings.Join(auditFindings(t, acme), "\n"); !strings.Contains(fs, `tenant "globex"`) {
		t.Fatalf("audit of acme does not flag the moved review:\n%s", fs)
	}
}

// A tool's stack (the review commands') opens a tenant's root the way the
// tenant's server serves it: Start recorded the tenant beside the policy,
// so the root given alone is read as that tenant's — its grants bind, and
// a decision by a reviewer not granted it is refused before anything is
// written — and a tenant named otherwise is refused. Opening writes
// nothing; before the server's Start the store holds no policy at all.
func TestToolStackReadsTheTenantItsServerRecorded(t *testing.T) {
	f := newGrantsFixture(t, "acme")
	ts := f.open(t)
	globex := ts.Stack("globex")
	if _, ok, err := app.RecordedPolicy(t.Context(), globex.Store()); err != nil || ok {
		t.Fatalf("before Start the store records a policy (%v, %v): a start refused after opening would leave it", ok, err)
	}
	ans := ask(t, globex, engine.Question{Counterparty: "0x9999999999999999999999999999999999999999", Amount: "0.10"})
	if err := ts.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := app.RecordedPolicy(t.Context(), globex.Store())
	if err != nil || !ok || rec.Tenant != "globex" {
		t.Fatalf("after Start: %+v %v %v, want the policy recorded for tenant globex", rec, ok, err)
	}
	root := filepath.Join(f.dir, "globex")
	tool := func(cfg app.Config) (*app.Stack, error) {
		cfg.Dir, cfg.Tool, cfg.ReviewersPath, cfg.Store = root, true, f.reviewers, "file:"
		return app.Open(t.Context(), cfg)
	}
	before := treeOf(t, root)
	st, err := tool(app.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Tenant() != "globex" || !st.PolicyKnown() || st.Engine() != nil {
		t.Fatalf("tool stack: tenant %q, policy known %v, engine %v", st.Tenant(), st.PolicyKnown(), st.Engine())
	}
	if _, err := f.decide(t.Context(), st.Log(), ans.ReviewID, reviewlog.Rejected); !errors.Is(err, reviewlog.ErrUntrusted) || !strings.Contains(err.Error(), `tenant "globex"`) {
		t.Fatalf("alice, granted acme only, deciding globex's review through its root: %v", err)
	}
	if after := treeOf(t, root); after != before {
		t.Errorf("opening a tool's stack and a refused decision changed the root:\n%s\nwas\n%s", after, before)
	}
	if _, err := tool(app.Config{Tenant: "acme"}); err == nil || !strings.Contains(err.Error(), `serves this store as tenant "globex"`) {
		t.Errorf("globex's root opened as acme's: %v", err)
	}
	var ce *app.ConfigError
	other := filepath.Join(t.TempDir(), "other.json")
	if err := os.WriteFile(other, []byte(`{"reviewAbove": "3"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tool(app.Config{GuardConfig: other}); !errors.As(err, &ce) || !errors.Is(err, app.ErrPolicyNotInForce) {
		t.Errorf("a --guard-config that is not the recorded policy: %v", err)
	}
	f.grant(t, "globex")
	if r, err := f.decide(t.Context(), st.Log(), ans.ReviewID, reviewlog.Rejected); err != nil || r.Status != reviewlog.Rejected {
		t.Fatalf("alice granted globex: %+v %v", r, err)
	}
	if r, err := globex.Log().Get(t.Context(), ans.ReviewID); err != nil || r.Status != reviewlog.Rejected {
		t.Errorf("the server reads the tool's decision as %+v (%v)", r.Status, err)
	}
}

// treeOf lists every file under dir with its size and time.
func treeOf(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %s\n", path, info.Size(), info.ModTime())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
