package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/termsafe"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const reviewerUsage = `usage:
  haia-trace-mcp reviewer init --id ID [--key-file K] [--reviewers F]
  haia-trace-mcp reviewer passkey add|remove --id ID …   (see reviewer passkey --help)

Creates an Ed25519 key for a reviewer (mode 0600; an existing key file is
reused) and adds {ID: base64 SPKI} to the trusted reviewers file. The server
and the review commands trust a human decision only when its receipt is
signed by a key listed there. Both files live outside the Trace root.

  --id ID          the reviewer's id, written into every decision receipt
  --key-file K     the reviewer's key (default: reviewer-key.pem in the user configuration directory)
  --reviewers F    the trusted reviewers file (default: reviewers.json in the user configuration directory)

exit codes: 0 done, 1 error, 2 usage
`

func runReviewer(_ context.Context, args []string, stdout, stderr io.Writer) int {
	if isHelp(args) {
		fmt.Fprint(stdout, reviewerUsage)
		return exitOK
	}
	if len(args) == 0 || args[0] != "init" {
		name := ""
		if len(args) > 0 {
			name = args[0]
		}
		return newCommand("reviewer", reviewerUsage, stdout, stderr).failf("unknown subcommand %q; the subcommands are init and passkey", name)
	}
	c := newCommand("reviewer init", reviewerUsage, stdout, stderr)
	id := c.fs.String("id", "", "the reviewer's id, written into every decision receipt (required)")
	keyFile := c.fs.String("key-file", "", "the reviewer's key (default: reviewer-key.pem in the user configuration directory)")
	reviewers := c.fs.String("reviewers", "", "the trusted reviewers file (default: reviewers.json in the user configuration directory)")
	pos, code, ok := c.parse(args[1:])
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 0, 0, "no arguments"); !ok {
		return code
	}
	if err := reviewlog.CheckReviewerID(*id); err != nil {
		return c.failf("--id: %v", err)
	}
	keyPath := *keyFile
	var err error
	if keyPath == "" {
		if keyPath, err = defaultKeyPath("--key-file", "reviewer-key.pem"); err != nil {
			fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: %v; pass --key-file\n", err)
			return exitFail
		}
	} else if err := os.MkdirAll(filepath.Dir(keyPath), 0o700); err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: %v\n", err)
		return exitFail
	}
	reviewersPath, err := reviewersFile(*reviewers)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: %v\n", err)
		return exitFail
	}
	key, created, err := noa.LoadOrCreateKeyFile(keyPath)
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: --key-file: %v\n", err)
		return exitFail
	}
	signer := noa.NewKeySigner(key)
	added, err := reviewlog.AddReviewer(reviewersPath, *id, signer.PublicKey())
	if err != nil {
		fmt.Fprintf(stderr, "haia-trace-mcp reviewer init: %v\n", err)
		return exitFail
	}
	what := "reused the key"
	if created {
		what = "created a new key"
	}
	fmt.Fprintf(stdout, "reviewer %s: %s (kid %s)\n", termsafe.String(*id), what, signer.KeyID())
	fmt.Fprintf(stdout, "key file:        %s\n", keyPath)
	if added {
		fmt.Fprintf(stdout, "trusted in:      %s (added)\n", reviewersPath)
	} else {
		fmt.Fprintf(stdout, "trusted in:      %s (already listed)\n", reviewersPath)
	}
	fmt.Fprintf(stdout, "give the server: --reviewers %s\n", reviewersPath)
	return exitOK
}
