package receipt

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
	"unsafe"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jsjson"
)

// Limits bound what one run may cost to read.
type Limits struct {
	MaxLineBytes int   // longest accepted line, line end excluded
	MaxRunBytes  int64 // most bytes read from one run file
}

// DefaultLimits allows 4 MiB per line and 256 MiB per run file. A recorder
// line is normally well under 4 KiB; a 256 MiB run is about 400k events, and
// holding it costs roughly twice its size in memory.
func DefaultLimits() Limits {
	return Limits{MaxLineBytes: 4 << 20, MaxRunBytes: 256 << 20}
}

// orDefault fills unset (zero or negative) limits with the defaults.
func (l Limits) orDefault() Limits {
	def := DefaultLimits()
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = def.MaxLineBytes
	}
	if l.MaxRunBytes <= 0 {
		l.MaxRunBytes = def.MaxRunBytes
	}
	return l
}

// size prints a byte count the way the limits are usually set.
func size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// ReadEvents reads complete lines from r (an append-only run file positioned
// at some offset) and calls fn for each event, in file order. It skips blank
// lines (as JavaScript's trim() sees them), accepts "\r\n" line ends, and
// never consumes the text after the last '\n': that is either nothing or a
// line a writer has not finished. It returns how many bytes it consumed (up to
// and including the last '\n') and the number of the next line, so a caller
// can resume from (offset+consumed, nextLine) when the file grows.
//
// A line that breaks the envelope rules stops the read with a *LineError
// naming the line and the rule; so does an error returned by fn.
func ReadEvents(r io.Reader, firstLine int, lim Limits, fn func(Event) error) (consumed int64, nextLine int, err error) {
	return readEvents(r, firstLine, lim, fn)
}

// ScanEvents is ReadEvents for a caller that keeps no event's Raw value
// past fn (an index that extracts what it needs and drops the payload): an
// event's Raw, and every value reached from it, is valid only during fn,
// which lets the reader reuse one parse buffer for every line. The event's
// strings stay valid.
//
// It reads a MiB at a time and decodes the complete lines in it from one
// string, instead of copying each line out on its own.
func ScanEvents(r io.Reader, firstLine int, lim Limits, fn func(Event) error) (consumed int64, nextLine int, err error) {
	return ScanEventsAt(r, firstLine, lim, func(ev Event, _ int64) error { return fn(ev) })
}

// ScanEventsAt is ScanEvents that also tells fn where each event's line
// starts, in bytes from where r started: an index that keeps no event can
// read one operation's lines again (see DecodeLineAt) instead of the file.
func ScanEventsAt(r io.Reader, firstLine int, lim Limits, fn func(ev Event, at int64) error) (consumed int64, nextLine int, err error) {
	consumed, nextLine, _, err = scanEvents(r, firstLine, lim, nil, false, fn)
	return consumed, nextLine, err
}

// ScanEventsBorrowed is ScanEventsAt for a caller that keeps none of an
// event's strings past fn either (it copies what it keeps): they point into
// the read buffer, which the next MiB read overwrites, so no MiB is copied
// into a string of its own first. buf is a read buffer to use again (nil:
// a new one); the buffer used is given back for the caller's next read, or
// nil after an error (whose text may point into it). What is read, and
// every error, is ScanEventsAt's.
func ScanEventsBorrowed(r io.Reader, firstLine int, lim Limits, buf []byte, fn func(ev Event, at int64) error) (consumed int64, nextLine int, kept []byte, err error) {
	return scanEvents(r, firstLine, lim, buf, true, fn)
}

