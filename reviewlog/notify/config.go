package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// maxSecretBytes bounds the webhook secret file.
const maxSecretBytes = 64 << 10

// Config is what the server's flags say about notification. The zero value
// notifies nobody.
type Config struct {
	// Command is --notify-command: a program run for each message.
	Command string
	// Env is --notify-env (repeatable): the server's variables the command
	// gets besides its own and PATH.
	Env []string
	// Lookup reads the server's environment; os.LookupEnv when nil.
	Lookup func(string) (string, bool)
	// URL is --notify-url: the opt-in webhook.
	URL string
	// SecretFile is --notify-secret-file: the webhook's HMAC key.
	SecretFile string
}

// New starts the sinks c names, in one group (empty when c names none).
// Close the group on shutdown to drain it.
func New(c Config, opts Options) (*Group, error) {
	if c.URL == "" && c.SecretFile != "" {
		return nil, errors.New("notify: --notify-secret-file is set but --notify-url is not")
	}
	if c.Command == "" && len(c.Env) > 0 {
		return nil, errors.New("notify: --notify-env is set but --notify-command is not")
	}
	if c.URL != "" && c.SecretFile == "" {
		return nil, errors.New("notify: --notify-url needs --notify-secret-file (the key that signs each body)")
	}
	var secret []byte
	if c.URL != "" {
		var err error
		if secret, err = ReadSecretFile(c.SecretFile); err != nil {
			return nil, err
		}
	}
	opts = opts.withDefaults() // one Metrics shared by both sinks
	var members []Notifier
	if c.Command != "" {
		cmd, err := NewCommand(c.Command, CommandEnv{Pass: c.Env, Lookup: c.Lookup}, opts)
		if err != nil {
			return nil, err
		}
		members = append(members, cmd)
	}
	if c.URL != "" {
		w, err := NewWebhook(c.URL, secret, opts)
		if err != nil {
			_ = Multi(members...).Close(context.Background()) // nothing is queued yet
			return nil, err
		}
		members = append(members, w)
	}
	return Multi(members...), nil
}

// ReadSecretFile reads the webhook secret once. Trailing white space (the
// newline an editor or echo leaves) is not part of the secret. A missing,
// empty, oversized or non-regular file is refused.
func ReadSecretFile(path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("notify: no webhook secret file was named")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("notify: the webhook secret file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("notify: the webhook secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("notify: the webhook secret file %s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("notify: read the webhook secret file %s: %w", path, err)
	}
	if len(data) > maxSecretBytes {
		return nil, fmt.Errorf("notify: the webhook secret file %s is larger than %d KiB", path, maxSecretBytes>>10)
	}
	secret := bytes.TrimRight(data, " \t\r\n")
	if len(secret) == 0 {
		return nil, fmt.Errorf("notify: the webhook secret file %s is empty", path)
	}
	return secret, nil
}
