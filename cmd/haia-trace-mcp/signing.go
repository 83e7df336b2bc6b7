package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// signerTimeout bounds one request to a signer process; past it the
// decision fails closed.
const signerTimeout = 5 * time.Second

// signingFlags choose how decision receipts are signed: a local key file,
// or a signer process so that the process facing callers never holds the key.
type signingFlags struct {
	keyFile       string
	signer        string
	paramsKeyFile string
	tenant        string
}

func (s *signingFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.keyFile, "key-file", "", keyFileFlagHelp)
	fs.StringVar(&s.signer, "signer", "", "sign through a signer process at unix:PATH instead of holding the key (see the signer command)")
	fs.StringVar(&s.paramsKeyFile, "params-key-file", "", "secret for the keyed paramsHash of receipts (PEM key file, 0600; created when absent)\n(default: derived from --key-file; with --signer: $HAIA_CONFIG_DIR/params-key.pem, else $XDG_CONFIG_HOME/haia-trace-mcp/params-key.pem)")
	fs.StringVar(&s.tenant, "tenant", "haia-trace-mcp", "scope.tenant written into decision receipts")
}

// open returns the signer and the paramsHash key.
func (s *signingFlags) open(logger *slog.Logger) (noa.Signer, []byte, error) {
	var signer noa.Signer
	var paramsSecret []byte
	if s.signer != "" {
		path, ok := strings.CutPrefix(s.signer, "unix:")
		if !ok || path == "" {
			return nil, nil, fmt.Errorf("--signer %q: want unix:PATH", s.signer)
		}
		if s.keyFile != "" {
			return nil, nil, errors.New("--signer and --key-file exclude each other: the key lives in the signer process")
		}
		rs, err := noa.DialSigner(path, signerTimeout)
		if err != nil {
			return nil, nil, fmt.Errorf("--signer: %w", err)
		}
		signer = rs
		if s.paramsKeyFile == "" {
			p, err := defaultKeyPath("--params-key-file", "params-key.pem")
			if err != nil {
				return nil, nil, err
			}
			s.paramsKeyFile = p
		}
	} else {
		path := s.keyFile
		if path == "" {
			p, err := defaultKeyPath("--key-file", "signing-key.pem")
			if err != nil {
				return nil, nil, err
			}
			path = p
		}
		key, created, err := noa.LoadOrCreateKeyFile(path)
		if err != nil {
			return nil, nil, fmt.Errorf("--key-file: %w", err)
		}
		if created {
			logger.Info("created a new signing key", "key_file", path)
		}
		signer = noa.NewKeySigner(key)
		paramsSecret = key.Seed()
	}
	if s.paramsKeyFile != "" {
		pk, created, err := noa.LoadOrCreateKeyFile(s.paramsKeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--params-key-file: %w", err)
		}
		if created {
			logger.Info("created a new paramsHash key", "params_key_file", s.paramsKeyFile)
		}
		paramsSecret = ed25519.PrivateKey(pk).Seed()
	}
	return signer, engine.ParamsKeyFrom(paramsSecret), nil
}

// noteRotation says so when this key starts a new chain beside others.
func noteRotation(ctx context.Context, st reviewlog.Store, chains *reviewlog.Chains, logger *slog.Logger) {
	var list []reviewlog.ChainInfo
	err := st.View(ctx, func(r reviewlog.Reader) (err error) {
		list, err = reviewlog.ListChains(ctx, r)
		return err
	})
	if err != nil {
		logger.Warn("cannot list decision chains", "err", err)
		return
	}
	current := chains.ChainID()
	var others []string
	for _, c := range list {
		if c.ID == current || strings.HasPrefix(c.ID, current+"-lane") {
			// This key's chain, or one of its lanes (a database's
			// sections of other scopes append side by side).
			return
		}
		others = append(others, c.ID)
	}
	if len(others) > 0 {
		logger.Warn("the signing key changed: decisions now go to a new chain; earlier chains stay verifiable with guard/keyring.json",
			"new_chain", current, "earlier_chains", strings.Join(others, ","))
	}
}
