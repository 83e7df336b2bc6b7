package reviewlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Where signed decision receipts live, under guard/.
const (
	ReceiptsDir = "receipts"
	KeyringFile = "keyring.json"
	chainSuffix = ".ndjson"
	// headWindow is how much of a chain file's end is read to find its
	// head; one receipt line is far smaller.
	headWindow = 64 << 10
)

// Limits of one chain segment.
const (
	// DefaultSegmentReceipts is the default of Chains.SegmentReceipts.
	DefaultSegmentReceipts = 500_000
	// DefaultSegmentBytes is the default of Chains.SegmentBytes: well
	// under the 64 MiB that NOA verifiers read in the array form.
	DefaultSegmentBytes = 48 << 20
	// MaxSegmentBytes bounds Chains.SegmentBytes, so that the array
	// export of a full segment (one byte more a receipt) stays under
	// noa.MaxArrayBytes.
	MaxSegmentBytes = 60 << 20
)

// Chains appends signed NOA receipts to one chain per signing key:
// guard/receipts/<chain>.ndjson. A rotated key starts a new chain, because
// NOA pins one key per agent id within a chain; the old chain stays
// verifiable with the keyring, which keeps every key ever used.
//
// A chain is split into segments before it reaches a verifier's limit:
// segment 0 is <chain>.ndjson, segment k ≥ 1 is <chain>.<k>.ndjson with
// scope.chain "<chain>.<k>", and opens with a signed continuation receipt
// (noa.ContinueDraft) naming the previous segment and its head hash. Each
// segment verifies on its own with any NOA verifier; VerifySegments (and
// `verify --follow`) checks them end to end.
//
// Append must run inside the review log's lock (a Hook), which is what keeps
// a chain linear when several processes append.
type Chains struct {
	Signer noa.Signer
	// Tenant is written as scope.tenant.
	Tenant string
	// SegmentReceipts is how many receipts one segment holds at most,
	// the continuation included (0: DefaultSegmentReceipts; at least 2,
	// at most noa.MaxReceipts).
	SegmentReceipts int
	// SegmentBytes is how large one segment file grows at most (0:
	// DefaultSegmentBytes; at most MaxSegmentBytes). A segment always
	// holds at least its continuation and one receipt.
	SegmentBytes int64
	// Name is the chain's name before its key id ("" : "decisions"); the
	// spend ledger's own receipts go to "ledger".
	Name string
	// keyed is the key id this Chains read in the store's keyring once
	// (committed by an earlier section): it is not read again.
	keyed atomic.Value
	// heads holds a *headCache: per chain, the last receipt this Chains
	// appended and where its line ends (see cachedHead). A copy of the
	// Chains (another Name) shares it; its keys are the chains' names.
	heads atomic.Value
}

type headCache struct {
	mu sync.Mutex
	m  map[string]chainHead
}

func (c *Chains) headCache() *headCache {
	if h, ok := c.heads.Load().(*headCache); ok {
		return h
	}
	c.heads.CompareAndSwap(nil, &headCache{m: map[string]chainHead{}})
	return c.heads.Load().(*headCache)
}

// chainHead is the head receipt of one segment file as this process last
// wrote it: the receipt parsed, and its line's exact bytes.
type chainHead struct {
	file string
	end  int64
	line []byte
	head noa.Receipt
}

// ChainID names the chain this signer appends to (in lane 0: see
// ChainLaner).
func (c *Chains) ChainID() string {
	if c.Name != "" {
		return c.Name + "-" + c.Signer.KeyID()
	}
	return "decisions-" + c.Signer.KeyID()
}

// LaneChainID is the chain of lane k of chain: chain itself for lane 0,
// "<chain>-lane<k>" otherwise. Each lane is a chain of its own, signed by
// the same key and verified as any other.
func LaneChainID(chain string, k int) string {
	if k <= 0 {
		return chain
	}
	return chain + "-lane" + strconv.Itoa(k)
}

func (c *Chains) limits() (int64, int64, error) {
	n, b := int64(c.SegmentReceipts), c.SegmentBytes
	switch {
	case n == 0:
		n = DefaultSegmentReceipts
	case n < 2 || n > noa.MaxReceipts:
		return 0, 0, fmt.Errorf("segment size %d receipts: want 2 to %d", n, noa.MaxReceipts)
	}
	switch {
	case b == 0:
		b = DefaultSegmentBytes
	case b < 0 || b > MaxSegmentBytes:
		return 0, 0, fmt.Errorf("segment size %d bytes: want 1 to %d", b, MaxSegmentBytes)
	}
	return n, b, nil
}