// scanEvents is ScanEventsAt and ScanEventsBorrowed: with borrow, each
// MiB's complete lines are decoded from buf itself.
func scanEvents(r io.Reader, firstLine int, lim Limits, buf []byte, borrow bool, fn func(ev Event, at int64) error) (consumed int64, nextLine int, kept []byte, err error) {
	lim = lim.orDefault()
	if firstLine < 1 {
		firstLine = 1
	}
	var dec jsjson.Decoder
	line := firstLine
	// Exactly the size a new buffer has: a full buffer with no line end
	// is read on or refused by the same rule whatever buffer was handed in.
	if want := min(1<<20, lim.MaxLineBytes+2); cap(buf) < want {
		buf = make([]byte, 0, want)
	} else {
		buf = buf[:0:want]
	}
	fresh := 0 // where the bytes not yet searched for a line end start
	for eof := false; ; {
		if last := bytes.LastIndexByte(buf[fresh:], '\n'); last >= 0 {
			last += fresh
			var chunk string
			if borrow {
				// Valid until buf is written again, after these lines.
				chunk = unsafe.String(&buf[0], last+1)
			} else {
				chunk = string(buf[:last+1])
			}
			for len(chunk) > 0 {
				nl := strings.IndexByte(chunk, '\n')
				text := chunk[:nl]
				chunk = chunk[nl+1:]
				if len(text) > lim.MaxLineBytes {
					return consumed, line, nil, &LineError{Line: line, Rule: RuleLineSize,
						Err: fmt.Errorf("line is %d bytes, over the %s line limit", len(text), size(int64(lim.MaxLineBytes)))}
				}
				if consumed+int64(len(text))+1 > lim.MaxRunBytes {
					return consumed, line, nil, &LineError{Line: line, Rule: RuleRunSize,
						Err: fmt.Errorf("run file is larger than the %s limit", size(lim.MaxRunBytes))}
				}
				if !isBlank(text) {
					ev, err := decodeEvent(&dec, text, line, true)
					if err == nil {
						err = fn(ev, consumed)
					}
					if err != nil {
						return consumed, line, nil, err
					}
				}
				consumed += int64(len(text)) + 1
				line++
			}
			buf = buf[:copy(buf, buf[last+1:])]
		}
		fresh = len(buf)
		if eof {
			return consumed, line, buf, nil // whatever is left is a torn tail
		}
		if len(buf) == cap(buf) {
			// No line end in a full buffer: one long line.
			if len(buf) > lim.MaxLineBytes {
				return consumed, line, nil, &LineError{Line: line, Rule: RuleLineSize,
					Err: fmt.Errorf("line is longer than the %s line limit", size(int64(lim.MaxLineBytes)))}
			}
			buf = slices.Grow(buf, min(cap(buf), lim.MaxLineBytes+2-len(buf)))
		}
		n, rerr := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case rerr == io.EOF:
			eof = true
		case rerr != nil:
			return consumed, line, nil, fmt.Errorf("reading line %d: %w", line, rerr)
		}
	}
}

func readEvents(r io.Reader, firstLine int, lim Limits, fn func(Event) error) (consumed int64, nextLine int, err error) {
	lim = lim.orDefault()
	if firstLine < 1 {
		firstLine = 1
	}
	br := bufio.NewReaderSize(r, 64<<10)
	var dec jsjson.Decoder
	line := firstLine
	var long []byte // a line longer than the reader's buffer
	for {
		chunk, rerr := br.ReadSlice('\n')
		if rerr == bufio.ErrBufferFull {
			long = append(long, chunk...)
			if len(long) > lim.MaxLineBytes {
				return consumed, line, &LineError{Line: line, Rule: RuleLineSize,
					Err: fmt.Errorf("line is longer than the %s line limit", size(int64(lim.MaxLineBytes)))}
			}
			continue
		}
		if rerr == io.EOF {
			// Whatever is left is a torn tail: not consumed, not an error.
			return consumed, line, nil
		}
		if rerr != nil {
			return consumed, line, fmt.Errorf("reading line %d: %w", line, rerr)
		}
		text := chunk[:len(chunk)-1]
		if long != nil {
			long = append(long, text...)
			text = long
		}
		if len(text) > lim.MaxLineBytes {
			return consumed, line, &LineError{Line: line, Rule: RuleLineSize,
				Err: fmt.Errorf("line is %d bytes, over the %s line limit", len(text), size(int64(lim.MaxLineBytes)))}
		}
		if consumed+int64(len(text))+1 > lim.MaxRunBytes {
			return consumed, line, &LineError{Line: line, Rule: RuleRunSize,
				Err: fmt.Errorf("run file is larger than the %s limit", size(lim.MaxRunBytes))}
		}
		if !isBlank(text) {
			ev, err := decodeEvent(&dec, string(text), line, false)
			if err == nil {
				err = fn(ev)
			}
			if err != nil {
				return consumed, line, err
			}
		}
		consumed += int64(len(text)) + 1
		line++
		long = long[:0]
		if cap(long) > 1<<20 {
			long = nil // do not pin a huge buffer for the rest of the file
		}
	}
}

