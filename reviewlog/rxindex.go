package reviewlog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// receiptIndex maps the action ids of review receipts ("review:<id>") to
// where they are: chain file and byte offset. It is brought up to date by
// reading only what each chain file gained since (chain files only grow); a
// chain file that was replaced, rewritten or removed makes it start over.
type receiptIndex struct {
	mu       sync.Mutex
	files    map[string]*chainCursor
	byAction map[string][]receiptLoc
	// byQuestion maps a caller's question (the guard's DEFERRED receipts:
	// agent.id and paramsHash) to the reviews that answered it, so a
	// signed decision is found even where the log no longer holds it.
	byQuestion map[string][]string
}

func questionOf(agent, paramsHash string) string { return agent + "\x00" + paramsHash }

type chainCursor struct {
	dev, ino uint64
	off      int64
	size     int64     // the file's size when it was last read
	mtime    time.Time // and its modification time
	anchor   []byte
}

type receiptLoc struct {
	file string
	off  int64
}

// refresh reads what the chain files under g gained since the last call.
func (ix *receiptIndex) refresh(g *confined.Dir) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if g == nil {
		return nil
	}
	dir, err := g.OpenDir(ReceiptsDir)
	if errors.Is(err, fs.ErrNotExist) {
		ix.files, ix.byAction, ix.byQuestion = nil, nil, nil
		return nil
	}
	if err != nil {
		return fmt.Errorf("receipts directory: %w", err)
	}
	defer dir.Close()
	entries, err := dir.ReadDir()
	if err != nil {
		return err
	}
	present := map[string]confined.Entry{}
	for _, e := range entries {
		if e.Regular() && strings.HasSuffix(e.Name, chainSuffix) {
			present[e.Name] = e
		}
	}
	for name := range ix.files {
		if _, ok := present[name]; !ok {
			ix.files = nil // a chain file went away: start over
			break
		}
	}
	for restart := 0; restart < 2; restart++ {
		if ix.files == nil {
			ix.files, ix.byAction, ix.byQuestion = map[string]*chainCursor{}, map[string][]receiptLoc{}, map[string][]string{}
		}
		stale := false
		for name, e := range present {
			// Unchanged since the last read (same inode and size, as the
			// directory listing says): nothing to open.
			if cur := ix.files[name]; cur != nil && cur.ino == e.Ino && cur.dev == e.Dev && cur.size == e.Size && cur.mtime.Equal(e.ModTime) {
				continue
			}
			ok, err := ix.readFile(dir, name)
			if err != nil {
				return err
			}
			if !ok {
				stale = true
				break
			}
		}
		if !stale {
			return nil
		}
		ix.files = nil
	}
	return errors.New("the decision chains keep changing under the reader")
}

// readFile indexes what name gained; false when the file is not the one
// indexed before (the caller starts over).
func (ix *receiptIndex) readFile(dir *confined.Dir, name string) (bool, error) {
	f, err := dir.Open(name)
	if err != nil {
		return false, fmt.Errorf("chain %s: %w", name, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	cur := ix.files[name]
	if cur == nil {
		cur = &chainCursor{dev: uint64(st.Dev), ino: st.Ino}
		ix.files[name] = cur
	} else if cur.dev != uint64(st.Dev) || cur.ino != st.Ino || st.Size < cur.off || !bytes.Equal(readAnchor(f, cur.off), cur.anchor) {
		return false, nil
	}
	cur.size, cur.mtime = st.Size, time.Unix(st.Mtim.Sec, st.Mtim.Nsec)
	if st.Size == cur.off {
		return true, nil
	}
	br := bufio.NewReaderSize(io.NewSectionReader(f, cur.off, st.Size-cur.off), 64<<10)
	off := cur.off
	for {
		line, err := readLine(br)
		if err == io.EOF {
			break // a torn last line is no receipt yet
		}
		if err != nil && !errors.Is(err, errLineTooLong) {
			return false, fmt.Errorf("chain %s: %w", name, err)
		}
		at := off
		off += int64(len(line))
		if err != nil || !bytes.Contains(line, []byte(`"review:`)) {
			continue
		}
		r, perr := noa.ParseReceipt(bytes.TrimRight(line, "\r\n"))
		if perr != nil || !strings.HasPrefix(r.Action.ID, "review:") {
			continue // the chain's verifier reports what is malformed
		}
		ix.byAction[r.Action.ID] = append(ix.byAction[r.Action.ID], receiptLoc{file: name, off: at})
		if r.Agent.Principal == noa.PrincipalService && r.Governance.Verdict == noa.VerdictDeferred {
			k := questionOf(r.Agent.ID, r.Action.ParamsHash)
			if !slices.Contains(ix.byQuestion[k], r.Action.ID) {
				ix.byQuestion[k] = append(ix.byQuestion[k], r.Action.ID)
			}
		}
	}
	cur.off = off
	cur.anchor = readAnchor(f, off)
	return true, nil
}

// receipts reads back the receipts of one action, in chain order.
func (ix *receiptIndex) receipts(g *confined.Dir, action string) ([]noa.Receipt, error) {
	ix.mu.Lock()
	locs := append([]receiptLoc(nil), ix.byAction[action]...)
	ix.mu.Unlock()
	if len(locs) == 0 || g == nil {
		return nil, nil
	}
	dir, err := g.OpenDir(ReceiptsDir)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	out := make([]noa.Receipt, 0, len(locs))
	for _, loc := range locs {
		f, err := dir.Open(loc.file)
		if err != nil {
			return nil, fmt.Errorf("chain %s: %w", loc.file, err)
		}
		st := &state{src: f}
		line, err := lineAt(st.src, loc.off)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("chain %s: %w", loc.file, err)
		}
		r, err := noa.ParseReceipt(line)
		if err != nil {
			return nil, fmt.Errorf("chain %s at byte %d: %w", loc.file, loc.off, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// reviewsOf lists the action ids of the reviews the chains say answered
// caller's question (by its paramsHash), oldest first.
func (ix *receiptIndex) reviewsOf(caller, paramsHash string) []string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return append([]string(nil), ix.byQuestion[questionOf(caller, paramsHash)]...)
}

// actions lists the indexed action ids.
func (ix *receiptIndex) actions() []string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make([]string, 0, len(ix.byAction))
	for a := range ix.byAction {
		out = append(out, a)
	}
	return out
}

// lineAt reads the line that starts at off (without its newline).
func lineAt(src io.ReaderAt, off int64) ([]byte, error) {
	buf := make([]byte, 4096)
	var line []byte
	for {
		n, err := src.ReadAt(buf, off+int64(len(line)))
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return bytes.TrimSuffix(append(line, buf[:i]...), []byte{'\r'}), nil
		}
		line = append(line, buf[:n]...)
		if err != nil || len(line) > maxLineBytes {
			return nil, fmt.Errorf("the line at byte %d can no longer be read: the file changed under the reader", off)
		}
		if len(buf) < 64<<10 {
			buf = make([]byte, 64<<10)
		}
	}
}
