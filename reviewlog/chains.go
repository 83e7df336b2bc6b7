package reviewlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
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
	maxKeyring = 1 << 20
)

// Chains appends signed NOA receipts to one chain file per signing key:
// guard/receipts/<chain>.ndjson. A rotated key starts a new chain, because
// NOA pins one key per agent id within a chain; the old chain stays
// verifiable with the keyring, which keeps every key ever used.
//
// Append must run inside the review log's lock (a Hook), which is what keeps
// a chain linear when several processes append.
type Chains struct {
	Signer noa.Signer
	// Tenant is written as scope.tenant.
	Tenant string
}

// ChainID names the chain this signer appends to.
func (c *Chains) ChainID() string { return "decisions-" + c.Signer.KeyID() }

// Append seals d as the next receipt of the signer's chain and appends it.
// d.Chain and d.Tenant are filled in. When the signer fails, nothing is
// written and no sequence number is used.
func (c *Chains) Append(ctx context.Context, g *confined.Dir, d noa.Draft) (noa.Receipt, error) {
	d.Chain = c.ChainID()
	d.Tenant = c.Tenant
	dir, err := g.MkdirAll(ReceiptsDir, 0o700)
	if err != nil {
		return noa.Receipt{}, fmt.Errorf("receipts directory: %w", err)
	}
	defer dir.Close()
	if err := c.ensureKeyring(g); err != nil {
		return noa.Receipt{}, err
	}
	f, err := dir.OpenFile(d.Chain+chainSuffix, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return noa.Receipt{}, fmt.Errorf("chain file: %w", err)
	}
	defer f.Close()
	head, end, err := readHead(f)
	if err != nil {
		return noa.Receipt{}, fmt.Errorf("chain %s: %w", d.Chain, err)
	}
	r, line, err := noa.Seal(ctx, d, head, c.Signer)
	if err != nil {
		return noa.Receipt{}, fmt.Errorf("sign decision receipt: %w", err)
	}
	// A torn tail left by a writer that died is cut off first: it was never
	// a receipt, and gluing onto it would make the next line unreadable.
	if err := f.Truncate(end); err != nil {
		return noa.Receipt{}, fmt.Errorf("chain %s: drop torn tail: %w", d.Chain, err)
	}
	if _, err := f.WriteAt(line, end); err != nil {
		_ = f.Truncate(end)
		return noa.Receipt{}, fmt.Errorf("chain %s: append: %w", d.Chain, err)
	}
	if err := f.Sync(); err != nil {
		return noa.Receipt{}, fmt.Errorf("chain %s: sync: %w", d.Chain, err)
	}
	return r, nil
}

// readHead returns the chain's last receipt (nil for an empty chain) and
// the offset just after its line.
func readHead(f *os.File) (*noa.Receipt, int64, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := st.Size()
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

// ensureKeyring records the signer's public key in guard/keyring.json.
func (c *Chains) ensureKeyring(g *confined.Dir) error {
	kr, err := ReadKeyring(g)
	if err != nil {
		return err
	}
	kid := c.Signer.KeyID()
	if cur, ok := kr[kid]; ok {
		if cur != noa.EncodeSPKI(c.Signer.PublicKey()) {
			return fmt.Errorf("%s: key id %s is recorded with another public key", KeyringFile, kid)
		}
		return nil
	}
	kr.Add(kid, c.Signer.PublicKey())
	data, err := kr.JSON()
	if err != nil {
		return err
	}
	return g.WriteFileAtomic(KeyringFile, data, 0o644)
}

// ReadKeyring reads guard/keyring.json (empty when absent).
func ReadKeyring(g *confined.Dir) (noa.Keyring, error) {
	data, err := fs.ReadFile(g.FS(maxKeyring), KeyringFile)
	if errors.Is(err, fs.ErrNotExist) {
		return noa.Keyring{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyringFile, err)
	}
	kr, err := noa.ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyringFile, err)
	}
	return kr, nil
}

// ChainInfo describes one chain file.
type ChainInfo struct {
	ID     string
	Path   string
	Length int
	Head   string // the head receipt's chain.hash, "" when empty
}

// ListChains describes every chain under guard/receipts/ (none when absent).
func ListChains(g *confined.Dir) ([]ChainInfo, error) {
	dir, err := g.OpenDir(ReceiptsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	entries, err := dir.ReadDir()
	if err != nil {
		return nil, err
	}
	var out []ChainInfo
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name, chainSuffix)
		if !ok || !e.Regular() {
			continue
		}
		rs, err := ReadChainFile(g, id)
		if err != nil {
			return nil, err
		}
		ci := ChainInfo{ID: id, Path: dir.Path() + "/" + e.Name, Length: len(rs)}
		if len(rs) > 0 {
			ci.Head = rs[len(rs)-1].Chain.Hash
		}
		out = append(out, ci)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ReadChainFile reads chain id's receipts (a torn last line is dropped).
func ReadChainFile(g *confined.Dir, id string) ([]noa.Receipt, error) {
	dir, err := g.OpenDir(ReceiptsDir)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	f, err := dir.Open(id + chainSuffix)
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

// ReceiptsForAction lists the ids of receipts, in every chain, whose
// action.id is actionID (the receipts that record one review).
func ReceiptsForAction(g *confined.Dir, actionID string) ([]string, error) {
	chains, err := ListChains(g)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range chains {
		rs, err := ReadChainFile(g, c.ID)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if r.Action.ID == actionID {
				ids = append(ids, r.ID)
			}
		}
	}
	return ids, nil
}
