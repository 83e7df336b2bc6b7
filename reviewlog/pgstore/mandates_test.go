package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

// The mandate records are appended in order (an append after fewer
// records than the store holds is refused), and store import and export
// copy them line for line.
func TestMandateRecordsAppendAndCopy(t *testing.T) {
	lines := [][]byte{[]byte(`{"first":1}`), []byte(`{"second":2}`)}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	src := filestore.New(root)
	ctx := t.Context()
	appendAll := func(s reviewlog.Store) {
		t.Helper()
		for i, l := range lines {
			if err := s.Locked(ctx, 5*time.Second, func(w reviewlog.Writer) error { return w.AppendMandate(ctx, i, l) }); err != nil {
				t.Fatal(err)
			}
		}
		err := s.Locked(ctx, 5*time.Second, func(w reviewlog.Writer) error { return w.AppendMandate(ctx, 1, []byte(`{"late":1}`)) })
		if !errors.Is(err, reviewlog.ErrMandateTaken) {
			t.Fatalf("%s: an append after fewer records than held: %v, want ErrMandateTaken", s.Describe(), err)
		}
	}
	read := func(s reviewlog.Store) [][]byte {
		t.Helper()
		var got [][]byte
		if err := s.View(ctx, func(r reviewlog.Reader) error {
			var err error
			got, err = r.Mandates(ctx)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	same := func(what string, got [][]byte) {
		t.Helper()
		if len(got) != len(lines) || !bytes.Equal(got[0], lines[0]) || !bytes.Equal(got[1], lines[1]) {
			t.Fatalf("%s: %q, want %q", what, got, lines)
		}
	}
	appendAll(src)
	same("files", read(src))
	pgDB := open(t, freshStore(t, true))
	defer pgDB.Close()
	rep, err := reviewlog.CopyStore(ctx, src, pgDB)
	if err != nil || rep.Mandates != 2 {
		t.Fatalf("import: %+v %v", rep, err)
	}
	same("imported", read(pgDB))
	other := open(t, freshStore(t, true))
	defer other.Close()
	appendAll(other)
	out := t.TempDir()
	if err := os.MkdirAll(filepath.Join(out, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	outRoot, err := confined.OpenRoot(out)
	if err != nil {
		t.Fatal(err)
	}
	defer outRoot.Close()
	dst := filestore.New(outRoot)
	if _, err := reviewlog.CopyStore(context.Background(), other, dst); err != nil {
		t.Fatal(err)
	}
	same("exported", read(dst))
}
