package filestore

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

var segT0 = time.Date(2026, 7, 24, 9, 0, 0, 0, time.UTC)

func segDraft(i int) noa.Draft {
	return noa.Draft{
		TS:    segT0.Add(time.Duration(i) * time.Second),
		Agent: noa.Agent{ID: "agent-buyer", Principal: noa.PrincipalService},
		Action: noa.Action{
			ID: "x402.pay", Canonical: "payment.x402", RiskClass: "IRREVERSIBLE",
			ParamsHash: "hmac-sha256:" + strings.Repeat("ab", 32),
		},
		Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictAllowed},
	}
}

// The chains of the review log, kept in the file store: segments, heads,
// listing and verification over guard/receipts.

// segGuard is a guard/ directory and a signer.
type segGuard struct {
	path string
	root *confined.Dir
	g    *confined.Dir
	s    noa.Signer
}

func newSegGuard(t *testing.T) segGuard {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	g, err := root.MkdirAll(reviewlog.DirName, 0o700)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return segGuard{path: filepath.Join(dir, reviewlog.DirName), root: root, g: g, s: noa.NewKeySigner(key)}
}

func (sg segGuard) r() reviewlog.Reader {
	return &fileReader{s: New(nil), g: sg.g}
}

func (sg segGuard) w() reviewlog.Writer {
	return &fileWriter{fileReader: fileReader{s: New(nil), g: sg.g}, ledgerEnd: -1}
}

func (sg segGuard) appendN(t *testing.T, c *reviewlog.Chains, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if _, err := c.Append(context.Background(), sg.w(), segDraft(i)); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
}

