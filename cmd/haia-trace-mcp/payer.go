package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// payerFlags choose how x402 payments are signed: a payer key in this
// process, or a payer signer process so that the key never enters it.
// Neither: authorize_payment is not served.
type payerFlags struct {
	keyFile      string
	passwordFile string
	signer       string
}

func (p *payerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.keyFile, "payer-key", "", "sign x402 payments the guard allows with this secp256k1 key `file` (64 hex digits, 0x optional; or a keystore v3 JSON file); mode 0600, no symlink")
	fs.StringVar(&p.passwordFile, "payer-key-password-file", "", "the password `file` of a keystore v3 --payer-key (mode 0600; one trailing newline is ignored)")
	fs.StringVar(&p.signer, "payer-signer", "", "sign x402 payments through a payer signer process at `unix:PATH` (haia-trace-mcp signer --payer-key K --listen unix:PATH --max-value AMOUNT)")
}

func (p *payerFlags) set() bool { return p.keyFile != "" || p.signer != "" }

// open returns the payer signer, or nil when payments are not signed here.
func (p *payerFlags) open(ctx context.Context) (x402.Signer, error) {
	switch {
	case p.keyFile != "" && p.signer != "":
		return nil, errors.New("--payer-key and --payer-signer exclude each other: the key lives in the signer process")
	case p.passwordFile != "" && p.keyFile == "":
		return nil, errors.New("--payer-key-password-file goes with a keystore --payer-key")
	case p.signer != "":
		path, ok := strings.CutPrefix(p.signer, "unix:")
		if !ok || path == "" {
			return nil, fmt.Errorf("--payer-signer %q: want unix:PATH", p.signer)
		}
		s, err := x402.DialPayer(ctx, path, app.SignerTimeout)
		if err != nil {
			return nil, fmt.Errorf("--payer-signer: %w", err)
		}
		return s, nil
	case p.keyFile != "":
		key, err := x402.LoadKeyFile(p.keyFile, p.passwordFile)
		if err != nil {
			return nil, fmt.Errorf("--payer-key: %w", err)
		}
		return x402.NewKeySigner(key), nil
	}
	return nil, nil
}

// parseTools reads --tools: the tools to serve (nil: every one).
func parseTools(v string) []string {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	var out []string
	for _, name := range strings.Split(v, ",") {
		if name = strings.TrimSpace(name); name != "" {
			out = append(out, name)
		}
	}
	return out
}

// definePayerAddress is `payer address`: the address x402 payments
// are signed from, never the key.
func definePayerAddress(fs *flag.FlagSet) runFunc {
	var p payerFlags
	p.register(fs)
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		if !p.set() {
			return usageErrorf("give --payer-key or --payer-signer")
		}
		s, err := p.open(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintln(env.stdout, s.Address().Hex())
		return nil
	}
}

// payerLimitFlags are the payer signer's own limits.
type payerLimitFlags struct {
	maxValue    string
	guardConfig string
}

// limits reads them: the policy file's maxAuthorizationSeconds and
// assets (the built-in defaults without one), and --max-value.
func (f payerLimitFlags) limits() (x402.PayerLimits, error) {
	pol := guard.DefaultConfig()
	if f.guardConfig != "" {
		var err error
		if pol, err = guard.LoadConfig(f.guardConfig); err != nil {
			return x402.PayerLimits{}, fmt.Errorf("--guard-config: %w", err)
		}
	}
	lim, err := x402.NewPayerLimits(int64(pol.MaxAuthorizationSeconds), f.maxValue, pol.Assets, time.Now)
	if err != nil {
		if f.guardConfig != "" && !strings.Contains(err.Error(), "--max-value") {
			return x402.PayerLimits{}, fmt.Errorf("--guard-config %s: maxAuthorizationSeconds: %w", f.guardConfig, err)
		}
		return x402.PayerLimits{}, usageErrorf("%s", err)
	}
	return lim, nil
}

// servePayerSigner is the signer command with --payer-key.
func servePayerSigner(ctx context.Context, p payerFlags, f payerLimitFlags, path string, log *slog.Logger) error {
	lim, err := f.limits()
	if err != nil {
		return err
	}
	key, err := x402.LoadKeyFile(p.keyFile, p.passwordFile)
	if err != nil {
		return fmt.Errorf("--payer-key: %w", err)
	}
	ln, err := listenSigner(path)
	if err != nil {
		return err
	}
	return x402.ServePayer(ctx, ln, x402.NewKeySigner(key), lim, log)
}
