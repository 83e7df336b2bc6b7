package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// configDirEnv names the environment variable that sets the directory of
// the operator's default files (signing keys, reviewer keys, reviewers.json).
// The container image sets it, since a container often has no HOME.
const configDirEnv = "HAIA_CONFIG_DIR"

// configDirName is the subdirectory of the user's configuration directory
// used when configDirEnv is not set.
const configDirName = "haia-trace-mcp"

// errNoConfigDir is wrapped when no default directory can be found.
var errNoConfigDir = errors.New("no configuration directory")

// configDir resolves the directory of the default files without creating
// it: $HAIA_CONFIG_DIR when set (it must be absolute), else
// os.UserConfigDir()/haia-trace-mcp. A HOME of "/" (what container runtimes
// set for a user without a home) does not count as a home: it would put
// keys in /.config, on what is usually a read-only root filesystem.
func configDir() (string, error) {
	if dir := os.Getenv(configDirEnv); dir != "" {
		if !filepath.IsAbs(dir) {
			return "", fmt.Errorf("%s=%q: want an absolute path", configDirEnv, dir)
		}
		return filepath.Clean(dir), nil
	}
	base, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("%w: set %s to a directory for keys and reviewer files: %w", errNoConfigDir, configDirEnv, err)
	}
	if filepath.Clean(base) == "/.config" {
		return "", fmt.Errorf("%w: HOME is / and XDG_CONFIG_HOME is not set; set %s to a directory for keys and reviewer files", errNoConfigDir, configDirEnv)
	}
	return filepath.Join(base, configDirName), nil
}

// defaultConfigPath is where a default file called name lives, such as
// "signing-key.pem" or "reviewers.json". It only resolves the path; callers
// that create the file call ensureConfigDir first. The error says what to
// set; callers add the flag that would have avoided the default.
func defaultConfigPath(name string) (string, error) {
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return "", fmt.Errorf("default file name %q: want a single path element", name)
	}
	dir, err := configDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

// ensureConfigDir creates the directory of a default file path (mode 0700)
// when it is missing. An existing directory is left as it is.
func ensureConfigDir(path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the configuration directory %s (set %s elsewhere): %w", dir, configDirEnv, err)
	}
	return nil
}

// defaultKeyPath is where a key lives when its flag is not given: in the
// configuration directory, never in the Trace root. The directory is
// created when missing; flag names the flag that overrides the default.
func defaultKeyPath(flag, name string) (string, error) {
	path, err := defaultConfigPath(name)
	if err != nil {
		return "", fmt.Errorf("no %s given: %w", flag, err)
	}
	if err := ensureConfigDir(path); err != nil {
		return "", fmt.Errorf("no %s given: %w", flag, err)
	}
	return path, nil
}
