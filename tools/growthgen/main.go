// Command growthgen builds the Trace root of the growth benchmark: a guard
// that has run for a long time — many reviews in the log, many signed
// receipts in the chains — so that check_before_pay and get_review_status
// can be timed against it and against an empty guard/.
//
//	go run ./tools/growthgen -dir /tmp/growth -reviews 100000 -receipts 1000000
//
// It writes DIR/.trace (events/, guard/decisions.ndjson, guard/receipts/,
// guard/keyring.json), DIR/reviewers.json, DIR/server-key.pem and
// DIR/reviewer-key.pem. Every receipt is sealed and signed for real.
package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// The sellers of the benchmark: A settles, B never does.
const (
	SellerA = "0x209693bc6afc0c5328ba36faf03c514ef312287c"
	SellerB = "0xb0b0000000000000000000000000000000000002"
)

func main() {
	dir := flag.String("dir", "", "where to build (must not exist)")
	reviews := flag.Int("reviews", 100_000, "reviews in the log (half of them decided)")
	receipts := flag.Int("receipts", 1_000_000, "receipts in the chains in all")
	chains := flag.Int("chains", 4, "server chains the plain answers are spread over (built in parallel)")
	flag.Parse()
	if *dir == "" || *reviews < 10 || *receipts < 2**reviews || *chains < 1 {
		fmt.Fprintln(os.Stderr, "growthgen: -dir is required; -reviews ≥ 10; -receipts ≥ 2×reviews; -chains ≥ 1")
		os.Exit(2)
	}
	if err := build(*dir, *reviews, *receipts, *chains); err != nil {
		fmt.Fprintln(os.Stderr, "growthgen:", err)
		os.Exit(1)
	}
}

