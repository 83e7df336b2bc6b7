package app

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// SignerTimeout bounds one request to a signer process; past it the
// decision fails closed.
const SignerTimeout = 5 * time.Second

// Signing says how decision receipts are signed: a local key file, or a
// signer process so that the process facing callers never holds the key.
// The caller resolves default paths; nothing here reads the environment.
type Signing struct {
	// KeyFile is the Ed25519 key (PKCS#8 PEM, created when absent).
	KeyFile string
	// Signer is a signer process's address, unix:PATH (excludes KeyFile).
	Signer string
	// ParamsKeyFile keys the paramsHash of receipts (created when absent);
	// "" derives it from KeyFile. With Signer it is required.
	ParamsKeyFile string
	// Tenant is scope.tenant in decision receipts.
	Tenant string
}

// Open returns the signer and the paramsHash key.
func (s Signing) Open(logger *slog.Logger) (noa.Signer, []byte, error) {
	var signer noa.Signer
	var paramsSecret []byte
	if s.Signer != "" {
		path, ok := strings.CutPrefix(s.Signer, "unix:")
		if !ok || path == "" {
			return nil, nil, fmt.Errorf("--signer %q: want unix:PATH", s.Signer)
		}
		if s.KeyFile != "" {
			return nil, nil, errors.New("--signer and --key-file exclude each other: the key lives in the signer process")
		}
		if s.ParamsKeyFile == "" {
			return nil, nil, errors.New("--signer needs --params-key-file: the paramsHash key cannot come from a key this process does not hold")
		}
		rs, err := noa.DialSigner(path, SignerTimeout)
		if err != nil {
			return nil, nil, fmt.Errorf("--signer: %w", err)
		}
		signer = rs
	} else {
		if s.KeyFile == "" {
			return nil, nil, errors.New("no --key-file given and no --signer")
		}
		key, created, err := noa.LoadOrCreateKeyFile(s.KeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--key-file: %w", err)
		}
		if created {
			logger.Info("created a new signing key", "key_file", s.KeyFile)
		}
		signer = noa.NewKeySigner(key)
		paramsSecret = key.Seed()
	}
	if s.ParamsKeyFile != "" {
		pk, created, err := noa.LoadOrCreateKeyFile(s.ParamsKeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--params-key-file: %w", err)
		}
		if created {
			logger.Info("created a new paramsHash key", "params_key_file", s.ParamsKeyFile)
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
