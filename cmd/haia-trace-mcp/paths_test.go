package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigPath(t *testing.T) {
	tmp := t.TempDir()
	cases := []struct {
		name                 string
		haiaDir, xdg, home   string
		file                 string
		want                 string // exact path, when no error
		wantErr              string // substring of the error
		wantErrIsNoConfigDir bool
	}{
		{name: "HAIA_CONFIG_DIR wins", haiaDir: tmp + "/cfg", xdg: tmp + "/xdg", home: tmp, file: "signing-key.pem", want: tmp + "/cfg/signing-key.pem"},
		{name: "HAIA_CONFIG_DIR is cleaned", haiaDir: tmp + "/cfg/./", file: "reviewers.json", want: tmp + "/cfg/reviewers.json"},
		{name: "XDG_CONFIG_HOME next", xdg: tmp + "/xdg", home: tmp, file: "params-key.pem", want: tmp + "/xdg/haia-trace-mcp/params-key.pem"},
		{name: "HOME last", home: tmp, file: "signing-key.pem", want: tmp + "/.config/haia-trace-mcp/signing-key.pem"},
		{name: "relative HAIA_CONFIG_DIR", haiaDir: "cfg", home: tmp, file: "k.pem", wantErr: "HAIA_CONFIG_DIR=\"cfg\": want an absolute path"},
		{name: "no HOME, no XDG", file: "k.pem", wantErr: "set HAIA_CONFIG_DIR", wantErrIsNoConfigDir: true},
		{name: "HOME is / as in a container", home: "/", file: "k.pem", wantErr: "HOME is /", wantErrIsNoConfigDir: true},
		{name: "name with a slash", haiaDir: tmp, file: "a/b", wantErr: "single path element"},
		{name: "dot-dot", haiaDir: tmp, file: "..", wantErr: "single path element"},
		{name: "empty name", haiaDir: tmp, file: "", wantErr: "single path element"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(configDirEnv, c.haiaDir)
			t.Setenv("XDG_CONFIG_HOME", c.xdg)
			t.Setenv("HOME", c.home)
			got, err := defaultConfigPath(c.file)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, c.wantErr)
				}
				if errors.Is(err, errNoConfigDir) != c.wantErrIsNoConfigDir {
					t.Errorf("errors.Is(err, errNoConfigDir) is not %v (err: %v)", c.wantErrIsNoConfigDir, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
			if _, err := os.Stat(filepath.Dir(got)); err == nil {
				t.Errorf("defaultConfigPath created %s; only ensureConfigDir may", filepath.Dir(got))
			}
		})
	}
}

func TestDefaultKeyPathCreatesPrivateDir(t *testing.T) {
	base := t.TempDir()
	t.Setenv(configDirEnv, filepath.Join(base, "a", "b"))
	path, err := defaultKeyPath("--key-file", "signing-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(base, "a", "b", "signing-key.pem"); path != want {
		t.Errorf("got %q, want %q", path, want)
	}
	st, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Errorf("configuration directory mode %v, want drwx------", st.Mode())
	}

	// A directory that cannot be created: the error names the flag and
	// the variable to set.
	blocker := filepath.Join(base, "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(configDirEnv, filepath.Join(blocker, "sub"))
	_, err = defaultKeyPath("--params-key-file", "params-key.pem")
	if err == nil || !strings.Contains(err.Error(), "--params-key-file") || !strings.Contains(err.Error(), configDirEnv) {
		t.Errorf("err %v; want it to name --params-key-file and %s", err, configDirEnv)
	}
}

// TestServeWithoutHome starts the real binary the way a container does:
// no HOME (or HOME=/), no XDG_CONFIG_HOME. Without HAIA_CONFIG_DIR it
// refuses to start with a message naming what to set, and creates nothing;
// with it, the key is created there.
func TestServeWithoutHome(t *testing.T) {
	root := sampleRoot(t)
	cfg := filepath.Join(t.TempDir(), "cfg")
	cases := []struct {
		name     string
		env      []string
		wantCode int
		wantErr  []string
		wantKey  string
	}{
		{name: "no HOME", env: nil, wantCode: exitFail, wantErr: []string{"--key-file", configDirEnv}},
		{name: "HOME is /", env: []string{"HOME=/"}, wantCode: exitFail, wantErr: []string{"--key-file", configDirEnv, "HOME is /"}},
		{name: "HAIA_CONFIG_DIR", env: []string{configDirEnv + "=" + cfg}, wantCode: exitOK, wantKey: filepath.Join(cfg, "signing-key.pem")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, binPath, "--dir", root)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, c.env...)
			cmd.Stdin = strings.NewReader("") // stdio: EOF at once, then a clean stop
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, c.wantCode, stderr.String())
			}
			for _, w := range c.wantErr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr does not name %q:\n%s", w, stderr.String())
				}
			}
			if strings.Contains(stderr.String(), "mkdir /.config") {
				t.Errorf("the binary tried to create /.config:\n%s", stderr.String())
			}
			if c.wantKey != "" {
				if _, err := os.Stat(c.wantKey); err != nil {
					t.Errorf("key not created where HAIA_CONFIG_DIR says: %v\n%s", err, stderr.String())
				}
			}
		})
	}
}