func build(dir string, nReviews, nReceipts, nChains int) error {
	start := time.Now()
	root := filepath.Join(dir, ".trace")
	if err := os.MkdirAll(filepath.Join(root, "guard", "receipts"), 0o700); err != nil {
		return err
	}
	rec, err := simrec.New(root, "run-1", time.Now().Add(-time.Hour))
	if err != nil {
		return err
	}
	if err := rec.PayAll([]simrec.Payment{
		{OperationID: "op-a", URL: "https://a.example.com/x", PayTo: SellerA, Amount: "100000", Outcome: "settled"},
		{OperationID: "op-b", URL: "https://b.example.net/x", PayTo: SellerB, Amount: "100000", Outcome: "unsettled"},
	}); err != nil {
		return err
	}
	serverKey, _, err := noa.LoadOrCreateKeyFile(filepath.Join(dir, "server-key.pem"))
	if err != nil {
		return err
	}
	reviewerKey, _, err := noa.LoadOrCreateKeyFile(filepath.Join(dir, "reviewer-key.pem"))
	if err != nil {
		return err
	}
	if _, err := reviewlog.AddReviewer(filepath.Join(dir, "reviewers.json"), "alice", reviewerKey.Public().(ed25519.PublicKey)); err != nil {
		return err
	}
	paramsKey := engine.ParamsKeyFrom(serverKey.Seed())
	server := noa.NewKeySigner(serverKey)
	reviewer := noa.NewKeySigner(reviewerKey)
	keyring := noa.Keyring{}
	keyring.Add(server.KeyID(), server.PublicKey())
	keyring.Add(reviewer.KeyID(), reviewer.PublicKey())
	kj, err := keyring.JSON()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "guard", "keyring.json"), kj, 0o600); err != nil {
		return err
	}
	// As a server records the policy it runs with: the built-in defaults.
	pj, err := json.Marshal(reviewlog.PolicyRecord{Source: "built-in defaults", At: time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "guard", reviewlog.PolicyFile), pj, 0o644); err != nil {
		return err
	}

	// The reviews: opened long ago (so they have expired), half decided.
	logf, err := os.OpenFile(filepath.Join(root, "guard", "decisions.ndjson"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	lw := bufio.NewWriterSize(logf, 1<<20)
	type review struct {
		id, at, decidedAt string
		paramsHash        string
		approved, decided bool
	}
	revs := make([]review, nReviews)
	base := time.Now().Add(-365 * 24 * time.Hour)
	for i := range revs {
		id, err := uuid()
		if err != nil {
			return err
		}
		q := guard.Question{Counterparty: SellerB, Amount: guard.FormatAmount(big.NewInt(int64(i+1)), 6), Asset: guard.USDCBase, Template: guard.DefaultTemplate}
		ph, err := engine.ParamsHash(paramsKey, q)
		if err != nil {
			return err
		}
		at := base.Add(time.Duration(i) * 300 * time.Millisecond)
		r := review{id: id, at: stamp(at), paramsHash: ph, decided: i%2 == 0, approved: i%4 == 0}
		line := map[string]any{"type": "opened", "review_id": id, "at": r.at, "counterparty": q.Counterparty, "amount": q.Amount,
			"asset": q.Asset, "template": q.Template, "caller": fmt.Sprintf("agent-%d", i%1000), "params_hash": ph,
			"reasons": []guard.Reason{{Rule: "open_partial", Detail: "1 partial operation where the payment stage closed and the outcome was not confirmed",
				Evidence: []guard.Ref{{RunID: "run-1", OperationID: "op-b"}}}, {Rule: "history", Detail: "read 2 operations in 1 run"}}}
		if err := writeJSON(lw, line); err != nil {
			return err
		}
		if r.decided {
			r.decidedAt = stamp(at.Add(time.Minute))
			status := "rejected"
			if r.approved {
				status = "approved"
			}
			if err := writeJSON(lw, map[string]any{"type": "decided", "review_id": id, "at": r.decidedAt, "status": status, "by": "alice", "note": "benchmark"}); err != nil {
				return err
			}
		}
		revs[i] = r
	}
	if err := lw.Flush(); err != nil {
		return err
	}
	if err := logf.Close(); err != nil {
		return err
	}

	// The chains, built in parallel: the reviewer's (one HUMAN receipt per
	// decided review), one server chain with the DEFERRED receipt of every
	// review, and further server chains of plain answers up to nReceipts.
	decided := nReviews / 2
	plain := nReceipts - nReviews - decided
	var wg sync.WaitGroup
	errs := make(chan error, nChains+2)
	run := func(f func() error) {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- f() }()
	}
	run(func() error {
		return writeChain(root, reviewer, "decisions-"+reviewer.KeyID(), decided, func(i int) noa.Draft {
			r := revs[2*i]
			verdict := noa.VerdictBlocked
			if r.approved {
				verdict = noa.VerdictAllowed
			}
			at, _ := time.Parse(time.RFC3339Nano, r.decidedAt)
			rule := reviewlog.RuleHumanReview
			return noa.Draft{TS: at, Agent: noa.Agent{ID: "alice", Principal: noa.PrincipalHuman},
				Action:     noa.Action{ID: reviewlog.ActionID(r.id), Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: r.paramsHash},
				Governance: noa.Governance{Mode: "approvals_on", Verdict: verdict, RuleID: &rule, Approval: &noa.Approval{By: "alice", At: noa.FormatTS(at)}}}
		})
	})
	// Every server chain is signed by the one server key, so their ids
	// must differ: the first is the server's own, the rest are older
	// segments of its history.
	serverChain := "decisions-" + server.KeyID()
	run(func() error {
		return writeChain(root, server, serverChain, nReviews, func(i int) noa.Draft {
			r := revs[i]
			at, _ := time.Parse(time.RFC3339Nano, r.at)
			rule := "open_partial"
			return noa.Draft{TS: at, Agent: noa.Agent{ID: fmt.Sprintf("agent-%d", i%1000), Principal: noa.PrincipalService},
				Action:     noa.Action{ID: reviewlog.ActionID(r.id), Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: r.paramsHash},
				Governance: noa.Governance{Mode: "approvals_on", Verdict: noa.VerdictDeferred, RuleID: &rule}}
		})
	})
	per := plain / nChains
	for c := 0; c < nChains; c++ {
		n := per
		if c == nChains-1 {
			n = plain - per*(nChains-1)
		}
		id := fmt.Sprintf("history-%d-%s", c, server.KeyID())
		run(func() error {
			return writeChain(root, server, id, n, func(i int) noa.Draft {
				at := base.Add(time.Duration(i) * 30 * time.Millisecond)
				return noa.Draft{TS: at, Agent: noa.Agent{ID: fmt.Sprintf("agent-%d", i%1000), Principal: noa.PrincipalService},
					Action:     noa.Action{ID: fmt.Sprintf("check:%024x", i), Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: revs[i%nReviews].paramsHash},
					Governance: noa.Governance{Mode: "approvals_on", Verdict: noa.VerdictAllowed}}
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	fmt.Printf("growthgen: %d reviews, %d receipts under %s in %s\n", nReviews, nReceipts, root, time.Since(start).Round(time.Second))
	return nil
}

func writeChain(root string, s noa.Signer, chain string, n int, draft func(i int) noa.Draft) error {
	f, err := os.OpenFile(filepath.Join(root, "guard", "receipts", chain+".ndjson"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var prev *noa.Receipt
	for i := 0; i < n; i++ {
		d := draft(i)
		d.Chain, d.Tenant = chain, "haia-trace-mcp"
		r, line, err := noa.Seal(context.Background(), d, prev, s)
		if err != nil {
			f.Close()
			return fmt.Errorf("chain %s, receipt %d: %w", chain, i, err)
		}
		prev = &r
		if _, err := w.Write(line); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeJSON(w *bufio.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Write(b)
	return w.WriteByte('\n')
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func uuid() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
