package reviewlog

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Archive files sit beside the log: guard/decisions.archive-<stamp>.ndjson.
const (
	// ArchivePrefix begins the name of every archive (IsArchiveName).
	ArchivePrefix = "decisions.archive-"
	archiveSuffix = ".ndjson"
)

// ArchiveResult says what Archive moved.
type ArchiveResult struct {
	// File is the archive's name under guard/ ("" when nothing moved).
	File    string
	Reviews int
	Lines   int
}

// Archive moves the reviews that are final — decided, or pending and
// expired — and whose last line is older than before, out of the log into
// a new dated archive file beside it: the same lines, byte for byte, so that
// audit still checks them against their receipts, which stay in the chains.
// The log keeps every other line in order. It runs under the log's lock;
// the archive is written and synced before the log is replaced, so a crash
// leaves the reviews in both files (audit reads each once), never in none.
func (l *Log) Archive(ctx context.Context, before time.Time) (ArchiveResult, error) {
	var res ArchiveResult
	err := l.locked(ctx, nil, nil, func(g Writer, st *state, at time.Time) error {
		if len(st.tail) > 0 || st.partial > 0 || !st.endsClean {
			return fmt.Errorf("%w: the log ends in an unfinished line; the next decision repairs it — archive after that", ErrBadInput)
		}
		move := map[int64]bool{}
		for _, e := range st.entries {
			last := e.created
			final := e.status != Pending
			for _, off := range []int64{e.decided, e.used} {
				if off < 0 {
					continue
				}
				rec, err := st.recordAt(off)
				if err != nil {
					return err
				}
				if t, err := parseTime(rec.At); err == nil && t.After(last) {
					last = t
				}
			}
			if ttl := l.ttl(); !final && ttl > 0 && !at.Before(e.created.Add(ttl)) {
				final = true
			}
			if !final || !last.Before(before) {
				continue
			}
			res.Reviews++
			for _, off := range []int64{e.opened, e.decided, e.used} {
				if off >= 0 {
					move[off] = true
				}
			}
		}
		if res.Reviews == 0 {
			return nil
		}
		var keep, out bytes.Buffer
		br := bufio.NewReaderSize(io.NewSectionReader(st.src, 0, st.offset), 64<<10)
		var off int64
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 {
				if move[off] {
					out.Write(line)
					res.Lines++
				} else {
					keep.Write(line)
				}
				off += int64(len(line))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", l.Path(), err)
			}
		}
		res.File = ArchivePrefix + at.UTC().Format("20060102T150405.000Z") + archiveSuffix
		if err := g.ReplaceLog(ctx, res.File, out.Bytes(), keep.Bytes()); err != nil {
			return err
		}
		l.cache = nil // rewritten on purpose: the next reader folds it afresh
		return nil
	})
	return res, err
}

// IsArchiveName says whether name is the name of an archive of the review
// log (ArchivePrefix<stamp>.ndjson), as every store names them.
func IsArchiveName(name string) bool {
	return strings.HasPrefix(name, ArchivePrefix) && strings.HasSuffix(name, archiveSuffix)
}

// foldArchive folds one archive (read whole: archives are the old,
// finished part of the trail).
func foldArchive(ctx context.Context, g Reader, name string) (*state, error) {
	f, err := g.Archive(ctx, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f, 0, f.Size()))
	if err != nil {
		return nil, err
	}
	st, err := fold(data, name)
	if err != nil {
		return nil, err
	}
	if st.partial > 0 || len(st.tail) > 0 {
		return nil, errors.New("the archive ends in an unfinished line")
	}
	return st, nil
}