// SegmentFile is the file name of segment k of chain under receipts/.
func SegmentFile(chain string, k int) string { return noa.SegmentChain(chain, k) + chainSuffix }

// ParseSegmentFile splits a chain file name into its chain id and segment
// number: "c.ndjson" is segment 0 of c, "c.3.ndjson" segment 3.
func ParseSegmentFile(name string) (chain string, k int, ok bool) {
	stem, ok := strings.CutSuffix(name, chainSuffix)
	if !ok || stem == "" {
		return "", 0, false
	}
	if i := strings.LastIndexByte(stem, '.'); i > 0 {
		digits := stem[i+1:]
		if n, err := strconv.Atoi(digits); err == nil && n >= 1 && strconv.Itoa(n) == digits {
			return stem[:i], n, true
		}
	}
	return stem, 0, true
}

// Append seals d as the next receipt of the signer's chain and appends it
// to the chain's last segment, or starts the next segment when the last
// one is full. d.Chain and d.Tenant are filled in. When the signer fails,
// nothing is written and no sequence number is used. w must be the writer
// of a locked section (a Hook's Tx.Store): the lock is what keeps a chain
// linear when several processes append.
func (c *Chains) Append(ctx context.Context, w Writer, d noa.Draft) (noa.Receipt, error) {
	r, _, err := c.AppendAt(ctx, w, d)
	return r, err
}

// Appended is where AppendAt put a receipt: the bytes [Off, End) of
// segment file Segment ("" when the receipt started a segment).
type Appended struct {
	Segment  string
	Off, End int64
}

// AppendAt is Append, and says where the receipt's line went.
func (c *Chains) AppendAt(ctx context.Context, w Writer, d noa.Draft) (noa.Receipt, Appended, error) {
	r, _, at, err := c.appendAt(ctx, w, d, nil)
	return r, at, err
}

// AppendPairAt is AppendAt for d followed by the receipt of the draft next
// makes of d's receipt (an authorization's own receipt after the decision
// that allowed it): both are sealed before either is written, then written
// in one append, so a store that syncs a chain file once a write covers
// both with one sync. It says where d's receipt went. When the pair does
// not fit the chain's last segment, the two are appended one after the
// other as Append would. When a signature fails, nothing is written.
func (c *Chains) AppendPairAt(ctx context.Context, w Writer, d noa.Draft, next func(first noa.Receipt) noa.Draft) (noa.Receipt, noa.Receipt, Appended, error) {
	r, r2, at, err := c.appendAt(ctx, w, d, next)
	if err != nil || next == nil || r2 != nil {
		var second noa.Receipt
		if r2 != nil {
			second = *r2
		}
		return r, second, at, err
	}
	// Not written together (a segment starts or is full): the second
	// follows on its own.
	second, err := c.Append(ctx, w, next(r))
	return r, second, at, err
}

