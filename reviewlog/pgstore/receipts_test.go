package pgstore_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// receiptRow is a row of receipt_rows, every column as text.
type receiptRow [15]string

const receiptRowCols = `stream, off::text, seq::text, receipt_id, action_id, agent_id, principal, verdict, COALESCE(rule_id, '-'), params_hash, canonical,
	COALESCE(to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '-'), COALESCE(credential, '-'), COALESCE(reserves, '-'), rcount::text`

func receiptRows(t *testing.T, conn *pgx.Conn) []receiptRow {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT `+receiptRowCols+` FROM receipt_rows ORDER BY receipt_rows.stream, receipt_rows.off`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (receiptRow, error) {
		var x receiptRow
		ptrs := make([]any, len(x))
		for i := range x {
			ptrs[i] = &x[i]
		}
		return x, r.Scan(ptrs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// wantReceiptRows is what the rows of the receipts stored must be, read
// from the lines by reviewlog's own parser.
func wantReceiptRows(t *testing.T, conn *pgx.Conn) []receiptRow {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT stream, off, line FROM receipts ORDER BY stream, off`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []receiptRow
	counts := map[string]int{}
	for rows.Next() {
		var stream string
		var off int64
		var line []byte
		if err := rows.Scan(&stream, &off, &line); err != nil {
			t.Fatal(err)
		}
		rc, err := noa.ParseReceipt(bytes.TrimRight(line, "\n"))
		if err != nil {
			t.Fatal(err)
		}
		opt := func(s string) string {
			if s == "" {
				return "-"
			}
			return s
		}
		rule := "-"
		if rc.Governance.RuleID != nil {
			rule = *rc.Governance.RuleID
		}
		ts, err := time.Parse(time.RFC3339Nano, rc.TS)
		if err != nil {
			t.Fatal(err)
		}
		reserves := reviewlog.ReservesOf(&rc)
		if reserves != "" {
			counts[stream]++
		}
		out = append(out, receiptRow{stream, fmt.Sprint(off), fmt.Sprint(rc.Chain.Seq), rc.ID, rc.Action.ID, rc.Agent.ID, rc.Agent.Principal,
			rc.Governance.Verdict, rule, rc.Action.ParamsHash, rc.Action.Canonical, ts.UTC().Format("2006-01-02T15:04:05.000000"),
			opt(reviewlog.PasskeyCredential(&rc)), opt(reserves), fmt.Sprint(counts[stream])})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// passkeyModel is an agent.model that carries an assertion by credential.
func passkeyModel(credential string) *string {
	a := `{"credential_id":"` + credential + `","authenticator_data":"AA","client_data_json":"AA","signature":"AA"}`
	m := "webauthn-assertion:" + base64.RawURLEncoding.EncodeToString([]byte(a))
	return &m
}

// fillChains appends, through the store, receipts of every kind a
// decision looks up, across segments of three receipts (so continuations
// too), a caller's name escaped as JSON may carry it included.
func fillChains(t *testing.T, st *pgstore.Store) {
	t.Helper()
	var keys [2]ed25519.PrivateKey
	for i := range keys {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	service := &reviewlog.Chains{Signer: noa.NewKeySigner(keys[0]), SegmentReceipts: 3, Tenant: "acme"}
	human := &reviewlog.Chains{Signer: noa.NewKeySigner(keys[1])}
	terms, approved := reviewlog.RuleReviewTerms, reviewlog.RuleHumanApproved
	ph := "hmac-sha256:" + strings.Repeat("ab", 32)
	at := time.Date(2026, 12, 1, 9, 0, 0, 123_000_000, time.UTC)
	for i, d := range []struct {
		c     *reviewlog.Chains
		draft noa.Draft
	}{
		{service, noa.Draft{Agent: noa.Agent{ID: "b\u00f8t", Principal: noa.PrincipalService}, Action: noa.Action{ID: "x402.pay", Canonical: "x402.payment", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictAllowed}}},
		{service, noa.Draft{Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService}, Action: noa.Action{ID: "review:r1", Canonical: "x402.payment", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictDeferred, RuleID: &terms}}},
		{human, noa.Draft{Agent: noa.Agent{ID: "alice", Principal: noa.PrincipalHuman, Model: passkeyModel("cred-1")}, Action: noa.Action{ID: "review:r1", Canonical: "x402.payment", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictAllowed, Approval: &noa.Approval{By: "alice", At: noa.FormatTS(at)}}}},
		{service, noa.Draft{Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService}, Action: noa.Action{ID: "review:r1", Canonical: "x402.payment", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictAllowed, RuleID: &approved}}},
		{service, noa.Draft{Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService}, Action: noa.Action{ID: "x402.pay", Canonical: "x402.authorization", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictAllowed}}},
		{service, noa.Draft{Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService}, Action: noa.Action{ID: "x402.pay", Canonical: "x402.payment", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictBlocked}}},
		{service, noa.Draft{Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService}, Action: noa.Action{ID: "x402.pay", Canonical: "x402.payment", ParamsHash: ph}, Governance: noa.Governance{Verdict: noa.VerdictAllowed}}},
	} {
		d.draft.TS = at.Add(time.Duration(i) * time.Second)
		d.draft.Action.RiskClass, d.draft.Governance.Mode = "IRREVERSIBLE", "on"
		// Receipts as a build before the spend ledger signed them: a copy
		// (commitment_in_ledger lets a copy bring them without entries).
		if err := st.Locked(reviewlog.Bulk(t.Context()), time.Second, func(w reviewlog.Writer) error {
			_, err := d.c.Append(t.Context(), w, d.draft)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// A receipt that commits a payment commits only with its entry in the
// spend ledger: a build older than the ledger, which writes none, has its
// allow refused at commit, nothing written; with the entry it commits.
func TestCommitmentNeedsItsLedgerEntry(t *testing.T) {
	st := open(t, freshStore(t, true))
	defer st.Close()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	c := &reviewlog.Chains{Signer: noa.NewKeySigner(key)}
	draft := noa.Draft{ID: "rcpt_allow1", TS: time.Now(), Agent: noa.Agent{ID: "bot", Principal: noa.PrincipalService},
		Action:     noa.Action{ID: "check:1", Canonical: "x402.payment", RiskClass: "IRREVERSIBLE", ParamsHash: "hmac-sha256:" + strings.Repeat("ab", 32)},
		Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictAllowed}}
	err := st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
		_, err := c.Append(t.Context(), w, draft)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "without its entry in the spend ledger") {
		t.Fatalf("an allow without its ledger entry: %v, want refused at commit", err)
	}
	err = st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
		e := ledger.Entry{Kind: ledger.KindHold, At: ledger.FormatTime(time.Now()), Until: ledger.FormatTime(time.Now().Add(time.Hour)), Receipt: "rcpt_allow1",
			Caller: "bot", PayTo: "0xabc", Atomic: "1", Asset: "usdc"}
		line, err := e.Seal([]byte("k"))
		if err != nil {
			return err
		}
		if err := w.LedgerAppender().Append(t.Context(), ledger.Pos{}, [][]byte{line}); err != nil {
			return err
		}
		_, err = c.Append(t.Context(), w, draft)
		return err
	})
	if err != nil {
		t.Fatalf("an allow with its ledger entry: %v", err)
	}
}

