package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// mandateLines reads the store's mandate records as a writer of its
// medium can (the file, the table).
func (f *fleet) mandateLines(t *testing.T) [][]byte {
	t.Helper()
	var lines [][]byte
	err := f.logs[0].Store().View(t.Context(), func(r reviewlog.Reader) error {
		var err error
		lines, err = r.Mandates(t.Context())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// writeMandateLines replaces the store's mandate records as a writer of
// its medium: on files the volume's writer, on PostgreSQL the table's
// owner, who turns the trigger that keeps the rows fixed off first.
func (f *fleet) writeMandateLines(t *testing.T, lines [][]byte) {
	t.Helper()
	if f.kind == fileKind {
		var data []byte
		for _, l := range lines {
			data = append(append(data, l...), '\n')
		}
		if err := os.WriteFile(filepath.Join(f.dir, reviewlog.DirName, filestore.MandatesFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The runtime role cannot: the trigger refuses the edit.
	if _, err := conn.Exec(ctx, `DELETE FROM mandate_records`); err == nil || !strings.Contains(err.Error(), "written once and never changed") {
		t.Fatalf("a delete with the trigger on: %v, want it refused", err)
	}
	for _, q := range []string{`ALTER TABLE mandate_records DISABLE TRIGGER mandate_records_fixed`, `DELETE FROM mandate_records`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for i, l := range lines {
		if _, err := conn.Exec(ctx, `INSERT INTO mandate_records (seq, line) VALUES ($1, $2)`, i, l); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE mandate_records ENABLE TRIGGER mandate_records_fixed`); err != nil {
		t.Fatal(err)
	}
}

// What a writer of the store (the volume; the table's owner with its
// trigger off) can do to the mandate records is seen: a record added
// under another's name, a grant's terms raised, a record removed, a
// revocation removed. Nothing is allowed under any mandate of the payee
// while the records do not verify, and audit's check says why.
func TestMandateRecordsTamperedWith(t *testing.T) {
	_, mallory, _ := ed25519.GenerateKey(rand.Reader)
	tests := []struct {
		name string
		// edit changes the records (alice's grant, then her second
		// grant revoked); fresh: the question is asked by a process that
		// starts after the edit (else by one that read the records before).
		edit  func(t *testing.T, f *fleet, lines [][]byte) [][]byte
		fresh bool
		want  string
	}{
		{name: "a grant added under alice's name with another key", fresh: true, want: "is not trusted: not signed by reviewer",
			edit: func(t *testing.T, f *fleet, lines [][]byte) [][]byte {
				g := grantTerms(f, "1000.00", "1000000.00", 0)
				id, _ := mandate.NewID()
				g.Kind, g.ID, g.Prev, g.Tenant, g.At, g.By, g.KID = mandate.KindGrant, id, mandate.Hash(lines[len(lines)-1]), DefaultTenant, mandate.FormatTime(f.clock()), "alice", noa.KeyID(f.reviewers["alice"])
				line, err := g.Sign(mallory)
				if err != nil {
					t.Fatal(err)
				}
				return append(lines, line)
			}},
		{name: "a grant's budget raised", fresh: true, want: "not signed by reviewer \"alice\"'s trusted key",
			edit: func(t *testing.T, f *fleet, lines [][]byte) [][]byte {
				lines[0] = bytes.Replace(lines[0], []byte(`"budget_atomic":"3000000"`), []byte(`"budget_atomic":"3000000000"`), 1)
				return lines
			}},
		{name: "a record removed from the middle", fresh: true, want: "does not link to the record before it",
			edit: func(t *testing.T, f *fleet, lines [][]byte) [][]byte { return append(lines[:1:1], lines[2:]...) }},
		{name: "the revocation removed from the end", fresh: false, want: "fewer than the 3 this process read before",
			edit: func(t *testing.T, f *fleet, lines [][]byte) [][]byte { return lines[:2] }},
	}
	for _, kind := range stores(t) {
		for _, tc := range tests {
			t.Run(string(kind)+"/"+tc.name, func(t *testing.T) {
				f, s := mandateFleet(t, kind, 1, mandatePolicy)
				m := mustGrant(t, s, grantTerms(f, "2.00", "3.00", 0))
				second := mustGrant(t, s, grantTerms(f, "2.00", "3.00", 0))
				if _, err := s.Revoke(t.Context(), second.ID); err != nil {
					t.Fatal(err)
				}
				q := Question{Counterparty: sellerA, Amount: "1.00"}
				if a, err := f.engines[0].Check(t.Context(), "bot", q); err != nil || a.Decision != guard.Allow || !has(a, RuleMandate) {
					t.Fatalf("before the edit: %v %+v", err, a)
				}
				f.writeMandateLines(t, tc.edit(t, f, f.mandateLines(t)))
				e := f.engines[0]
				if tc.fresh {
					e = f.fresh(t)
				}
				a, err := e.Check(t.Context(), "bot", q)
				if err != nil || a.Decision != guard.Review || has(a, RuleMandate) || !strings.Contains(reasonOf(a, guard.RuleReviewAbove), "the mandate records do not verify") {
					t.Fatalf("after the edit: %v %+v", err, a)
				}
				set, err := e.MandatesNow(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				found := strings.Join(set.Findings, "\n")
				if !strings.Contains(found, tc.want) {
					t.Fatalf("findings %q, want %q", found, tc.want)
				}
				// Audit's check of the uses reports the records.
				if out := mandate.Audit(set, nil); len(out) == 0 {
					t.Fatalf("audit found nothing")
				}
				// Nothing can be signed onto records that do not verify (a
				// removed tail is seen only by a process that read it).
				if _, err := s.Revoke(t.Context(), m.ID); tc.fresh && (err == nil || !strings.Contains(err.Error(), "do not verify")) {
					t.Fatalf("a revocation onto tampered records: %v", err)
				}
			})
		}
	}
}