// decodeEvent decodes the text of line number line.
func decodeEvent(dec *jsjson.Decoder, text string, line int, transient bool) (Event, error) {
	var (
		ev  Event
		err error
	)
	if transient {
		ev, err = decodeLineScratch(dec, text)
	} else {
		ev, err = decodeLine(dec, text)
	}
	if err != nil {
		return Event{}, atLine(err, line)
	}
	ev.Line = line
	return ev, nil
}

// DecodeLineAt decodes one line of a run file (without its line end),
// known to be line number line, as ScanEvents would: a *LineError names
// the line and the broken rule.
func DecodeLineAt(text []byte, line int) (Event, error) {
	if isBlank(text) {
		return Event{}, &LineError{Line: line, Rule: RuleJSON, Err: errors.New("blank line where an event was")}
	}
	return decodeEvent(nil, string(text), line, false)
}

// atLine puts a line number on a decoding error.
func atLine(err error, line int) error {
	var le *LineError
	if errors.As(err, &le) {
		le.Line = line
		return le
	}
	return fmt.Errorf("line %d: %w", line, err)
}

// isBlank reports whether a line is empty after JavaScript's String#trim,
// which is how the reference decides to skip it.
func isBlank[T string | []byte](b T) bool {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			switch c {
			case ' ', '\t', '\n', '\v', '\f', '\r':
				i++
				continue
			}
			return false
		}
		r, n := utf8.DecodeRuneInString(string(b[i:]))
		switch {
		case r == 0x00A0, r == 0x1680, r >= 0x2000 && r <= 0x200A, r == 0x2028, r == 0x2029,
			r == 0x202F, r == 0x205F, r == 0x3000, r == 0xFEFF:
			i += n
		default:
			return false
		}
	}
	return true
}

// decodeText decodes the complete lines of a whole run file's text, with the
// same rules as ReadEvents. Lines are decoded in parallel, one part of the
// text per processor, into one slice of events; a plain event keeps only its
// line's text (see jsjson.Decoder.Text), which the writer prints from.
func decodeText(text string, lim Limits, summed bool) ([]Event, error) {
	if int64(len(text)) > lim.MaxRunBytes {
		return nil, &LineError{Rule: RuleRunSize, Err: fmt.Errorf("file is larger than the %s limit", size(lim.MaxRunBytes))}
	}
	body := text[:strings.LastIndexByte(text, '\n')+1] // a torn tail is not read
	// A few parts per processor, so that a core slowed by other work does not
	// hold the rest up.
	parts := splitLines(body, 4*runtime.GOMAXPROCS(0))
	// Count each part's lines first, so every part knows its first line
	// number and where its events go in the one shared slice.
	lines := make([]int, len(parts))
	parallel(len(parts), func(k int) { lines[k] = strings.Count(parts[k], "\n") })
	first := make([]int, len(parts)+1)
	for k, n := range lines {
		first[k+1] = first[k] + n
	}
	events := make([]Event, first[len(parts)])
	got := make([]int, len(parts))
	errs := make([]error, len(parts))
	parallel(len(parts), func(k int) {
		got[k], errs[k] = decodePart(parts[k], first[k]+1, lim, summed, events[first[k]:first[k+1]])
	})
	for _, err := range errs {
		if err != nil {
			return nil, err // the first bad line in file order
		}
	}
	// Blank lines left gaps at the end of each part's share.
	n := got[0]
	for k := 1; k < len(parts); k++ {
		n += copy(events[n:], events[first[k]:first[k]+got[k]])
	}
	clear(events[n:])
	return events[:n:n], nil
}