// appendAt is AppendAt; with next set, it appends next's receipt after
// d's in the same write when both fit the last segment (second non-nil),
// and leaves it to the caller otherwise.
func (c *Chains) appendAt(ctx context.Context, w Writer, d noa.Draft, next func(first noa.Receipt) noa.Draft) (noa.Receipt, *noa.Receipt, Appended, error) {
	base := c.ChainID()
	if l, ok := w.(ChainLaner); ok {
		base = LaneChainID(base, l.ChainLane())
	}
	d.Tenant = c.Tenant
	maxN, maxB, err := c.limits()
	if err != nil {
		return noa.Receipt{}, nil, Appended{}, fmt.Errorf("chain %s: %w", base, err)
	}
	if err := c.ensureKeyring(ctx, w); err != nil {
		return noa.Receipt{}, nil, Appended{}, err
	}
	segs, err := segmentNumbers(ctx, w, base)
	if err != nil {
		return noa.Receipt{}, nil, Appended{}, err
	}
	k := 0
	if len(segs) > 0 {
		k = segs[len(segs)-1]
	}
	name := noa.SegmentChain(base, k)
	head, end, err := c.openHead(ctx, w, base, SegmentFile(base, k))
	if err != nil {
		return noa.Receipt{}, nil, Appended{}, fmt.Errorf("chain %s: %w", name, err)
	}
	if head == nil && k > 0 {
		// A segment started by a writer that died before its
		// continuation reached the disk: start it again.
		prev, err := segmentHead(ctx, w, base, k-1)
		if err != nil {
			return noa.Receipt{}, nil, Appended{}, err
		}
		r, err := c.startSegment(ctx, w, end, base, k, *prev, d)
		return r, nil, Appended{}, err
	}
	d.Chain = name
	if head != nil {
		// One chain, one order: a receipt is never dated before the one it
		// follows (sections of one lane may read their clocks in another
		// order than they take the lane).
		d.TS = notBefore(d.TS, head.TS)
	}
	r, line, err := noa.Seal(ctx, d, head, c.Signer)
	if err != nil {
		return noa.Receipt{}, nil, Appended{}, fmt.Errorf("sign decision receipt: %w", err)
	}
	if head != nil && (head.Chain.Seq+1 >= maxN || end+int64(len(line)) > maxB) {
		_, nend, err := openHead(ctx, w, SegmentFile(base, k+1))
		if err != nil {
			return noa.Receipt{}, nil, Appended{}, fmt.Errorf("chain %s: %w", noa.SegmentChain(base, k+1), err)
		}
		r, err := c.startSegment(ctx, w, nend, base, k+1, *head, d)
		return r, nil, Appended{}, err
	}
	data, last, lastLine := line, r, line
	var second *noa.Receipt
	if next != nil && head != nil && head.Chain.Seq+2 < maxN {
		d2 := next(r)
		d2.Tenant, d2.Chain = c.Tenant, name
		d2.TS = notBefore(d2.TS, r.TS)
		r2, line2, err := noa.Seal(ctx, d2, &r, c.Signer)
		if err != nil {
			return noa.Receipt{}, nil, Appended{}, fmt.Errorf("sign the receipt that follows the decision's: %w", err)
		}
		if end+int64(len(line)+len(line2)) <= maxB {
			data = append(append(make([]byte, 0, len(line)+len(line2)), line...), line2...)
			last, lastLine, second = r2, line2, &r2
		}
	}
	if err := w.AppendSegment(ctx, SegmentFile(base, k), end, data); err != nil {
		c.forget(base)
		return noa.Receipt{}, nil, Appended{}, fmt.Errorf("chain %s: %w", name, err)
	}
	c.remember(base, chainHead{file: SegmentFile(base, k), end: end + int64(len(data)), line: bytes.Clone(lastLine), head: last})
	return r, second, Appended{Segment: SegmentFile(base, k), Off: end, End: end + int64(len(line))}, nil
}