// Every receipt the store appends is a row of receipt_rows, written with
// it, saying what reviewlog's parser reads in its line; `store migrate`
// to schema 6 builds the same rows in SQL from the receipts a schema-5
// database holds; and a replica of schema 5 still answering on the
// migrated database has its receipt refused at commit.
func TestReceiptRowsFollowTheChains(t *testing.T) {
	dsn := freshStore(t, true)
	st := open(t, dsn)
	defer st.Close()
	fillChains(t, st)
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	want := wantReceiptRows(t, conn)
	if got := receiptRows(t, conn); len(want) < 9 || !slices.Equal(got, want) {
		t.Fatalf("rows written with the receipts:\n%q\nwant\n%q", got, want)
	}
	var holds, creds int
	for _, r := range want {
		if r[13] == reviewlog.ReservesHold {
			holds++
		}
		if r[12] == "cred-1" {
			creds++
		}
	}
	if holds != 1 || creds != 1 {
		t.Fatalf("%d holds and %d passkey receipts in the rows, want 1 each", holds, creds)
	}

	// What a decision looks up, by index: the lines of the rows.
	ph := "hmac-sha256:" + strings.Repeat("ab", 32)
	err = st.View(t.Context(), func(r reviewlog.Reader) error {
		idx := r.(reviewlog.ReceiptIndex)
		for _, q := range []struct {
			what string
			get  func() ([]reviewlog.IndexedReceipt, error)
			want []string // the agents, in order
		}{
			{"review:r1", func() ([]reviewlog.IndexedReceipt, error) { return idx.ActionReceipts(t.Context(), "review:r1") }, []string{"bot", "alice", "bot"}},
			{"question", func() ([]reviewlog.IndexedReceipt, error) { return idx.QuestionReceipts(t.Context(), "bot", ph) }, []string{"bot"}},
			{"another caller's question", func() ([]reviewlog.IndexedReceipt, error) { return idx.QuestionReceipts(t.Context(), "b\u00f8t", ph) }, nil},
			{"passkey", func() ([]reviewlog.IndexedReceipt, error) { return idx.CredentialReceipts(t.Context(), "cred-1") }, []string{"alice"}},
		} {
			got, err := q.get()
			if err != nil {
				return err
			}
			var agents []string
			for _, g := range got {
				rc, err := noa.ParseReceipt(bytes.TrimRight(g.Line, "\n"))
				if err != nil {
					return fmt.Errorf("%s: %w", q.what, err)
				}
				agents = append(agents, rc.Agent.ID)
			}
			if !slices.Equal(agents, q.want) {
				t.Errorf("%s: %q, want %q", q.what, agents, q.want)
			}
		}
		rr, err := idx.ReservingReceipts(t.Context(), time.Date(2026, 12, 1, 9, 0, 2, 0, time.UTC), nil, nil)
		if err != nil {
			return err
		}
		var ids []string
		for _, g := range rr.Rows {
			ids = append(ids, g.Segment+":"+fmt.Sprint(g.Count))
		}
		// Segment 0: the allow of 09:00:00 is before the window, the use
		// after it; segment 1: its hold; segment 2: its allow.
		if len(rr.Segments) != 4 || len(rr.Rows) != 4 {
			t.Errorf("reserving receipts: %q in %d segments %+v", ids, len(rr.Segments), rr.Segments)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The same receipts in a database of schema 5, as its binary wrote
	// them (receipts alone), then migrated.
	old := freshStore(t, false)
	if err := pgstore.MigrateTo(t.Context(), old, 5); err != nil {
		t.Fatal(err)
	}
	oc, err := pgx.Connect(t.Context(), old)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close(context.Background())
	copyRows := func(table, cols string) {
		rows, err := conn.Query(t.Context(), "SELECT "+cols+" FROM "+table)
		if err != nil {
			t.Fatal(err)
		}
		vals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
		if err != nil {
			t.Fatal(err)
		}
		n := strings.Count(cols, ",") + 1
		ph := make([]string, n)
		for i := range ph {
			ph[i] = fmt.Sprintf("$%d", i+1)
		}
		for _, v := range vals {
			if _, err := oc.Exec(t.Context(), "INSERT INTO "+table+" ("+cols+") VALUES ("+strings.Join(ph, ", ")+")", v...); err != nil {
				t.Fatal(err)
			}
		}
	}
	copyRows("guard_streams", "name, size, generation")
	copyRows("receipts", "stream, off, seq, action_id, verdict, line")
	if _, _, err := pgstore.Migrate(t.Context(), old, nil); err != nil {
		t.Fatal(err)
	}
	if got := receiptRows(t, oc); !slices.Equal(got, want) {
		t.Fatalf("rows the migration built:\n%q\nwant\n%q", got, want)
	}

	// A schema-5 replica appends a receipt as it did: refused at commit.
	tx, err := oc.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var stream string
	var size int64
	if err := tx.QueryRow(t.Context(), `SELECT name, size FROM guard_streams WHERE starts_with(name, 'receipts/') ORDER BY name LIMIT 1`).Scan(&stream, &size); err != nil {
		t.Fatal(err)
	}
	line := []byte(`{"late":true}` + "\n")
	if _, err := tx.Exec(t.Context(), `UPDATE guard_streams SET size = size + $2 WHERE name = $1`, stream, len(line)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `INSERT INTO receipts (stream, off, seq, action_id, verdict, line) VALUES ($1, $2, 999, 'x402.pay', 'ALLOWED', $3)`, stream, size, line); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err == nil || !strings.Contains(err.Error(), "without its row in receipt_rows") {
		t.Fatalf("a receipt appended without its row: %v, want refused at commit", err)
	}
}
