package ingest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// Stored is an event as a shared store holds it, at its position in the
// tenant's commit order.
type Stored struct {
	Pos int64
	Event
}

// Source is a store the events of every replica's ingest go to, read in
// commit order (the PostgreSQL events table).
type Source interface {
	Since(ctx context.Context, tenant string, after int64, limit int) ([]Stored, error)
}

// markFile is where a root's copy keeps the last position it holds, in
// events/ (the Trace reader reads only *.ndjson there).
const markFile = ".ingest-position"

// mirrorChunk is how many events one read of the source takes.
const mirrorChunk = 5000

// Mirror copies a shared source into each tenant's own run files, through
// a FileSink, so the Trace reader of a replica on its own host reads the
// events every replica took in. The copy is idempotent (the sink skips
// what a run already holds), so a lost or stale position only costs a
// re-read; the position is written after the events it covers are
// synced, never before.
type Mirror struct {
	source Source
	sink   *FileSink
	roots  map[string]string
	logger *slog.Logger

	mu  sync.Mutex
	pos map[string]int64
}

// NewMirror copies source into the roots (tenant → Trace root).
func NewMirror(source Source, roots map[string]string, logger *slog.Logger) *Mirror {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Mirror{source: source, sink: NewFileSink(roots), roots: roots, logger: logger, pos: map[string]int64{}}
}

// Close releases the roots.
func (m *Mirror) Close() { m.sink.Close() }

// SyncAll brings every tenant's copy up to the source; it goes on with the
// other tenants when one fails and returns the errors joined.
func (m *Mirror) SyncAll(ctx context.Context) error {
	var errs []error
	for tenant := range m.roots {
		if _, err := m.Sync(ctx, tenant); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Sync copies what the source holds past tenant's position and returns
// how many events it appended.
func (m *Mirror) Sync(ctx context.Context, tenant string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	root := m.roots[tenant]
	pos, ok := m.pos[tenant]
	if !ok {
		pos = readMark(root)
	}
	added := 0
	for {
		batch, err := m.source.Since(ctx, tenant, pos, mirrorChunk)
		if err != nil {
			return added, err
		}
		if len(batch) == 0 {
			m.pos[tenant] = pos
			return added, nil
		}
		events := make([]Event, len(batch))
		for i, s := range batch {
			events[i] = s.Event
		}
		dup, err := m.sink.Store(ctx, tenant, events)
		if err != nil {
			return added, fmt.Errorf("copy ingested events into %s: %w", root, err)
		}
		for _, d := range dup {
			if !d {
				added++
			}
		}
		pos = batch[len(batch)-1].Pos
		if err := writeMark(root, pos); err != nil {
			m.logger.Warn("ingest: the copy's position could not be kept; a restart re-reads from the last one kept", "root", root, "err", err)
		}
		m.pos[tenant] = pos
		if len(batch) < mirrorChunk {
			return added, nil
		}
	}
}

func readMark(root string) int64 {
	b, err := os.ReadFile(filepath.Join(root, "events", markFile))
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

func writeMark(root string, pos int64) error {
	dir := filepath.Join(root, "events")
	tmp, err := os.CreateTemp(dir, markFile+".*")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(strconv.FormatInt(pos, 10) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, markFile))
}
