package noa

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/noa from the current sealer")

// goldenDir holds this product's own frozen chain: a test key derived from
// a public phrase (never use it for anything real), fixed ids and times.
// Ed25519 signing is deterministic, so the bytes pin the producer: a
// change in canonicalization, hashing or layout shows up here.
var goldenDir = filepath.Join("..", "..", "testdata", "noa")

func goldenSigner() *KeySigner {
	seed := sha256.Sum256([]byte("haia-trace-mcp public TEST key: never use for real receipts"))
	return NewKeySigner(ed25519.NewKeyFromSeed(seed[:]))
}

func goldenFiles(t *testing.T) map[string][]byte {
	t.Helper()
	s := goldenSigner()
	ctx := context.Background()
	var rs []Receipt
	var chain []byte
	var prev *Receipt
	for i := range 3 {
		d := testDraft(i)
		d.ID = "rcpt_golden_" + string(rune('0'+i))
		if i == 2 {
			d.Governance.Compliance = &Compliance{
				PolicyHash:  "sha256:" + zeroHex,
				ReadSetHash: "sha256:" + zeroHex[:63] + "1",
				InputsHash:  "sha256:" + zeroHex[:63] + "2",
				Verdict:     "ALLOW",
			}
			model := "vendor/model-\u00e9\U0001F600"
			d.Agent.Model = &model
		}
		r, line, err := Seal(ctx, d, prev, s)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
		chain = append(chain, line...)
		prev = &rs[len(rs)-1]
	}
	_, cp, err := NewCheckpoint(ctx, rs[2], t0.Add(time.Hour), s)
	if err != nil {
		t.Fatal(err)
	}
	arr, err := ExportArray(rs)
	if err != nil {
		t.Fatal(err)
	}
	kr := Keyring{}
	kr.Add(s.KeyID(), s.PublicKey())
	krb, err := kr.JSON()
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"chain.ndjson":    chain,
		"chain.json":      arr,
		"checkpoint.json": cp,
		"keyring.json":    append(krb, '\n'),
	}
}

func TestGoldenChain(t *testing.T) {
	files := goldenFiles(t)
	for name, want := range files {
		path := filepath.Join(goldenDir, name)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./reviewlog/noa -run TestGoldenChain -update to create it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the sealer's bytes changed:\n got %s\nwant %s", name, want, got)
		}
	}
	// Both forms verify, with the checkpoint, as one chain.
	for _, form := range []string{"chain.ndjson", "chain.json"} {
		res := VerifyDocuments(Documents{
			Chain:      bytes.NewReader(files[form]),
			Keyring:    files["keyring.json"],
			Checkpoint: files["checkpoint.json"],
		})
		if res.Verdict != Valid || !res.TailChecked || res.Count != 3 {
			t.Errorf("%s: %s", form, res.Line())
		}
	}
}
