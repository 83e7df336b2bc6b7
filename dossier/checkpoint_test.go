package dossier

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// chainRig is a real file store whose chain splits every 4 receipts.
type chainRig struct {
	t      *testing.T
	st     *filestore.Store
	chains *reviewlog.Chains
	ids    []string
}

var t0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

func newChainRig(t *testing.T) *chainRig {
	t.Helper()
	root, err := confined.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	return &chainRig{t: t, st: filestore.New(root), chains: &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "t1", SegmentReceipts: 4}}
}

// add appends n decisions (a continuation opens every partition after the first).
func (g *chainRig) add(n int) {
	g.t.Helper()
	err := g.st.Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
		for range n {
			i := len(g.ids)
			rc, err := g.chains.Append(context.Background(), w, noa.Draft{TS: t0.Add(time.Duration(i) * time.Second),
				Agent:      noa.Agent{ID: "agent-1", Principal: noa.PrincipalService},
				Action:     noa.Action{ID: "x402.pay", Canonical: "payment.x402", RiskClass: "IRREVERSIBLE", ParamsHash: "hmac-sha256:" + strings.Repeat("ab", 32)},
				Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictAllowed}})
			if err != nil {
				return err
			}
			g.ids = append(g.ids, rc.ID)
		}
		return nil
	})
	if err != nil {
		g.t.Fatal(err)
	}
}

