package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// MandatesFile keeps the mandate records under guard/, one line each.
const MandatesFile = "mandates.ndjson"

// maxMandates bounds the file read whole.
const maxMandates = 64 << 20

// Mandates reads guard/mandates.ndjson's whole lines.
func (r *fileReader) Mandates(ctx context.Context) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r.g == nil {
		return nil, nil
	}
	f, err := r.g.Open(MandatesFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the mandate records %s: %w", r.Locate(MandatesFile), err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMandates+1))
	if err != nil {
		return nil, fmt.Errorf("read the mandate records %s: %w", r.Locate(MandatesFile), err)
	}
	if len(data) > maxMandates {
		return nil, fmt.Errorf("the mandate records %s are more than %d bytes", r.Locate(MandatesFile), maxMandates)
	}
	return splitLines(data), nil
}

// splitLines is data's whole lines (a torn tail left out).
func splitLines(data []byte) [][]byte {
	var out [][]byte
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return out
		}
		out = append(out, data[:i:i])
		data = data[i+1:]
	}
}

// AppendMandate appends line after the n records read, cutting a torn
// tail off first, and syncs it.
func (w *fileWriter) AppendMandate(ctx context.Context, n int, line []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if bytes.IndexByte(line, '\n') >= 0 {
		return fmt.Errorf("%w: a mandate record is one line", reviewlog.ErrBadInput)
	}
	if err := w.syncPending(); err != nil {
		return err
	}
	f, err := w.g.OpenFile(MandatesFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open the mandate records: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMandates+1))
	if err != nil {
		return fmt.Errorf("read the mandate records: %w", err)
	}
	whole := bytes.LastIndexByte(data, '\n') + 1
	if got := len(splitLines(data)); got != n {
		return fmt.Errorf("%w (%d records, %d read)", reviewlog.ErrMandateTaken, got, n)
	}
	if err := f.Truncate(int64(whole)); err != nil {
		return fmt.Errorf("drop the mandate records' torn tail: %w", err)
	}
	if _, err := f.WriteAt(append(append([]byte(nil), line...), '\n'), int64(whole)); err != nil {
		_ = f.Truncate(int64(whole))
		return fmt.Errorf("append to the mandate records %s: %w", w.Locate(MandatesFile), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync the mandate records %s: %w", w.Locate(MandatesFile), err)
	}
	return nil
}
