package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const chainUsage = `usage:
  haia-trace-mcp chain list [--dir .trace]                 one line a chain: id, path, length, head hash (tab-separated)
  haia-trace-mcp chain export ID [--dir .trace]            the chain as a NOA JSON array on stdout
  haia-trace-mcp chain checkpoint ID [--dir .trace] [--key-file K | --signer unix:PATH]
                                                           a signed noa.checkpoint/0.1 for the chain's head on stdout
`

func runChain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, chainUsage)
		return exitUsage
	}
	verb := args[0]
	fs := flag.NewFlagSet("chain "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".trace", "the Trace root")
	var signing signingFlags
	wantArgs := 1
	switch verb {
	case "list":
		wantArgs = 0
	case "export":
	case "checkpoint":
		signing.register(fs)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, chainUsage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "haia-trace-mcp chain: unknown subcommand %q\n\n%s", verb, chainUsage)
		return exitUsage
	}
	pos, err := reviewParseArgs(fs, args[1:])
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain %s: %v\n", verb, err)
		return exitUsage
	}
	if len(pos) != wantArgs {
		fmt.Fprintf(stderr, "haia-trace-mcp chain %s: expected %d argument(s), got %d\n\n%s", verb, wantArgs, len(pos), chainUsage)
		return exitUsage
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
			fmt.Fprintf(stdout, "%s\t%s\t%d\t%s\n", c.ID, c.Path, c.Length, c.Head)
		}
		return exitOK
	}
	rs, err := reviewlog.ReadChainFile(g, pos[0])
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			fmt.Fprintf(stderr, "haia-trace-mcp chain %s: no chain %q (chain list shows them)\n", verb, pos[0])
		} else {
			fmt.Fprintf(stderr, "haia-trace-mcp chain %s: %v\n", verb, err)
		}
		return exitFail
	}
	if verb == "export" {
		out, err := noa.ExportArray(rs)
		if err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp chain export: %v\n", err)
			return exitFail
		}
		_, err = stdout.Write(out)
		if err != nil {
			return exitFail
		}
		return exitOK
	}
	if len(rs) == 0 {
		fmt.Fprintf(stderr, "haia-trace-mcp chain checkpoint: chain %q is empty\n", pos[0])
		return exitFail
	}
	signer, _, err := signing.open(slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp chain checkpoint: %v\n", err)
		return exitFail
	}
	// A checkpoint signed by another key than the chain's would make a
	// clean chain verify TAMPERED: refuse it before signing anything.
	if head := rs[len(rs)-1]; head.Sig.KID != signer.KeyID() {
		fmt.Fprintf(stderr, "haia-trace-mcp chain checkpoint: chain %q is signed by key %s, not by this key (%s); pass the chain's own --key-file or --signer\n",
			pos[0], head.Sig.KID, signer.KeyID())
		return exitUsage
	}
	_, data, err := noa.NewCheckpoint(ctx, rs[len(rs)-1], time.Now(), signer)
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
