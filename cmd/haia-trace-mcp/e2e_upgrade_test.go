package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// The builds a rolling upgrade to this one starts from, each built from
// its commit the way the rollback test builds release 0.1.0 (releaseBinary:
// cached, and required where .ci/run sets HAIA_RELEASE_TEST=1).
const (
	// lastSchema2 is the parent of the commit that added migration 00004
	// (reservations in rows): the last build whose newest migration is 2.
	lastSchema2 = "5918103"
	// withoutReviewRows is the parent of the commit that added migration
	// 00003 (the review state in rows): the last build whose decisions
	// write review lines without rows. It carries migrations 1, 2, 4 and 5
	// (4 and 5 landed before 3), so its schema version is 5.
	withoutReviewRows = "56e9805"
	// lastSchema5 is the last build of schema 5, before migration 00006
	// (receipts in rows).
	lastSchema5 = "1077e5d"
)

// upgradeFrom is an older build replicas are upgraded from, and the
// migrations it carries: what it writes rows for decides what
// docs/store.md says of it while it still serves the migrated database.
type upgradeFrom struct {
	name, ref  string
	migrations []int
}

func (u upgradeFrom) carries(migration int) bool { return slices.Contains(u.migrations, migration) }

var upgradesFrom = []upgradeFrom{
	{"schema 2", lastSchema2, []int{1, 2}},
	{"without review rows", withoutReviewRows, []int{1, 2, 4, 5}},
	{"schema 5", lastSchema5, []int{1, 2, 3, 4, 5}},
}

// How the database refuses, at commit, what an older build writes without
// the rows a later migration keeps: a review line (review_row_written,
// schema 3), a receipt (receipt_row_written, schema 6).
const (
	noReviewRow  = "its row in reviews (a binary older than schema 3 wrote it?)"
	noReceiptRow = "without its row in receipt_rows"
)

// TestRollingUpgradeWithAnOldBinary plays docs/store.md's rolling upgrade
// with real binaries on one PostgreSQL database, as an orchestrator would:
// a replica of the older build serves (over --http, callers by their
// HS256 tokens' subjects) and decides; this build's `store migrate` runs
// under it; a replica of this build starts beside it; both answer, at
// once, until the old one is stopped (the load balancer drops it). What
// the doc promises is asserted: the old replica reads not ready exactly
// when the database's schema version is no longer its own, and is then
// refused at start; what it records without the rows the database keeps
// (a review line before schema 3, any receipt before schema 6) is refused
// at commit with nothing written, the agent told no decision is given and
// the operator's log naming why; allows from both replicas never exceed
// the per-counterparty limit, and reach it exactly once `store migrate`
// has indexed every reservation; the new replica answers from every
// review and reservation the old one recorded; afterwards `audit` reads
// CONSISTENT and every exported chain segment verifies VALID.
func TestRollingUpgradeWithAnOldBinary(t *testing.T) {
	for _, from := range upgradesFrom {
		t.Run(from.name, func(t *testing.T) { rollingUpgrade(t, from) })
	}
}

