package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const signerDetails = `Holds the receipt signing key in this process and signs NOA receipt and
checkpoint preimages for clients on a unix socket (mode 0600), so the
process facing the network never holds the key. The key file is created
(mode 0600, PKCS#8 PEM) when absent. Runs until SIGTERM or SIGINT, then
removes the socket.
With --payer-key instead, holds the x402 payer key and signs EIP-3009
TransferWithAuthorization messages from its address only (the server runs
with --payer-signer unix:PATH). One key per signer process. It signs no
value above --max-value (required; display units of the token, such as
5.00) and nothing valid longer than the policy's maxAuthorizationSeconds
(--guard-config, the server's policy file; 300 without), whoever asks, and
logs every signature and refusal (payee, value, asset, validBefore, nonce).
`

// defineSigner is `haia-trace-mcp signer`.
func defineSigner(fs *flag.FlagSet) runFunc {
	keyFile := fs.String("key-file", "", "the Ed25519 signing key `file` (PKCS#8 PEM, mode 0600)")
	listen := fs.String("listen", "", "socket to listen on, `unix:PATH`")
	var p payerFlags
	fs.StringVar(&p.keyFile, "payer-key", "", "hold this x402 payer key `file` instead (64 hex digits or keystore v3; mode 0600)")
	fs.StringVar(&p.passwordFile, "payer-key-password-file", "", "the password `file` of a keystore --payer-key")
	var lim payerLimitFlags
	fs.StringVar(&lim.maxValue, "max-value", "", "with --payer-key: sign no authorization above this `amount` in display units of its token (5.00); required")
	fs.StringVar(&lim.guardConfig, "guard-config", "", "with --payer-key: the server's guard policy `FILE`, for its maxAuthorizationSeconds and assets (default: the built-in defaults, 300 s and USDC on Base)")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		return runSigner(ctx, env.stderr, *keyFile, *listen, p, lim)
	}
}

func runSigner(ctx context.Context, stderr io.Writer, keyFile, listen string, p payerFlags, lim payerLimitFlags) error {
	path, ok := strings.CutPrefix(listen, "unix:")
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if p.keyFile != "" {
		if keyFile != "" || !ok || path == "" {
			return usageErrorf("--payer-key needs --listen unix:PATH and no --key-file: run one signer process per key")
		}
		if lim.maxValue == "" {
			return usageErrorf("--payer-key needs --max-value AMOUNT: the most one authorization may move, in display units of its token (5.00)")
		}
		return servePayerSigner(ctx, p, lim, path, log)
	}
	if p.passwordFile != "" {
		return usageErrorf("--payer-key-password-file goes with --payer-key")
	}
	if lim.maxValue != "" || lim.guardConfig != "" {
		return usageErrorf("--max-value and --guard-config go with --payer-key (the payer signer's limits)")
	}
	if keyFile == "" || !ok || path == "" {
		return usageErrorf("--key-file and --listen unix:PATH are required")
	}
	key, created, err := noa.LoadOrCreateKeyFile(keyFile)
	if err != nil {
		return err
	}
	kid := noa.NewKeySigner(key).KeyID()
	if created {
		log.Info("created a new signing key", "path", keyFile, "kid", kid)
	}
	ln, err := listenSigner(path)
	if err != nil {
		return err
	}
	if err := noa.ServeSigner(ctx, ln, key, log); err != nil {
		return err
	}
	return nil
}

// listenSigner opens a signer's unix socket (mode 0600).
func listenSigner(path string) (net.Listener, error) { return noa.ListenSigner(path) }
