package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const verifyUsage = `usage:
  haia-trace-mcp verify CHAIN [KEYRING] [--keyring K] [--checkpoint C] [--identity M]
      verify a NOA receipt v0.1 chain offline: the NOA JSON-array form or
      this product's chain file (one receipt per line). KEYRING may be given
      as a second argument, as the NOA reference verifier accepts it.
      Prints one line (verdict: reason) on stdout, warnings on stderr.
      exit 0 VALID, 1 UNVERIFIED (no keyring), 2 TAMPERED, 3 MALFORMED,
      4 usage or unreadable file, 5 UNTRUSTED (identity manifest)
`

// exitVerifyUsage is the NOA verifier's usage exit code; 2 means TAMPERED.
const exitVerifyUsage = 4

// maxTrustFileBytes bounds a keyring, checkpoint or identity file.
const maxTrustFileBytes = 4 << 20

// runVerify is `haia-trace-mcp verify`.
func runVerify(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, verifyUsage) }
	keyring := fs.String("keyring", "", "keyring file `K` ({kid: base64 SPKI})")
	checkpoint := fs.String("checkpoint", "", "signed checkpoint file `C` (noa.checkpoint/0.1)")
	identity := fs.String("identity", "", "identity manifest `M` ({agent.id: [kid]})")
	// Positionals may sit between flags: parse, take one, parse the rest.
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return exitOK
			}
			return exitVerifyUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) < 1 || len(pos) > 2 {
		fmt.Fprintf(stderr, "verify: want CHAIN and at most one KEYRING, got %d arguments\n\n%s", len(pos), verifyUsage)
		return exitVerifyUsage
	}
	if len(pos) == 2 {
		if *keyring != "" {
			fmt.Fprintln(stderr, "verify: keyring given twice (argument and --keyring)")
			return exitVerifyUsage
		}
		*keyring = pos[1]
	}

	f, err := os.Open(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "verify: %v\n", err)
		return exitVerifyUsage
	}
	defer f.Close()
	docs := noa.Documents{Chain: f}
	for _, in := range []struct {
		path string
		dst  *[]byte
	}{{*keyring, &docs.Keyring}, {*checkpoint, &docs.Checkpoint}, {*identity, &docs.Identity}} {
		if in.path == "" {
			continue
		}
		b, err := readBounded(in.path, maxTrustFileBytes)
		if err != nil {
			fmt.Fprintf(stderr, "verify: %v\n", err)
			return exitVerifyUsage
		}
		*in.dst = b
	}
	res := noa.VerifyDocuments(docs)
	for _, w := range res.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	fmt.Fprintln(stdout, res.Line())
	return res.Verdict.ExitCode()
}

// readBounded reads a whole file, refusing one larger than limit.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}