func rollingUpgrade(t *testing.T, from upgradeFrom) {
	admin := pgtest.DSN(t)
	old := releaseBinary(t, from.ref)
	db := pgtest.Database(t, admin)
	oldSchema := migrateWith(t, old, db)

	root := loopRoot(t)
	key := filepath.Join(t.TempDir(), "signing.pem")
	// One key for every replica: the old replica, started first, makes it.
	secret := []byte(strings.Repeat("u", 48))
	secretFile := filepath.Join(t.TempDir(), "hs256")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	const issuer = "http://127.0.0.1/upgrade-as"
	serve := func(bin string) *httpProc {
		return startHTTPBin(t, bin, nil, "--http", "127.0.0.1:0", "--dir", root, "--key-file", key, "--store", db,
			"--auth-issuer", issuer, "--auth-hmac-secret", secretFile, "--rate-limit", "100000", "--rate-burst", "100000")
	}
	// A caller is its token's subject, on whichever replica it reaches.
	connect := func(p *httpProc, caller string) *mcp.ClientSession {
		tok := signHS256(t, secret, map[string]any{"iss": issuer, "aud": p.resource, "sub": caller,
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
		cs, err := httpSession(t, p.resource, func() string { return tok })
		if err != nil {
			t.Fatalf("connect %s: %v\n%s", caller, err, p.logs())
		}
		return cs
	}
	ask := func(cs *mcp.ClientSession, counterparty, amount string) *mcp.CallToolResult {
		t.Helper()
		return callTool(t, cs, "check_before_pay", map[string]any{"counterparty": counterparty, "amount": amount})
	}
	answer := func(res *mcp.CallToolResult) checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, res, &a)
		return a
	}
	ready := func(p *httpProc) int {
		code, _ := getText(t, p.base+"/readyz")
		return code
	}

	// The old build alone, before the upgrade: allows reserve 1.00 of the
	// payee's 5.00 limit, two reviews open.
	const payee = "0xa11ce000000000000000000000000000000000aa"
	o := serve(old)
	if !fileExists(key) {
		t.Fatalf("the old replica made no signing key\n%s", o.logs())
	}
	oldAs := map[string]*mcp.ClientSession{}
	for _, c := range []string{"agent-1", "agent-2"} {
		oldAs[c] = connect(o, c)
	}
	for _, amount := range []string{"0.50", "0.50"} {
		if a := answer(ask(oldAs["agent-1"], payee, amount)); a.Decision != "allow" {
			t.Fatalf("the old build before the upgrade, %s to the payee: %+v", amount, a)
		}
	}
	r1 := answer(ask(oldAs["agent-1"], sellerB, "0.30"))
	r2 := answer(ask(oldAs["agent-2"], sellerB, "0.40"))
	if r1.Decision != "review" || r2.Decision != "review" || r1.ReviewID == r2.ReviewID {
		t.Fatalf("the old build's reviews: %+v %+v", r1, r2)
	}
	if code := ready(o); code != http.StatusOK {
		t.Fatalf("the old replica's /readyz before the upgrade: %d", code)
	}

	// `store migrate` by this build, under the serving old replica; it
	// says so when it applies an earlier migration the old build lacked
	// at the same version.
	out, errOut, code := runCLI(t, "store", "migrate", "--store", db)
	newSchema := migratedTo(t, out, errOut, code)
	if !from.carries(3) && newSchema == oldSchema && !strings.Contains(out, "earlier migrations it lacked applied: 3") {
		t.Errorf("store migrate applying migration 3 at version %d says %q", newSchema, out)
	}
	t.Logf("the old build %s at schema version %d, this build's store migrate took the database to %d", from.ref, oldSchema, newSchema)
	// What the database refuses the old build at commit.
	var refusals []string
	if !from.carries(3) {
		refusals = append(refusals, noReviewRow)
	}
	decisionsRefused := newSchema >= 6 && !from.carries(6)
	if decisionsRefused {
		refusals = append(refusals, noReceiptRow)
	}
	reviewsRefused := len(refusals) > 0
	wantOld := http.StatusOK
	if newSchema != oldSchema {
		wantOld = http.StatusServiceUnavailable
	}
	if code := ready(o); code != wantOld {
		t.Errorf("the old replica's /readyz on the database migrated from version %d to %d: %d, want %d", oldSchema, newSchema, code, wantOld)
	}
	// A database the old build does not know refuses it what it starts
	// (a replica, a CLI command) by its schema check.
	aheadOfOld := fmt.Sprintf("ahead of this binary's %d", oldSchema)
	if wantOld != http.StatusOK {
		_, errOut, code := runBinEnv(t, old, nil, "--http", "127.0.0.1:0", "--dir", root, "--key-file", key, "--store", db, "--http-insecure-no-auth")
		if code == 0 || !strings.Contains(errOut, aheadOfOld) {
			t.Errorf("a replica of the old build started on the migrated database: exit %d %s", code, errOut)
		}
	}

	// The first review approved by this build's CLI.
	if out, errOut, code := runCLI(t, "review", "approve", r1.ReviewID, "--dir", root, "--store", db, "--note", "upgrade"); code != 0 {
		t.Fatalf("review approve by this build: %d %s %s", code, out, errOut)
	}
	// loggedRefusals waits until the old replica's log names the
	// database's refusals at least want times, and says how often it does.
	loggedRefusals := func(want int) int {
		deadline := time.Now().Add(10 * time.Second)
		for {
			n := 0
			for _, r := range refusals {
				n += strings.Count(o.logs(), r)
			}
			if n >= want || time.Now().After(deadline) {
				return n
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	named := func(msg string) bool {
		for _, r := range append([]string{aheadOfOld}, refusals...) {
			if strings.Contains(msg, r) {
				return true
			}
		}
		return false
	}
	// refused: what do does (an old replica's question, an old CLI's
	// decision) fails, naming the database's refusal (the CLI) or telling
	// the agent no decision is given while the replica's log names it, and
	// writes nothing.
	refused := func(what string, do func() (bool, string)) {
		t.Helper()
		before, logged := dbCounts(t, db), loggedRefusals(0)
		failed, msg := do()
		after := dbCounts(t, db)
		if !failed || !named(msg) && (!strings.Contains(msg, "no decision is given") || loggedRefusals(logged+1) == logged) {
			t.Errorf("%s: failed=%v %q, want it refused at commit (%q)", what, failed, msg, refusals)
		}
		if after != before {
			t.Errorf("%s wrote to the database: %s, then %s", what, before, after)
		}
	}
	// The old build's questions that open, decide or use a review.
	opened := "" // the review the old replica opens, where it may
	if reviewsRefused {
		refused("the old build's review approve", func() (bool, string) {
			_, errOut, code := runBinEnv(t, old, nil, "review", "approve", r2.ReviewID, "--dir", root, "--store", db, "--note", "old")
			return code != 0, errOut
		})
		refused("the old replica's use of the approval", func() (bool, string) {
			res := ask(oldAs["agent-1"], sellerB, "0.30")
			return res.IsError, resultText(res)
		})
		refused("the old replica's new review", func() (bool, string) {
			res := ask(oldAs["agent-2"], sellerB, "0.45")
			return res.IsError, resultText(res)
		})
	} else {
		a := answer(ask(oldAs["agent-2"], sellerB, "0.45"))
		if a.Decision != "review" || a.ReviewID == r2.ReviewID {
			t.Errorf("the old replica, a new question: %+v, want a review of its own", a)
		}
		opened = a.ReviewID
	}
	// Its answers that open nothing stand (the pending review, reused),
	// unless every receipt it writes is refused.
	if decisionsRefused {
		refused("the old replica's reuse of the pending review", func() (bool, string) {
			res := ask(oldAs["agent-2"], sellerB, "0.40")
			return res.IsError, resultText(res)
		})
	} else if a := answer(ask(oldAs["agent-2"], sellerB, "0.40")); a.Decision != "review" || a.ReviewID != r2.ReviewID {
		t.Errorf("the old replica asked the pending question again: %+v, want review %s", a, r2.ReviewID)
	}

	// A replica of this build beside it.
	n := serve(binPath)
	if code := ready(n); code != http.StatusOK {
		t.Fatalf("the new replica's /readyz: %d\n%s", code, n.logs())
	}
	newAs := map[string]*mcp.ClientSession{}
	for _, c := range []string{"agent-1", "agent-2"} {
		newAs[c] = connect(n, c)
	}
	// Both at once, on one payee: 4.00 of its limit is left, sixteen
	// questions of 0.50 from eight callers, each on both replicas.
	type reply struct {
		replica, caller string
		res             *mcp.CallToolResult
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		replies []reply
		start   = make(chan struct{})
	)
	for i := range 8 {
		caller := fmt.Sprintf("burst-%d", i)
		for name, p := range map[string]*httpProc{"old": o, "new": n} {
			cs := connect(p, caller)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": payee, "amount": "0.50"}})
				if err != nil {
					t.Errorf("%s replica, %s: %v", name, caller, err)
					return
				}
				mu.Lock()
				replies = append(replies, reply{name, caller, res})
				mu.Unlock()
			}()
		}
	}
	logged := loggedRefusals(0)
	close(start)
	wg.Wait()
	allowed, refusedNow := map[string]int{}, 0
	for _, r := range replies {
		switch a := decisionOfResult(r.res); {
		case r.res.IsError && r.replica == "old" && reviewsRefused && strings.Contains(resultText(r.res), "no decision is given"):
			// The limit's review (or, before schema 6, any answer) of
			// the old build: refused.
			refusedNow++
		case a.Decision == "allow":
			allowed[r.replica]++
		case a.Decision == "review" && hasRule(a, "per_counterparty_limit"):
		case a.Decision == "review" && r.replica == "new" && !from.carries(4) && hasRule(a, "reservation_unverified"):
			// The old replica's reserved lines have no rows yet.
		default:
			t.Errorf("%s replica, %s: %s", r.replica, r.caller, resultSummary(r.res))
		}
	}
	if refusedNow > 0 && loggedRefusals(logged+refusedNow) != logged+refusedNow {
		t.Errorf("the old replica's %d tool errors are not all the database's refusal in its log:\n%s", refusedNow, o.logs())
	}
	allows := allowed["old"] + allowed["new"]
	if allows > 8 || from.carries(4) && allows != 8 || (allowed["old"] == 0) != decisionsRefused {
		t.Errorf("allows of 0.50 with 4.00 of the limit left: %v, want 8 at most (exactly 8 where the old build writes reservation rows), the old replica's among them unless its receipts are refused", allowed)
	}
	// The new replica answers from what the old one recorded: the limit
	// is reached (or, where the old build's reserved lines have no rows,
	// cannot be judged), the approval used once, the pending review the
	// same.
	if a := answer(ask(newAs["agent-1"], payee, "0.01")); a.Decision != "review" ||
		!hasRule(a, "per_counterparty_limit") && (from.carries(4) || !hasRule(a, "reservation_unverified")) {
		t.Errorf("the new replica, 0.01 more to the payee: %+v, want review for the limit", a)
	}
	if a := answer(ask(newAs["agent-1"], sellerB, "0.30")); a.Decision != "allow" {
		t.Errorf("the new replica, the approved question: %+v", a)
	}
	if a := answer(ask(newAs["agent-1"], sellerB, "0.30")); a.Decision != "review" || a.ReviewID == r1.ReviewID {
		t.Errorf("the new replica, the approved question again: %+v, want a new review", a)
	}
	if a := answer(ask(newAs["agent-2"], sellerB, "0.40")); a.Decision != "review" || a.ReviewID != r2.ReviewID {
		t.Errorf("the new replica, the pending question: %+v, want review %s", a, r2.ReviewID)
	}
	if a := answer(ask(newAs["agent-2"], sellerB, "0.45")); a.Decision != "review" || a.ReviewID == r2.ReviewID || opened != "" && a.ReviewID != opened {
		t.Errorf("the new replica, the question the old one was asked: %+v, want review %q (the old replica's, if it opened one)", a, opened)
	}
	if out, errOut, code := runCLI(t, "review", "reject", r2.ReviewID, "--dir", root, "--store", db, "--note", "upgrade"); code != 0 {
		t.Fatalf("review reject by this build: %d %s %s", code, out, errOut)
	}
	if a := answer(ask(newAs["agent-2"], sellerB, "0.40")); a.Decision != "block" {
		t.Errorf("the new replica, the rejected question: %+v, want block", a)
	}

	// The load balancer drops the old replica.
	if code := o.stop(t); code != 0 {
		t.Errorf("the old replica exited %d\n%s", code, o.logs())
	}
	migrateWith(t, binPath, db) // once the last old replica is gone (store.md)
	// Every reservation counts, whichever replica made it: the payee's
	// limit takes exactly 8 allows of 0.50 after the first 1.00.
	for ; allows <= 8; allows++ {
		a := answer(ask(newAs["agent-2"], payee, "0.50"))
		if a.Decision == "review" && hasRule(a, "per_counterparty_limit") && !hasRule(a, "reservation_unverified") {
			break
		}
		if a.Decision != "allow" {
			t.Fatalf("the new replica alone, 0.50 to the payee after %d allows: %+v", allows, a)
		}
	}
	if allows != 8 {
		t.Errorf("the new replica alone: the payee's limit reached after %d allows of 0.50, want 8", allows)
	}
	if code := n.stop(t); code != 0 {
		t.Errorf("the new replica exited %d\n%s", code, n.logs())
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", root, "--store", db); code != 0 || !strings.HasPrefix(out, "CONSISTENT") {
		t.Errorf("audit after the upgrade: %d %s %s", code, out, errOut)
	}
	exported := filepath.Join(t.TempDir(), "exported")
	if out, errOut, code := runCLI(t, "store", "export", "--store", db, "--dir", exported); code != 0 {
		t.Fatalf("store export: %d %s %s", code, out, errOut)
	}
	if segments := verifyExportedChains(t, exported); segments == 0 {
		t.Error("no chain segment was exported")
	}
}

// migrateWith runs bin's `store migrate` on dsn and returns the schema
// version it reports the database at.
func migrateWith(t *testing.T, bin, dsn string) int {
	t.Helper()
	out, errOut, code := runBinEnv(t, bin, nil, "store", "migrate", "--store", dsn)
	return migratedTo(t, out, errOut, code)
}

// migratedTo is the schema version a `store migrate` run says it left the
// database at.
func migratedTo(t *testing.T, out, errOut string, code int) int {
	t.Helper()
	m := regexp.MustCompile(`schema version (?:\d+ → )?(\d+)`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("store migrate: %d %s %s", code, out, errOut)
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

// dbCounts sums up what a store holds: review lines, receipts, review
// rows, reservation rows and notifications waiting.
func dbCounts(t *testing.T, dsn string) string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var lines, receipts, reviews, reservations, outbox int
	if err := conn.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM review_lines), (SELECT count(*) FROM receipts),
		(SELECT count(*) FROM reviews), (SELECT count(*) FROM reservations), (SELECT count(*) FROM notify_outbox)`).
		Scan(&lines, &receipts, &reviews, &reservations, &outbox); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d lines, %d receipts, %d review rows, %d reservation rows, %d notifications", lines, receipts, reviews, reservations, outbox)
}

// verifyExportedChains exports every chain of the file root at dir (a
// `store export`) segment by segment and verifies each with the root's
// keyring, failing t on any verdict but VALID; it returns the number of
// segments.
func verifyExportedChains(t *testing.T, dir string) int {
	t.Helper()
	list, errOut, code := runCLI(t, "chain", "list", "--dir", dir)
	if code != 0 {
		t.Fatalf("chain list of %s: %d %s", dir, code, errOut)
	}
	keyring := filepath.Join(dir, reviewlog.DirName, reviewlog.KeyringFile)
	segments := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		chain := strings.Split(line, "\t")[0]
		out := filepath.Join(t.TempDir(), chain)
		if err := os.Mkdir(out, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, errOut, code := runCLI(t, "chain", "export", chain, "--all", "--out", out, "--dir", dir); code != 0 {
			t.Fatalf("chain export %s: %d %s", chain, code, errOut)
		}
		files, _ := filepath.Glob(filepath.Join(out, "*.json"))
		for _, f := range files {
			segments++
			if verdict, errOut, code := runCLI(t, "verify", f, keyring); code != 0 || !strings.HasPrefix(verdict, "VALID") {
				t.Errorf("verify %s of %s: %d %s %s", filepath.Base(f), chain, code, verdict, errOut)
			}
		}
	}
	return segments
}

// decisionOfResult is the answer a check_before_pay result carries, or
// the zero answer for a tool error.
func decisionOfResult(res *mcp.CallToolResult) checkAnswer {
	var a checkAnswer
	if res.IsError {
		return a
	}
	if b, err := json.Marshal(res.StructuredContent); err == nil {
		_ = json.Unmarshal(b, &a)
	}
	return a
}

func resultSummary(res *mcp.CallToolResult) string {
	if res.IsError {
		return "tool error: " + resultText(res)
	}
	a := decisionOfResult(res)
	return fmt.Sprintf("%+v", a)
}
