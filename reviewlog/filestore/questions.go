package filestore

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// KeepQuestion appends a decision's question to guard/questions.ndjson,
// inside the section's flock and after the decision's receipt, and syncs
// it once the section has ended, off the answer's path, within
// syncLaterEvery and with the questions of the other sections of that time
// (a copy's questions are synced before its section ends): a crash of the
// host may leave a receipt whose
// question is not kept (a replay counts it as such) or a question without
// its receipt, which a replay never trusts — a question is replayed only
// with its receipt. A question commits nothing, so no answer waits for its
// sync.
func (w *fileWriter) KeepQuestion(ctx context.Context, receipt string, line []byte) error {
	if bytes.IndexByte(line, '\n') >= 0 || len(line) == 0 || len(line) > reviewlog.MaxQuestionLine {
		return fmt.Errorf("the question of receipt %s is not one line of at most %d bytes", receipt, reviewlog.MaxQuestionLine)
	}
	f, err := w.g.OpenFile(reviewlog.QuestionsFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", w.Locate(reviewlog.QuestionsFile), err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	end := st.Size()
	if end > 0 {
		// A torn tail (a writer killed mid-line) is cut off: the line
		// appended now must start a line of its own. The last byte says
		// whether there is one; only then is the tail read.
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, end-1); err != nil {
			return fmt.Errorf("read the end of %s: %w", w.Locate(reviewlog.QuestionsFile), err)
		}
		if last[0] != '\n' {
			n := min(end, int64(reviewlog.MaxQuestionLine)+1)
			tail := make([]byte, n)
			if _, err := f.ReadAt(tail, end-n); err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("read the end of %s: %w", w.Locate(reviewlog.QuestionsFile), err)
			}
			end -= n - int64(bytes.LastIndexByte(tail, '\n')+1)
		}
	}
	buf := append(append(make([]byte, 0, len(line)+1), line...), '\n')
	if _, err := f.WriteAt(buf, end); err != nil {
		_ = f.Truncate(end)
		return fmt.Errorf("append to %s: %w", w.Locate(reviewlog.QuestionsFile), err)
	}
	if st.Size() > end+int64(len(buf)) {
		// What is left of a longer torn tail goes.
		if err := f.Truncate(end + int64(len(buf))); err != nil {
			return fmt.Errorf("append to %s: %w", w.Locate(reviewlog.QuestionsFile), err)
		}
	}
	keep = true
	if reviewlog.IsBulk(ctx) {
		w.deferSync(reviewlog.QuestionsFile, f, end, false)
	} else {
		w.syncAfter(reviewlog.QuestionsFile, f)
	}
	return nil
}

// Questions reads guard/questions.ndjson line by line (none when it is
// absent); a torn last line is not a question yet.
func (r *fileReader) Questions(ctx context.Context, fn func(line []byte) error) error {
	if r.g == nil {
		return nil
	}
	f, err := r.g.Open(reviewlog.QuestionsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", r.Locate(reviewlog.QuestionsFile), err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Longer than any question kept: read past it whole, and hand
			// it on for the reader to report.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", r.Locate(reviewlog.QuestionsFile), err)
		}
		if err := fn(line[:len(line)-1]); err != nil {
			return err
		}
	}
}
