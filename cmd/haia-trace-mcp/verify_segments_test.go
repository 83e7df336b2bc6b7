package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// segmentedRoot is a Trace root whose decision chain has been split into
// segments, with the key file that signed it.
type segmentedRoot struct {
	root, key, keyring string
	chain              string // the chain id
	seg                func(k int) string
}

// newSegmentedRoot appends decisions receipts, segment receipts a segment.
func newSegmentedRoot(t *testing.T, decisions, segment int) segmentedRoot {
	t.Helper()
	dir := t.TempDir()
	rootDir := filepath.Join(dir, "root")
	keyPath := filepath.Join(dir, "signing-key.pem")
	key, _, err := noa.LoadOrCreateKeyFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(rootDir, "events"), 0o700); err != nil {
		t.Fatal(err)
	}
	root, err := confined.OpenRoot(rootDir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	store := filestore.New(root)
	c := &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "ops", SegmentReceipts: segment}
	t0 := time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)
	for i := range decisions {
		d := noa.Draft{
			TS:    t0.Add(time.Duration(i) * time.Second),
			Agent: noa.Agent{ID: "agent-buyer", Principal: noa.PrincipalService},
			Action: noa.Action{
				ID: "x402.pay", Canonical: "payment.x402", RiskClass: "IRREVERSIBLE",
				ParamsHash: "hmac-sha256:" + strings.Repeat("cd", 32),
			},
			Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictAllowed},
		}
		err := store.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
			_, err := c.Append(context.Background(), w, d)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	receipts := filepath.Join(rootDir, reviewlog.DirName, reviewlog.ReceiptsDir)
	id := c.ChainID()
	return segmentedRoot{
		root: rootDir, key: keyPath, keyring: filepath.Join(rootDir, reviewlog.DirName, reviewlog.KeyringFile),
		chain: id,
		seg:   func(k int) string { return filepath.Join(receipts, reviewlog.SegmentFile(id, k)) },
	}
}

func runChainArgs(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"chain"}, args...), strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

func TestVerifyFollowSegments(t *testing.T) {
	// 7 decisions, 3 receipts a segment: 3, then a continuation and 2, twice.
	sr := newSegmentedRoot(t, 7, 3)
	cpOut, errOut, code := runChainArgs(t, "checkpoint", sr.chain, "--dir", sr.root, "--key-file", sr.key)
	if code != 0 {
		t.Fatalf("chain checkpoint: %d %s", code, errOut)
	}
	cp := filepath.Join(t.TempDir(), "cp.json")
	if err := os.WriteFile(cp, []byte(cpOut), 0o600); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cpOut, `"chain":"`+sr.chain+`.2"`) {
		t.Fatalf("the checkpoint is not for the last segment: %s", cpOut)
	}

	cases := []struct {
		name   string
		args   []string
		code   int
		out    string
		stderr string
	}{
		{"follow from segment 0", []string{sr.seg(0), "--keyring", sr.keyring, "--follow"}, 0, "VALID: 9 receipts in 3 segments", ""},
		{"follow from the last segment", []string{sr.seg(2), sr.keyring, "--follow"}, 0, "VALID: 9 receipts in 3 segments", ""},
		{"follow with the tail checkpoint", []string{"--follow", sr.seg(0), "--keyring", sr.keyring, "--checkpoint", cp}, 0, "VALID: 9 receipts in 3 segments", ""},
		{"one segment alone", []string{sr.seg(1), "--keyring", sr.keyring}, 0, "VALID: 3 receipts", "--follow verifies them all"},
		{"follow without a keyring", []string{sr.seg(0), "--follow"}, 1, "UNVERIFIED: 9 receipts in 3 segments", "no keyring"},
		{"follow, checkpoint of the tail against segment 0 alone", []string{sr.seg(0), "--keyring", sr.keyring, "--checkpoint", cp}, 2, "TAMPERED: checkpoint is for chain", ""},
		{"follow, not a chain file name", []string{sr.keyring, "--follow"}, 4, "", "not a chain file name"},
		{"follow, missing file", []string{sr.seg(7), "--follow"}, 4, "", "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := runVerifyArgs(t, c.args...)
			if code != c.code || !strings.HasPrefix(out, c.out) || !strings.Contains(errOut, c.stderr) {
				t.Fatalf("exit %d stdout %q stderr %q; want exit %d, stdout starting %q, stderr with %q", code, out, errOut, c.code, c.out, c.stderr)
			}
		})
	}

	t.Run("a segment cut from the middle", func(t *testing.T) {
		sr := newSegmentedRoot(t, 7, 3)
		if err := os.Remove(sr.seg(1)); err != nil {
			t.Fatal(err)
		}
		out, _, code := runVerifyArgs(t, sr.seg(0), "--keyring", sr.keyring, "--follow")
		if code != 2 || !strings.Contains(out, "segment 1") || !strings.Contains(out, "missing") {
			t.Fatalf("exit %d %q", code, out)
		}
	})
	t.Run("the tail of segment 0 cut", func(t *testing.T) {
		sr := newSegmentedRoot(t, 7, 3)
		data, err := os.ReadFile(sr.seg(0))
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.LastIndexByte(data[:len(data)-1], '\n')
		os.WriteFile(sr.seg(0), data[:i+1], 0o600)
		out, _, code := runVerifyArgs(t, sr.seg(0), "--keyring", sr.keyring, "--follow")
		if code != 2 || !strings.Contains(out, "segment 1") || !strings.Contains(out, "links to head") {
			t.Fatalf("exit %d %q", code, out)
		}
	})
}

