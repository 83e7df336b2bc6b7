package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// previousRelease is the commit of release 0.1.0, whose PostgreSQL store
// is at schema version 1: the release a rollback goes back to.
const previousRelease = "3a7cb0f"

// releaseBinary builds the binary of commit ref of this repository once
// (kept in the temporary directory across runs), or skips t where the
// history or the modules it needs are not here. With HAIA_RELEASE_TEST=1
// (.ci/run sets it where the history holds ref) a missing release fails t
// instead: a rollback test that quietly skips proves nothing.
func releaseBinary(t *testing.T, ref string) string {
	t.Helper()
	bin := filepath.Join(os.TempDir(), "haia-trace-mcp-release-"+ref)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		releaseMissing(t, "no git history to build release %s from: %v", ref, err)
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", strings.TrimSpace(string(top)), ref, src)
	if out, err := archive.CombinedOutput(); err != nil {
		releaseMissing(t, "release %s is not in this repository's history: %v %s", ref, err, out)
	}
	build := exec.Command("go", "build", "-o", bin+".tmp", "./cmd/haia-trace-mcp")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	if out, err := build.CombinedOutput(); err != nil {
		releaseMissing(t, "building release %s (its modules must be in the module cache): %v\n%s", ref, err, out)
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// releaseMissing skips t for the stated reason, or fails it where the
// release is required (HAIA_RELEASE_TEST=1).
func releaseMissing(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("HAIA_RELEASE_TEST") == "1" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// probe is one question asked of every copy of the store, and what its
// answer must agree on: the decision, the rules, and which review.
type probe struct{ counterparty, amount string }

// probeAnswers starts bin on a store (args: --dir, --store …), asks every
// probe in order of one session and stops it; each answer is summed up as
// its decision, its sorted rules and its review (named through reviews,
// "new" for one opened by the probe itself).
func probeAnswers(t *testing.T, bin string, probes []probe, reviews map[string]string, args ...string) []string {
	t.Helper()
	p := startHTTPBin(t, bin, nil, append([]string{"--http", "127.0.0.1:0", "--http-insecure-no-auth"}, args...)...)
	cs, err := httpSession(t, p.resource, func() string { return "" })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	defer cs.Close()
	var out []string
	for _, q := range probes {
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": q.counterparty, "amount": q.amount}), &a)
		var rules []string
		for _, r := range a.Reasons {
			rules = append(rules, r.Rule)
		}
		slices.Sort(rules)
		review := reviews[a.ReviewID]
		if a.ReviewID != "" && review == "" {
			review = "new"
		}
		out = append(out, a.Decision+" "+strings.Join(slices.Compact(rules), ",")+" "+review)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("%s exited %d\n%s", bin, code, p.logs())
	}
	return out
}

// Rolling back from PostgreSQL, as store.md says: this release's `store
// export` of a migrated database that replicas decided in (allows whose
// reservations hold, lanes, an approval used, a review pending) writes a
// file root that `audit` finds CONSISTENT and whose every chain segment
// `verify`s VALID with the exported keyring; `store import` takes it into
// a fresh database; and the database, its import and the file root answer
// the same questions alike, reservations and reviews included. The
// previous release refuses the migrated database, whatever it is asked to
// do with it; its own import of the exported root reads as corrupt to it,
// and it gives no decision.
func TestStoreRollbackThroughExportImport(t *testing.T) {
	db := e2eDatabase(t)
	rs := startReplicas(t, db, 2)
	ask := func(cs *mcp.ClientSession, counterparty, amount string) checkAnswer {
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": counterparty, "amount": amount}), &a)
		return a
	}
	// Allows to one payee from both replicas at once: 4.60 of its 5.00
	// limit reserved, receipts in more than one lane.
	const payee = "0xa11ce00000000000000000000000000000000001"
	var wg sync.WaitGroup
	allows := []string{"0.90", "0.91", "0.92", "0.93", "0.94"}
	got := make([]checkAnswer, len(allows))
	for i, amount := range allows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = ask(rs.sessions[i%2], payee, amount)
		}()
	}
	wg.Wait()
	for i, a := range got {
		if a.Decision != "allow" {
			t.Fatalf("allow %d of %s: %+v", i, allows[i], a)
		}
	}
	// A review approved and its approval used; another left pending.
	used := ask(rs.sessions[0], sellerB, "0.30")
	if used.Decision != "review" {
		t.Fatalf("the open seller: %+v", used)
	}
	if out, errOut, code := runCLI(t, "review", "approve", used.ReviewID, "--dir", rs.root, "--store", db, "--note", "once"); code != 0 {
		t.Fatalf("review approve: %d %s %s", code, out, errOut)
	}
	if a := ask(rs.sessions[1], sellerB, "0.30"); a.Decision != "allow" {
		t.Fatalf("the approved question: %+v", a)
	}
	pending := ask(rs.sessions[0], sellerB, "0.40")
	if pending.Decision != "review" {
		t.Fatalf("the second question: %+v", pending)
	}
	for _, p := range rs.procs {
		p.stop(t)
	}

	// Out of the database: a file root, consistent, every segment VALID.
	exported := filepath.Join(t.TempDir(), "exported")
	if out, errOut, code := runCLI(t, "store", "export", "--store", db, "--dir", exported); code != 0 {
		t.Fatalf("store export: %d %s %s", code, out, errOut)
	}
	if err := os.CopyFS(filepath.Join(exported, "events"), os.DirFS(filepath.Join(rs.root, "events"))); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", exported); code != 0 || !strings.HasPrefix(out, "CONSISTENT") {
		t.Fatalf("audit of the exported root: %d %s %s", code, out, errOut)
	}
	list, errOut, code := runCLI(t, "chain", "list", "--dir", exported)
	if code != 0 || strings.Count(list, "decisions-") < 2 {
		t.Fatalf("chain list of the exported root: %d %q %s (want the key's chain and a lane at least)", code, list, errOut)
	}
	if verifyExportedChains(t, exported) == 0 {
		t.Fatal("no chain segment was exported")
	}
	// Into a fresh database of this release.
	imported := e2eDatabase(t)
	if out, errOut, code := runCLI(t, "store", "import", "--dir", exported, "--store", imported); code != 0 || !strings.Contains(out, "VALID before and after") {
		t.Fatalf("store import: %d %s %s", code, out, errOut)
	}

	probes := []probe{
		{payee, "0.95"},   // 4.60 reserved + 0.95 is over the limit: the reservations came along
		{sellerB, "0.40"}, // the pending review, the same one
		{sellerB, "0.30"}, // its approval is used already
		{"0xa11ce00000000000000000000000000000000009", "0.50"},
	}
	reviews := map[string]string{pending.ReviewID: "pending", used.ReviewID: "used"}
	// Each copy from the same state: the file root is copied before it is
	// asked, the databases are asked once each.
	fileRoot := filepath.Join(t.TempDir(), "file")
	if err := os.CopyFS(fileRoot, os.DirFS(exported)); err != nil {
		t.Fatal(err)
	}
	want := probeAnswers(t, binPath, probes, reviews, "--dir", rs.root, "--key-file", rs.key, "--store", db)
	if !strings.HasPrefix(want[0], "review ") || !strings.Contains(want[0], "limit") || !strings.HasSuffix(want[1], " pending") {
		t.Fatalf("the migrated database's answers: %q (want the limit reached by the reservations, and the pending review)", want)
	}
	for name, args := range map[string][]string{
		"the imported database":  {"--dir", rs.root, "--key-file", rs.key, "--store", imported},
		"the exported file root": {"--dir", fileRoot, "--key-file", rs.key},
	} {
		if got := probeAnswers(t, binPath, probes, reviews, args...); !slices.Equal(got, want) {
			t.Errorf("%s answers %q, the database %q", name, got, want)
		}
	}

	t.Run("previous release", func(t *testing.T) {
		old := releaseBinary(t, previousRelease)
		// It refuses the migrated database, for serving, listing and
		// exporting alike, naming the schema ahead of it.
		for _, args := range [][]string{
			{"--dir", rs.root, "--key-file", rs.key, "--store", db, "--http", "127.0.0.1:0", "--http-insecure-no-auth"},
			{"review", "list", "--dir", rs.root, "--store", db},
			{"store", "export", "--store", db, "--dir", filepath.Join(t.TempDir(), "x")},
			{"store", "migrate", "--store", db},
		} {
			_, errOut, code := runBinEnv(t, old, nil, args...)
			if code == 0 || !strings.Contains(errOut, "ahead of this binary's 1") {
				t.Errorf("the previous release %v on the migrated database: exit %d %s", args[:2], code, errOut)
			}
		}
		// Its own database, migrated by it, takes the exported root.
		back := pgtest.Database(t, pgtest.DSN(t))
		if out, errOut, code := runBinEnv(t, old, nil, "store", "migrate", "--store", back); code != 0 {
			t.Fatalf("the previous release's store migrate: %d %s %s", code, out, errOut)
		}
		out, errOut, code := runBinEnv(t, old, nil, "store", "import", "--dir", exported, "--store", back)
		if code != 0 {
			t.Fatalf("the previous release's store import of the exported root: %d %s %s", code, out, errOut)
		}
		// But it cannot read the review log this release writes (the line
		// that says the spend ledger started, which it knows nothing of):
		// the log is corrupt to it, and it gives no decision at all — never
		// an allow that would not count the ledger's commitments.
		if out, errOut, code := runBinEnv(t, old, nil, "audit", "--dir", rs.root, "--store", back); code == 0 || !strings.Contains(errOut, `unknown field "ledger"`) {
			t.Errorf("the previous release's audit of its import: exit %d %s %s", code, out, errOut)
		}
		p := startHTTPBin(t, old, nil, "--http", "127.0.0.1:0", "--http-insecure-no-auth", "--dir", rs.root, "--key-file", rs.key, "--store", back)
		cs, err := httpSession(t, p.resource, func() string { return "" })
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, p.logs())
		}
		defer cs.Close()
		for _, q := range probes {
			res := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": q.counterparty, "amount": q.amount})
			if !res.IsError || !strings.Contains(resultText(res), "review log is damaged") {
				t.Errorf("the previous release asked %s %s of its import: %s", q.counterparty, q.amount, resultText(res))
			}
		}
	})
}
