package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

func TestSignerCommand(t *testing.T) {
	sockDir, err := os.MkdirTemp("", "sig")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "s.sock")
	keyFile := filepath.Join(t.TempDir(), "signing.key")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"signer", "--key-file", keyFile, "--listen", "unix:" + sock}, strings.NewReader(""), &bytes.Buffer{}, &errb)
	}()

	// Wait for the socket by dialing, not by sleeping for a fixed time.
	var s *noa.RemoteSigner
	for i := 0; ; i++ {
		if s, err = noa.DialSigner(sock, time.Second); err == nil {
			break
		}
		select {
		case code := <-done:
			t.Fatalf("signer exited early with %d", code)
		case <-time.After(20 * time.Millisecond):
		}
		if i > 500 {
			t.Fatalf("signer never came up: %v", err)
		}
	}
	key, err := noa.LoadKeyFile(keyFile)
	if err != nil {
		t.Fatalf("the signer's key file: %v", err)
	}
	if s.KeyID() != noa.NewKeySigner(key).KeyID() {
		t.Fatal("the signer serves another key than its key file")
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errb.String())
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket not removed: %v", err)
	}
}

func TestSignerCommandUsage(t *testing.T) {
	for _, args := range [][]string{
		{"signer"},
		{"signer", "--key-file", "k"},
		{"signer", "--key-file", "k", "--listen", "tcp:1.2.3.4:5"},
		{"signer", "--key-file", "k", "--listen", "unix:/x", "extra"},
	} {
		var errb bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &bytes.Buffer{}, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}