// decodePart decodes the lines of part, numbered from line, into out (one
// slot per line) and returns how many events it decoded; summed keeps
// each event's line and its sum (see Event.changed).
func decodePart(part string, line int, lim Limits, summed bool, out []Event) (int, error) {
	var dec jsjson.Decoder
	lines := jsjson.NewLines(part)
	n := 0
	for off := 0; off < len(part); {
		nl := strings.IndexByte(part[off:], '\n')
		l := part[off : off+nl]
		at := off
		off += nl + 1
		if len(l) > lim.MaxLineBytes {
			return n, &LineError{Line: line, Rule: RuleLineSize,
				Err: fmt.Errorf("line is %d bytes, over the %s line limit", len(l), size(int64(lim.MaxLineBytes)))}
		}
		if !isBlank(l) {
			ev, err := decodeLineText(&dec, lines, l, at)
			if err != nil {
				return n, atLine(err, line)
			}
			ev.Line = line
			if summed {
				ev.mapped, ev.sum = true, lineSum(l) // l is ev.Raw.Source()
			}
			out[n] = ev
			n++
		}
		line++
	}
	return n, nil
}

// splitLines cuts text (whole lines) into at most n parts of similar size,
// each made of whole lines. Small texts stay in one part.
func splitLines(text string, n int) []string {
	const minPart = 1 << 20
	n = max(1, min(n, len(text)/minPart))
	parts := make([]string, 0, n)
	for k := n; k > 1; k-- {
		at := len(text) / k
		nl := strings.IndexByte(text[at:], '\n')
		if nl < 0 {
			break
		}
		parts = append(parts, text[:at+nl+1])
		text = text[at+nl+1:]
	}
	return append(parts, text)
}

// parallel calls fn(0..n-1), each on its own goroutine, and waits. A
// fault reading mapped text (see Guard) panics again here.
func parallel(n int, fn func(k int)) {
	if n == 1 {
		fn(0)
		return
	}
	var wg sync.WaitGroup
	faults := make([]any, n)
	for k := range n {
		wg.Go(func() { faults[k] = guarded(func() { fn(k) }) })
	}
	wg.Wait()
	for _, f := range faults {
		if f != nil {
			panic(f)
		}
	}
}

