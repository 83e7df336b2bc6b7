package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const chainUsage = `usage:
  haia-trace-mcp chain list [--dir .trace]                 one line a chain: id, path, receipts, head hash, segments (tab-separated)
  haia-trace-mcp chain export ID [--dir .trace]            one chain file (a segment) as a NOA JSON array on stdout
  haia-trace-mcp chain export ID --all --out DIR [--dir .trace]
                                                           every segment of ID's chain, each as DIR/<segment>.json
  haia-trace-mcp chain checkpoint ID [--dir .trace] [--key-file K | --signer unix:PATH]
                                                           a signed noa.checkpoint/0.1 for the head of the chain's
                                                           last segment (its tail) on stdout
  ID is a chain id, a segment id (<chain>.<k>), or the path chain list prints.
`

func runChain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if isHelp(args) {
		fmt.Fprint(stdout, chainUsage)
		return exitOK
	}
	if len(args) == 0 {
		return newCommand("chain", chainUsage, stdout, stderr).failf("name a subcommand: list, export or checkpoint")
	}
	verb := args[0]
	c := newCommand("chain "+verb, chainUsage, stdout, stderr)
	fs := c.fs
	dir := fs.String("dir", ".trace", "the Trace root")
	var signing signingFlags
	var all *bool
	var out *string
	wantArgs := 1
	switch verb {
	case "list":
		wantArgs = 0
	case "export":
		all = fs.Bool("all", false, "export every segment of the chain (needs --out)")
		out = fs.String("out", "", "directory `DIR` that --all writes one <segment>.json a segment into")
	case "checkpoint":
		signing.register(fs)
	default:
		return newCommand("chain", chainUsage, stdout, stderr).failf("unknown subcommand %q", verb)
	}
	pos, code, ok := c.parse(args[1:])
	if !ok {
		return code
	}
	what := "one chain ID"
	if wantArgs == 0 {
		what = "no arguments"
	}
	if code, ok := c.wantArgs(pos, wantArgs, wantArgs, what); !ok {
		return code
	}
	root, err := confined.OpenRoot(*dir)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain: the Trace root: %v\n", err)
		return exitFail
	}
	defer root.Close()
	g, err := root.OpenDir(reviewlog.DirName)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain: %v\n", err)
		return exitFail
	}
	defer g.Close()
	if verb == "list" {
		chains, err := reviewlog.ListChains(g)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp chain list: %v\n", err)
			return exitFail
		}
		for _, c := range chains {
			fmt.Fprintf(stdout, "%s\t%s\t%d\t%s\t%d\n", c.ID, c.Path, c.Length, c.Head, c.Segments)
		}
		return exitOK
	}
	id, err := chainArg(g, pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain %s: %v\n", verb, err)
		return exitUsage
	}
	notFound := func(err error) int {
		if errors.Is(err, iofs.ErrNotExist) {
			fmt.Fprintf(stderr, "haia-trace-mcp chain %s: no chain %q (chain list shows them)\n", verb, id)
		} else {
			fmt.Fprintf(stderr, "haia-trace-mcp chain %s: %v\n", verb, err)
		}
		return exitFail
	}
	if verb == "export" {
		if *all != (*out != "") {
			fmt.Fprintf(stderr, "haia-trace-mcp chain export: --all and --out DIR go together\n\n%s", chainUsage)
			return exitUsage
		}
		if *all {
			return exportAll(g, id, *out, stdout, stderr, notFound)
		}
		f, err := openChainFile(g, id)
		if err != nil {
			return notFound(err)
		}
		defer f.Close()
		if _, err := noa.ExportStream(stdout, f); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp chain export: chain %s: %v\n", id, err)
			return exitFail
		}
		return exitOK
	}
	head, err := reviewlog.ChainHead(g, id)
	if err != nil {
		return notFound(err)
	}
	if head == nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain checkpoint: chain %q is empty\n", id)
		return exitFail
	}
	signer, _, err := signing.open(slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain checkpoint: %v\n", err)
		return exitFail
	}
	// A checkpoint signed by another key than the chain's would make a
	// clean chain verify TAMPERED: refuse it before signing anything.
	if head.Sig.KID != signer.KeyID() {
		fmt.Fprintf(stderr, "haia-trace-mcp chain checkpoint: chain %q is signed by key %s, not by this key (%s); pass the chain's own --key-file or --signer\n",
			pos[0], head.Sig.KID, signer.KeyID())
		return exitUsage
	}
	_, data, err := noa.NewCheckpoint(ctx, *head, time.Now(), signer)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain checkpoint: %v\n", err)
		return exitFail
	}
	stdout.Write(data)
	if len(data) > 0 && data[len(data)-1] != '\n' {
		fmt.Fprintln(stdout)
	}
	return exitOK
}

// chainArg turns what the user gave (an id, a segment id, a file name or
// the path chain list prints) into a chain file's stem under receipts/.
// A path must be in this Trace root's receipts directory.
func chainArg(g *confined.Dir, arg string) (string, error) {
	if arg == "" {
		return "", errors.New("empty chain id")
	}
	name := arg
	if strings.ContainsRune(arg, '/') {
		want, err1 := filepath.Abs(filepath.Join(g.Path(), reviewlog.ReceiptsDir))
		got, err2 := filepath.Abs(filepath.Dir(arg))
		if err1 != nil || err2 != nil || want != got {
			return "", fmt.Errorf("%s is not a chain file of this Trace root (%s); give --dir the root it belongs to", arg, want)
		}
		name = filepath.Base(arg)
	}
	if stem, ok := strings.CutSuffix(name, ".ndjson"); ok {
		name = stem
	}
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return "", fmt.Errorf("%q is not a chain id", arg)
	}
	return name, nil
}

func openChainFile(g *confined.Dir, id string) (*os.File, error) {
	dir, err := g.OpenDir(reviewlog.ReceiptsDir)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return dir.Open(id + ".ndjson")
}

// exportAll writes every segment of id's chain to outDir/<segment>.json
// (each replaced atomically) and prints each path.
func exportAll(g *confined.Dir, id, outDir string, stdout, stderr io.Writer, notFound func(error) int) int {
	segs, err := reviewlog.ChainSegments(g, id)
	if err != nil {
		return notFound(err)
	}
	for _, s := range segs {
		dst := filepath.Join(outDir, s.Chain+".json")
		if err := exportSegment(g, s, dst); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp chain export: %v\n", err)
			return exitFail
		}
		fmt.Fprintln(stdout, dst)
	}
	return exitOK
}

func exportSegment(g *confined.Dir, s reviewlog.Segment, dst string) error {
	src, err := openChainFile(g, s.Chain)
	if err != nil {
		return fmt.Errorf("chain %s: %w", s.Chain, err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return fmt.Errorf("export directory: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := noa.ExportStream(tmp, src); err != nil {
		return fmt.Errorf("chain %s: %w", s.Chain, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	return nil
}
