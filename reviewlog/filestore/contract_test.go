package filestore_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/storetest"
)

// The file store keeps the store contract: each handle is its own
// FileStore on the same Trace root, as separate processes are.
func TestFileStoreContract(t *testing.T) { storetest.Run(t, fileStores) }

// BenchmarkFileStoreAsk: go test -bench FileStoreAsk ./reviewlog/filestore/
func BenchmarkFileStoreAsk(b *testing.B) { storetest.Bench(b, fileStores, 1, false, nil) }

func fileStores(t testing.TB) (reviewlog.Store, func() reviewlog.Store, storetest.Tamperer) {
	dir := t.TempDir()
	open := func() reviewlog.Store {
		root, err := confined.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { root.Close() })
		return filestore.New(root)
	}
	return open(), open, volumeWriter(filepath.Join(dir, reviewlog.DirName, reviewlog.FileName))
}

// volumeWriter writes the review log file directly.
type volumeWriter string

func (v volumeWriter) AppendLogLine(t *testing.T, line []byte) {
	f, err := os.OpenFile(string(v), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
}

func (v volumeWriter) EmptyLog(t *testing.T) {
	if err := os.Truncate(string(v), 0); err != nil {
		t.Fatal(err)
	}
}

// EditLog rewrites the line in place, as a writer of the volume can: the
// file keeps its inode and its size.
func (v volumeWriter) EditLog(t *testing.T, reviewID, old, new string) {
	t.Helper()
	if len(old) != len(new) {
		t.Fatalf("EditLog keeps the size: %q and %q differ in length", old, new)
	}
	data, err := os.ReadFile(string(v))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	var off int64
	for _, line := range lines {
		if bytes.Contains(line, []byte(reviewID)) && bytes.Contains(line, []byte(old)) {
			f, err := os.OpenFile(string(v), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(bytes.ReplaceAll(line, []byte(old), []byte(new)), off); err != nil {
				t.Fatal(err)
			}
			return
		}
		off += int64(len(line))
	}
	t.Fatalf("no line of the log holds %s and %q", reviewID, old)
}