func TestChainCommandsOnSegments(t *testing.T) {
	sr := newSegmentedRoot(t, 7, 3)
	out, errOut, code := runChainArgs(t, "list", "--dir", sr.root)
	if code != 0 {
		t.Fatalf("chain list: %d %s", code, errOut)
	}
	f := strings.Split(strings.TrimSuffix(out, "\n"), "\t")
	if strings.Count(out, "\n") != 1 || len(f) != 5 || f[0] != sr.chain || f[2] != "9" || f[4] != "3" {
		t.Fatalf("chain list: %q", out)
	}
	listed := f[1]

	// Every way of naming segment 0 exports it; a segment id exports that one.
	for _, arg := range []string{sr.chain, sr.chain + ".ndjson", listed} {
		out, errOut, code := runChainArgs(t, "export", arg, "--dir", sr.root)
		if code != 0 {
			t.Fatalf("chain export %s: %d %s", arg, code, errOut)
		}
		rs, err := noa.ReadChain(strings.NewReader(out))
		if err != nil || len(rs) != 3 || rs[0].Scope.Chain != sr.chain {
			t.Fatalf("chain export %s: %d receipts, %v", arg, len(rs), err)
		}
	}
	out, _, code = runChainArgs(t, "export", sr.chain+".2", "--dir", sr.root)
	arr := filepath.Join(t.TempDir(), "seg2.json")
	os.WriteFile(arr, []byte(out), 0o600)
	if vout, _, vcode := runVerifyArgs(t, arr, sr.keyring); code != 0 || vcode != 0 || !strings.HasPrefix(vout, "VALID: 3 receipts") {
		t.Fatalf("export of segment 2 (exit %d) verifies as %q (exit %d)", code, vout, vcode)
	}

	outDir := t.TempDir()
	out, errOut, code = runChainArgs(t, "export", listed, "--all", "--out", outDir, "--dir", sr.root)
	if code != 0 || strings.Count(out, "\n") != 3 {
		t.Fatalf("chain export --all: %d %q %s", code, out, errOut)
	}
	for _, p := range strings.Fields(out) {
		if vout, _, vcode := runVerifyArgs(t, p, sr.keyring); vcode != 0 {
			t.Errorf("%s: %s", p, vout)
		}
	}

	for _, bad := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"export", "nope", "--dir", sr.root}, 1, `no chain "nope"`},
		{[]string{"export", filepath.Join(t.TempDir(), sr.chain+".ndjson"), "--dir", sr.root}, 2, "not a chain file of this Trace root"},
		{[]string{"export", sr.chain, "--all", "--dir", sr.root}, 2, "--all and --out"},
		{[]string{"export", "..", "--dir", sr.root}, 2, "not a chain id"},
	} {
		_, errOut, code := runChainArgs(t, bad.args...)
		if code != bad.code || !strings.Contains(errOut, bad.msg) {
			t.Errorf("chain %v: exit %d %q; want %d with %q", bad.args, code, errOut, bad.code, bad.msg)
		}
	}
}
