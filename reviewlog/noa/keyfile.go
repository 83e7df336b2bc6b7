package noa

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// The signing key file holds one Ed25519 private key as PKCS#8 in a PEM
// block of type "PRIVATE KEY" (what `openssl genpkey -algorithm ed25519`
// writes). It must be a regular file, not a symbolic link, readable and
// writable by its owner only (mode 0600 or stricter).

const maxKeyFileBytes = 16 << 10

// ErrUnsafeKeyFile is wrapped by every refusal of a key file's kind or
// permissions.
var ErrUnsafeKeyFile = errors.New("unsafe key file")

// LoadKeyFile reads the signing key. The file is opened without following
// a symbolic link and then checked through the open descriptor, so no one
// can swap the file between the check and the read.
func LoadKeyFile(path string) (ed25519.PrivateKey, error) {
	data, err := ReadSecretFile(path, "key file")
	if err != nil {
		return nil, err
	}
	key, err := decodeKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return key, nil
}

// ReadSecretFile reads a file that holds a secret (a key, a password) with
// the signing key's hardening: it is opened without following a symbolic
// link, then checked through the open descriptor — a regular file, owned
// by this user, readable by its owner only (mode 0600 or stricter), at most
// 16 KiB. what names the file in errors ("key file", "payer key file").
func ReadSecretFile(path, what string) ([]byte, error) {
	// O_NONBLOCK keeps a FIFO planted at path from blocking the open; the
	// fstat below refuses it.
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NOCTTY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s %s: %w: it is a symbolic link", what, path, ErrUnsafeKeyFile)
		}
		return nil, fmt.Errorf("%s %s: %w", what, path, &os.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%s %s: fstat: %w", what, path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, fmt.Errorf("%s %s: %w: not a regular file", what, path, ErrUnsafeKeyFile)
	}
	if perm := st.Mode & 0o777; perm&0o077 != 0 {
		return nil, fmt.Errorf("%s %s: %w: mode %04o gives access to group or others; run chmod 600 %s", what, path, ErrUnsafeKeyFile, perm, path)
	}
	if err := checkKeyFileOwner(path, st.Uid, os.Geteuid()); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read: %w", what, path, err)
	}
	if len(data) > maxKeyFileBytes {
		return nil, fmt.Errorf("%s %s: larger than %d bytes, not a key", what, path, maxKeyFileBytes)
	}
	return data, nil
}

// LoadOrCreateKeyFile loads the signing key, or creates a new one with
// mode 0600 when path does not exist (its directory must). Creation is
// atomic: the key is written to a private temporary file in the same
// directory and then hard-linked to path, which fails if another process
// got there first — in which case that process's key is loaded.
func LoadOrCreateKeyFile(path string) (ed25519.PrivateKey, bool, error) {
	key, err := LoadKeyFile(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return key, false, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("key file %s: generate: %w", path, err)
	}
	data, err := encodeKeyPEM(priv)
	if err != nil {
		return nil, false, fmt.Errorf("key file %s: %w", path, err)
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, false, fmt.Errorf("key file %s: %w", path, err)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-"+hex.EncodeToString(nonce[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("key file %s: create: %w", path, err)
	}
	defer os.Remove(tmp)
	// The umask may have taken bits away but never adds any; set the mode
	// exactly anyway.
	err = f.Chmod(0o600)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, false, fmt.Errorf("key file %s: write: %w", path, err)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			key, err := LoadKeyFile(path)
			return key, false, err
		}
		return nil, false, fmt.Errorf("key file %s: create: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync() // make the new name durable; best effort
		d.Close()
	}
	return priv, true, nil
}

func encodeKeyPEM(key ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func decodeKeyPEM(data []byte) (ed25519.PrivateKey, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New(`not a PEM "PRIVATE KEY" (PKCS#8) block`)
	}
	if len(trimSpace(rest)) != 0 {
		return nil, errors.New("unexpected data after the PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("PKCS#8: %w", err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("the key is a %T, not an Ed25519 key", k)
	}
	return key, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\n' || b[0] == '\r' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}
