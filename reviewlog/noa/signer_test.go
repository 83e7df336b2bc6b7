package noa

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// socketDir returns a short private directory: unix socket paths are
// limited to about 100 bytes, which t.TempDir() can exceed.
func socketDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "noa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func startSigner(t *testing.T, path string) (ed25519Key []byte, stop func()) {
	t.Helper()
	key := newKey(t)
	ln, err := ListenSigner(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeSigner(ctx, ln, key, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	return key, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeSigner: %v", err)
		}
	}
}

func TestSignerOverUnixSocket(t *testing.T) {
	path := filepath.Join(socketDir(t), "signer.sock")
	key, stop := startSigner(t, path)

	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket with 0600", fi.Mode())
	}

	rs, err := DialSigner(path, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	local := NewKeySigner(key)
	if rs.KeyID() != local.KeyID() || !rs.PublicKey().Equal(local.PublicKey()) {
		t.Fatal("remote signer reports another key")
	}
	receipts, file := sealChain(t, rs, 3)
	if res := verifyFile(t, file, keyringFor(rs), nil); res.Verdict != Valid {
		t.Fatal(res.Line())
	}
	if _, _, err := NewCheckpoint(context.Background(), receipts[2], t0, rs); err != nil {
		t.Fatalf("checkpoint through the signer: %v", err)
	}
	// The signer signs NOA preimages only.
	if _, err := rs.Sign(context.Background(), []byte("transfer all funds")); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("arbitrary message: err = %v", err)
	}

	stop()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket left behind after stop: %v", err)
	}
	// A stopped signer fails closed: an error, no receipt.
	_, line, err := Seal(context.Background(), testDraft(3), &receipts[2], rs)
	if err == nil || line != nil {
		t.Fatalf("seal with a stopped signer: line=%q err=%v", line, err)
	}
	if _, err := DialSigner(path, time.Second); err == nil {
		t.Fatal("dialing a stopped signer succeeded")
	}
	// The chain written so far still verifies.
	if res := verifyFile(t, file, keyringFor(rs), nil); res.Verdict != Valid {
		t.Fatal(res.Line())
	}
}

func TestSignerHungTimesOut(t *testing.T) {
	path := filepath.Join(socketDir(t), "hung.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A peer that accepts and reads but never answers.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(io.Discard, c) }()
		}
	}()
	if _, err := DialSigner(path, 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "no answer in time") {
		t.Fatalf("hung signer: err = %v", err)
	}
}

func TestSignerProtocolErrors(t *testing.T) {
	path := filepath.Join(socketDir(t), "p.sock")
	_, stop := startSigner(t, path)
	defer stop()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	for _, tc := range []struct{ req, want string }{
		{"not json\n", "not a JSON object"},
		{`{"op":"launch"}` + "\n", "unknown op"},
		{`{"op":"sign","msg":"!!"}` + "\n", "refused"},
		{strings.Repeat("x", maxSignerLine+10) + "\n", "longer than"},
	} {
		if _, err := io.WriteString(c, tc.req); err != nil {
			t.Fatal(err)
		}
		line, err := br.ReadString('\n')
		if err != nil || !strings.Contains(line, tc.want) {
			t.Fatalf("request %.20q: answer %q, err %v", tc.req, line, err)
		}
	}
}

func TestListenSignerRefusesOtherFiles(t *testing.T) {
	dir := socketDir(t)
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenSigner(plain); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("err = %v", err)
	}
	live := filepath.Join(dir, "live.sock")
	_, stop := startSigner(t, live)
	defer stop()
	if _, err := ListenSigner(live); err == nil || !strings.Contains(err.Error(), "another signer") {
		t.Fatalf("err = %v", err)
	}
}
