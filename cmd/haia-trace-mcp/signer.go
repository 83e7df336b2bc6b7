package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const signerUsage = `usage:
  haia-trace-mcp signer --key-file K --listen unix:PATH
      hold the receipt signing key in this process and sign NOA receipt and
      checkpoint preimages for clients on a unix socket (mode 0600), so the
      process facing the network never holds the key. The key file is
      created (mode 0600, PKCS#8 PEM) when absent. Runs until SIGTERM or
      SIGINT, then removes the socket.
`

// runSigner is `haia-trace-mcp signer`.
func runSigner(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("signer", signerUsage, stdout, stderr)
	keyFile := c.fs.String("key-file", "", "Ed25519 signing key `file` (PKCS#8 PEM, mode 0600)")
	listen := c.fs.String("listen", "", "socket to listen on, `unix:PATH`")
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 0, 0, "no arguments"); !ok {
		return code
	}
	path, ok := strings.CutPrefix(*listen, "unix:")
	if *keyFile == "" || !ok || path == "" {
		return c.failf("--key-file and --listen unix:PATH are required")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	key, created, err := noa.LoadOrCreateKeyFile(*keyFile)
	if err != nil {
		fmt.Fprintf(stderr, "signer: %v\n", err)
		return exitFail
	}
	kid := noa.NewKeySigner(key).KeyID()
	if created {
		log.Info("created a new signing key", "path", *keyFile, "kid", kid)
	}
	ln, err := noa.ListenSigner(path)
	if err != nil {
		fmt.Fprintf(stderr, "signer: %v\n", err)
		return exitFail
	}
	if err := noa.ServeSigner(ctx, ln, key, log); err != nil {
		fmt.Fprintf(stderr, "signer: %v\n", err)
		return exitFail
	}
	return exitOK
}
