package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const signerUsage = `usage:
  haia-trace-mcp signer --key-file K --listen unix:PATH
  haia-trace-mcp signer --payer-key K [--payer-key-password-file P] --listen unix:PATH
      hold the receipt signing key in this process and sign NOA receipt and
      checkpoint preimages for clients on a unix socket (mode 0600), so the
      process facing the network never holds the key. The key file is
      created (mode 0600, PKCS#8 PEM) when absent. Runs until SIGTERM or
      SIGINT, then removes the socket.
      With --payer-key instead, hold the x402 payer key and sign EIP-3009
      TransferWithAuthorization messages from its address only (the server
      runs with --payer-signer unix:PATH). One key per signer process.
`

// runSigner is `haia-trace-mcp signer`.
func runSigner(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("signer", signerUsage, stdout, stderr)
	keyFile := c.fs.String("key-file", "", "Ed25519 signing key `file` (PKCS#8 PEM, mode 0600)")
	listen := c.fs.String("listen", "", "socket to listen on, `unix:PATH`")
	var p payerFlags
	c.fs.StringVar(&p.keyFile, "payer-key", "", "hold this x402 payer key `file` instead (64 hex digits or keystore v3; mode 0600)")
	c.fs.StringVar(&p.passwordFile, "payer-key-password-file", "", "the password `file` of a keystore --payer-key")
	pos, code, ok := c.parse(args)
	if !ok {
		return code
	}
	if code, ok := c.wantArgs(pos, 0, 0, "no arguments"); !ok {
		return code
	}
	path, ok := strings.CutPrefix(*listen, "unix:")
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if p.keyFile != "" {
		if *keyFile != "" || !ok || path == "" {
			return c.failf("--payer-key needs --listen unix:PATH and no --key-file: run one signer process per key")
		}
		return servePayerSigner(ctx, p, path, log, stderr)
	}
	if p.passwordFile != "" {
		return c.failf("--payer-key-password-file goes with --payer-key")
	}
	if *keyFile == "" || !ok || path == "" {
		return c.failf("--key-file and --listen unix:PATH are required")
	}
	key, created, err := noa.LoadOrCreateKeyFile(*keyFile)
	if err != nil {
		fmt.Fprintf(stderr, "signer: %v\n", err)
		return exitFail
	}
	kid := noa.NewKeySigner(key).KeyID()
	if created {
		log.Info("created a new signing key", "path", *keyFile, "kid", kid)
	}
	ln, err := listenSigner(path)
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

// listenSigner opens a signer's unix socket (mode 0600).
func listenSigner(path string) (net.Listener, error) { return noa.ListenSigner(path) }
