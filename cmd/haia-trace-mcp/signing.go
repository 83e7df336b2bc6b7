package main

import (
	"flag"
	"log/slog"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

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

// config resolves the signing flags' default paths: the key file, or with
// --signer the paramsHash key file, in the configuration directory.
func (s *signingFlags) config() (app.Signing, error) {
	out := app.Signing{KeyFile: s.keyFile, Signer: s.signer, ParamsKeyFile: s.paramsKeyFile, Tenant: s.tenant}
	var err error
	switch {
	case s.signer != "":
		if out.ParamsKeyFile == "" && s.keyFile == "" && strings.HasPrefix(s.signer, "unix:") {
			if out.ParamsKeyFile, err = defaultKeyPath("--params-key-file", "params-key.pem"); err != nil {
				return out, err
			}
		}
	case out.KeyFile == "":
		if out.KeyFile, err = defaultKeyPath("--key-file", "signing-key.pem"); err != nil {
			return out, err
		}
	}
	return out, nil
}

// open returns the signer and the paramsHash key.
func (s *signingFlags) open(logger *slog.Logger) (noa.Signer, []byte, error) {
	cfg, err := s.config()
	if err != nil {
		return nil, nil, err
	}
	return cfg.Open(logger)
}
