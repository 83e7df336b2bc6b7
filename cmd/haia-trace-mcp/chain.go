package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const chainDetails = `list prints one line a chain: id, path, receipts, head hash, segments
(tab-separated). export prints one chain file (a segment) as a NOA JSON
array on stdout; with --all --out DIR, every segment of ID's chain, each as
DIR/<segment>.json. checkpoint prints a signed noa.checkpoint/0.1 for the
head of the chain's last segment (its tail).
ID is a chain id, a segment id (<chain>.<k>), or the path chain list prints.
--store URL (default $HAIA_STORE, else file:) reads the chains of a PostgreSQL store.
`

// defineChain is `chain list|export|checkpoint` (verb).
func defineChain(verb string) func(fs *flag.FlagSet) runFunc {
	return func(fs *flag.FlagSet) runFunc {
		dir := dirFlag(fs)
		storeFlag := storeFlag(fs)
		signing := new(signingFlags)
		var all *bool
		var out *string
		switch verb {
		case "export":
			all = fs.Bool("all", false, "export every segment of the chain (needs --out)")
			out = fs.String("out", "", "directory `DIR` that --all writes one <segment>.json a segment into")
		case "checkpoint":
			signing.register(fs)
		}
		return func(ctx context.Context, env *cmdEnv, pos []string) error {
			return runChain(ctx, env.stdout, env.stderr, verb, pos, dir, storeFlag, out, all, signing)
		}
	}
}

func runChain(ctx context.Context, stdout, stderr io.Writer, verb string, pos []string, dir, storeFlag, out *string, all *bool, signing *signingFlags) error {
	spec := storeSpec(*storeFlag)
	if err := app.CheckStoreSpec(spec); err != nil {
		return usageErrorf("%v", err)
	}
	// The file store's chains are under --dir's guard/: --dir must be a
	// Trace root (exit 2 otherwise), whose guard/ holds no chain until the
	// first decision (an empty list). A database needs no Trace root.
	var root *confined.Dir
	if app.IsFileStore(spec) {
		var code int
		if root, code = openCLIRoot("chain "+verb, *dir, stderr); root == nil {
			return exitCode(code)
		}
		defer root.Close()
	}
	st, err := app.OpenStore(ctx, root, spec)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain: %s\n", termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	defer st.Close()
	code := exitFail
	err = st.View(ctx, func(g reviewlog.Reader) error {
		code = chainIn(ctx, g, st, verb, pos, all, out, signing, stdout, stderr)
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain %s: %s\n", verb, termsafe.String(err.Error()))
		return exitCode(exitFail)
	}
	return exitCode(code)
}

// chainIn runs one chain subcommand over a store's reader.
func chainIn(ctx context.Context, g reviewlog.Reader, st reviewlog.Store, verb string, pos []string, all *bool, out *string, signing *signingFlags, stdout, stderr io.Writer) int {
	if verb == "list" {
		chains, err := reviewlog.ListChains(ctx, g)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp chain list: %v\n", err)
			return exitFail
		}
		for _, c := range chains {
			fmt.Fprintf(stdout, "%s\t%s\t%d\t%s\t%d\n", c.ID, c.Path, c.Length, c.Head, c.Segments)
		}
		return exitOK
	}
	id, err := chainArg(g, st, pos[0])
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
			fmt.Fprintln(stderr, "haia-trace-mcp chain export: --all and --out DIR go together (see haia-trace-mcp chain export --help)")
			return exitUsage
		}
		if *all {
			return exportAll(ctx, g, id, *out, stdout, stderr, notFound)
		}
		f, err := reviewlog.OpenSegment(ctx, g, id+".ndjson")
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
	head, err := reviewlog.ChainHead(ctx, g, id)
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
func chainArg(g reviewlog.Reader, st reviewlog.Store, arg string) (string, error) {
	if arg == "" {
		return "", errors.New("empty chain id")
	}
	name := arg
	if i := strings.LastIndexByte(arg, '#'); i >= 0 && arg[:i]+"#" == g.Locate("") {
		arg = arg[i+1:] // the name chain list prints for a database store
		name = arg
	}
	if strings.ContainsRune(arg, '/') {
		fst, ok := st.(*filestore.Store)
		if !ok {
			return "", fmt.Errorf("%s is a path, and the store is %s: give the chain id", arg, st.Describe())
		}
		want, err1 := filepath.Abs(filepath.Join(fst.Describe(), reviewlog.ReceiptsDir))
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

// exportAll writes every segment of id's chain to outDir/<segment>.json
// (each replaced atomically) and prints each path.
func exportAll(ctx context.Context, g reviewlog.Reader, id, outDir string, stdout, stderr io.Writer, notFound func(error) int) int {
	segs, err := reviewlog.ChainSegments(ctx, g, id)
	if err != nil {
		return notFound(err)
	}
	for _, s := range segs {
		dst := filepath.Join(outDir, s.Chain+".json")
		if err := exportSegment(ctx, g, s, dst); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp chain export: %v\n", err)
			return exitFail
		}
		fmt.Fprintln(stdout, dst)
	}
	return exitOK
}

func exportSegment(ctx context.Context, g reviewlog.Reader, s reviewlog.Segment, dst string) error {
	src, err := reviewlog.OpenSegment(ctx, g, s.File)
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
