package ingest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/receipt"
)

// Sink stores the events of a batch.
type Sink interface {
	// Store appends, for tenant, the events its store does not hold yet
	// (the same event_id in the same run is held once), and returns only
	// once they are durable. dup[i] reports that events[i] was held
	// already. On an error some events may be stored and others not; a
	// retry of the batch stores the rest and counts the others as
	// duplicates.
	Store(ctx context.Context, tenant string, events []Event) (dup []bool, err error)
}

// FileSink stores events in the run files of each tenant's Trace root,
// events/<run_id>.ndjson, the layout the Trace reader reads: one append of
// a run's new lines per batch, synced (and the directory synced when the
// file is new) before Store returns. A run file is locked (flock) while it
// is appended, so replicas sharing the root append in turn; a line torn by
// a crash mid-append is cut off before the next append, so the retried
// event is written whole.
type FileSink struct {
	roots map[string]string
	// MaxRuns bounds how many runs per tenant keep their event ids in
	// memory between batches (a run not kept is re-read on its next batch).
	maxRuns int

	mu      sync.Mutex
	tenants map[string]*tenantFiles
}

// NewFileSink stores each tenant's events under its root: roots maps a
// tenant ("" on a server of one root) to its Trace root directory.
func NewFileSink(roots map[string]string) *FileSink {
	return &FileSink{roots: roots, maxRuns: 256, tenants: map[string]*tenantFiles{}}
}

type tenantFiles struct {
	mu     sync.Mutex
	root   *confined.Dir
	events *confined.Dir
	runs   map[string]*runIDs
	tick   uint64
}

// runIDs is what this process knows of a run file: the length it has
// read (whole lines) and the event ids in it.
type runIDs struct {
	size int64
	ids  map[[16]byte]struct{}
	used uint64
}

func idKey(id string) [16]byte {
	sum := sha256.Sum256([]byte(id))
	return [16]byte(sum[:16])
}

func (s *FileSink) tenant(name string) (*tenantFiles, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tenants[name]; t != nil {
		return t, nil
	}
	path, ok := s.roots[name]
	if !ok {
		return nil, fmt.Errorf("no Trace root for tenant %q", name)
	}
	root, err := confined.OpenRoot(path)
	if err != nil {
		return nil, err
	}
	t := &tenantFiles{root: root, runs: map[string]*runIDs{}}
	s.tenants[name] = t
	return t, nil
}

// Close releases the roots.
func (s *FileSink) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tenants {
		if t.events != nil {
			t.events.Close()
		}
		t.root.Close()
	}
	s.tenants = map[string]*tenantFiles{}
}

// Store implements Sink.
func (s *FileSink) Store(ctx context.Context, tenant string, events []Event) ([]bool, error) {
	t, err := s.tenant(tenant)
	if err != nil {
		return nil, err
	}
	dup := make([]bool, len(events))
	var order []string
	byRun := map[string][]int{}
	for i, ev := range events {
		if _, ok := byRun[ev.Run]; !ok {
			order = append(order, ev.Run)
		}
		byRun[ev.Run] = append(byRun[ev.Run], i)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.openEvents(); err != nil {
		return nil, err
	}
	for _, run := range order {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := t.appendRun(run, events, byRun[run], dup); err != nil {
			return nil, fmt.Errorf("run %s: %w", run, err)
		}
	}
	t.evict(s.maxRuns)
	return dup, nil
}

// openEvents opens events/, creating it (and syncing the root) when absent.
func (t *tenantFiles) openEvents() error {
	if t.events != nil {
		return nil
	}
	d, err := t.root.OpenDir("events")
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOENT) {
		if d, err = t.root.MkdirAll("events", 0o755); err == nil {
			err = syncDir(t.root.Path())
		}
	}
	if err != nil {
		return fmt.Errorf("the events directory of %s: %w", t.root.Path(), err)
	}
	t.events = d
	return nil
}

func (t *tenantFiles) appendRun(run string, events []Event, idx []int, dup []bool) error {
	name := run + ".ndjson"
	created := false
	f, err := t.events.OpenFile(name, os.O_RDWR|os.O_APPEND, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, fs.ErrNotExist) {
		f, err = t.events.OpenFile(name, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o644)
		created = err == nil
		if errors.Is(err, unix.EEXIST) || errors.Is(err, fs.ErrExist) {
			f, err = t.events.OpenFile(name, os.O_RDWR|os.O_APPEND, 0)
		}
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	r := t.runs[run]
	if r == nil || st.Size() < r.size {
		r = &runIDs{ids: map[[16]byte]struct{}{}}
	}
	t.runs[run] = nil // until the file and r agree again
	mustSync := false
	if st.Size() > r.size {
		// Lines another writer (or this process before a restart) appended.
		consumed, _, err := receipt.ScanEvents(io.NewSectionReader(f, r.size, st.Size()-r.size), 1, receipt.Limits{}, func(ev receipt.Event) error {
			r.ids[idKey(ev.ID)] = struct{}{}
			return nil
		})
		if err != nil {
			return fmt.Errorf("reading %s to find the events it holds: %w", f.Name(), err)
		}
		r.size += consumed
		if r.size < st.Size() {
			mustSync = true
			// A line torn by a writer that died mid-append: nobody
			// acknowledged it, so its event comes again whole.
			if err := f.Truncate(r.size); err != nil {
				return fmt.Errorf("cut the torn last line of %s: %w", f.Name(), err)
			}
		}
	}
	var buf []byte
	for _, i := range idx {
		k := idKey(events[i].ID)
		if _, ok := r.ids[k]; ok {
			dup[i] = true
			continue
		}
		r.ids[k] = struct{}{}
		buf = append(buf, events[i].Line...)
		buf = append(buf, '\n')
	}
	if len(buf) > 0 {
		if _, err := f.Write(buf); err != nil {
			return fmt.Errorf("append to %s: %w", f.Name(), err)
		}
		mustSync = true
	}
	if mustSync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", f.Name(), err)
		}
		r.size += int64(len(buf))
	}
	if created {
		if err := syncDir(t.events.Path()); err != nil {
			return err
		}
	}
	t.tick++
	r.used = t.tick
	t.runs[run] = r
	return nil
}

// evict drops the ids of the least recently used runs past max.
func (t *tenantFiles) evict(max int) {
	for len(t.runs) > max {
		var oldest string
		var at uint64
		for name, r := range t.runs {
			if r == nil || oldest == "" || r.used < at {
				oldest = name
				if r == nil {
					break
				}
				at = r.used
			}
		}
		delete(t.runs, oldest)
	}
}

func syncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", path, err)
	}
	return nil
}
