package reviewlog_test

import (
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/storetest"
)

// The file store keeps the store contract: each handle is its own
// FileStore on the same Trace root, as separate processes are.
func TestFileStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (reviewlog.Store, func() reviewlog.Store) {
		dir := t.TempDir()
		open := func() reviewlog.Store {
			root, err := confined.OpenRoot(dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { root.Close() })
			return reviewlog.NewFileStore(root)
		}
		return open(), open
	})
}
