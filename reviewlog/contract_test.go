package reviewlog_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/storetest"
)

// The file store keeps the store contract: each handle is its own
// FileStore on the same Trace root, as separate processes are.
func TestFileStoreContract(t *testing.T) { storetest.Run(t, fileStores) }

// BenchmarkFileStoreAsk: go test -bench FileStoreAsk ./reviewlog/
func BenchmarkFileStoreAsk(b *testing.B) { storetest.Bench(b, fileStores, 1) }

func fileStores(t testing.TB) (reviewlog.Store, func() reviewlog.Store, storetest.Tamperer) {
	dir := t.TempDir()
	open := func() reviewlog.Store {
		root, err := confined.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { root.Close() })
		return reviewlog.NewFileStore(root)
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