// openHead is the package's openHead for the chain base, without reading
// and parsing the segment's end again when it still ends with the line
// this Chains appended last: the same bytes at the same offset are the
// same receipt. Anything else — another process appended, a failed
// section cut its line off again, the file was edited — reads the head
// from the file as before.
func (c *Chains) openHead(ctx context.Context, r Reader, base, file string) (*noa.Receipt, int64, error) {
	s, err := r.Segment(ctx, file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer s.Close()
	if ll, ok := s.(lastLiner); ok {
		// A database hands out its last row in one read anyway: when it
		// is the very line this Chains appended last, at the same end,
		// its receipt is the one remembered, not parsed again.
		off, line, err := ll.LastLine()
		if err != nil || line == nil {
			return nil, 0, err
		}
		end := off + int64(len(line))
		if h, ok := c.rememberedLine(base, file, end, line); ok {
			return h, end, nil
		}
		return headOfLine(off, line)
	}
	if h, ok := c.cachedHead(base, file, s); ok {
		return h, s.Size(), nil
	}
	return readHead(s)
}

// rememberedLine is the remembered head of file when line, ending at end,
// is exactly the line this Chains appended last there.
func (c *Chains) rememberedLine(base, file string, end int64, line []byte) (*noa.Receipt, bool) {
	h, ok := c.remembered(base, file)
	if !ok || h.end != end || !bytes.Equal(h.line, line) {
		return nil, false
	}
	head := h.head
	return &head, true
}

// cachedHead is the remembered head of file when s still ends with its
// exact line, preceded by a line break or the file's start.
// (A database's stream, a lastLiner, is read by rememberedLine instead.)
func (c *Chains) cachedHead(base, file string, s Stream) (*noa.Receipt, bool) {
	h, ok := c.remembered(base, file)
	if !ok || s.Size() != h.end || int64(len(h.line)) > h.end {
		return nil, false
	}
	start := h.end - int64(len(h.line))
	buf := make([]byte, len(h.line)+1)
	got := buf
	if start > 0 {
		start--
	} else {
		got = buf[1:]
		buf[0] = '\n'
	}
	if n, err := s.ReadAt(got, start); n != len(got) && err != nil {
		return nil, false
	}
	if buf[0] != '\n' || !bytes.Equal(buf[1:], h.line) {
		return nil, false
	}
	head := h.head
	return &head, true
}

// remembered is the head this Chains last appended to base, when it was
// in file.
func (c *Chains) remembered(base, file string) (chainHead, bool) {
	hc := c.headCache()
	hc.mu.Lock()
	h, ok := hc.m[base]
	hc.mu.Unlock()
	return h, ok && h.file == file
}

func (c *Chains) remember(base string, h chainHead) {
	if len(h.line) == 0 || h.line[len(h.line)-1] != '\n' {
		return
	}
	hc := c.headCache()
	hc.mu.Lock()
	defer hc.mu.Unlock()
	hc.m[base] = h
}

func (c *Chains) forget(base string) {
	hc := c.headCache()
	hc.mu.Lock()
	defer hc.mu.Unlock()
	delete(hc.m, base)
}

// openHead reads the head of one segment file (nil, 0 when it does not
// exist yet).
func openHead(ctx context.Context, r Reader, file string) (*noa.Receipt, int64, error) {
	s, err := r.Segment(ctx, file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer s.Close()
	return readHead(s)
}

// notBefore is ts, or the time of the receipt it follows (prevTS) when ts
// is earlier: one chain, one order of time.
func notBefore(ts time.Time, prevTS string) time.Time {
	if prev, err := time.Parse(time.RFC3339Nano, prevTS); err == nil && ts.Before(prev) {
		return prev
	}
	return ts
}

// startSegment writes the continuation of segment k after prev and d's
// receipt after it, as the start of the segment (end is where its torn
// tail, if any, begins).
func (c *Chains) startSegment(ctx context.Context, w Writer, end int64, base string, k int, prev noa.Receipt, d noa.Draft) (noa.Receipt, error) {
	name := noa.SegmentChain(base, k)
	d.TS = notBefore(d.TS, prev.TS)
	cont, contLine, err := noa.Seal(ctx, noa.ContinueDraft(base, k, prev, d.TS, c.Tenant), nil, c.Signer)
	if err != nil {
		return noa.Receipt{}, fmt.Errorf("sign the continuation of chain %s: %w", name, err)
	}
	d.Chain = name
	r, line, err := noa.Seal(ctx, d, &cont, c.Signer)
	if err != nil {
		return noa.Receipt{}, fmt.Errorf("sign decision receipt: %w", err)
	}
	if err := w.AppendSegment(ctx, SegmentFile(base, k), end, append(contLine, line...)); err != nil {
		return noa.Receipt{}, fmt.Errorf("chain %s: %w", name, err)
	}
	return r, nil
}

// segmentNumbers lists the segments of chain present, ascending.
func segmentNumbers(ctx context.Context, r Reader, chain string) ([]int, error) {
	infos, err := r.Segments(ctx)
	if err != nil {
		return nil, err
	}
	var ks []int
	for _, e := range infos {
		if c, k, ok := ParseSegmentFile(e.Name); ok && c == chain {
			ks = append(ks, k)
		}
	}
	sort.Ints(ks)
	return ks, nil
}

var errEmptySegment = errors.New("the segment is empty, refusing to continue it")

// segmentHead is the head of segment k of chain, which must have one.
func segmentHead(ctx context.Context, r Reader, chain string, k int) (*noa.Receipt, error) {
	f, err := r.Segment(ctx, SegmentFile(chain, k))
	if err != nil {
		return nil, fmt.Errorf("chain %s: %w", noa.SegmentChain(chain, k), err)
	}
	defer f.Close()
	head, _, err := readHead(f)
	if err != nil {
		return nil, fmt.Errorf("chain %s: %w", noa.SegmentChain(chain, k), err)
	}
	if head == nil {
		return nil, fmt.Errorf("chain %s: segment %d: %w", chain, k, errEmptySegment)
	}
	return head, nil
}

// lastLiner is a stream that hands out its last line directly (a
// database reads one row instead of the end of a file).
type lastLiner interface {
	LastLine() (off int64, line []byte, err error)
}

// headOfLine is the receipt of a segment's last line, at off.
func headOfLine(off int64, line []byte) (*noa.Receipt, int64, error) {
	r, err := noa.ParseReceipt(bytes.TrimRight(line, "\r\n"))
	if err != nil {
		return nil, 0, fmt.Errorf("the head receipt cannot be read, refusing to extend the chain: %w", err)
	}
	return &r, off + int64(len(line)), nil
}

// readHead returns the segment's last receipt (nil for an empty one) and
// the offset just after its line.
func readHead(f Stream) (*noa.Receipt, int64, error) {
	if ll, ok := f.(lastLiner); ok {
		off, line, err := ll.LastLine()
		if err != nil || line == nil {
			return nil, 0, err
		}
		return headOfLine(off, line)
	}
	size := f.Size()
	start := max(size-headWindow, 0)
	buf := make([]byte, size-start)
	if _, err := f.ReadAt(buf, start); err != nil && !errors.Is(err, io.EOF) {
		return nil, 0, err
	}
	nl := bytes.LastIndexByte(buf, '\n')
	if nl < 0 {
		if start > 0 {
			return nil, 0, fmt.Errorf("no complete receipt in the last %d bytes", headWindow)
		}
		return nil, 0, nil // empty, or only a torn first line
	}
	end := start + int64(nl) + 1
	prev := bytes.LastIndexByte(buf[:nl], '\n')
	last := bytes.TrimRight(buf[prev+1:nl], "\r")
	r, err := noa.ParseReceipt(last)
	if err != nil {
		return nil, 0, fmt.Errorf("the head receipt cannot be read, refusing to extend the chain: %w", err)
	}
	return &r, end, nil
}

// ensureKeyring records the signer's public key in the store's keyring.
func (c *Chains) ensureKeyring(ctx context.Context, w Writer) error {
	kid := c.Signer.KeyID()
	if k, ok := c.keyed.Load().(string); ok && k == kid {
		// Read in the keyring before (the keyring only grows).
		return nil
	}
	kr, err := w.Keyring(ctx)
	if err != nil {
		return err
	}
	spki := noa.EncodeSPKI(c.Signer.PublicKey())
	if cur, ok := kr[kid]; ok {
		if cur != spki {
			return fmt.Errorf("%s: key id %s is recorded with another public key", KeyringFile, kid)
		}
		c.keyed.Store(kid)
		return nil
	}
	return w.AddKey(ctx, kid, spki)
}

// ChainInfo describes one chain, all its segments together.
type ChainInfo struct {
	ID string
	// Path is segment 0's file, the name `verify --follow` starts from.
	Path string
	// Length is the receipts of every segment, as each head's seq says
	// (verification is what checks it).
	Length int
	// Head is the last segment's head chain.hash, "" when empty.
	Head string
	// Segments is how many segment files the chain has.
	Segments int
}

// Segment is one file of a chain.
type Segment struct {
	// Index is the segment number: 0 for <chain>.ndjson.
	Index int
	// Chain is the segment's scope.chain (noa.SegmentChain).
	Chain string
	// File is the name under receipts/, Path the whole path.
	File string
	Path string
}

// ListChains describes every chain in the store. It reads only each
// segment's head.
func ListChains(ctx context.Context, r Reader) ([]ChainInfo, error) {
	infos, err := r.Segments(ctx)
	if err != nil {
		return nil, err
	}
	byID := map[string][]int{}
	for _, e := range infos {
		if id, k, ok := ParseSegmentFile(e.Name); ok {
			byID[id] = append(byID[id], k)
		}
	}
	out := make([]ChainInfo, 0, len(byID))
	for id, ks := range byID {
		sort.Ints(ks)
		ci := ChainInfo{ID: id, Path: r.Locate(ReceiptsDir + "/" + SegmentFile(id, ks[0])), Segments: len(ks)}
		for _, k := range ks {
			head, _, err := openHead(ctx, r, SegmentFile(id, k))
			if err != nil {
				return nil, fmt.Errorf("chain %s: %w", noa.SegmentChain(id, k), err)
			}
			if head != nil {
				ci.Length += int(head.Chain.Seq) + 1
				ci.Head = head.Chain.Hash
			}
		}
		out = append(out, ci)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ErrSegmentMissing marks a chain with a segment missing between two
// present ones (or before them): evidence removed, TAMPERED.
var ErrSegmentMissing = errors.New("a chain segment is missing")

// ChainSegments lists the segments of chain id in order; id may also name
// one of its segments ("<chain>.<k>"). A missing segment between two
// present ones is an error, since verification could not follow it.
func ChainSegments(ctx context.Context, r Reader, id string) ([]Segment, error) {
	base, _, ok := ParseSegmentFile(id + chainSuffix)
	if !ok {
		return nil, fmt.Errorf("chain %q: not a chain name", id)
	}
	ks, err := segmentNumbers(ctx, r, base)
	if err != nil {
		return nil, err
	}
	if len(ks) == 0 {
		return nil, fmt.Errorf("chain %s: %w", base, fs.ErrNotExist)
	}
	segs := make([]Segment, 0, len(ks))
	for i, k := range ks {
		if k != i {
			return nil, fmt.Errorf("chain %s: %w: segment %d (%s), while segment %d is present", base, ErrSegmentMissing, i, SegmentFile(base, i), k)
		}
		segs = append(segs, Segment{Index: k, Chain: noa.SegmentChain(base, k), File: SegmentFile(base, k), Path: r.Locate(ReceiptsDir + "/" + SegmentFile(base, k))})
	}
	return segs, nil
}

// EachReceipt calls fn with every receipt of chain id, segment by
// segment, in order, with the byte offset of its line in the segment; it
// holds one receipt in memory at a time. A non-nil error from fn stops the
// walk and is returned.
func EachReceipt(ctx context.Context, r Reader, id string, fn func(s Segment, off int64, r *noa.Receipt) error) error {
	segs, err := ChainSegments(ctx, r, id)
	if err != nil {
		return err
	}
	for _, s := range segs {
		if err := eachInSegment(ctx, r, s, fn); err != nil {
			return err
		}
	}
	return nil
}

func eachInSegment(ctx context.Context, rd Reader, s Segment, fn func(s Segment, off int64, r *noa.Receipt) error) error {
	f, err := rd.Segment(ctx, s.File)
	if err != nil {
		return err
	}
	defer f.Close()
	lr := noa.NewLineReader(io.NewSectionReader(f, 0, f.Size()))
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := lr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("chain %s: %w", s.Chain, err)
		}
		if err := fn(s, lr.Offset(), &r); err != nil {
			return err
		}
	}
}

// OpenSegment opens one segment for reading from its start.
func OpenSegment(ctx context.Context, r Reader, file string) (io.ReadCloser, error) {
	f, err := r.Segment(ctx, file)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, 0, f.Size()), f}, nil
}

