package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAuthorizedLineWithoutItsReceipts: on the file store an authorization's
// log line is synced in the same wait as its two receipts, after its ledger
// entry is on disk, so a crash of the host in that wait can leave the line
// while the chain lost one or both receipts (what the kernel had not yet
// written). The test leaves that state by cutting the chain's end, as such a
// crash does. audit reports it as INCOMPLETE (exit 4), never as tampering;
// a fresh server still allows the next payment (the entry counts, nothing
// reads the line as signed); and a line naming receipts no chain holds that
// no ledger entry backs is a finding (exit 2).
func TestAuthorizedLineWithoutItsReceipts(t *testing.T) {
	payerKey := writeSecret(t, "payer.key", e2ePayerKey)
	for _, tc := range []struct {
		name string
		lost int // receipts lost from the chain's end
	}{
		{"both receipts lost", 2},
		{"the authorization's own receipt lost", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			key := filepath.Join(t.TempDir(), "key.pem")
			args := []string{"--dir", root, "--key-file", key, "--payer-key", payerKey}
			authorize := func(i int) authorizeAnswer {
				cs := mcpSession(t, &lockedBuffer{}, args...)
				defer cs.Close()
				var a authorizeAnswer
				decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{
					"payment_required": e2ePaymentRequiredAt(fmt.Sprintf("https://h%d.example/data", i), "10000", fmt.Sprintf("0x%040x", 0x2000+i))}), &a)
				if a.Decision != "allow" || a.Authorization == nil {
					t.Fatalf("authorization %d: %+v", i, a)
				}
				return a
			}
			authorize(1)
			last := authorize(2)
			// The host crashed in the last section's final wait: the
			// chain's end did not reach the disk, the log line did.
			chain, _ := chainFile(t, root)
			data, err := os.ReadFile(chain)
			if err != nil {
				t.Fatal(err)
			}
			lines := bytes.SplitAfter(data, []byte("\n"))
			lines = lines[:len(lines)-1] // the empty piece after the last newline
			if !bytes.Contains(lines[len(lines)-2], []byte(`"id":"`+last.ReceiptID+`"`)) || !bytes.Contains(lines[len(lines)-1], []byte(`"id":"`+last.Authorization.ReceiptID+`"`)) {
				t.Fatalf("the chain does not end with the last authorization's two receipts")
			}
			if err := os.WriteFile(chain, bytes.Join(lines[:len(lines)-tc.lost], nil), 0o600); err != nil {
				t.Fatal(err)
			}
			logPath := filepath.Join(root, "guard", "decisions.ndjson")
			if log, err := os.ReadFile(logPath); err != nil || !strings.Contains(string(log), `"receipt":"`+last.Authorization.ReceiptID+`"`) {
				t.Fatalf("the review log holds no line of the last authorization (%v)", err)
			}
			audit := func(want int) string {
				out, errOut, code := runCLI(t, "audit", "--dir", root, "--key-file", key)
				if code != want {
					t.Fatalf("audit: exit %d, want %d\n%s\n%s", code, want, out, errOut)
				}
				return out
			}
			out := audit(4)
			if !strings.Contains(out, "INCOMPLETE decisions.ndjson line") || !strings.Contains(out, last.Authorization.Nonce) || strings.Contains(out, "TAMPERED") {
				t.Fatalf("audit does not report the line as what a crash leaves:\n%s", out)
			}
			// The next server allows the next payment: the entry counts,
			// no finding answers every question review.
			authorize(3)
			out = audit(4)
			if !strings.Contains(out, last.Authorization.Nonce) {
				t.Fatalf("audit forgot the line once more was appended:\n%s", out)
			}
			// A line whose decision the ledger never committed, naming
			// receipts no chain holds: nobody's section wrote it.
			log, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			var orphan string
			for _, l := range strings.SplitAfter(string(log), "\n") {
				if strings.Contains(l, `"receipt":"`+last.Authorization.ReceiptID+`"`) {
					orphan = l
				}
			}
			forged := strings.ReplaceAll(strings.ReplaceAll(orphan, last.ReceiptID, "rcpt_00000000000000000000000000"), last.Authorization.ReceiptID, "rcpt_11111111111111111111111111")
			if err := os.WriteFile(logPath, append(log, forged...), 0o600); err != nil {
				t.Fatal(err)
			}
			out = audit(2)
			if !strings.Contains(out, "TAMPERED decisions.ndjson line") || !strings.Contains(out, "rcpt_00000000000000000000000000") {
				t.Fatalf("audit does not report the forged line:\n%s", out)
			}
		})
	}
}