func (sg segGuard) keyring(t *testing.T) noa.Keyring {
	t.Helper()
	kr, err := ReadKeyring(sg.g)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func (sg segGuard) file(c *reviewlog.Chains, k int) string {
	return filepath.Join(sg.path, reviewlog.ReceiptsDir, reviewlog.SegmentFile(c.ChainID(), k))
}

func TestAppendSplitsIntoSegments(t *testing.T) {
	sg := newSegGuard(t)
	c := &reviewlog.Chains{Signer: sg.s, Tenant: "ops", SegmentReceipts: 4}
	sg.appendN(t, c, 0, 10)
	kr := sg.keyring(t)

	// 10 decisions, 4 receipts a segment: 4, then a continuation and 3, twice.
	wantLens := []int{4, 4, 4}
	for k, want := range wantLens {
		data, err := os.ReadFile(sg.file(c, k))
		if err != nil {
			t.Fatalf("segment %d: %v", k, err)
		}
		krJSON, _ := kr.JSON()
		res := noa.VerifyDocuments(noa.Documents{Chain: bytes.NewReader(data), Keyring: krJSON})
		if res.Verdict != noa.Valid || res.Count != want || res.Chain != noa.SegmentChain(c.ChainID(), k) {
			t.Fatalf("segment %d on its own: %s (count %d, chain %q)", k, res.Line(), res.Count, res.Chain)
		}
		rs, err := noa.ReadChain(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if k > 0 {
			cont := rs[0].Action
			if cont.Canonical != noa.ContinueCanonical || cont.ID != noa.SegmentChain(c.ChainID(), k-1) {
				t.Fatalf("segment %d opens with %+v", k, cont)
			}
		}
	}
	if _, err := os.Stat(sg.file(c, 3)); !os.IsNotExist(err) {
		t.Fatalf("a fourth segment exists: %v", err)
	}

	list, err := reviewlog.ListChains(context.Background(), sg.r())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != c.ChainID() || list[0].Segments != 3 || list[0].Length != 12 ||
		!strings.HasSuffix(list[0].Path, "/"+c.ChainID()+".ndjson") {
		t.Fatalf("ListChains: %+v", list)
	}

	res, err := reviewlog.VerifySegments(context.Background(), sg.r(), c.ChainID(), noa.Options{Keyring: kr})
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != noa.Valid || res.Count != 12 || res.Segments != 3 || res.Head != list[0].Head {
		t.Fatalf("end to end: %s (%+v)", res.Line(), res)
	}

	var seen, decisions int
	err = reviewlog.EachReceipt(context.Background(), sg.r(), c.ChainID()+".2", func(s reviewlog.Segment, off int64, r *noa.Receipt) error {
		data, err := os.ReadFile(s.Path)
		if err != nil {
			return err
		}
		if !bytes.HasPrefix(data[off:], []byte(`{"action":{"canonical":"`+r.Action.Canonical)) {
			t.Errorf("receipt %s: offset %d of %s is not its line", r.ID, off, s.File)
		}
		seen++
		if r.Action.Canonical != noa.ContinueCanonical {
			decisions++
		}
		return nil
	})
	if err != nil || seen != 12 || decisions != 10 {
		t.Fatalf("EachReceipt: %d receipts, %d decisions, %v", seen, decisions, err)
	}
	head, err := reviewlog.ChainHead(context.Background(), sg.r(), c.ChainID())
	if err != nil || head == nil || head.Chain.Hash != list[0].Head || head.Scope.Chain != c.ChainID()+".2" {
		t.Fatalf("ChainHead: %+v %v", head, err)
	}
}

func TestChainHeadSkipsAnUnstartedSegment(t *testing.T) {
	sg := newSegGuard(t)
	c := &reviewlog.Chains{Signer: sg.s, SegmentReceipts: 3}
	sg.appendN(t, c, 0, 5)
	want, err := reviewlog.ChainHead(context.Background(), sg.r(), c.ChainID())
	if err != nil || want == nil {
		t.Fatal(want, err)
	}
	if err := os.WriteFile(sg.file(c, 2), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := reviewlog.ChainHead(context.Background(), sg.r(), c.ChainID())
	if err != nil || got == nil || got.Chain.Hash != want.Chain.Hash {
		t.Fatalf("ChainHead with an empty last segment: %+v %v", got, err)
	}
}

func TestAppendSegmentByBytes(t *testing.T) {
	sg := newSegGuard(t)
	c := &reviewlog.Chains{Signer: sg.s, SegmentBytes: 3000}
	sg.appendN(t, c, 0, 12)
	list, err := reviewlog.ListChains(context.Background(), sg.r())
	if err != nil || len(list) != 1 {
		t.Fatalf("%+v %v", list, err)
	}
	if list[0].Segments < 3 {
		t.Fatalf("want several segments at 3000 bytes each, got %+v", list[0])
	}
	for k := range list[0].Segments {
		st, err := os.Stat(sg.file(c, k))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 3000 {
			t.Errorf("segment %d is %d bytes, over the 3000-byte limit", k, st.Size())
		}
	}
	res, err := reviewlog.VerifySegments(context.Background(), sg.r(), c.ChainID(), noa.Options{Keyring: sg.keyring(t)})
	if err != nil || res.Verdict != noa.Valid || res.Count != list[0].Length {
		t.Fatalf("%s %v", res.Line(), err)
	}
}

// A writer that died after creating the next segment, before or while
// writing its continuation, leaves it empty or torn; the next append
// starts it again.
func TestAppendRestartsATornSegment(t *testing.T) {
	for name, content := range map[string]string{"empty": "", "torn": `{"action":{"canon`} {
		t.Run(name, func(t *testing.T) {
			sg := newSegGuard(t)
			c := &reviewlog.Chains{Signer: sg.s, SegmentReceipts: 3}
			sg.appendN(t, c, 0, 5) // segments 0 and 1 full (3 decisions; a continuation and 2)
			if err := os.WriteFile(sg.file(c, 2), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			sg.appendN(t, c, 5, 2)
			res, err := reviewlog.VerifySegments(context.Background(), sg.r(), c.ChainID(), noa.Options{Keyring: sg.keyring(t)})
			if err != nil || res.Verdict != noa.Valid || res.Segments != 3 {
				t.Fatalf("%s %v", res.Line(), err)
			}
		})
	}
}

func TestVerifySegmentsCatchesBrokenLinks(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(t *testing.T, sg segGuard, c *reviewlog.Chains)
		want   noa.Verdict
		reason string
	}{
		{"intact", func(*testing.T, segGuard, *reviewlog.Chains) {}, noa.Valid, "12 receipts in 3 segments"},
		{"segment 0 tail cut", func(t *testing.T, sg segGuard, c *reviewlog.Chains) {
			cutLastLine(t, sg.file(c, 0))
		}, noa.Tampered, "segment 1"},
		{"segment 1 replaced by segment 2", func(t *testing.T, sg segGuard, c *reviewlog.Chains) {
			data, _ := os.ReadFile(sg.file(c, 2))
			os.WriteFile(sg.file(c, 1), data, 0o600)
		}, noa.Tampered, "partition"},
		{"continuation removed", func(t *testing.T, sg segGuard, c *reviewlog.Chains) {
			data, _ := os.ReadFile(sg.file(c, 1))
			_, rest, _ := bytes.Cut(data, []byte("\n"))
			os.WriteFile(sg.file(c, 1), rest, 0o600)
		}, noa.Tampered, "segment 1"},
		{"middle segment deleted", func(t *testing.T, sg segGuard, c *reviewlog.Chains) {
			os.Remove(sg.file(c, 1))
		}, noa.Tampered, "segment 1"},
		{"first segment deleted", func(t *testing.T, sg segGuard, c *reviewlog.Chains) {
			os.Remove(sg.file(c, 0))
		}, noa.Tampered, "segment 0"},
		{"an empty next segment (its first write did not finish)", func(t *testing.T, sg segGuard, c *reviewlog.Chains) {
			os.WriteFile(sg.file(c, 3), []byte(`{"act`), 0o600)
		}, noa.Valid, "12 receipts in 3 segments"},
		{"tenant changes in a later segment", func(t *testing.T, sg segGuard, c *reviewlog.Chains) {
			other := &reviewlog.Chains{Signer: sg.s, Tenant: "other", SegmentReceipts: 4}
			sg.appendN(t, other, 10, 2) // fills segment 2, starts segment 3
		}, noa.Tampered, "tenant"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sg := newSegGuard(t)
			c := &reviewlog.Chains{Signer: sg.s, Tenant: "ops", SegmentReceipts: 4}
			sg.appendN(t, c, 0, 10)
			tc.mutate(t, sg, c)
			res, err := reviewlog.VerifySegments(context.Background(), sg.r(), c.ChainID(), noa.Options{Keyring: sg.keyring(t)})
			if err != nil {
				t.Fatal(err)
			}
			if res.Verdict != tc.want || !strings.Contains(res.Reason, tc.reason) {
				t.Fatalf("got %s, want %s mentioning %q", res.Line(), tc.want, tc.reason)
			}
		})
	}
}

func cutLastLine(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.LastIndexByte(data[:len(data)-1], '\n')
	if err := os.WriteFile(path, data[:i+1], 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestSegmentLimitsAndNames(t *testing.T) {
	sg := newSegGuard(t)
	for _, c := range []*reviewlog.Chains{
		{Signer: sg.s, SegmentReceipts: 1},
		{Signer: sg.s, SegmentReceipts: noa.MaxReceipts + 1},
		{Signer: sg.s, SegmentBytes: reviewlog.MaxSegmentBytes + 1},
		{Signer: sg.s, SegmentBytes: -1},
	} {
		if _, err := c.Append(context.Background(), sg.w(), segDraft(0)); err == nil || !strings.Contains(err.Error(), "segment size") {
			t.Errorf("%+v: %v", *c, err)
		}
	}
	for _, tc := range []struct {
		name  string
		chain string
		k     int
		ok    bool
	}{
		{"decisions-haia-ab.ndjson", "decisions-haia-ab", 0, true},
		{"decisions-haia-ab.1.ndjson", "decisions-haia-ab", 1, true},
		{"decisions-haia-ab.12.ndjson", "decisions-haia-ab", 12, true},
		{"decisions-haia-ab.01.ndjson", "decisions-haia-ab.01", 0, true},
		{"decisions-haia-ab.0.ndjson", "decisions-haia-ab.0", 0, true},
		{"x.json", "", 0, false},
		{".ndjson", "", 0, false},
	} {
		chain, k, ok := reviewlog.ParseSegmentFile(tc.name)
		if chain != tc.chain || k != tc.k || ok != tc.ok {
			t.Errorf("ParseSegmentFile(%q) = %q %d %v", tc.name, chain, k, ok)
		}
		if ok && reviewlog.SegmentFile(chain, k) != tc.name {
			t.Errorf("SegmentFile(%q, %d) = %q", chain, k, reviewlog.SegmentFile(chain, k))
		}
	}
}

// TestAppendChainsOnTheHeadOnDisk: a Chains remembers the head it wrote
// last, and must still chain on what the file really ends with when
// another process (the same key) appended, or when its own last line was
// cut off again (a failed section) and another line of the same length
// took its place.
func TestAppendChainsOnTheHeadOnDisk(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, sg segGuard, a, b *reviewlog.Chains)
	}{
		{"interleaved", func(t *testing.T, sg segGuard, a, b *reviewlog.Chains) {
			for i := 0; i < 6; i++ {
				c := a
				if i%3 == 1 {
					c = b
				}
				sg.appendN(t, c, 10+i, 1)
			}
		}},
		{"cut off and replaced by a line of the same length", func(t *testing.T, sg segGuard, a, b *reviewlog.Chains) {
			sg.appendN(t, a, 10, 2)
			before, err := os.Stat(sg.file(a, 0))
			if err != nil {
				t.Fatal(err)
			}
			sg.appendN(t, a, 12, 1)
			after, err := os.Stat(sg.file(a, 0))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(sg.file(a, 0), before.Size()); err != nil {
				t.Fatal(err)
			}
			sg.appendN(t, b, 12, 1)
			if st, err := os.Stat(sg.file(a, 0)); err != nil || st.Size() != after.Size() {
				t.Fatalf("the other line is %v bytes, want the same length as the cut one (%d): %v", st.Size()-before.Size(), after.Size()-before.Size(), err)
			}
			sg.appendN(t, a, 13, 2)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sg := newSegGuard(t)
			a := &reviewlog.Chains{Signer: sg.s}
			b := &reviewlog.Chains{Signer: sg.s}
			tc.run(t, sg, a, b)
			res, err := reviewlog.VerifySegments(context.Background(), sg.r(), a.ChainID(), noa.Options{Keyring: sg.keyring(t)})
			if err != nil || res.Verdict != noa.Valid {
				t.Fatalf("%s %v", res.Line(), err)
			}
		})
	}
}

// TestAppendPairAt: an authorization's two receipts, sealed together and
// written in one append where they fit the last segment, one after the
// other across a segment's end, make a chain that verifies end to end with
// every receipt once, each second one right after its first, never dated
// before it.
func TestAppendPairAt(t *testing.T) {
	sg := newSegGuard(t)
	c := &reviewlog.Chains{Signer: sg.s, Tenant: "ops", SegmentReceipts: 4}
	sg.appendN(t, c, 0, 1)
	const pairs = 7
	for i := range pairs {
		first := segDraft(10 + i)
		r, r2, at, err := c.AppendPairAt(context.Background(), sg.w(), first, func(got noa.Receipt) noa.Draft {
			d := segDraft(i) // dated before its first: moved to it
			d.Action.ID = "second-of:" + got.ID
			return d
		})
		if err != nil {
			t.Fatal(err)
		}
		// In one segment the second links to its first; across a
		// segment's end, to the continuation that opens the next.
		linked := r2.Chain.PrevHash != nil && *r2.Chain.PrevHash == r.Chain.Hash
		if r2.Scope.Chain != r.Scope.Chain {
			linked = r2.Chain.Seq == 1
		}
		if r2.Action.ID != "second-of:"+r.ID || !linked || r2.TS < r.TS {
			t.Fatalf("pair %d: the second %+v does not follow its first %+v", i, r2.Chain, r.Chain)
		}
		if at.Segment != "" {
			data, err := os.ReadFile(filepath.Join(sg.path, reviewlog.ReceiptsDir, at.Segment))
			if err != nil || !bytes.Contains(data[at.Off:at.End], []byte(`"id":"`+r.ID+`"`)) || bytes.Contains(data[at.Off:at.End], []byte(r2.ID)) {
				t.Fatalf("pair %d: [%d, %d) of %s is not the first receipt's line alone (%v)", i, at.Off, at.End, at.Segment, err)
			}
		}
	}
	res, err := reviewlog.VerifySegments(context.Background(), sg.r(), c.ChainID(), noa.Options{Keyring: sg.keyring(t)})
	if err != nil {
		t.Fatal(err)
	}
	// 15 receipts, 4 a segment with a continuation opening each after the
	// first: 4 + 3 + 3 + 3 + 2 decisions in 5 segments.
	if res.Verdict != noa.Valid || res.Count != 1+2*pairs+res.Segments-1 || res.Segments < 4 {
		t.Fatalf("end to end: %s (%+v)", res.Line(), res)
	}
}