// RunIDFromFileName returns the run id of a run file name ("<id>.ndjson").
func RunIDFromFileName(name string) (string, bool) {
	id, ok := strings.CutSuffix(name, ".ndjson")
	if !ok || id == "" || strings.ContainsAny(id, `/\`) {
		return "", false
	}
	return id, true
}

// ReadRunFile reads a whole run file, as the build command does. The run id
// is the file name without ".ndjson" (or the whole base name otherwise).
// Errors are *LineError values carrying the run id where a line is at fault.
func ReadRunFile(path string, lim Limits) (runID string, events []Event, err error) {
	return readRunFile(path, lim, false)
}

// ReadRunFileHeld is ReadRunFile for a process that reads one run, uses its
// events and ends (the build command): the file's text, which the events
// share, is the file mapped into memory (Linux; read into the heap
// elsewhere, or where the file cannot be mapped) until release is called,
// after which no event may be used. It costs no copy and no fresh memory,
// but the text is the file's own: each event keeps a sum of its line, which
// WriteBuild checks for every event it prints before handing its bytes on
// (so bytes rewritten in place under the build fail it instead of being
// printed unchecked), and a read past the end of a file cut short under
// it faults. The caller reads the events only inside Guard, which turns
// such a fault into an error; the package's own goroutines guard
// themselves.
func ReadRunFileHeld(path string, lim Limits) (runID string, events []Event, release func(), err error) {
	return readRunFileHeld(path, lim, true)
}

func readRunFileHeld(path string, lim Limits, mapped bool) (runID string, events []Event, release func(), err error) {
	base := filepath.Base(path)
	runID, ok := RunIDFromFileName(base)
	if !ok {
		runID = base
	}
	lim = lim.orDefault()
	f, err := os.Open(path)
	if err != nil {
		return runID, nil, nil, fmt.Errorf("opening run file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return runID, nil, nil, fmt.Errorf("opening run file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return runID, nil, nil, fmt.Errorf("run file %s is not a regular file", path)
	}
	if st.Size() > lim.MaxRunBytes {
		return runID, nil, nil, &LineError{Run: runID, Rule: RuleRunSize,
			Err: fmt.Errorf("file is %d bytes, over the %s limit", st.Size(), size(lim.MaxRunBytes))}
	}
	var (
		buf    []byte
		n      int
		summed bool
	)
	release = func() {}
	if mapped {
		// Exactly its size: what a recorder appends since is not read (a
		// torn last line never is).
		buf, release, summed = mapText(f, int(st.Size()))
		n = len(buf)
	}
	if !summed {
		release = func() {}
		// One byte more than its size: a file that grew since (a recorder
		// appending) is read up to the buffer's end, and at most to the limit.
		buf = make([]byte, int(st.Size())+1)
		if n, err = readAtParallel(f, buf); err != nil {
			return runID, nil, nil, fmt.Errorf("reading run file: %w", err)
		}
	}
	text := ""
	if n > 0 {
		// The buffer is not written again: the events' strings share it.
		text = unsafe.String(&buf[0], n)
	}
	events, err = decodeText(text, lim, summed)
	if err != nil {
		release()
		var le *LineError
		if errors.As(err, &le) {
			le.Run = runID
		}
		return runID, nil, nil, err
	}
	return runID, events, release, nil
}

// readRunFile reads the file whole into the heap and decodes its lines in
// place: events then share the file's text instead of each holding a copy.
func readRunFile(path string, lim Limits, mapped bool) (runID string, events []Event, err error) {
	runID, events, _, err = readRunFileHeld(path, lim, mapped)
	return runID, events, err
}

// readChunk is the part of a run file one reader reads at a time.
const readChunk = 4 << 20

// readAtParallel fills buf from the start of f, a chunk per reader, one
// reader per processor, and returns how many bytes it holds: up to the
// first chunk the file ended in (a file cut short since its size was
// taken is read to where it ends). Reading in parallel spreads over the
// cores the kernel's work of giving the process fresh pages and copying
// into them, which one reader does alone otherwise.
func readAtParallel(f *os.File, buf []byte) (int, error) {
	chunks := (len(buf) + readChunk - 1) / readChunk
	got := make([]int, chunks)
	errs := make([]error, chunks)
	var next atomic.Int64
	read := func() {
		for {
			k := int(next.Add(1) - 1)
			if k >= chunks {
				return
			}
			lo := k * readChunk
			part := buf[lo:min(lo+readChunk, len(buf))]
			got[k], errs[k] = f.ReadAt(part, int64(lo))
		}
	}
	workers := min(chunks, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		read()
	} else {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(read)
		}
		wg.Wait()
	}
	n := 0
	for k := range chunks {
		n += got[k]
		if errs[k] != nil {
			if errors.Is(errs[k], io.EOF) {
				return n, nil
			}
			return n, errs[k]
		}
	}
	return n, nil
}