// VerifySegments verifies chain id (every segment and the links between
// them, see noa.VerifySegments) in bounded memory.
func VerifySegments(ctx context.Context, r Reader, id string, opt noa.Options) (noa.Result, error) {
	segs, err := ChainSegments(ctx, r, id)
	if errors.Is(err, ErrSegmentMissing) {
		return noa.Result{Verdict: noa.Tampered, Chain: id, Reason: err.Error()}, nil
	}
	if err != nil {
		return noa.Result{}, err
	}
	srcs := make([]noa.SegmentSource, len(segs))
	for i, s := range segs {
		srcs[i] = noa.SegmentSource{Name: s.File, Open: func() (io.ReadCloser, error) { return OpenSegment(ctx, r, s.File) }}
	}
	return noa.VerifySegments(srcs, opt)
}

// ReadChainFile reads the receipts of one segment into memory: id is a
// chain (its segment 0) or one segment "<chain>.<k>". A torn last line is
// dropped. Use EachReceipt to walk a whole chain without holding it.
func ReadChainFile(ctx context.Context, r Reader, id string) ([]noa.Receipt, error) {
	f, err := OpenSegment(ctx, r, id+chainSuffix)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rs, err := noa.ReadChain(f)
	if err != nil {
		return nil, fmt.Errorf("chain %s: %w", id, err)
	}
	return rs, nil
}

// ChainHead returns the head receipt of chain id's last segment (nil when
// empty), reading only its end.
func ChainHead(ctx context.Context, r Reader, id string) (*noa.Receipt, error) {
	segs, err := ChainSegments(ctx, r, id)
	if err != nil {
		return nil, err
	}
	// The last segment may be empty when its first write did not finish.
	base := ChainIDOf(segs[0].Chain)
	for i := len(segs) - 1; i >= 0; i-- {
		head, err := segmentHead(ctx, r, base, segs[i].Index)
		if errors.Is(err, errEmptySegment) {
			continue
		}
		return head, err
	}
	return nil, nil
}

// ChainIDOf is the chain a scope.chain or file stem belongs to.
func ChainIDOf(segment string) string {
	id, _, _ := ParseSegmentFile(segment + chainSuffix)
	return id
}
