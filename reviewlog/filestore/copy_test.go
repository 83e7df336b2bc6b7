package filestore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// TestCopyRefusesAChainWhoseFirstReceiptCannotBeRead: a chain whose very
// first receipt is malformed verifies no receipt at all (a count of 0), and
// must be refused like a chain with a bad signature further on, not taken
// for an empty chain and copied. The e2e store import test found it when
// the byte it flips happened to fall in a member's name.
func TestCopyRefusesAChainWhoseFirstReceiptCannotBeRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func([]byte) []byte
	}{
		{"a member renamed in the first receipt", func(b []byte) []byte {
			return bytes.Replace(b, []byte(`"value":`), []byte(`"valud":`), 1)
		}},
		{"the first receipt cut in half", func(b []byte) []byte {
			nl := bytes.IndexByte(b, '\n')
			return append(append([]byte{}, b[:nl/2]...), b[nl:]...)
		}},
		{"a signature byte of the second receipt", func(b []byte) []byte {
			nl := bytes.IndexByte(b, '\n')
			i := bytes.Index(b[nl:], []byte(`"value":"`)) + nl + len(`"value":"`) + 3
			b[i] ^= 0x01
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sg := newSegGuard(t)
			c := &reviewlog.Chains{Signer: sg.s, SegmentReceipts: 100}
			sg.appendN(t, c, 0, 3)
			path := sg.file(c, 0)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tc.edit(data), 0o600); err != nil {
				t.Fatal(err)
			}
			src := New(sg.root)
			out := t.TempDir()
			root, err := confined.OpenRoot(out)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			dst := New(root)
			_, err = reviewlog.CopyStore(context.Background(), src, dst)
			if !errors.Is(err, reviewlog.ErrChainInvalid) {
				t.Fatalf("copy of a tampered chain: %v, want ErrChainInvalid", err)
			}
			if _, err := os.Stat(out + "/" + reviewlog.DirName + "/" + reviewlog.ReceiptsDir); err == nil {
				entries, _ := os.ReadDir(out + "/" + reviewlog.DirName + "/" + reviewlog.ReceiptsDir)
				if len(entries) > 0 {
					t.Fatalf("the refused copy wrote %d chain files", len(entries))
				}
			}
		})
	}
}
