package noa

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func TestLoadOrCreateKeyFileCreates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "signing.key")
	key, created, err := LoadOrCreateKeyFile(path)
	if err != nil || !created || len(key) == 0 {
		t.Fatalf("create: created=%v err=%v", created, err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("created with mode %v, want -rw-------", fi.Mode())
	}
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), "-----BEGIN PRIVATE KEY-----\n") {
		t.Fatalf("not a PKCS#8 PEM: %q", data)
	}
	again, created, err := LoadOrCreateKeyFile(path)
	if err != nil || created || !again.Equal(key) {
		t.Fatalf("reload: created=%v err=%v same=%v", created, err, again.Equal(key))
	}
	// No temporary file is left behind.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the key", len(entries))
	}
}

func TestLoadOrCreateKeyFileConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "signing.key")
	const n = 8
	keys := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k, _, err := LoadOrCreateKeyFile(path)
			if err != nil {
				t.Error(err)
				return
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for i := 1; i < n; i++ {
		if string(keys[i]) != string(keys[0]) {
			t.Fatal("concurrent creators ended up with different keys")
		}
	}
}

func TestLoadKeyFileRefuses(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.key")
	if _, _, err := LoadOrCreateKeyFile(good); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(good)

	write := func(name string, mode os.FileMode, content []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := filepath.Join(dir, "link.key")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "adir")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.key")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, msg string
		unsafe          bool
	}{
		{"symbolic link", link, "symbolic link", true},
		{"world readable 0644", write("w.key", 0o644, data), "mode 0644", true},
		{"group readable 0640", write("g.key", 0o640, data), "mode 0640", true},
		{"group writable 0620", write("gw.key", 0o620, data), "mode 0620", true},
		{"directory", sub, "not a regular file", true},
		{"fifo", fifo, "not a regular file", true},
		{"not a key", write("junk.key", 0o600, []byte("hello")), "PRIVATE KEY", false},
		{"trailing data", write("trail.key", 0o600, append(append([]byte{}, data...), "x"...)), "after the PEM block", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadKeyFile(c.path)
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("err = %v, want mention of %q", err, c.msg)
			}
			if errors.Is(err, ErrUnsafeKeyFile) != c.unsafe {
				t.Fatalf("errors.Is(ErrUnsafeKeyFile) = %v, want %v", !c.unsafe, c.unsafe)
			}
			// LoadOrCreate must refuse too, never replace the file.
			if _, created, err := LoadOrCreateKeyFile(c.path); err == nil || created {
				t.Fatalf("LoadOrCreateKeyFile accepted %s (created=%v)", c.name, created)
			}
		})
	}
	// A symlink to a missing target is refused, not created through.
	dangling := filepath.Join(dir, "dangling.key")
	if err := os.Symlink(filepath.Join(dir, "nowhere.key"), dangling); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateKeyFile(dangling); err == nil {
		t.Fatal("dangling symlink accepted")
	}
	if _, err := os.Lstat(filepath.Join(dir, "nowhere.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a key was created through a symlink")
	}
	// The parent directory must exist.
	if _, _, err := LoadOrCreateKeyFile(filepath.Join(dir, "missing", "k.key")); err == nil {
		t.Fatal("created a key in a missing directory")
	}
}