// checkpoint signs the chain's head now, as chain checkpoint does.
func (g *chainRig) checkpoint(name string) Kept {
	g.t.Helper()
	var k Kept
	err := g.st.View(context.Background(), func(r reviewlog.Reader) error {
		head, err := reviewlog.ChainHead(context.Background(), r, g.chains.ChainID())
		if err != nil {
			return err
		}
		k.CP, k.Raw, err = noa.NewCheckpoint(context.Background(), *head, t0.Add(time.Hour), g.chains.Signer)
		k.Name = name
		return err
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return k
}

func (g *chainRig) segment(opt Options, ids ...string) Segment {
	g.t.Helper()
	if opt.Signer == nil {
		opt.Signer = g.chains.Signer
	}
	if opt.MaxLink == 0 {
		opt.MaxLink = DefaultMaxLink
	}
	if opt.Now.IsZero() {
		opt.Now = t0.Add(2 * time.Hour)
	}
	var s Segment
	err := g.st.View(context.Background(), func(r reviewlog.Reader) error {
		var ok bool
		var err error
		s, ok, err = segmentOf(context.Background(), r, g.chains.ChainID(), ids, opt)
		if err == nil && !ok {
			g.t.Fatal("no segment")
		}
		return err
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return s
}

func (g *chainRig) keyring() noa.Keyring {
	kr := noa.Keyring{}
	kr.Add(g.chains.Signer.KeyID(), g.chains.Signer.PublicKey())
	return kr
}

// chainLinks verifies a file that holds s alone and returns the lines of
// its segment and checkpoints.
func chainLinks(t *testing.T, s Segment, own, kr noa.Keyring) []Link {
	t.Helper()
	b, err := Marshal(File{Format: Format, Segments: []Segment{s}, Keyring: own})
	if err != nil {
		t.Fatal(err)
	}
	var out []Link
	for _, l := range Verify(b, kr, nil) {
		if strings.HasPrefix(l.Link, "segment ") || strings.HasPrefix(l.Link, "checkpoint ") {
			out = append(out, l)
		}
	}
	return out
}

func worstOf(t *testing.T, links []Link) string {
	t.Helper()
	if len(links) == 0 {
		t.Fatal("no segment or checkpoint line")
	}
	return Worst(links)
}

func dump(links []Link) string {
	var b strings.Builder
	for _, l := range links {
		b.WriteString(l.Verdict + " " + l.Link + " " + l.Reason + "\n")
	}
	return b.String()
}

// TestSegmentCheckpoints: a segment that crosses a partition of its chain
// carries the receipts that link it to the chain's head and a checkpoint
// of that head signed at export; verify accepts it and refuses every
// tampered or dropped part.
func TestSegmentCheckpoints(t *testing.T) {
	g := newChainRig(t)
	g.add(11) // partitions of 4: r0 r1 r2 r3 | c r4 r5 r6 | c r7 r8 r9 | c r10
	s := g.segment(Options{}, g.ids[2], g.ids[5])
	kr := g.keyring()
	if len(s.Receipts) != 5 || len(s.Link) != 7 || s.LinkOmitted != 0 || len(s.Checkpoints) != 1 || s.Checkpoints[0].Kind != KindExport {
		t.Fatalf("segment: %d receipts, link %d (+%d omitted), %d checkpoints", len(s.Receipts), len(s.Link), s.LinkOmitted, len(s.Checkpoints))
	}
	links := chainLinks(t, s, kr, kr)
	if w := worstOf(t, links); w != Valid || len(links) != 2 || !strings.Contains(links[1].Reason, "through 7 receipts") {
		t.Fatalf("want VALID segment and checkpoint:\n%s", dump(links))
	}
	if w := worstOf(t, chainLinks(t, s, kr, nil)); w != Unverified {
		t.Fatalf("under the file's own keyring: %s", w)
	}

	otherKey := func() noa.Signer { _, k, _ := ed25519.GenerateKey(rand.Reader); return noa.NewKeySigner(k) }()
	edit := func(f func(s *Segment)) Segment {
		b, _ := json.Marshal(s)
		var c Segment
		json.Unmarshal(b, &c)
		f(&c)
		return c
	}
	cpField := func(c *Segment, from, to string) {
		c.Checkpoints[0].Checkpoint = json.RawMessage(strings.Replace(string(c.Checkpoints[0].Checkpoint), from, to, 1))
	}
	var cp noa.Checkpoint
	cp, _ = noa.ParseCheckpoint(s.Checkpoints[0].Checkpoint)
	for name, c := range map[string]Segment{
		"no link":          edit(func(c *Segment) { c.Link = nil }),
		"link cut short":   edit(func(c *Segment) { c.Link = c.Link[:len(c.Link)-1] }),
		"link receipt out": edit(func(c *Segment) { c.Link = append(c.Link[:2], c.Link[3:]...) }),
		"link edited": edit(func(c *Segment) {
			c.Link[0] = json.RawMessage(strings.Replace(string(c.Link[0]), "ALLOWED", "BLOCKED", 1))
		}),
		"no checkpoint": edit(func(c *Segment) { c.Checkpoints = nil }),
		"head seq": edit(func(c *Segment) {
			cpField(c, `"highestSeq":`+itoa(cp.HighestSeq), `"highestSeq":`+itoa(cp.HighestSeq-1))
		}),
		"head hash": edit(func(c *Segment) { cpField(c, cp.HeadHash, "sha256:"+strings.Repeat("0", 64)) }),
		"signature": edit(func(c *Segment) { cpField(c, cp.Sig.Value, strings.Repeat("A", len(cp.Sig.Value)-2)+"==") }),
		"kind":      edit(func(c *Segment) { c.Checkpoints[0].Kind = KindKept }),
		"omitted, wrong count": edit(func(c *Segment) {
			c.Link = c.Link[:6] // up to the continuation that opens the head's partition
			c.LinkOmitted = 2
		}),
		"another key's checkpoint": edit(func(c *Segment) {
			var head noa.Receipt
			head, _ = noa.ParseReceipt(c.Link[len(c.Link)-1])
			_, b, _ := noa.NewCheckpoint(context.Background(), head, t0, otherKey)
			c.Checkpoints[0].Checkpoint = json.RawMessage(strings.TrimSpace(string(b)))
		}),
	} {
		t.Run(name, func(t *testing.T) {
			links := chainLinks(t, c, kr, kr)
			if w := worstOf(t, links); w != Tampered && w != Malformed {
				t.Fatalf("want TAMPERED:\n%s", dump(links))
			}
		})
	}
	// The link left out, as a chain too long to carry leaves it, with the
	// right count: the checkpoint cannot be checked offline, and says so.
	omitted := edit(func(c *Segment) {
		c.Link = c.Link[:6] // up to the continuation that opens the head's partition
		c.LinkOmitted = 1
	})
	if links := chainLinks(t, omitted, kr, kr); worstOf(t, links) != Unverified {
		t.Fatalf("an omitted link: want UNVERIFIED:\n%s", dump(links))
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestSegmentKeptCheckpoint: the newest checkpoint the operator kept at or
// after the segment's end is carried and verified beside the export's; a
// kept checkpoint the chain contradicts stops the export; past MaxLink
// the link stops at the kept checkpoint and the head's is UNVERIFIED.
func TestSegmentKeptCheckpoint(t *testing.T) {
	g := newChainRig(t)
	g.add(3)
	before := g.checkpoint("before.json") // at r2: before the segment's end
	g.add(3)
	older := g.checkpoint("older.json")
	g.add(2)
	newer := g.checkpoint("newer.json")
	g.add(4)
	kr := g.keyring()

	s := g.segment(Options{Kept: []Kept{before, older, newer}}, g.ids[3], g.ids[4])
	if len(s.Checkpoints) != 2 || s.Checkpoints[0].Kind != KindKept || string(s.Checkpoints[0].Checkpoint) != strings.TrimSpace(string(newer.Raw)) {
		t.Fatalf("want the newest kept checkpoint, then the export's: %+v", s.Checkpoints)
	}
	links := chainLinks(t, s, kr, kr)
	if w := worstOf(t, links); w != Valid || len(links) != 3 || !strings.Contains(links[1].Reason, "a checkpoint the operator kept") {
		t.Fatalf("want VALID:\n%s", dump(links))
	}

	// Past MaxLink: the link stops at the newest kept checkpoint in reach.
	short := g.segment(Options{Kept: []Kept{older, newer}, MaxLink: 3}, g.ids[3], g.ids[4])
	if short.LinkOmitted == 0 || len(short.Checkpoints) != 2 || string(short.Checkpoints[0].Checkpoint) != strings.TrimSpace(string(older.Raw)) {
		t.Fatalf("MaxLink 3: link %d (+%d omitted), %+v", len(short.Link), short.LinkOmitted, short.Checkpoints)
	}
	links = chainLinks(t, short, kr, kr)
	if w := worstOf(t, links); w != Unverified || links[1].Verdict != Valid || links[2].Verdict != Unverified {
		t.Fatalf("want the kept checkpoint VALID and the head's UNVERIFIED:\n%s", dump(links))
	}

	// A kept checkpoint the chain contradicts: the same key's chain of
	// the same length elsewhere, whose head differs.
	g.add(1)
	other := newChainRig(t)
	other.chains = &reviewlog.Chains{Signer: g.chains.Signer, Tenant: "t2", SegmentReceipts: 4}
	other.add(len(g.ids))
	forged := other.checkpoint("forged.json")
	err := g.st.View(context.Background(), func(r reviewlog.Reader) error {
		_, _, err := segmentOf(context.Background(), r, g.chains.ChainID(), []string{g.ids[3]}, Options{Signer: g.chains.Signer, MaxLink: DefaultMaxLink, Kept: []Kept{forged}, Now: t0})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "forged.json") {
		t.Fatalf("a kept checkpoint the chain contradicts: %v", err)
	}
}
