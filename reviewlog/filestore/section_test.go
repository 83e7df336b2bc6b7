package filestore

import (
	"bytes"
	"context"
	"io"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		// Only Linux is bound to have it; there its absence is a failure.
		if runtime.GOOS == "linux" {
			t.Fatalf("/proc/self/fd cannot be read on Linux: %v", err)
		}
		t.Skipf("/proc/self/fd cannot be read on %s (it is Linux's): %v", runtime.GOOS, err)
	}
	return len(ents)
}

// readStream reads a stream whole, as of its size when opened.
func readStream(t *testing.T, s reviewlog.Stream) []byte {
	t.Helper()
	data := make([]byte, s.Size())
	if _, err := s.ReadAt(data, 0); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return data
}

// TestSectionReadsWhatItAppends: a section reads the ledger and a chain,
// appends to them, and reads them again through the descriptors it keeps
// (one a file): each read sees what the section appended, a chain's torn
// tail is still cut before its receipt, and no descriptor outlives the
// section — also past the number a section keeps, where each chain is
// opened and closed as before.
func TestSectionReadsWhatItAppends(t *testing.T) {
	ctx := context.Background()
	for _, chains := range []int{1, maxSectionFiles + 3} {
		t.Run(strconv.Itoa(chains)+" chains", func(t *testing.T) {
			sg := newSegGuard(t)
			s := New(sg.root)
			files := make([]string, chains)
			for i := range files {
				files[i] = reviewlog.SegmentFile("decisions-haia-"+strconv.FormatInt(0x0123456789abc000+int64(i), 16), 0)
			}
			// A torn tail on the first chain, which its append cuts.
			if err := os.MkdirAll(sg.path+"/"+reviewlog.ReceiptsDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(sg.path+"/"+reviewlog.ReceiptsDir+"/"+files[0], []byte(`{"torn`), 0o600); err != nil {
				t.Fatal(err)
			}
			before := openFDs(t)
			err := s.Locked(ctx, time.Second, func(w reviewlog.Writer) error {
				app := w.LedgerAppender()
				raws, err := w.Ledger().Since(ctx, nil)
				if err != nil || len(raws) != 0 {
					t.Fatalf("an empty ledger read %d entries (%v)", len(raws), err)
				}
				entry := []byte(`{"entry":0}`)
				if err := app.Append(ctx, ledger.Pos{Lane: 0}, [][]byte{entry}); err != nil {
					return err
				}
				raws, err = w.Ledger().Since(ctx, nil)
				if err != nil || len(raws) != 1 || !bytes.Equal(raws[0].Line, entry) {
					t.Fatalf("the section read %d entries back (%v), want its own one", len(raws), err)
				}
				for i, file := range files {
					receipt := []byte("{\"receipt\":" + strconv.Itoa(i) + "}\n")
					if err := w.AppendSegment(ctx, file, 0, receipt); err != nil {
						return err
					}
					st, err := w.Segment(ctx, file)
					if err != nil {
						return err
					}
					if got := readStream(t, st); !bytes.Equal(got, receipt) {
						t.Fatalf("chain %d read back %q in its section, want %q", i, got, receipt)
					}
					more := []byte("{\"more\":" + strconv.Itoa(i) + "}\n")
					if err := w.AppendSegment(ctx, file, int64(len(receipt)), more); err != nil {
						return err
					}
					st, err = w.Segment(ctx, file)
					if err != nil {
						return err
					}
					if got := readStream(t, st); !bytes.Equal(got, append(receipt, more...)) {
						t.Fatalf("chain %d read back %q after its second receipt", i, got)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if after := openFDs(t); after > before {
				t.Fatalf("%d descriptors open after the section, %d before", after, before)
			}
			for i, file := range files {
				data, err := os.ReadFile(sg.path + "/" + reviewlog.ReceiptsDir + "/" + file)
				want := "{\"receipt\":" + strconv.Itoa(i) + "}\n{\"more\":" + strconv.Itoa(i) + "}\n"
				if err != nil || string(data) != want {
					t.Fatalf("chain %d holds %q (%v), want %q", i, data, err, want)
				}
			}
		})
	}
}
